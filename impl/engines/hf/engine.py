"""KVEngine: a few verbs over a model's KV caches.

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
it crops. Handles are never reused, even after `drop`.

Three engine-level services (issue 8):

* `share_prefix(lineage, n)` makes a new lineage holding the first n tokens
  of another without copying them (copy-on-write views; see
  `adapter.share_cache_prefix` for why that is safe), so a restore costs the
  same at any context length.
* A KV budget in bytes (`KVEngine(lm, kv_budget=...)`): lineages that no live
  runtime holds a pin on (`pin`) and that are not current are evicted, least
  recently used first, until the bytes they alone hold fit the budget. An
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
import weakref
from typing import Iterable, Iterator, Sequence

import torch

from unsee.impl.engines.decoding import get_draft_bound, get_lookup, get_scores, get_threshold, pick
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.models import LoadedModel, retain_freed_host_memory
from unsee.impl.engines.lineage import Counters, LineageBook, as_int
from unsee.impl.engines.protocol import Determinism


class _Lineage:
    """One cache plus what we know about it."""

    __slots__ = ("cache", "tokens", "last_logits", "chunk_ends", "chunked", "decode_logits", "served_last",
                 "last_used", "_storages")

    def __init__(self, cache, tokens: list[int], last_logits: torch.Tensor | None):
        self.cache = cache
        self.tokens = tokens  # the ids the cache holds, in order
        self.last_logits = last_logits  # logits after the last prefill, or None
        # The prefill chunks that built the cache, as cumulative end offsets.
        # `chunked` is False once a crop cut a chunk: the tail then is no
        # longer a chunk sequence, and later chunks are not recorded.
        self.chunk_ends: list[int] = []
        self.chunked = True
        # position -> the logits a decode started from there (what a served
        # chunk needs to be decoded from; see KVEngine.prefix_cache)
        self.decode_logits: dict[int, torch.Tensor] = {}
        self.served_last = False  # the last chunk was served without its logits
        self.last_used = 0  # the engine's clock at the last access (LRU eviction)
        self._storages: tuple | None = None  # (weakref, key, storages): see storages()

    def copy_history(self, src: "_Lineage", n: int) -> None:
        """Take ``src``'s chunk history and decode logits up to ``n`` tokens."""
        self.chunk_ends = [e for e in src.chunk_ends if e <= n]
        self.chunked = src.chunked and n == (self.chunk_ends[-1] if self.chunk_ends else 0)
        self.decode_logits = {p: t for p, t in src.decode_logits.items() if p <= n}

    def cut(self, n: int) -> None:
        """Forget the chunk history beyond ``n`` tokens (a crop to ``n``)."""
        ends = [e for e in self.chunk_ends if e <= n]
        if n != (ends[-1] if ends else 0):
            self.chunked = False
        self.chunk_ends = ends
        self.decode_logits = {p: t for p, t in self.decode_logits.items() if p <= n}
        self.served_last = False
        self._storages = None

    def storages(self) -> dict:
        """Distinct storages held (KV and kept logits): ``{(device, address): bytes}``.

        Cached, keyed on the identity of the first layer's key tensor: every
        change to a cache (a prefill, a decode step, a crop) replaces every
        layer's tensors, so the same tensor object means the same storages."""
        first = next(iter(adapter.cache_tensors(self.cache)), (None, None))[0]
        key = (len(self.tokens), len(self.decode_logits), id(self.last_logits))
        if self._storages is not None:
            ref, old_key, out = self._storages
            if old_key == key and ref is not None and ref() is first:
                return out
        out = adapter.cache_storages(self.cache)
        for t in list(self.decode_logits.values()) + [self.last_logits]:
            if t is not None:
                adapter.add_storage(out, t)
        self._storages = (weakref.ref(first) if first is not None else None, key, out)
        return out


