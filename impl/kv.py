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
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, fields, replace
from typing import Iterable, Sequence

import torch

from unsee.impl import adapter
from unsee.impl.drafts import get_draft_bound, get_scores, get_threshold, pick
from unsee.impl.models import LoadedModel


@dataclass
class Counters:
    """Work done by an engine, for measuring a span:

        before = engine.counters.snapshot(); ...; spent = engine.counters - before

    forward_calls          model forwards (a prefill chunk or a decode step is one)
    prefilled_tokens       tokens fed by prefill forwards, canonicalisation and
                           draft verification included
    decoded_tokens         tokens the decoding rule produced (n tokens need n-1
                           decode forwards: the last one is never fed back one
                           by one); draft tokens accepted are not counted here
    draft_accepted_tokens  draft tokens verified and kept (impl/drafts.py)
    draft_rejected_tokens  draft tokens verified and thrown away
    draft_fallbacks        turns re-decoded from the header at an unstable decision
    """

    forward_calls: int = 0
    prefilled_tokens: int = 0
    decoded_tokens: int = 0
    draft_accepted_tokens: int = 0
    draft_rejected_tokens: int = 0
    draft_fallbacks: int = 0

    def snapshot(self) -> "Counters":
        return replace(self)

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def since(self, earlier: "Counters") -> "Counters":
        return self - earlier


