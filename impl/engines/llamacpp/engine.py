"""LlamaCppEngine: the :class:`~unsee.impl.engines.protocol.Engine` verbs over llama.cpp.

Through llama-cpp-python's own ctypes API (``llama_cpp``; no subprocess, no
server), the optional extra ``pip install 'unsee[llamacpp]'``. It reads GGUF
files directly: the embedded SmolLM2 Q4_1 file by default (no dequantising),
or the tiny random GGUF of :mod:`unsee.impl.engines.llamacpp.tiny_gguf` for fast properties.

How lineages map onto llama.cpp (the clone mechanism, chosen once):

* Each engine owns **one context with one sequence** (``n_seq_max = 1``, sequence 0),
  the *resident* lineage. Every other lineage is held on the host as its
  sequence state (``llama_state_seq_get_data``) parsed into K and V rows by
  position (:class:`~unsee.impl.engines.llamacpp.state.SeqKV`). These arrays
  are never written to, so forking (``fork``: a shared prefix or a clone) is
  slicing, with no copy, and a clone is independent of its source both ways
  by construction.
* ``use`` of another lineage parks the resident one (one state read) and
  loads the new one into the emptied sequence (``llama_memory_clear`` +
  ``llama_state_seq_set_data``): a state copy. Loading into an empty cache
  puts position p in cell p, the layout a fresh run has, so a loaded lineage
  continues exactly as a fresh prefill of the same chunks would (measured by
  tests/test_llamacpp.py and bench/llamacpp_bitwise.py).
* Crop is ``llama_memory_seq_rm(mem, 0, n, -1)`` on the resident lineage
  (the freed cells are the tail, so the next prefill writes cells n.. as a
  fresh run does), and a slice of the rows on a parked one.
* Limits of this mechanism: switching lineages costs a copy of the KV of
  both (O(length), about 23 KB a token for SmolLM2's f16 KV); one lineage
  computes at a time (the engine is not thread-safe, like KVEngine); unified
  versus split KV does not arise with one sequence; ``n_ctx`` bounds every
  lineage's length.

The digest hashes K and V *by position* (every layer's K row and V row of
each position, in position order, plus the positions themselves), parsed
from the state blob, not the blob: the blob also carries the cell layout
(V is stored transposed over the cells when flash attention is off), so the
same KV in other cells would hash differently.

Decoding applies :mod:`unsee.impl.engines.decoding`' rule (``get_scores`` + ``pick``:
greedy or the seeded exponential race) to llama.cpp's logits, exactly as
KVEngine does, and canonicalises a turn as one prefilled chunk. Drafts,
probes and context guesses (impl/engines/turn.py) run where this file's
decode equals its prefill bitwise, measured at load for forwards up to a
size (:mod:`~unsee.impl.engines.llamacpp.facts`): bound 0, every
verification forward capped at that size. The prefix cache serves whole
matching chunks from parked rows (B5'). A model with sliding-window layers
has two KV caches, kept full-size and parked whole (``_read_swa_rows``). A
KV budget evicts parked lineages by the bytes of their rows (the rule is
:class:`~unsee.impl.engines.lineage.LineageBook`'s, shared by every engine).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar

import numpy as np
import torch

from unsee.impl.engines.computed import ComputedKVBook
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.llamacpp.facts import forward
from unsee.impl.engines.llamacpp.lineage import LlamaLineage, TurnView
from unsee.impl.engines.llamacpp.model import (
    INSTALL_HINT,
    LlamaCppMissingError,
    LlamaCppModel,
    available,
    llama_module,
    load_llamacpp,
)
from unsee.impl.engines.llamacpp.state import KVState, SeqKV
from unsee.impl.engines.protocol import Determinism
from unsee.impl.engines.turn import Turn, decode_turn

# ----------------------------------------------------------------- engine


class LlamaCppEngine(ComputedKVBook):
    """The llama.cpp implementation of :class:`unsee.impl.engines.protocol.Engine`:
    lineages over one :class:`LlamaCppModel`, one resident in the engine's
    context and the others parked on the host as rows (the module docstring
    has the mapping), with the verbs prefill, generate (canonicalised; drafts,
    probe and lookup where decode == prefill was measured), crop,
    fork, drop, digest and logits; the KV budget and pins of
    :class:`~unsee.impl.engines.lineage.LineageBook`; and a prefix cache that
    serves whole matching chunks. Needs no transformers."""

    #: what equal digests mean (protocol.Determinism.digest), and the support matrix's words (engines/support.py)
    DIGEST = "kv"
    SUPPORT: ClassVar[dict[str, str]] = {"drafts": "yes where decode == prefill is measured at load (bound 0, forwards capped)",
               "kv_budget": "yes: parked lineages' rows, LRU", "store": "yes (records threads, flash attention, n_ctx, kernels)",
               "receipts": "yes"}

    def __init__(self, lm: LlamaCppModel, kv_budget: int | None = None):
        lc = llama_module()
        self.lm = lm
        self._lc = lc
        self._ctx = lm.new_context()  # freed with the engine
        self._mem = lc.llama_get_memory(self._ctx)
        self.counters = Counters()
        #: 0.0 where this file's decode == prefill bitwise for forwards of up to
        #: lm.max_forward tokens (measured: facts.py), else None (drafts off);
        #: decode_is_prefill stays False: longer forwards take other kernels
        self.draft_bound = lm.draft_bound
        self.draft_bound_source = lm.draft_bound_source  # the file's measured facts (facts.py)
        #: how a turn sizes its forwards (impl/engines/speculation.py; None: each feeds all it can)
        self.draft_policy = lm.draft_policy
        self.determinism = Determinism(same_chunking_repeats=True, crop_continue_is_fresh=True,
                                       chunk_invariant=False, decode_is_prefill=False,
                                       thread_invariant=False, statement=lm.determinism, digest=self.DIGEST)
        self._init_book()
        self._resident: str | None = None  # the lineage sequence 0 holds
        self._batch = lc.llama_batch_init(lm.n_ctx, 0, 1)
        self._v_trans = not lm.flash_attn  # llama.cpp stores V transposed without flash attention
        lc.llama_memory_clear(self._mem, True)
        self.budget.set(kv_budget)

    def __del__(self):
        try:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
        except Exception:  # noqa: BLE001, S110 (a half-built engine, or interpreter shutdown: nothing to free)
            pass

    # ------------------------------------------------------------ lineages

    def new_lineage(self) -> str:
        handle = self._fresh_handle()
        self._lineages[handle] = LlamaLineage([], None, None)
        self._current = handle
        self._touch(handle)
        return handle

    def fork(self, lineage: str, n_tokens: int | None = None) -> str:
        src = self._get(lineage)
        length = len(src.tokens)
        n = length if n_tokens is None else self._check_prefix_length("fork", n_tokens, length)
        kv = self._parked(lineage)
        handle = self._fresh_handle()
        lin = LlamaLineage(src.tokens[:n], kv.head(n), src.last_logits if n == length else None)
        lin.copy_history(src, n)
        lin.served_last = src.served_last and n == length
        self._lineages[handle] = lin
        self._touch(handle)
        self.budget.enforce()
        return handle

    # --------------------------------------------------------------- verbs

    def _generate(
        self, max_new_tokens: int, stop_ids: Iterable[int] | None = None, temperature: float = 0.0,
                 seed: int | None = None, draft: Sequence[int] | None = None,
                 probe: bool = False, lookup: bool = False) -> list[int]:
        """As :meth:`~unsee.impl.engines.protocol.Engine.generate`: decode by the rule of
        impl/engines/decoding.py on llama.cpp's logits, with a ``draft``,
        ``probe`` and ``lookup`` where the engine has a bound (this file's
        decode == prefill: :mod:`~unsee.impl.engines.llamacpp.facts`), through
        :func:`unsee.impl.engines.turn.decode_turn`; then commit the turn as
        one prefilled chunk (the canonical chunk a replay redoes)."""
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, draft, lookup)
        handle = self._need_current()
        lin = self._get_decodable(handle)
        draft = self._check_ids(draft, allow_empty=True)[:max_new_tokens] if draft is not None else []
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        self._make_resident(handle)
        start, header_logits = len(lin.tokens), lin.last_logits
        lin.decode_logits[start] = header_logits  # what a prefix cache needs to serve this position
        view = TurnView(lin, self._feed, self._truncate)
        turn = Turn(view, self.counters, start, torch.from_numpy(header_logits), max_new_tokens, stops,
                    temperature, seed, self.draft_bound, max_forward=self.lm.max_forward or None,
                    policy=self.draft_policy)
        try:
            out, committed = decode_turn(turn, draft, probe, lookup)
        except BaseException:
            self._truncate(lin, start)  # interrupted: the lineage as it was
            lin.last_logits = header_logits
            raise
        if committed:  # a draft accepted whole: its verification forward is the turn's chunk
            lin.record_chunk(start)
            lin.served_last = False
            self.budget.enforce()
        elif out and not self._commit_decoded(handle, lin, start, out):
            self._truncate(lin, start)
            # through the verb, as any prefill: a wrapper of the verbs (bench/timing.py) then
            # sees the canonical chunk as a prefill inside generate
            self.prefill(self._need_current(), out)
        return out

    def _commit_decoded(self, handle: str, lin: LlamaLineage, start: int, out: list[int]) -> bool:
        """Commit a decoded turn without re-prefilling it, where that is the
        same KV: a turn of at most ``max_forward`` tokens, whose rows before
        its last token the turn's own forwards wrote (each of at most
        ``max_forward`` tokens, so each row equal to a decode step's, and to
        the row a one-chunk prefill of the turn writes: facts.py). Feeds the
        last token alone for the logits after it. False (nothing changed)
        where it does not apply. Inside a prefix cache too, so that B5' does the
        work B5 does, less what it serves."""
        cap = self.lm.max_forward
        if not cap or len(out) > cap:
            return False
        if lin.tokens[start:start + len(out) - 1] != out[:-1]:
            return False
        self._truncate(lin, start + len(out) - 1, handle)
        lin.last_logits = self._feed(lin, out[-1:], False)
        lin.record_chunk(start)
        lin.served_last = False
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += 1
        self.budget.enforce()
        return True

    def logits(self, lineage: str) -> torch.Tensor | None:
        """The logits after the lineage's last prefill (float32, a copy), or
        None after a crop or a draft accepted whole."""
        handle = lineage
        lin = self._get(handle)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(handle, lin)
        return None if lin.last_logits is None else torch.from_numpy(lin.last_logits.copy())

    def digest(self, lineage: str) -> str:
        """sha256 over the K and V rows by position (see :meth:`SeqKV.digest_into`).
        Any empty lineage has the same digest, however it got empty."""
        handle = lineage
        lin = self._get(handle)
        h = hashlib.sha256(b"unsee-llamacpp-kv-v1")
        h.update(f"len={len(lin.tokens)};".encode())
        kv = self._parked(handle)
        if kv.n:
            kv.digest_into(h)
        return h.hexdigest()

    @contextlib.contextmanager
    def hook_forwards(self, on_forward: Callable[[int, float], None]) -> Iterator[None]:
        """Call ``on_forward(n_tokens, started)`` after every ``llama_decode`` in the block."""
        feed = self._feed

        def timed_feed(lin, ids, *args, **kwargs):
            started = time.perf_counter()
            try:
                return feed(lin, ids, *args, **kwargs)
            finally:
                on_forward(len(ids), started)

        self._feed = timed_feed
        try:
            yield
        finally:
            del self._feed

    # ------------------------------------------------------------ memory

    def _storages(self, handle: str, park: bool = False) -> dict:
        """Distinct host buffers a lineage holds: ``{key: bytes}``. The
        resident lineage, changed since it was parked, holds none outside the
        context unless ``park`` reads it out (what :meth:`~unsee.impl.engines.lineage.Budget.memory` does; the
        budget need not: the resident lineage is current, never evicted)."""
        if park:
            self._parked(handle)
        return self._lineages[handle].storages()

    def _lineage_storages(self, handle: str) -> dict:
        # the resident lineage read out of the context; the context's own
        # allocation (n_ctx cells, fixed) is not counted
        return self._storages(handle, park=True)

    def _budget_storages(self, handle: str) -> dict:
        # without reading the resident lineage out: it is current, never evicted
        return self._storages(handle)

    def _free_lineage(self, handle: str) -> None:
        """Empty the context's sequence if ``handle`` is the lineage it holds."""
        if handle == self._resident:
            self._lc.llama_memory_clear(self._mem, True)
            self._resident = None

    # --------------------------------------------------------- prefix cache

    # ------------------------------------------------- the skeleton's steps

    def _check_room(self, lin: LlamaLineage, ids: list[int]) -> None:
        if len(lin.tokens) + len(ids) > self.lm.n_ctx:
            raise ValueError(f"prefill: {len(lin.tokens)} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")

    def _forward(self, handle: str, lin: LlamaLineage, ids: list[int]) -> np.ndarray:
        self._make_resident(handle)
        return self._feed(lin, ids, False)

    def _truncate_to(self, handle: str, lin: LlamaLineage, n: int) -> None:
        self._make_resident(handle)
        self._truncate(lin, n, handle)

    def _take_rows(self, handle: str, lin: LlamaLineage, src_handle: str, src: LlamaLineage, n: int) -> None:
        kv = self._parked(src_handle).head(n)
        if handle == self._resident:
            self._free_lineage(handle)  # the rows below replace the context's copy
        lin.kv = kv

    # ------------------------------------------------------------ helpers

    def _feed(self, lin: LlamaLineage, ids: list[int], all_logits: bool) -> np.ndarray:
        """One llama_decode of ``ids`` after ``lin``'s tokens (``lin`` is
        resident), appending them: the logits after the last token, or after
        each (n, vocab). Counted by the caller."""
        start = len(lin.tokens)
        if start + len(ids) > self.lm.n_ctx:
            raise ValueError(f"{start} + {len(ids)} tokens exceed n_ctx={self.lm.n_ctx}")
        logits = forward(self._lc, self._ctx, self._batch, ids, start, all_logits, self.lm.vocab_size)
        lin.tokens.extend(ids)
        lin.kv = None
        return logits

    def _read_blob(self, seq: int, flags: int = 0) -> bytes:
        """Sequence ``seq``'s state blob (``flags``: llama.cpp's state-seq flags)."""
        lc, ctx = self._lc, self._ctx
        size = lc.llama_state_seq_get_size_ext(ctx, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        got = lc.llama_state_seq_get_data_ext(ctx, buf, size, seq, flags)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return bytes(buf)

    def _read_seq(self) -> KVState:
        """Sequence 0's KV, read out of the context and parsed; with a
        sliding-window cache, its rows of every position (:meth:`_read_swa_rows`)."""
        state = KVState.parse(self._read_blob(0), self.lm.n_layer, self._v_trans)
        if len(state.caches) == 2 and state.caches[1].n:
            state = state.with_cache(1, self._read_swa_rows(state.caches[1]))
        return state

    def _read_swa_rows(self, last: SeqKV) -> SeqKV:
        """The sliding-window cache's rows of every position of sequence 0.
        llama.cpp keeps them all (the context asks for a full-size SWA cache)
        but its state writer gives those of the last ``n_swa`` positions only
        (``last``); the earlier ones are read window by window through
        sequence 1: give it positions [0, p) (a copy of cell membership, no
        data), read its sliding-window cache, take sequence 1 away again."""
        lc, mem = self._lc, self._mem
        parts = [last]
        while int(parts[0].positions[0]) > 0:
            end = int(parts[0].positions[0])
            lc.llama_memory_seq_cp(mem, 0, 1, 0, end)
            try:
                blob = self._read_blob(1, lc.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY)
            finally:
                lc.llama_memory_seq_rm(mem, 1, -1, -1)
            window = SeqKV.parse(blob, len(last.k), self._v_trans)
            if not window.n or int(window.positions[-1]) != end - 1:
                raise RuntimeError(f"sliding-window rows before position {end} could not be read "
                                   "(an unexpected llama.cpp state layout)")
            parts.insert(0, window)
        return SeqKV.concat(parts)

    def _parked(self, handle: str | None) -> KVState:
        """The rows of ``handle``, parking (reading) them first if the
        resident copy changed since."""
        lin = self._lineages[handle]
        if lin.kv is None:
            if handle == self._resident:
                lin.kv = self._read_seq()
            elif not lin.tokens:
                lin.kv = KVState((SeqKV.empty(self.lm.n_layer, self._v_trans),))
            else:
                raise RuntimeError(f"lineage {handle!r} has neither rows nor residency")  # a bug, never input
        return lin.kv

    def _make_resident(self, handle: str) -> None:
        """Load ``handle`` into sequence 0 (parking the resident lineage first)."""
        if self._resident == handle:
            return
        if self._resident is not None and self._resident in self._lineages:
            self._parked(self._resident)
        lc, ctx = self._lc, self._ctx
        lc.llama_memory_clear(self._mem, True)
        self._resident = None
        kv = self._parked(handle)
        if kv.n:
            blob = kv.to_blob()
            arr = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
            if lc.llama_state_seq_set_data(ctx, arr, len(blob), 0) != len(blob):
                raise RuntimeError(f"llama_state_seq_set_data could not load lineage {handle!r}")
        self._resident = handle

    def _truncate(self, lin: LlamaLineage, n: int, handle: str | None = None) -> None:
        handle = handle or self._current
        if handle == self._resident:
            if not self._lc.llama_memory_seq_rm(self._mem, 0, n, -1):
                raise RuntimeError(f"llama_memory_seq_rm refused to crop lineage {handle!r} to {n}")
            if lin.kv is not None:
                lin.kv = lin.kv.head(n)
        elif lin.kv is not None:
            lin.kv = lin.kv.head(n)
        del lin.tokens[n:]


__all__ = ["INSTALL_HINT", "LlamaCppEngine", "LlamaCppMissingError", "LlamaCppModel", "available",
           "load_llamacpp"]
