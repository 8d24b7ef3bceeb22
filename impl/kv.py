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
from dataclasses import dataclass, replace
from typing import Iterable

import torch

from unsee.impl import adapter
from unsee.impl.models import LoadedModel


@dataclass
class Counters:
    """Work done by an engine, for measuring a span:

        before = engine.counters.snapshot(); ...; spent = engine.counters - before

    forward_calls     model forwards (a prefill chunk or a decode step is one)
    prefilled_tokens  tokens fed by prefill forwards, canonicalisation included
    decoded_tokens    tokens produced by generate (n tokens need n-1 decode
                      forwards: the last one is never fed back one by one)
    """

    forward_calls: int = 0
    prefilled_tokens: int = 0
    decoded_tokens: int = 0

    def snapshot(self) -> "Counters":
        return replace(self)

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(
            self.forward_calls - other.forward_calls,
            self.prefilled_tokens - other.prefilled_tokens,
            self.decoded_tokens - other.decoded_tokens,
        )

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
    ) -> list[int]:
        """Decode up to `max_new_tokens` ids on the current lineage and commit
        them canonically (as one prefilled chunk). Returns the ids.

        Greedy when temperature == 0; otherwise samples with a CPU generator
        seeded by `seed` (required), so a run is repeatable whatever the
        device. Stops after a stop id (it is included and committed) or at
        max_new_tokens. stop_ids=None means the model's eos_ids; pass () to
        never stop early.
        """
        if _as_int(max_new_tokens) is None or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
        max_new_tokens = int(max_new_tokens)
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} must be >= 0")
        if temperature > 0 and seed is None:
            raise ValueError(f"temperature={temperature!r} > 0 needs a seed for repeatable sampling")
        handle = self._need_current()
        lin = self._lineages[handle]
        if lin.last_logits is None:
            raise RuntimeError(
                f"generate on lineage {handle!r}: no logits to continue from; "
                "prefill first (a new lineage or a crop has none)"
            )
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        gen = torch.Generator(device="cpu").manual_seed(int(seed)) if temperature > 0 else None

        start = len(lin.tokens)
        logits = lin.last_logits
        out: list[int] = []
        try:
            while len(out) < max_new_tokens:
                tok = self._pick(logits, temperature, gen)
                out.append(tok)
                self.counters.decoded_tokens += 1
                if tok in stops or len(out) == max_new_tokens:
                    break  # the last token is not fed: the canonical prefill does it
                logits = adapter.forward_last_logits(self.lm.model, [tok], lin.cache)
                self.counters.forward_calls += 1
        except BaseException:
            # Interrupted mid-turn: leave the lineage as it was before the call.
            adapter.crop_cache(lin.cache, start)
            raise
        if not out:
            return out

        # Canonicalise: the decode steps wrote g_1..g_{n-1} one at a time;
        # replace them by one prefill of g_1..g_n, which a replay can redo.
        adapter.crop_cache(lin.cache, start)
        del lin.tokens[start:]
        self.prefill(out)
        return out

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

    def _check_ids(self, token_ids: Iterable[int]) -> list[int]:
        # Checked on the host: an out-of-range id on CUDA is a device assert
        # that kills the process instead of an error we can report.
        ids = [operator.index(t) for t in token_ids]  # ints only, no floats
        if not ids:
            raise ValueError("prefill: token_ids is empty; a forward needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.lm.vocab_size]
        if bad:
            raise ValueError(f"prefill: token ids {bad[:5]} outside [0, {self.lm.vocab_size})")
        return ids

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
        # On CPU in fp32, so greedy ties and sampling draws do not depend on
        # the device the logits came from.
        logits = logits.detach().to("cpu", torch.float32)
        if temperature == 0:
            return int(torch.argmax(logits))  # first index among equal maxima
        probs = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))