def _as_int(x) -> int | None:
    """x as an int if it is an integer (numpy ints too, not bools or floats)."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


class _Lineage:
    """One cache plus what we know about it."""

    __slots__ = ("cache", "tokens", "last_logits")

    def __init__(self, cache, tokens: list[int], last_logits: torch.Tensor | None):
        self.cache = cache
        self.tokens = tokens  # the ids the cache holds, in order
        self.last_logits = last_logits  # logits after the last prefill, or None


class KVEngine:
    """Lineages (string handles -> caches) over one LoadedModel.

    Verbs act on the current lineage unless one is named. Not thread-safe.
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.counters = Counters()
        self._lineages: dict[str, _Lineage] = {}
        self._current: str | None = None
        self._next_id = 0
        #: ceiling on |prefill - decode| logits for draft verification, or None:
        #: drafts off (impl/drafts.py; a test may set it, e.g. 0 = no guard)
        self.draft_bound = get_draft_bound(lm.name, lm.device, lm.dtype)

    # ------------------------------------------------------------ lineages

    def new_lineage(self) -> str:
        """Start an empty cache; it becomes current."""
        handle = self._fresh_handle()
        self._lineages[handle] = _Lineage(adapter.new_cache(self.lm.model), [], None)
        self._current = handle
        return handle

    @property
    def current(self) -> str | None:
        return self._current

    @property
    def lineages(self) -> tuple[str, ...]:
        return tuple(self._lineages)

    def use(self, lineage: str) -> None:
        self._get(lineage)
        self._current = lineage

    def clone(self, lineage: str | None = None) -> str:
        """Deep copy (cache, tokens, last logits) as a new lineage, e.g. for a
        baseline branching from the same base state. The current lineage is
        not changed; `use` the clone to work on it."""
        src = self._get(lineage)
        handle = self._fresh_handle()
        logits = None if src.last_logits is None else src.last_logits.clone()
        self._lineages[handle] = _Lineage(adapter.clone_cache(src.cache), list(src.tokens), logits)
        return handle

    def drop(self, lineage: str) -> None:
        """Free a lineage's cache. Dropping the current one leaves none current."""
        self._get(lineage)
        del self._lineages[lineage]
        if self._current == lineage:
            self._current = None

    def length(self, lineage: str | None = None) -> int:
        return adapter.cache_length(self._get(lineage).cache)

    def tokens(self, lineage: str | None = None) -> list[int]:
        """The token ids the lineage's cache holds (a copy)."""
        return list(self._get(lineage).tokens)

    # --------------------------------------------------------------- verbs

    def prefill(self, token_ids: Iterable[int]) -> None:
        """Exactly one forward over `token_ids` on the current lineage."""
        lin = self._get(None)
        ids = self._check_ids(token_ids)
        lin.last_logits = adapter.forward_last_logits(self.lm.model, ids, lin.cache)
        lin.tokens.extend(ids)
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)

    def generate(
        self,
        max_new_tokens: int,
        stop_ids: Iterable[int] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        draft: Sequence[int] | None = None,
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
        stably (impl/drafts.py explains the guard); needs `draft_bound`. The
        result is the same token list either way. After a draft is accepted
        whole its verification chunk *is* the canonical chunk; the logits after
        the turn are then not kept (they came from another matmul shape), so a
        prefill must come before the next generate.
        """
        if _as_int(max_new_tokens) is None or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
        max_new_tokens = int(max_new_tokens)
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} must be >= 0")
        if temperature > 0 and seed is None:
            raise ValueError(f"temperature={temperature!r} > 0 needs a seed for repeatable sampling")
        if draft is not None and self.draft_bound is None:
            raise ValueError(f"generate: a draft needs a measured discrepancy bound, and none is known for "
                             f"{self.lm.name} on {self.lm.device} {self.lm.dtype} (drafts are off there)")
        handle = self._need_current()
        lin = self._lineages[handle]
        if lin.last_logits is None:
            raise RuntimeError(
                f"generate on lineage {handle!r}: no logits to continue from; "
                "prefill first (a new lineage or a crop has none)"
            )
        draft = self._check_ids(draft, allow_empty=True)[:max_new_tokens] if draft is not None else []
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        start, header_logits = len(lin.tokens), lin.last_logits
        try:
            out, committed = None, False
            if draft:
                out, committed = self._decode_with_draft(lin, draft, max_new_tokens, stops, temperature, seed)
            if out is None:  # no draft, or an unstable decision: the reference procedure
                self._truncate(lin, start)
                lin.last_logits = header_logits
                out = self._decode(lin, [], header_logits, 0, max_new_tokens, stops, temperature, seed, None)
        except BaseException:
            # Interrupted mid-turn: leave the lineage as it was before the call.
            self._truncate(lin, start)
            lin.last_logits = header_logits
            raise
        if committed or not out:
            return out
        # Canonicalise: decode steps (and verification chunks) wrote the turn in
        # other chunks; replace them by one prefill of g_1..g_n, which a replay can redo.
        self._truncate(lin, start)
        self.prefill(out)
        return out

    def _decode(self, lin: _Lineage, out: list[int], logits: torch.Tensor, position: int, max_new_tokens: int,
                stops: set[int], temperature: float, seed: int | None, threshold: float | None) -> list[int] | None:
        """Decode one token at a time from `logits` at `position` of the turn.
        With a threshold (decoding on KV a verification prefill built), a
        decision whose margin does not clear it returns None: unstable."""
        while len(out) < max_new_tokens:
            tok, margin = pick(get_scores(logits, temperature, seed, position))
            if threshold is not None and margin <= threshold:
                return None
            out.append(tok)
            position += 1
            self.counters.decoded_tokens += 1
            if tok in stops or len(out) == max_new_tokens:
                break  # the last token is not fed: the canonical prefill does it
            logits = adapter.forward_last_logits(self.lm.model, [tok], lin.cache)
            lin.tokens.append(tok)
            self.counters.forward_calls += 1
        return out

    def _decode_with_draft(self, lin: _Lineage, draft: list[int], max_new_tokens: int, stops: set[int],
                           temperature: float, seed: int | None) -> tuple[list[int] | None, bool]:
        """Verify `draft` with one forward; accept its longest stable agreeing
        prefix, then decode on. Returns (tokens, committed): tokens None means
        an unstable decision (the caller falls back to the reference);
        committed means the verification chunk is the turn's canonical chunk."""
        start, header_logits = len(lin.tokens), lin.last_logits
        threshold = get_threshold(self.draft_bound, temperature)
        verify = adapter.forward_all_logits(self.lm.model, draft, lin.cache)
        lin.tokens.extend(draft)
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(draft)
        out: list[int] = []
        stable = True
        for k, proposed in enumerate(draft):
            # position 0 is decided on the header's own logits, exactly as the
            # reference decides it; later ones on verification logits (guarded)
            logits = header_logits if k == 0 else verify[k - 1]
            tok, margin = pick(get_scores(logits, temperature, seed, k))
            if k > 0 and margin <= threshold:
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
                                  None if accepted == 0 else threshold)
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
        n = _as_int(n_tokens)
        if n is None or not 0 <= n <= length:
            raise ValueError(f"crop: n_tokens={n_tokens!r} is outside [0, {length}] (the lineage's length)")
        n_tokens = n
        adapter.crop_cache(lin.cache, n_tokens)
        del lin.tokens[n_tokens:]
        lin.last_logits = None

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

    # ------------------------------------------------------------ helpers

    def _fresh_handle(self) -> str:
        handle = f"L{self._next_id}"
        self._next_id += 1
        return handle

    def _need_current(self) -> str:
        if self._current is None:
            raise RuntimeError("no current lineage: call new_lineage() or use(lineage)")
        return self._current

    def _get(self, lineage: str | None) -> _Lineage:
        handle = self._need_current() if lineage is None else lineage
        if handle not in self._lineages:
            raise KeyError(f"unknown lineage {handle!r}; live: {sorted(self._lineages)}")
        return self._lineages[handle]

    def _check_ids(self, token_ids: Iterable[int], allow_empty: bool = False) -> list[int]:
        # Checked on the host: an out-of-range id on CUDA is a device assert
        # that kills the process instead of an error we can report.
        ids = [operator.index(t) for t in token_ids]  # ints only, no floats
        if not ids and not allow_empty:
            raise ValueError("prefill: token_ids is empty; a forward needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.lm.vocab_size]
        if bad:
            raise ValueError(f"prefill: token ids {bad[:5]} outside [0, {self.lm.vocab_size})")
        return ids
