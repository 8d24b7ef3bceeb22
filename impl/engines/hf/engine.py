"""KVEngine: the engine verbs over a transformers model's KV caches.

The runtime needs the KV cache to be a pure function of the token chunks that
built it, so that "crop and replay" reproduces a state bit for bit. Two facts
about the kernels shape this module:

* the KV of a chunk depends on how the tokens were chunked (prefilling 40
  tokens at once can differ in the last bits from 20 + 20, and decoding
  tokens one at a time differs from prefilling them), but
* the same chunking, repeated, is bitwise identical.

So every `prefill(chunk)` is exactly one forward over that chunk, and
`generate` *canonicalises* its turn: after decoding g_1..g_n one by one, it
crops them away and prefills [g_1..g_n] as one chunk. The committed KV of a
model turn is then the KV of prefilling that turn, which a replay can redo.

A "lineage" is one cache, named by a string handle. A compaction rewrites
the prompt prefix and so starts a new lineage; a checkpoint names the lineage
it crops. Handles are never reused, even after `drop`. A lineage's cache
and chunk history are :class:`~unsee.impl.engines.hf.lineage.Lineage`; one
`generate` turn (drafts, probe, lookup) is :mod:`unsee.impl.engines.turn` over
:class:`~unsee.impl.engines.hf.generate.HFTurnLineage`;
every transformers call goes through :mod:`unsee.impl.engines.hf.adapter`.

Three engine-level services:

* `fork(lineage, n)` makes a new lineage holding the first n tokens
  of another without copying them (copy-on-write views; see
  `adapter.share_cache_prefix` for why that is safe), so a restore costs the
  same at any context length.
* A KV budget in bytes (`KVEngine(lm, kv_budget=...)`): lineages that no live
  runtime holds a pin on (`pin`) and that are not current are evicted, least
  recently used first, until the bytes they alone hold fit the budget (the
  rule is :class:`~unsee.impl.engines.lineage.LineageBook`'s, shared by
  every engine; this engine counts a lineage's KV and kept logits). An
  evicted handle stays known (`is_evicted`); the runtime rebuilds what it
  needs by prefill from a checkpoint's manifest (`rebuild`).
* A prefix cache (`with engine.prefix_cache(): ...`): a prefill whose whole
  chunk sequence, tokens and chunk boundaries both, matches a resident
  lineage's is served from that lineage's KV (shared views) instead of
  recomputed. Serving whole chunks of the same chunking keeps the result bit
  for bit equal to computing it. Decoding is never served; the logits a
  decode starts from are kept per lineage so a served chunk can be decoded
  from, and where they were not kept the engine recomputes that one chunk.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar

import torch

from unsee.impl.engines.bounds import get_bound_of
from unsee.impl.engines.computed import ComputedKVBook
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.attention import get_determinism_facts
from unsee.impl.engines.hf.generate import HFTurnLineage
from unsee.impl.engines.hf.lineage import Lineage
from unsee.impl.engines.hf.models import LoadedModel, retain_freed_host_memory
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.lineage import as_int
from unsee.impl.engines.protocol import Determinism
from unsee.impl.engines.turn import Turn, decode_turn


class KVEngine(ComputedKVBook):
    """The transformers implementation of :class:`unsee.impl.engines.protocol.Engine`:
    lineages (string handles -> HF caches) over one :class:`LoadedModel`, with
    the verbs prefill, generate (canonicalised; drafts, probe and lookup where
    a discrepancy bound is measured), fork, excise, drop,
    digest and logits; the KV budget and pins of
    :class:`~unsee.impl.engines.lineage.LineageBook`; and a prefix cache that
    serves whole matching chunks (:meth:`prefix_cache`).

    Every verb names its lineage. Not thread-safe.

    ``kv_budget`` (bytes, or None for no bound) bounds what the engine keeps
    of lineages that are neither pinned (:meth:`~unsee.impl.engines.protocol.KVBudget.pin`) nor current; 0 keeps
    only those. It is enforced when a verb that allocates returns (prefill,
    generate, clone, rebuild) and when a runtime moves its pin. `new_lineage`
    and `fork` allocate no KV, so the handle they return is safe
    until its caller pins or uses it.
    """

    #: what equal digests mean (protocol.Determinism.digest), and the support matrix's words (engines/support.py)
    DIGEST = "kv"
    SUPPORT: ClassVar[dict[str, str]] = {"drafts": "yes where a bound is measured (shipped for the tiny models and SmolLM2 on the CPU, "
                         "or by `unsee calibrate`); off elsewhere",
               "kv_budget": "yes: unpinned lineages' KV, LRU", "store": "yes", "receipts": "yes"}

    def __init__(self, lm: LoadedModel, kv_budget: int | None = None):
        self.lm = lm
        self.counters = Counters()
        self._init_book()
        #: ceiling on |prefill - decode| logits for draft verification, or None:
        #: drafts off (impl/agent/drafts.py; a test may set it, e.g. 0 = no guard), and where
        #: it came from (engines/bounds.py: a shipped measured row, a calibrated file, none)
        self.draft_bound, self.draft_bound_source = get_bound_of(lm)
        #: none: a verification forward is the turn's canonical chunk only when it is the turn's one
        #: forward, so a draft is verified whole (impl/engines/turn.py, ``decode_guarded``)
        self.draft_policy = None
        #: the measured facts of this device, attention and dtype (hf/attention.py's
        #: ATTN_FACTS, docs/engines.md): they pick the canonical chunking
        self.determinism = Determinism(**get_determinism_facts(lm.device, lm.attn, lm.dtype),
                                       statement=lm.determinism, digest=self.DIGEST)
        #: freed KV buffers stay in the process for reuse on the host
        #: (models.retain_freed_host_memory): a restore then costs the same at any length
        self.host_memory_retained = retain_freed_host_memory() if lm.device == "cpu" else False
        self.budget.set(kv_budget)

    # ------------------------------------------------------------ lineages

    def new_lineage(self) -> str:
        """Start an empty cache; it becomes current."""
        handle = self._fresh_handle()
        self._lineages[handle] = Lineage(adapter.new_cache(self.lm.model), [], None)
        self._current = handle
        self._touch(handle)
        return handle

    def fork(self, lineage: str, n_tokens: int | None = None) -> str:
        """A new lineage holding the first ``n_tokens`` (default: all) of
        ``lineage`` without copying them: its cache holds views of the
        source's tensors, and either side's later prefills, crops or drop
        leave the other unchanged (copy-on-write; see
        :func:`adapter.share_cache_prefix`). The logits after the last
        prefill come along only when the whole lineage is shared. The
        source is not changed."""
        src = self._get(lineage)
        length = len(src.tokens)
        n = length if n_tokens is None else self._check_prefix_length("fork", n_tokens, length)
        handle = self._fresh_handle()
        lin = Lineage(adapter.share_cache_prefix(self.lm.model, src.cache, n), src.tokens[:n],
                       src.last_logits if n == length else None)
        lin.copy_history(src, n)
        lin.served_last = src.served_last and n == length
        self._lineages[handle] = lin
        self._touch(handle)
        return handle

    def copy_lineage(self, lineage: str) -> str:
        """A new lineage equal to ``lineage`` whose KV is a copy (cache, tokens,
        last logits), not views of it (:class:`~unsee.impl.engines.protocol.DeepCopy`):
        what a restore cost before ``fork`` shared prefixes (bench/restore.py)."""
        src = self._get(lineage)
        handle = self._fresh_handle()
        logits = None if src.last_logits is None else src.last_logits.clone()
        lin = Lineage(adapter.clone_cache(src.cache), list(src.tokens), logits)
        lin.copy_history(src, len(src.tokens))
        lin.served_last = src.served_last
        self._lineages[handle] = lin
        self._touch(handle)
        self.budget.enforce()
        return handle

    # --------------------------------------------------------------- verbs

    def _generate(
        self,
        max_new_tokens: int,
        stop_ids: Iterable[int] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        draft: Sequence[int] | None = None,
        probe: bool = False,
        lookup: bool = False,
    ) -> list[int]:
        """Decode up to `max_new_tokens` ids on the lineage worked on and commit
        them canonically (as one prefilled chunk). Returns the ids.

        Greedy when temperature == 0; otherwise an exponential race seeded by
        (`seed`, position in the turn) (`decoding.get_scores`), so a run is
        repeatable whatever the device. Stops after a stop id (it is included
        and committed) or at max_new_tokens. stop_ids=None means the model's
        eos_ids; pass () to never stop early.

        With a `draft` (the tokens this turn had before a forget), the draft is
        verified instead of decoded where the decoding rule agrees with it
        stably (impl/agent/drafts.py explains the guard); needs `draft_bound`. The
        result is the same token list either way. After a draft is accepted
        whole its verification chunk *is* the canonical chunk; the logits after
        the turn are then not kept (they came from another matmul shape), so a
        prefill must come before the next generate.

        `probe` (with a draft): before verifying, feed the draft's first token
        as one decode step, exactly as the reference would, and check the
        draft's second token on those logits. A draft wrong there is decoded on
        from the reference's own state, with no verification forward spent on
        it; one right there costs that step (see `Drafts.should_probe`).

        `lookup` (a forget's replay): where the turn is decoded (no draft, or
        after the draft's first disagreement), each decided token is fed
        together with a guess from the lineage's own tokens
        (`decoding.get_lookup`), verified under the same guard; needs
        `draft_bound`. It changes no token, and adds no forward: a guess
        widens the forward that feeds the decided token.
        """
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, draft, lookup)
        lin = self._get_decodable(self._need_current())
        draft = self._check_ids(draft, allow_empty=True)[:max_new_tokens] if draft is not None else []
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        start, header_logits = len(lin.tokens), lin.last_logits
        lin.decode_logits[start] = header_logits  # what a prefix cache needs to serve this position
        turn = Turn(HFTurnLineage(self.lm.model, lin), self.counters, start, header_logits, max_new_tokens, stops,
                    temperature, seed, self.draft_bound)
        try:
            out, committed = decode_turn(turn, draft, probe, lookup)
        except BaseException:
            # Interrupted mid-turn: leave the lineage as it was before the call.
            lin.truncate(start)
            lin.last_logits = header_logits
            raise
        self._commit_turn(lin, start, out, committed)
        return out

    def _commit_turn(self, lin: Lineage, start: int, out: list[int], committed: bool) -> None:
        """Leave the turn ``out`` on ``lin`` as the one chunk a replay redoes."""
        if committed:
            # the verification chunk is the turn's canonical chunk: record it
            # as prefill would, so a prefix cache can serve this lineage later
            lin.record_chunk(start)
            lin.served_last = False
            lin.changed()
            self.budget.enforce()
        elif out:
            # Canonicalise: decode steps (and verification chunks) wrote the turn in
            # other chunks; replace them by one prefill of g_1..g_n, which a replay can redo.
            lin.truncate(start)
            # through the verb, as any prefill: a wrapper of the verbs (bench/timing.py) then
            # sees the canonical chunk as a prefill inside generate
            self.prefill(self._need_current(), out)

    def excise(self, lineage: str, start: int, end: int) -> None:
        """Remove the tokens ``[start, end)`` of a lineage from its cache and
        keep the rest as computed (span-only excision, a baseline of the
        paper's invalidation-boundary ablation; never used by a forget). The
        chunk history is cut at ``start`` and the last logits cleared, as a
        crop does: what follows is no longer a prefill sequence."""
        lin = self._get(lineage)
        length = adapter.cache_length(lin.cache)
        a, b = as_int(start), as_int(end)
        if a is None or b is None or not 0 <= a <= b <= length:
            raise ValueError(f"excise: [{start!r}, {end!r}) is not inside [0, {length}] (the lineage's length)")
        adapter.excise_cache_span(lin.cache, a, b)
        del lin.tokens[a:b]
        lin.last_logits = None
        lin.cut(a)

    def logits(self, lineage: str) -> torch.Tensor | None:
        """The logits after the lineage's last prefill (float32, on the CPU, a
        copy), or None where a crop or a fully accepted draft left none."""
        lin = self._get(lineage)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(lineage, lin)
        return None if lin.last_logits is None else lin.last_logits.detach().to("cpu", torch.float32).clone()

    def digest(self, lineage: str) -> str:
        """sha256 over every layer's key and value tensors (dtype, shape,
        bytes), taken from contiguous CPU copies. Equal digests mean bitwise
        equal KV. Any empty cache has the same digest, however it got empty."""
        lin = self._get(lineage)
        h = hashlib.sha256(b"unsee-kv-v1")
        h.update(f"len={adapter.cache_length(lin.cache)};".encode())
        for i, (k, v) in enumerate(adapter.cache_tensors(lin.cache)):
            for tag, t in (("k", k), ("v", v)):
                if t is None or t.numel() == 0:
                    continue  # an unused layer (fresh cache) or emptied by crop(0)
                t = t.detach().to("cpu").contiguous()
                h.update(f"{i}{tag}:{t.dtype}:{tuple(t.shape)};".encode())
                # view as bytes: works for bfloat16, which numpy cannot hold
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    @contextlib.contextmanager
    def hook_forwards(self, on_forward: Callable[[int, float], None]) -> Iterator[None]:
        """Call ``on_forward(n_tokens, started)`` after every model forward in the block (torch hooks)."""
        model = self.lm.model
        starts: list[float] = []

        def before(module, args, kwargs):
            starts.append(time.perf_counter())

        def after(module, args, kwargs, output):
            ids = kwargs.get("input_ids", args[0] if args else None)
            on_forward(int(ids.shape[-1]) if ids is not None else 0, starts.pop())

        handles = [model.register_forward_pre_hook(before, with_kwargs=True),
                   model.register_forward_hook(after, with_kwargs=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    # ------------------------------------------------------------ memory

    def _lineage_storages(self, handle: str) -> dict:
        """KV and kept logits (see :meth:`Lineage.storages`); the budget counts the same."""
        return self._lineages[handle].storages()

    # ------------------------------------------------- the skeleton's steps

    def _forward(self, handle: str, lin: Lineage, ids: list[int]) -> torch.Tensor:
        logits = adapter.forward_last_logits(self.lm.model, ids, lin.cache)
        lin.tokens.extend(ids)
        return logits

    def _truncate_to(self, handle: str, lin: Lineage, n: int) -> None:
        lin.truncate(n)

    def _take_rows(self, handle: str, lin: Lineage, src_handle: str, src: Lineage, n: int) -> None:
        lin.cache = adapter.share_cache_prefix(self.lm.model, src.cache, n)
