"""The llama.cpp KV backend of :class:`~unsee.impl.engines.llamacpp.engine.LlamaCppEngine`:
one lineage is its tokens, its parked KV rows, the logits a decode continues
from and the prefill chunks that built it (:class:`LlamaLineage`);
:class:`LlamaRows` is what the lineage book (:mod:`unsee.impl.engines.book`)
asks of them: one context holds the resident lineages, one per slot (one slot
unless the model says more), the others are parked on the host as rows (the
engine's module docstring has the mapping); with several slots a server decodes
their next tokens in one forward (:class:`Step`, :meth:`LlamaRows.flush`)."""

from __future__ import annotations

import collections
import ctypes
import hashlib
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np
import torch

from unsee.impl.engines.book import ForwardHookList, report_forward
from unsee.impl.engines.lineage import ChunkedLineage
from unsee.impl.engines.llamacpp.facts import forward, forward_steps
from unsee.impl.engines.llamacpp.model import LlamaCppModel, llama_module
from unsee.impl.engines.llamacpp.state import KVState, SeqKV


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


@dataclass(eq=False)
class Step:
    """A one-token decode forward waiting for a batch (:meth:`LlamaRows.flush`): the
    slot it decodes on, its lineage and the token; its logits, or the error, once run."""

    slot: int
    lin: LlamaLineage  # extended by the batch itself: a slot may be parked before the step's thread resumes
    token: int
    logits: np.ndarray | None = None
    error: BaseException | None = None
    thread: int = field(default_factory=threading.get_ident)  # whose step it is (a flush may leave some out)

    @property
    def done(self) -> bool:
        return self.logits is not None or self.error is not None


