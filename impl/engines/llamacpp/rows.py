"""The llama.cpp KV backend of :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine`:
one lineage is its tokens, its parked KV rows, the logits a decode continues
from and the prefill chunks that built it (:class:`LlamaLineage`);
:class:`LlamaRows` is what the lineage book (:mod:`unsee.impl.engines.book`)
asks of them: one context holds the resident lineages, one per slot (one slot
unless the model says more), the others are parked on the host as rows (the
engine's module docstring has the mapping); with several slots the engine's loop
decodes their next tokens in one forward (:meth:`LlamaRows.forward_steps`)."""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections.abc import Collection, Sequence

import numpy as np
import torch

from unsee.impl.engines.book import ForwardHookList, report_forward
from unsee.impl.engines.lineage import ChunkedLineage
from unsee.impl.engines.llamacpp.facts import forward, forward_steps
from unsee.impl.engines.llamacpp.model import LlamaCppModel, llama_module
from unsee.impl.engines.llamacpp.state import KVState, SeqKV
from unsee.impl.engines.scheduler import StepRequest


class LlamaLineage(ChunkedLineage):
    """What the llama.cpp engine knows of one lineage (logits as float32
    numpy arrays of the vocabulary's size)."""

    __slots__ = ("kv",)

    def __init__(self, tokens: list[int], kv: KVState | None, last_logits: np.ndarray | None):
        super().__init__(tokens, last_logits)
        self.kv = kv  # the parked rows; None while resident and changed since parked

    def storages(self) -> dict:
        """Distinct host buffers held: ``{key: bytes}`` (parked rows and kept logits)."""
        out = self.kv.storages() if self.kv is not None else {}
        for t in list(self.decode_logits.values()) + [self.last_logits]:
            if t is not None:
                out[id(t)] = t.nbytes
        return out


