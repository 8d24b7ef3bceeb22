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
it crops. Handles are never reused, even after `drop`. The verbs are the
lineage book's (:class:`~unsee.impl.engines.book.LineageBook`), written once
for every engine; a lineage's cache and chunk history, and what the book
asks of them, are :mod:`unsee.impl.engines.hf.kv`; one `generate` turn
(drafts, probe, lookup) is :mod:`unsee.impl.engines.turn`; every
transformers call goes through :mod:`unsee.impl.engines.hf.adapter`.

Three engine-level services:

* `fork(lineage, n)` makes a new lineage holding the first n tokens
  of another without copying them (copy-on-write views; see
  `adapter.share_cache_prefix` for why that is safe), so a restore costs the
  same at any context length.
* A KV budget in bytes (`KVEngine(lm, kv_budget=...)`): lineages that no live
  runtime holds a pin on (`budget.pin`) and that are not the spared one (the
  one the last prefill, generate or new_lineage named) are evicted, least
  recently used first, until the bytes they alone hold fit the budget (the
  rule is :class:`~unsee.impl.engines.lineage.Budget`'s, shared by
  every engine; this engine counts a lineage's KV and kept logits). An
  evicted handle stays known (`budget.is_evicted`); the runtime rebuilds what it
  needs by prefill from a checkpoint's manifest (`lineage.rebuild`).
* A prefix cache (`with engine.prefix_cache(): ...`): a prefill whose whole
  chunk sequence, tokens and chunk boundaries both, matches a resident
  lineage's is served from that lineage's KV (shared views) instead of
  recomputed. Serving whole chunks of the same chunking keeps the result bit
  for bit equal to computing it. Decoding is never served; the logits a
  decode starts from are kept per lineage so a served chunk can be decoded
  from, and where they were not kept the engine recomputes that one chunk.
"""

from __future__ import annotations

from typing import ClassVar

from unsee.impl.engines.book import LineageBook
from unsee.impl.engines.bounds import get_bound_of
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.attention import get_determinism_facts
from unsee.impl.engines.hf.kv import HFKV, Lineage
from unsee.impl.engines.hf.models import LoadedModel, retain_freed_host_memory
from unsee.impl.engines.lineage import as_int
from unsee.impl.engines.protocol import Determinism


class KVEngine(LineageBook):
    """The transformers implementation of :class:`unsee.impl.engines.protocol.Engine`:
    lineages (string handles -> HF caches) over one :class:`LoadedModel`, with
    the verbs prefill, generate (canonicalised; drafts, probe and lookup where
    a discrepancy bound is measured), fork, excise, drop,
    digest and logits, all :class:`~unsee.impl.engines.book.LineageBook`'s
    over :class:`~unsee.impl.engines.hf.kv.HFKV`; the KV budget and pins
    (``budget``); a prefix cache that serves whole matching chunks
    (:meth:`prefix_cache`); and a lineage's deep copy (:meth:`copy_lineage`).

    Every verb names its lineage. Not thread-safe.

    ``kv_budget`` (bytes, or None for no bound) bounds what the engine keeps
    of lineages that are neither pinned (``budget.pin``) nor the one the last
    prefill, generate or new_lineage named; 0 keeps only those. It is enforced
    when a verb that allocates returns (prefill, generate, fork, copy_lineage,
    rebuild) and when a runtime moves its pin. A fork shares its source's
    tensors, so it adds no bytes of its own until it is extended.
    """

    #: what equal digests mean (protocol.Determinism.digest), and the support matrix's words (engines/support.py)
    DIGEST = "kv"
    SUPPORT: ClassVar[dict[str, str]] = {"drafts": "yes where a bound is measured (shipped for the tiny models and SmolLM2 on the CPU, "
                         "or by `unsee calibrate`); off elsewhere",
               "kv_budget": "yes: unpinned lineages' KV, LRU", "store": "yes", "receipts": "yes"}

    def __init__(self, lm: LoadedModel, kv_budget: int | None = None):
        self.lm = lm
        super().__init__(HFKV(lm.model))
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
                                       statement=lm.determinism_statement, digest=self.DIGEST)
        #: freed KV buffers stay in the process for reuse on the host
        #: (models.retain_freed_host_memory): a restore then costs the same at any length
        self.host_memory_retained = retain_freed_host_memory() if lm.device == "cpu" else False
        self.budget.set(kv_budget)

    def copy_lineage(self, lineage: str) -> str:
        """A new lineage equal to ``lineage`` whose KV is a copy (cache, tokens,
        last logits), not views of it (:class:`~unsee.impl.engines.protocol.DeepCopy`):
        what a restore cost before ``fork`` shared prefixes (bench/restore.py)."""
        src = self._use(lineage)
        handle = self._fresh_handle()
        lin = Lineage(adapter.clone_cache(src.cache), list(src.tokens), None)
        lin.inherit(src, len(src.tokens))
        lin.last_logits = None if src.last_logits is None else src.last_logits.clone()
        self._lineages[handle] = lin
        self._touch(handle)
        self.budget.enforce()
        return handle

    def excise(self, lineage: str, start: int, end: int) -> None:
        """Remove the tokens ``[start, end)`` of a lineage from its cache and
        keep the rest as computed (span-only excision, a baseline of the
        paper's invalidation-boundary ablation; never used by a forget). The
        chunk history is cut at ``start`` and the last logits cleared, as a
        crop does: what follows is no longer a prefill sequence."""
        lin = self._use(lineage)
        length = adapter.cache_length(lin.cache)
        a, b = as_int(start), as_int(end)
        if a is None or b is None or not 0 <= a <= b <= length:
            raise ValueError(f"excise: [{start!r}, {end!r}) is not inside [0, {length}] (the lineage's length)")
        adapter.excise_cache_span(lin.cache, a, b)
        del lin.tokens[a:b]
        lin.last_logits = None
        lin.cut(a)