class KVEngine(LineageBook):
    """Lineages (string handles -> caches) over one LoadedModel: the
    transformers implementation of :class:`unsee.impl.engines.protocol.Engine`.

    Verbs act on the current lineage unless one is named. Not thread-safe.

    ``kv_budget`` (bytes, or None for no bound) bounds what the engine keeps
    of lineages that are neither pinned (:meth:`pin`) nor current; 0 keeps
    only those. It is enforced when a verb that allocates returns (prefill,
    generate, clone, rebuild) and when a runtime moves its pin. `new_lineage`
    and `share_prefix` allocate no KV, so the handle they return is safe
    until its caller pins or uses it.
    """

    def __init__(self, lm: LoadedModel, kv_budget: int | None = None):
        self.lm = lm
        self.counters = Counters()
        self._init_book()
        #: ceiling on |prefill - decode| logits for draft verification, or None:
        #: drafts off (impl/agent/drafts.py; a test may set it, e.g. 0 = no guard)
        self.draft_bound = get_draft_bound(lm.name, lm.device, lm.dtype)
        #: measured in tests/test_kv_engine.py and docs/engines.md: a crop
        #: keeps the tensors' first n rows, so continuing equals a fresh
        #: prefill; other chunkings, decode steps and thread counts may differ
        self.determinism = Determinism(same_chunking_repeats=True, crop_continue_is_fresh=True,
                                       chunk_invariant=False, decode_is_prefill=False, thread_invariant=False,
                                       statement=lm.determinism)
        #: freed KV buffers stay in the process for reuse on the host
        #: (models.retain_freed_host_memory): a restore then costs the same at any length
        self.host_memory_retained = retain_freed_host_memory() if lm.device == "cpu" else False
        self._serving = False  # inside `prefix_cache()`
        self._cache_sources: tuple[set[str], int] | None = None  # (handles, first new id); None: all
        self.set_kv_budget(kv_budget)

    # ------------------------------------------------------------ lineages

    def new_lineage(self) -> str:
        """Start an empty cache; it becomes current."""
        handle = self._fresh_handle()
        self._lineages[handle] = _Lineage(adapter.new_cache(self.lm.model), [], None)
        self._current = handle
        self._touch(handle)
        return handle

    def share_prefix(self, lineage: str | None = None, n_tokens: int | None = None) -> str:
        """A new lineage holding the first ``n_tokens`` (default: all) of
        ``lineage`` without copying them: its cache holds views of the
        source's tensors, and either side's later prefills, crops or drop
        leave the other unchanged (copy-on-write; see
        :func:`adapter.share_cache_prefix`). The logits after the last
        prefill come along only when the whole lineage is shared. The
        current lineage is not changed."""
        src = self._get(lineage)
        length = len(src.tokens)
        n = length if n_tokens is None else self._check_prefix_length("share_prefix", n_tokens, length)
        handle = self._fresh_handle()
        lin = _Lineage(adapter.share_cache_prefix(self.lm.model, src.cache, n), src.tokens[:n],
                       src.last_logits if n == length else None)
        lin.copy_history(src, n)
        lin.served_last = src.served_last and n == length
        self._lineages[handle] = lin
        self._touch(handle)
        return handle

    def clone(self, lineage: str | None = None) -> str:
        """Deep copy (cache, tokens, last logits) as a new lineage, e.g. for a
        baseline branching from the same base state. The current lineage is
        not changed; `use` the clone to work on it."""
        src = self._get(lineage)
        handle = self._fresh_handle()
        logits = None if src.last_logits is None else src.last_logits.clone()
        lin = _Lineage(adapter.clone_cache(src.cache), list(src.tokens), logits)
        lin.copy_history(src, len(src.tokens))
        lin.served_last = src.served_last
        self._lineages[handle] = lin
        self._touch(handle)
        self.enforce_budget()
        return handle

    def length(self, lineage: str | None = None) -> int:
        return adapter.cache_length(self._get(lineage).cache)

    # --------------------------------------------------------------- verbs

    def prefill(self, token_ids: Iterable[int]) -> None:
        """Exactly one forward over `token_ids` on the current lineage."""
        lin = self._get(None)
        ids = self._check_ids(token_ids)
        if self._serving and self._serve(lin, ids):
            self.counters.reused_tokens += len(ids)
        else:
            start = len(lin.tokens)
            lin.last_logits = adapter.forward_last_logits(self.lm.model, ids, lin.cache)
            lin.tokens.extend(ids)
            # Record the chunk only on an unbroken record: tokens that some
            # other path appended unrecorded make the lineage unservable
            # from there on, never wrongly served.
            if lin.chunked and start == (lin.chunk_ends[-1] if lin.chunk_ends else 0):
                lin.chunk_ends.append(len(lin.tokens))
            else:
                lin.chunked = False
            lin.served_last = False
            self.counters.forward_calls += 1
            self.counters.prefilled_tokens += len(ids)
        lin._storages = None
        self.enforce_budget()

    def generate(
        self,
        max_new_tokens: int,
        stop_ids: Iterable[int] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        draft: Sequence[int] | None = None,
        probe: bool = False,
        lookup: bool = False,
    ) -> list[int]:
        """Decode up to `max_new_tokens` ids on the current lineage and commit
        them canonically (as one prefilled chunk). Returns the ids.

        Greedy when temperature == 0; otherwise an exponential race seeded by
        (`seed`, position in the turn) (`drafts.get_scores`), so a run is
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
        (`drafts.get_lookup`), verified under the same guard; needs
        `draft_bound`. It changes no token, and adds no forward: a guess
        widens the forward that feeds the decided token.
        """
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, draft, lookup)
        handle = self._need_current()
        lin = self._lineages[handle]
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(lin)  # a served chunk whose logits were not kept
        if lin.last_logits is None:
            raise RuntimeError(
                f"generate on lineage {handle!r}: no logits to continue from; "
                "prefill first (a new lineage or a crop has none)"
            )
        draft = self._check_ids(draft, allow_empty=True)[:max_new_tokens] if draft is not None else []
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        start, header_logits = len(lin.tokens), lin.last_logits
        lin.decode_logits[start] = header_logits  # what a prefix cache needs to serve this position
        try:
            out, committed = None, False
            if draft and pick(get_scores(header_logits, temperature, seed, 0))[0] != draft[0]:
                # The first decision is taken on the header's own logits, the
                # reference's: a draft wrong there is known wrong without
                # prefilling it, and decoding from here *is* the reference.
                self._count_draft(len(draft), 0, fallback=False)
                draft = []
            if draft:
                out, committed = self._decode_with_draft(lin, draft, max_new_tokens, stops, temperature, seed,
                                                         probe, lookup)
            elif lookup:
                # decided on the header's own logits until the first guess; guarded from there
                out = self._decode(lin, [], header_logits, 0, max_new_tokens, stops, temperature, seed, None,
                                   lookup=True)
                self.counters.draft_fallbacks += int(out is None)
            if out is None:  # no draft or lookup, or an unstable decision: the reference procedure
                self._truncate(lin, start)
                lin.last_logits = header_logits
                out = self._decode(lin, [], header_logits, 0, max_new_tokens, stops, temperature, seed, None)
        except BaseException:
            # Interrupted mid-turn: leave the lineage as it was before the call.
            self._truncate(lin, start)
            lin.last_logits = header_logits
            raise
        if committed:
            # the verification chunk is the turn's canonical chunk: record it
            # as prefill would, so a prefix cache can serve this lineage later
            if lin.chunked and start == (lin.chunk_ends[-1] if lin.chunk_ends else 0):
                lin.chunk_ends.append(len(lin.tokens))
            else:
                lin.chunked = False
            lin.served_last = False
            lin._storages = None
            self.enforce_budget()
        if committed or not out:
            return out
        # Canonicalise: decode steps (and verification chunks) wrote the turn in
        # other chunks; replace them by one prefill of g_1..g_n, which a replay can redo.
        self._truncate(lin, start)
        self.prefill(out)
        return out

    def _decode(self, lin: _Lineage, out: list[int], logits: torch.Tensor, position: int, max_new_tokens: int,
                stops: set[int], temperature: float, seed: int | None, threshold: float | None,
                lookup: bool = False) -> list[int] | None:
        """Decode one token at a time from `logits` at `position` of the turn.
        With a threshold (decoding on KV a verification prefill built), a
        decision whose margin does not clear it returns None: unstable.

        With `lookup`, a decided token is fed together with a guess at what
        follows it (`drafts.get_lookup` over the lineage's tokens) in one
        forward, and the guess's longest stable agreeing prefix is accepted;
        the first disagreement is decided on that forward's logits. From the
        first such forward on the KV is not the reference's, so every later
        decision of the turn is guarded."""
        while len(out) < max_new_tokens:
            tok, margin = pick(get_scores(logits, temperature, seed, position))
            if threshold is not None and margin <= threshold:
                return None
            out.append(tok)
            position += 1
            self.counters.decoded_tokens += 1
            if tok in stops or len(out) == max_new_tokens:
                break  # the last token is not fed: the canonical prefill does it
            lin.tokens.append(tok)  # fed just below, alone or with a guess
            guess = get_lookup(lin.tokens, max_new_tokens - len(out)) if lookup else []
            ends = [i for i, g in enumerate(guess) if g in stops]
            if ends:  # a guess that ends the turn needs nothing after its stop id
                del guess[ends[0] + 1:]
            if not guess:
                logits = adapter.forward_last_logits(self.lm.model, [tok], lin.cache)
                self.counters.forward_calls += 1
                continue
            threshold = get_threshold(self.draft_bound, temperature)
            fed = len(lin.tokens)  # the lineage's length with `tok` fed
            verify = adapter.forward_all_logits(self.lm.model, [tok] + guess, lin.cache)
            lin.tokens.extend(guess)
            self.counters.forward_calls += 1
            self.counters.lookup_forwards += 1
            self.counters.prefilled_tokens += len(guess)
            accepted = 0
            for proposed, row in zip(guess, verify):
                guessed, margin = pick(get_scores(row, temperature, seed, position))
                if margin <= threshold:
                    self._count_lookup(len(guess), 0)
                    return None
                if guessed != proposed:
                    break  # decided on these logits at the top of the loop
                out.append(guessed)
                position += 1
                accepted += 1
                if guessed in stops or len(out) == max_new_tokens:
                    break
            self._count_lookup(len(guess), accepted)
            if out[-1] in stops or len(out) == max_new_tokens:
                break  # the canonical prefill replaces what the verification fed
            self._truncate(lin, fed + accepted)
            logits = verify[accepted]
        return out

    def _count_lookup(self, offered: int, accepted: int) -> None:
        self.counters.lookup_accepted_tokens += accepted
        self.counters.lookup_rejected_tokens += offered - accepted

    def _decode_with_draft(self, lin: _Lineage, draft: list[int], max_new_tokens: int, stops: set[int],
                           temperature: float, seed: int | None, probe: bool = False,
                           lookup: bool = False) -> tuple[list[int] | None, bool]:
        """Verify `draft` with one forward; accept its longest stable agreeing
        prefix, then decode on. Returns (tokens, committed): tokens None means
        an unstable decision (the caller falls back to the reference);
        committed means the verification chunk is the turn's canonical chunk.
        The caller has checked the draft's first token on the header logits."""
        start, header_logits = len(lin.tokens), lin.last_logits
        threshold = get_threshold(self.draft_bound, temperature)
        probed = None  # the reference's own logits at position 1, when probed
        if probe and len(draft) >= 2 and draft[0] not in stops and max_new_tokens >= 2:
            probed = adapter.forward_last_logits(self.lm.model, [draft[0]], lin.cache)
            lin.tokens.append(draft[0])
            self.counters.forward_calls += 1
            self.counters.draft_probes += 1
            if pick(get_scores(probed, temperature, seed, 1))[0] != draft[1]:
                # Wrong at position 1, decided on the reference's own logits on
                # the reference's own KV (header prefill + one decode step): the
                # rest of the turn is the reference's decode, with no guard
                # until a context guess (lookup) is fed.
                out = self._decode(lin, [draft[0]], probed, 1, max_new_tokens, stops, temperature, seed, None,
                                   lookup)
                self._count_draft(len(draft), 1 if out is not None else 0, fallback=out is None)
                return out, False
            # Right there: the verification forward below recomputes position 0
            # as part of the turn's chunk (a canonical chunk must be one forward).
            self._truncate(lin, start)
        verify = adapter.forward_all_logits(self.lm.model, draft, lin.cache)
        lin.tokens.extend(draft)
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(draft)
        out: list[int] = []
        stable = True
        for k, proposed in enumerate(draft):
            # position 0 is decided on the header's own logits, exactly as the
            # reference decides it (and position 1 on the probe's, when probed);
            # later ones on verification logits (guarded)
            exact = k == 0 or (k == 1 and probed is not None)
            logits = header_logits if k == 0 else probed if exact else verify[k - 1]
            tok, margin = pick(get_scores(logits, temperature, seed, k))
            if not exact and margin <= threshold:
                stable = False
                break
            if tok != proposed:
                break
            out.append(tok)
            if tok in stops or len(out) == max_new_tokens:
                break
        accepted = len(out)
        done = bool(out) and (out[-1] in stops or len(out) == max_new_tokens)
        result: list[int] | None = out
        if stable and done and accepted == len(draft):
            lin.last_logits = None  # see generate: not the canonical chunk's logits
            self._count_draft(len(draft), accepted, fallback=False)
            return out, True
        if stable and not done:
            # Resume at the first disagreement (or after a draft that ended
            # early) on the KV of the accepted prefix. With nothing accepted the
            # KV is the header's alone: decoding from it *is* the reference, so
            # no guard is needed there.
            self._truncate(lin, start + accepted)
            logits = header_logits if accepted == 0 else verify[accepted - 1]
            result = self._decode(lin, out, logits, accepted, max_new_tokens, stops, temperature, seed,
                                  None if accepted == 0 else threshold, lookup)
        self._count_draft(len(draft), accepted if stable and result is not None else 0,
                          fallback=not stable or result is None)
        return (result if stable else None), False

    def _count_draft(self, offered: int, accepted: int, fallback: bool) -> None:
        self.counters.draft_accepted_tokens += accepted
        self.counters.draft_rejected_tokens += offered - accepted
        self.counters.draft_fallbacks += int(fallback)

    def _truncate(self, lin: _Lineage, n: int) -> None:
        adapter.crop_cache(lin.cache, n)
        del lin.tokens[n:]

    def crop(self, n_tokens: int, lineage: str | None = None) -> None:
        """Keep the first n_tokens of a lineage. Clears its last logits: they
        belonged to the removed suffix, so a prefill must come next."""
        lin = self._get(lineage)
        length = adapter.cache_length(lin.cache)
        n_tokens = self._check_prefix_length("crop", n_tokens, length)
        adapter.crop_cache(lin.cache, n_tokens)
        del lin.tokens[n_tokens:]
        lin.last_logits = None
        lin.cut(n_tokens)

    def excise(self, start: int, end: int, lineage: str | None = None) -> None:
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

    def logits(self, lineage: str | None = None) -> torch.Tensor | None:
        """The logits after the lineage's last prefill (float32, on the CPU, a
        copy), or None where a crop or a fully accepted draft left none."""
        lin = self._get(lineage)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(lin)
        return None if lin.last_logits is None else lin.last_logits.detach().to("cpu", torch.float32).clone()

    def digest(self, lineage: str | None = None) -> str:
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

    # ------------------------------------------------------------ memory

    def _lineage_storages(self, handle: str) -> dict:
        """KV and kept logits (see :meth:`Lineage.storages`); the budget counts the same."""
        return self._lineages[handle].storages()

    # --------------------------------------------------------- prefix cache

    @contextlib.contextmanager
    def prefix_cache(self, sources: Iterable[str] | None = None) -> Iterator["KVEngine"]:
        """Serve prefills inside the block from a prefix cache (B5').

        The cache holds the lineages ``sources`` (default: every resident
        one) and every lineage created inside the block, as a serving
        engine caches what it computes. A prefill of chunk ``c`` on a
        lineage whose chunks so far are ``c_1..c_k`` is served by another
        cached lineage whose first ``k + 1`` chunks are ``c_1..c_k, c``,
        token ids and boundaries both: the lineage then holds views of that
        lineage's KV (nothing is computed; ``reused_tokens`` counts it).
        Whole chunks of the same chunking only, so the KV is the one a
        prefill would compute, bit for bit (the engine's same-chunking
        identity). Evicted sources are simply not in the cache."""
        previous = self._serving, self._cache_sources
        self._serving = True
        self._cache_sources = None if sources is None else ({h for h in sources if h in self._lineages},
                                                             self._next_id)
        try:
            yield self
        finally:
            self._serving, self._cache_sources = previous

    def _serve(self, lin: _Lineage, ids: list[int]) -> bool:
        """Serve chunk ``ids`` on ``lin`` from another lineage; False if none has it."""
        start = len(lin.tokens)
        if not lin.chunked or start != (lin.chunk_ends[-1] if lin.chunk_ends else 0):
            return False  # the lineage is not a chunk sequence: nothing can match it
        end, k = start + len(ids), len(lin.chunk_ends)
        found = None
        for handle, src in self._lineages.items():
            if not self._in_cache(handle):
                continue
            if (src is lin or len(src.chunk_ends) <= k or src.chunk_ends[k] != end
                    or src.chunk_ends[:k] != lin.chunk_ends or src.tokens[start:end] != ids
                    or src.tokens[:start] != lin.tokens):
                continue
            # Logits are only kept where a decode started (or after a
            # lineage's last prefill); prefer a source that has them. Without
            # them the next verb is usually a prefill, which needs none, and
            # a generate recomputes this one chunk.
            logits = src.decode_logits.get(end)
            if logits is None and len(src.tokens) == end:
                logits = src.last_logits
            if found is None or logits is not None:
                found = (handle, src, logits)
            if logits is not None:
                break
        if found is None:
            return False
        handle, src, logits = found
        lin.cache = adapter.share_cache_prefix(self.lm.model, src.cache, end)
        lin.tokens.extend(ids)
        lin.chunk_ends.append(end)
        lin.decode_logits.update({q: t for q, t in src.decode_logits.items() if start < q <= end})
        lin.last_logits = logits
        lin.served_last = logits is None
        self._touch(handle)
        return True

    def _in_cache(self, handle: str) -> bool:
        """Whether the active prefix cache holds ``handle`` (see `prefix_cache`)."""
        if self._cache_sources is None:
            return True
        cached, first_new = self._cache_sources
        return handle in cached or int(handle[1:]) >= first_new  # handles are "L<n>", n increasing

    def _recompute_served_chunk(self, lin: _Lineage) -> None:
        """Compute the last (served) chunk for real, for the logits a decode needs."""
        end = lin.chunk_ends.pop()
        start = lin.chunk_ends[-1] if lin.chunk_ends else 0
        ids = lin.tokens[start:end]
        adapter.crop_cache(lin.cache, start)
        del lin.tokens[start:]
        lin.decode_logits = {p: t for p, t in lin.decode_logits.items() if p <= start}
        lin.served_last = False
        self.counters.reused_tokens -= len(ids)  # it was not reused after all
        lin.last_logits = adapter.forward_last_logits(self.lm.model, ids, lin.cache)
        lin.tokens.extend(ids)
        lin.chunk_ends.append(end)
        lin._storages = None
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)