#: ``gather(done, flush)``: a server's rendezvous for a pending step (impl/serve/engine_lock.py):
#: it returns once ``done()``, having run ``flush(skip)`` (the batch, less the steps of the
#: threads in ``skip``) itself or let another thread run it
Gather = Callable[[Callable[[], bool], Callable[[Collection[int]], None]], None]


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
    and a server can decode several lineages' next tokens in one forward: a
    one-token forward then becomes a :class:`Step` that ``gather`` (set by the
    server) batches with other threads' (:meth:`flush`). One thread's batch of next
    tokens in split cells gives each sequence the bits of its own step
    (docs/bench.md; tests/test_llamacpp_slots.py checks the verbs)."""

    def __init__(self, lm: LlamaCppModel):
        lc = llama_module()
        self.lm = lm
        self.lc = lc
        self.slots = max(1, int(getattr(lm, "slots", 1)))
        # freed with the backend
        self.ctx = (lm.new_context(lm.n_ctx * self.slots, n_seq=self.slots, unified=False) if self.slots > 1
                    else lm.new_context())
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(max(lm.n_ctx, self.slots), 0, 1)
        self.v_trans = not lm.flash_attn  # llama.cpp stores V transposed without flash attention
        self.held: list[tuple[str, LlamaLineage] | None] = [None] * self.slots
        self.slot_used = [0] * self.slots  # when each slot was last made resident or used (an LRU clock)
        self.clock = 0
        self.hooks: ForwardHookList = []
        #: steps waiting for the next batch; ``gather`` None: a one-token forward runs alone
        self.pending: list[Step] = []
        self.gather: Gather | None = None
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # steps per batched forward
        lc.llama_memory_clear(self.mem, True)

    def __del__(self):
        try:
            self.lc.llama_batch_free(self.batch)
            self.lc.llama_free(self.ctx)
        except Exception:  # noqa: BLE001, S110 (a half-built backend, or interpreter shutdown: nothing to free)
            pass

    @property
    def can_batch(self) -> bool:
        """Whether one-token forwards may share a forward (:meth:`flush`): several slots,
        and decode on one thread. A batch is a forward of several rows, which llama.cpp
        computes on ``batch_threads``; that equals one-thread steps (docs/bench.md), while
        a step alone on more threads splits its keys among them and would not."""
        return self.slots > 1 and self.lm.threads == 1

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
        allocation (``slots`` x n_ctx cells, fixed) is not counted."""
        if full:
            self.park(handle, lin)
        return lin.storages()

    def free(self, handle: str) -> None:
        """Empty the slot that holds ``handle``, if one does (running the pending batch
        first if a step of it waits there)."""
        slot = self.get_slot(handle)
        if slot is None:
            return
        if any(step.slot == slot for step in self.pending):
            self.flush()
        self.clear_slot(slot)

    def forward(self, handle: str, lin: LlamaLineage, ids: list[int], all_logits: bool,
                commit: bool = False) -> np.ndarray:
        """One llama_decode of ``ids`` after ``lin``'s tokens, appending them:
        the logits after the last token, or after each (n, vocab). A one-token
        forward under a server's ``gather`` is a :class:`Step` of a batch."""
        slot = self.make_resident(handle, lin)
        start = len(lin.tokens)
        if start + len(ids) > self.lm.n_ctx:
            raise ValueError(f"{start} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")
        started = time.perf_counter()
        if len(ids) == 1 and self.gather is not None:
            logits = self.step(slot, lin, ids[0])
            logits = logits[None] if all_logits else logits
        else:
            logits = forward(self.lc, self.ctx, self.batch, ids, start, all_logits, self.lm.vocab_size, seq=slot)
            lin.tokens.extend(ids)
            lin.kv = None
        # after the tokens are the lineage's: a streaming listener reads them from it
        report_forward(self.hooks, len(ids), started, commit)
        return logits

    def step(self, slot: int, lin: LlamaLineage, token: int) -> np.ndarray:
        """The logits after ``token`` at the end of ``lin`` (resident in ``slot``), decoded in
        a batch with whatever other threads' steps ``gather`` collects."""
        step = Step(slot, lin, token)
        self.pending.append(step)
        try:
            self.gather(lambda: step.done, self.flush)
        finally:
            if step in self.pending:  # interrupted before its batch ran
                self.pending.remove(step)
        if step.error is not None:
            raise step.error
        return step.logits

    def flush(self, skip: Collection[int] = ()) -> None:
        """Run the pending steps as one forward (one step: the plain forward), each
        lineage extended by its token and given its logits, or every step the error.
        The steps of the threads in ``skip`` stay pending (a response's batch leaves a
        forget's replay out, so that the replay never slows it)."""
        steps = [s for s in self.pending if s.thread not in skip]
        self.pending = [s for s in self.pending if s.thread in skip]
        if not steps:
            return
        try:
            if len(steps) == 1:
                s = steps[0]
                out = [forward(self.lc, self.ctx, self.batch, [s.token], len(s.lin.tokens), False,
                               self.lm.vocab_size, seq=s.slot)]
            else:
                out = forward_steps(self.lc, self.ctx, self.batch, [(s.slot, len(s.lin.tokens), s.token) for s in steps],
                                    self.lm.vocab_size)
        except BaseException as e:  # noqa: BLE001 (each step's own thread raises it)
            for s in steps:
                s.error = e
            return
        self.batch_sizes[len(steps)] += 1
        for s, logits in zip(steps, out):
            s.lin.tokens.append(s.token)
            s.lin.kv = None
            s.logits = logits

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

    def make_resident(self, handle: str, lin: LlamaLineage) -> int:
        """The slot holding ``lin``, loading it first into an emptied slot (the
        least recently used, parked first; never one a pending step decodes on)
        if none does: ``llama_state_seq_set_data`` into an empty sequence puts
        position p in cell p, the layout a fresh run has."""
        self.clock += 1
        slot = self.get_slot(handle)
        if slot is None:
            slot = self.pick_slot()
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
        self.slot_used[slot] = self.clock
        return slot

    def pick_slot(self) -> int:
        """A free slot, else the least recently used one no pending step decodes on
        (running the pending batch first when every slot has one)."""
        if None in self.held:
            return self.held.index(None)
        busy = {step.slot for step in self.pending}
        if len(busy) == self.slots:
            self.flush()
            busy = set()
        return min((s for s in range(self.slots) if s not in busy), key=self.slot_used.__getitem__)

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


__all__ = ["Gather", "LlamaLineage", "LlamaRows", "Step"]