class LlamaRows:
    """One llama.cpp context as the book's :class:`~unsee.impl.engines.book.KVBackend`.

    The context holds ``slots`` lineages at once, *resident*, each in a sequence of
    its own (``held[slot]``: its handle and lineage object); every other lineage's
    rows are parked on the host and never written to, so a fork is a slice and a
    clone is independent of its source both ways. A forward or a crop first makes
    its lineage resident, parking the least recently used slot's if none is free.

    With one slot (the default) the context is one sequence, as every bitwise fact
    was measured. With more, each sequence has a stream of its own (``kv_unified``
    off), so its first cell is its position 0 as in a context of its own
    (docs/bench.md, "many sequences in one forward": unified cells move a prefill),
    and the engine's loop decodes several lineages' next tokens in one forward
    (:meth:`forward_steps`). A batch of next tokens in split cells gives each
    sequence the bits of its own step (docs/bench.md; tests/test_llamacpp_slots.py
    checks the verbs). It computes when asked, and holds no thread."""

    def __init__(self, lm: LlamaCppModel):
        lc = llama_module()
        self.lm = lm
        self.lc = lc
        self.slots = max(1, int(getattr(lm, "slots", 1)))
        # freed with the backend
        self.ctx = (lm.new_context(lm.n_ctx * self.slots, n_seq=self.slots, unified=False) if self.slots > 1
                    else lm.new_context())
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(max(lm.n_ctx, self.slots * max(1, lm.max_forward or 0)), 0, 1)
        self.v_trans = not lm.flash_attn  # llama.cpp stores V transposed without flash attention
        self.held: list[tuple[str, LlamaLineage] | None] = [None] * self.slots
        self.hooks: ForwardHookList = []
        lc.llama_memory_clear(self.mem, True)

    def __del__(self):
        try:
            self.lc.llama_batch_free(self.batch)
            self.lc.llama_free(self.ctx)
        except Exception:  # noqa: BLE001, S110 (a half-built backend, or interpreter shutdown: nothing to free)
            pass

    @property
    def can_batch(self) -> bool:
        """Whether one-token forwards may share a forward (:meth:`forward_steps`): several slots.
        A forward of two or more rows runs on ``batch_threads`` (llama.cpp takes ``n_threads``
        for a one-row forward only), and flash attention splits a query row's keys among the
        threads only where the forward is that one row in one stream: a batch of steps, one per
        stream, computes each row whole on one thread, so it equals each step on one thread
        at any thread count (tests/test_llamacpp_threads.py). A step left alone runs on
        ``threads``: on more than one, whole on one thread where the library has the split switch
        (kernels.py), else padded to two rows (facts.forward_padded)."""
        return self.slots > 1

    @property
    def batch_limit(self) -> int:
        """The most decode steps one forward takes (:meth:`forward_steps`): the slots where it batches."""
        return self.slots if self.can_batch else 1

    # --- the book's backend

    def new(self) -> LlamaLineage:
        return LlamaLineage([], None, None)

    def fork(self, handle: str, src: LlamaLineage, n: int) -> LlamaLineage:
        lin = LlamaLineage(src.tokens[:n], self.park(handle, src).head(n), None)
        lin.inherit(src, n)
        return lin

    def storages(self, handle: str, lin: LlamaLineage, full: bool) -> dict:
        """Distinct host buffers ``lin`` holds: ``{key: bytes}``. A resident
        lineage, changed since it was parked, holds none outside the context
        unless ``full`` reads it out (what memory counts; the budget need not:
        evicting it frees none of the context's cells). The context's own
        allocation (``slots`` x n_ctx cells, fixed) is not counted.

        A resident lineage changed since it was parked is counted where it is, at the bytes
        reading it out would hold (:meth:`get_resident_bytes`), not read out: a server counts
        memory after every request, and reading every conversation's rows out each time took
        the engine's loop tens of milliseconds between turns (docs/serve.md, "Where the time goes")."""
        slot = self.get_slot(handle) if full and lin.kv is None else None
        if slot is not None and not self.lm.n_swa:
            return lin.storages() | {("resident", handle): self.get_resident_bytes(slot, len(lin.tokens))}
        if full:
            self.park(handle, lin)
        return lin.storages()

    def get_resident_bytes(self, slot: int, n_cells: int) -> int:
        """What :meth:`read_seq` of ``slot`` (``n_cells`` cells, no sliding window) would hold:
        the state blob, which the parsed rows view, and the positions, parsed into an array."""
        return int(self.lc.llama_state_seq_get_size_ext(self.ctx, slot, 0)) + 4 * n_cells

    def free(self, handle: str) -> None:
        """Empty the slot that holds ``handle``, if one does."""
        slot = self.get_slot(handle)
        if slot is not None:
            self.clear_slot(slot)

    def forward(self, handle: str, lin: LlamaLineage, ids: list[int], all_logits: bool,
                commit: bool = False) -> np.ndarray:
        """One llama_decode of ``ids`` after ``lin``'s tokens, appending them:
        the logits after the last token, or after each (n, vocab)."""
        slot = self.make_resident(handle, lin)
        start = len(lin.tokens)
        if start + len(ids) > self.lm.n_ctx:
            raise ValueError(f"{start} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")
        started = time.perf_counter()
        logits = forward(self.lc, self.ctx, self.batch, ids, start, all_logits, self.lm.vocab_size, seq=slot)
        lin.tokens.extend(ids)
        lin.kv = None
        # after the tokens are the lineage's: a streaming listener reads them from it
        report_forward(self.hooks, len(ids), started, commit)
        return logits

    def forward_steps(self, steps: Sequence[StepRequest]) -> list[np.ndarray]:
        """Several lineages' forwards (at most :attr:`batch_limit`, one each: next tokens, or
        chunks of at most the engine's ``max_forward`` tokens) in one ``llama_decode``, each in
        its own slot: each lineage extended by its tokens; the logits after each one's last.
        Each is reported to its own thread's hooks."""
        if len(steps) > self.batch_limit or len({s.handle for s in steps}) < len(steps):
            raise ValueError(f"forward_steps: {len(steps)} steps; expected distinct lineages, "
                             f"at most {self.batch_limit}")
        if any(len(s.tokens) > max(1, self.lm.max_forward or 0) for s in steps):
            raise ValueError(f"forward_steps: a chunk longer than max_forward={self.lm.max_forward} "
                             "(its rows would depend on how llama.cpp cuts the batch)")
        slots: list[int] = []
        for s in steps:
            slots.append(self.make_resident(s.handle, s.lin, keep=slots))
            if len(s.lin.tokens) + len(s.tokens) > self.lm.n_ctx:
                raise ValueError(f"{len(s.lin.tokens)} + {len(s.tokens)} tokens exceed n_ctx={self.lm.n_ctx}")
        started = time.perf_counter()
        out = forward_steps(self.lc, self.ctx, self.batch,
                            [(slot, len(s.lin.tokens), s.tokens) for slot, s in zip(slots, steps)], self.lm.vocab_size)
        for s in steps:
            s.lin.tokens.extend(s.tokens)
            s.lin.kv = None
            report_forward(self.hooks, len(s.tokens), started, False, thread=s.thread)
        return out

    def truncate(self, handle: str, lin: LlamaLineage, n: int) -> None:
        """Keep the first ``n`` tokens: ``llama_memory_seq_rm`` on the lineage's
        sequence (the freed cells are the tail, so the next prefill writes
        cells n.. as a fresh run does)."""
        slot = self.make_resident(handle, lin)
        if not self.lc.llama_memory_seq_rm(self.mem, slot, n, -1):
            raise RuntimeError(f"llama_memory_seq_rm refused to crop lineage {handle!r} to {n}")
        if lin.kv is not None:
            lin.kv = lin.kv.head(n)
        del lin.tokens[n:]

    def take_rows(self, handle: str, lin: LlamaLineage, src_handle: str, src: LlamaLineage, n: int) -> None:
        kv = self.park(src_handle, src).head(n)
        self.free(handle)  # the rows below replace the context's copy, if it held this lineage
        lin.kv = kv

    def check_room(self, lin: LlamaLineage, ids: list[int]) -> None:
        if len(lin.tokens) + len(ids) > self.lm.n_ctx:
            raise ValueError(f"prefill: {len(lin.tokens)} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")

    def digest(self, handle: str, lin: LlamaLineage) -> str:
        """sha256 over the K and V rows by position (see :meth:`SeqKV.digest_into`)."""
        h = hashlib.sha256(b"unsee-llamacpp-kv-v1")
        h.update(f"len={len(lin.tokens)};".encode())
        kv = self.park(handle, lin)
        if kv.n:
            kv.digest_into(h)
        return h.hexdigest()

    def to_torch(self, logits: np.ndarray | None) -> torch.Tensor | None:
        return None if logits is None else torch.from_numpy(logits)

    def from_torch(self, logits: torch.Tensor | None) -> np.ndarray | None:
        return None if logits is None else logits.numpy()

    # --- the context

    def get_slot(self, handle: str) -> int | None:
        """The slot that holds ``handle``, or None."""
        for slot, held in enumerate(self.held):
            if held is not None and held[0] == handle:
                return slot
        return None

    def park(self, handle: str, lin: LlamaLineage) -> KVState:
        """The rows of ``lin``, reading them out of the context first if a slot
        holds ``handle`` and it changed since it was parked."""
        if lin.kv is None:
            slot = self.get_slot(handle)
            if slot is not None:
                lin.kv = self.read_seq(slot)
            elif not lin.tokens:
                lin.kv = KVState((SeqKV.empty(self.lm.n_layer, self.v_trans),))
            else:
                raise RuntimeError(f"lineage {handle!r} has neither rows nor residency")  # a bug, never input
        return lin.kv

    def make_resident(self, handle: str, lin: LlamaLineage, keep: Collection[int] = ()) -> int:
        """The slot holding ``lin``, loading it first into an emptied slot (the
        least recently used, parked first; never one of ``keep``, the slots of a
        batch being built) if none does: ``llama_state_seq_set_data`` into an
        empty sequence puts position p in cell p, the layout a fresh run has."""
        slot = self.get_slot(handle)
        if slot is None:
            slot = self.pick_slot(keep)
            if self.held[slot] is not None:
                self.park(*self.held[slot])
            self.clear_slot(slot)
            kv = self.park(handle, lin)
            if kv.n:
                blob = kv.to_blob(self.slots, slot)
                arr = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
                if self.lc.llama_state_seq_set_data(self.ctx, arr, len(blob), slot) != len(blob):
                    raise RuntimeError(f"llama_state_seq_set_data could not load lineage {handle!r}")
            self.held[slot] = (handle, lin)
        return slot

    def pick_slot(self, keep: Collection[int] = ()) -> int:
        """A free slot, else the one not in ``keep`` whose lineage the book used least recently
        (the book's one LRU clock, ``last_used``, the one its KV budget evicts by)."""
        if None in self.held:
            return self.held.index(None)
        return min((s for s in range(self.slots) if s not in keep), key=lambda s: self.held[s][1].last_used)

    def clear_slot(self, slot: int) -> None:
        """Empty ``slot``: the whole memory where there is one slot (as every fact was
        measured), else its sequence (its own stream, every cell freed)."""
        if self.slots == 1:
            self.lc.llama_memory_clear(self.mem, True)
        elif not self.lc.llama_memory_seq_rm(self.mem, slot, -1, -1):
            raise RuntimeError(f"llama_memory_seq_rm refused to empty slot {slot}")
        self.held[slot] = None

    def read_blob(self, seq: int, flags: int = 0) -> bytes:
        """Sequence ``seq``'s state blob (``flags``: llama.cpp's state-seq flags)."""
        lc, ctx = self.lc, self.ctx
        size = lc.llama_state_seq_get_size_ext(ctx, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        got = lc.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return bytes(buf)

    def read_seq(self, slot: int = 0) -> KVState:
        """Sequence ``slot``'s KV, read out of the context and parsed; with a
        sliding-window cache (one slot), its rows of every position (:meth:`read_swa_rows`)."""
        state = KVState.parse(self.read_blob(slot), self.lm.n_layer, self.v_trans, self.slots)
        if len(state.caches) == 2 and state.caches[1].n:
            state = state.with_cache(1, self.read_swa_rows(state.caches[1]))
        return state

    def read_swa_rows(self, last: SeqKV) -> SeqKV:
        """The sliding-window cache's rows of every position of sequence 0.
        llama.cpp keeps them all (the context asks for a full-size SWA cache)
        but its state writer gives those of the last ``n_swa`` positions only
        (``last``); the earlier ones are read window by window through
        sequence 1: give it positions [0, p) (a copy of cell membership, no
        data), read its sliding-window cache, take sequence 1 away again."""
        lc, mem = self.lc, self.mem
        parts = [last]
        while int(parts[0].positions[0]) > 0:
            end = int(parts[0].positions[0])
            lc.llama_memory_seq_cp(mem, 0, 1, 0, end)
            try:
                blob = self.read_blob(1, lc.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY)
            finally:
                lc.llama_memory_seq_rm(mem, 1, -1, -1)
            window = SeqKV.parse(blob, len(last.k), self.v_trans)
            if not window.n or int(window.positions[-1]) != end - 1:
                raise RuntimeError(f"sliding-window rows before position {end} could not be read "
                                   "(an unexpected llama.cpp state layout)")
            parts.insert(0, window)
        return SeqKV.concat(parts)


__all__ = ["LlamaLineage", "LlamaRows"]
