"""VllmEngine: the :class:`~unsee.impl.engines.protocol.Engine` verbs over vLLM.

vLLM keeps no lineages: it serves requests, each a prompt of token ids, and
caches full blocks of KV by a hash chained over the tokens and the request's
``cache_salt``. So here a lineage is its tokens and a salt:

* ``prefill`` appends tokens; nothing is computed until a request needs it
  (the next ``generate``, or ``logits``). vLLM then computes the prompt
  tokens its prefix cache does not hold: ``prefilled_tokens`` counts those,
  ``reused_tokens`` the ones served from cached blocks.
* A restore (``fork`` of a checkpoint, then the replay's requests)
  is a prefix-cache hit on the checkpoint's tokens under the checkpoint's
  salt, rounded down to the block size (128 tokens on the CPU); the replay is
  ordinary requests.
* ``new_lineage`` draws a fresh salt: a new session, or a full reset, never
  hits a block another lineage built, so a reset is a cold run.

**Exactness.** A prefix-cache hit moves the logits in the last bits (the
CPU backend measured up to 2.1e-5 on SmolLM2; ``bench/vllm_restore.py``
measures the distribution per prefix length). Every decision is taken by the
decoding rule of :mod:`unsee.impl.engines.decoding` (``get_scores`` +
``pick``) on the logits vLLM returned; a decision whose margin is not above
:func:`~unsee.impl.engines.decoding.get_threshold` of the measured bound
(:data:`RESTORE_BOUNDS`) is recomputed on the *cold* logits: the same prompt
with ``skip_reading_prefix_cache``, one run over every token. Cold runs
repeat bitwise, so every decision equals the cold run's, a function of the
tokens before it whatever the cache held: forget == cold full reset, token
for token. Where no bound is known, every decision is recomputed cold.
:meth:`logits` is the cold run's too, so crop/continue and chunking cannot
show in it.

**Digest.** vLLM exposes no KV: the digest hashes the token ids (equal
digests mean equal tokens, and with the guard equal decisions after them).

**Residue.** Blocks stay in vLLM's pool after their lineage is dropped, until
evicted or until :meth:`release_prefix_cache` (``reset_prefix_cache``: the
hashes are dropped, the memory is overwritten on reuse, not zeroed). A block
holding a forgotten source's tokens is hittable only by a request under the
same salt whose tokens up to that block equal the forgotten lineage's, and
the forget drops every lineage that held them. :meth:`residue` reports what
the pool holds, from the block pool and the KV-cache events.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import ClassVar

import torch

from unsee.impl.engines.book import LineageBook
from unsee.impl.engines.decoding import PLAIN, Rule, get_scores, get_threshold, pick
from unsee.impl.engines.protocol import Assist, Determinism
from unsee.impl.engines.vllm import adapter

#: Ceilings on max |logit after a prefix-cache hit - logit of the cold run|
#: per (model, device, dtype), measured by ``python -m unsee.bench.vllm_restore``
#: (docs/engines.md, vLLM, has the distributions and the command); a decision
#: must clear twice the bound (get_threshold) or it is recomputed cold.
#:
#: vllm-tiny cpu float32: max 0.0 (bitwise) over 480 positions (prefixes of 128
#:   to 2048 tokens, 3 prompts, 16 decoded tokens, with and without a hit); the
#:   bound is a floor of 1e-6, so near-ties are still recomputed cold.
#: vllm-tiny-ties cpu float32 (SmolLM2's width): max 3.6e-6 over 384 positions
#:   (prefixes of 128 to 2048 tokens; the same with and without a hit: decode
#:   steps, not the hit, move these logits); bound 5e-5, 14x.
#: smollm2 cpu float32: max 1.1e-4 over 1,152 positions (prefixes of 128, 256,
#:   384, 512, 768 and 1024 tokens, 4 prompts each, 24 decoded tokens, with and
#:   without a hit; the issue's own probe saw 2.1e-5 on a 896-token hit); bound
#:   1.8e-3, 16x, the factor of the first bound (1e-3 over 48 positions, max 6.1e-5).
RESTORE_BOUNDS: Mapping[tuple[str, str, str], float] = {
    ("smollm2", "cpu", "float32"): 1.8e-3,
    ("vllm-tiny", "cpu", "float32"): 1e-6,
    ("vllm-tiny-ties", "cpu", "float32"): 5e-5,
}

_SALTS = itertools.count()


def get_restore_bound(name: str, device: str, dtype: str) -> float:
    """The measured hit-versus-cold bound of a configuration, or infinity:
    unknown, so every decision is recomputed cold."""
    return RESTORE_BOUNDS.get((name, device, dtype), float("inf"))


def get_margin(logits: Mapping[int, float], token: int) -> float:
    """How far ``token``'s logit lies above every other returned one (<= 0:
    not the strict maximum), from a top-k dict ``{id: logit}``."""
    others = [v for t, v in logits.items() if t != token]
    if token not in logits:
        return float("-inf")
    return logits[token] - max(others) if others else float("inf")


class _Lineage:
    __slots__ = ("has_logits", "last_used", "restore", "salt", "tokens")
    pending: tuple[int, ...] = ()  # nothing left for later: vLLM computes a prefill with its request

    def __init__(self, tokens: list[int], salt: str, has_logits: bool, restore: dict | None = None):
        self.tokens = tokens
        self.salt = salt
        self.has_logits = has_logits
        self.last_used = 0
        #: a lineage made by fork: its prefix length, then what its first request was served
        self.restore = restore


class SaltedLineages:
    """vLLM's lineages as the book's :class:`~unsee.impl.engines.book.LineageStore`:
    token ids and a cache salt. A new lineage draws a fresh salt (it never hits
    a block another lineage built); a fork keeps its source's salt (its next
    request hits the source's cached blocks: the restore)."""

    def __init__(self, salt_prefix: str):
        self.salt_prefix = salt_prefix
        self.hooks: list = []  # never called: vLLM's forwards run inside its requests

    def new(self) -> _Lineage:
        return _Lineage([], f"{self.salt_prefix}-{next(_SALTS)}", False)

    def fork(self, handle: str, src: _Lineage, n: int) -> _Lineage:
        # the source's tokens as they are now: what its cached blocks can hold (dropped after the first request)
        return _Lineage(src.tokens[:n], src.salt, src.has_logits and n == len(src.tokens),
                        restore={"prefix_tokens": n, "source": tuple(src.tokens)})

    def storages(self, handle: str, lin: _Lineage, full: bool) -> dict:
        # the host holds a lineage's token ids; its KV lives in vLLM's block pool (residue())
        return {("tokens", handle): 8 * len(lin.tokens)}

    def free(self, handle: str) -> None:
        """Nothing to release: vLLM's blocks stay until evicted (:meth:`VllmEngine.residue`)."""


class VllmEngine(LineageBook):
    """The vLLM implementation of :class:`unsee.impl.engines.protocol.Engine`
    (the module docstring has the mapping and what is exact). ``guard_stats``
    counts the decisions taken and those recomputed cold."""

    #: what equal digests mean (protocol.Determinism.digest), and the support matrix's words (engines/support.py)
    DIGEST = "tokens"
    SUPPORT: ClassVar[dict[str, str]] = {"drafts": "no: a turn is one request", "kv_budget": "host token lists only (the KV is vLLM's block pool)",
               "store": "yes (make test-vllm)", "receipts": "yes: the digest is of tokens"}

    def __init__(self, lm, kv_budget: int | None = None):
        self.lm = lm
        super().__init__(SaltedLineages(f"unsee-{secrets.token_hex(6)}"))
        self._llm = lm.llm
        self.draft_bound = None  # no drafts: a turn is one request already
        self.draft_bound_source = "none: the vLLM engine decodes a turn in one request"
        self.draft_policy = None
        self.restore_bound = get_restore_bound(lm.name, lm.device, lm.dtype)
        # decode_is_prefill is False: vLLM's decode steps move raw logits from the cold run's (the
        # guard absorbs it), and the "turn" chunking it implies keeps a turn's decoded tokens apart
        # from its header in the block graph (the conformance contract's turns)
        # restore_granularity: vLLM caches full blocks only, so a restore keeps the checkpoint's
        # tokens rounded down to the block size and its first request recomputes the tail
        self.determinism = Determinism(same_chunking_repeats=True, crop_continue_is_fresh=True, chunk_invariant=True,
                                       decode_is_prefill=False, thread_invariant=False, statement=lm.determinism_statement,
                                       restore_granularity=lm.block_size, digest=self.DIGEST)
        self.guard_stats = {"decisions": 0, "cold_recomputes": 0, "flips": 0}
        self._cold: dict[tuple[int, ...], torch.Tensor] = {}  # the last cold logits, by tokens
        self._events = adapter.record_kv_events(self._llm)
        self.budget.set(kv_budget)

    def get_restore(self, lineage: str) -> dict | None:
        """What the first request of a lineage made by :meth:`fork` was
        served: ``prefix_tokens`` (the prefix shared), ``prompt_tokens`` and
        ``cached_tokens`` (its prompt, and the part vLLM's cache served: whole
        blocks, so a multiple of the block size), ``matching_tokens`` (how far
        that prompt equals the source lineage's tokens, which may run past the
        shared prefix: a block of them is hittable if resident), or None for a
        lineage not made by fork (a new one, or one rebuilt from a manifest)."""
        restore = self._use(lineage).restore
        return None if restore is None else {k: v for k, v in restore.items() if k != "source"}

    # --------------------------------------------------------------- verbs

    def prefill(self, lineage: str, token_ids: Iterable[int]) -> None:
        """Append ``token_ids``; vLLM computes them in the next request."""
        lin = self._use(lineage)
        self.budget.spare(lineage)
        ids = self._check_ids(token_ids)
        if len(lin.tokens) + len(ids) > self._max_len():
            raise ValueError(f"prefill: {len(lin.tokens)} + {len(ids)} tokens exceed max_model_len={self._max_len()}")
        lin.tokens.extend(ids)
        lin.has_logits = True
        self.budget.enforce()

    def generate(self, lineage: str, max_new_tokens: int, stop_ids: Iterable[int] | None = None,
                 temperature: float = 0.0, seed: int | None = None, assist: Assist | None = None,
                 rule: Rule | None = None) -> list[int]:
        """Decode by the rule of impl/engines/decoding.py on vLLM's raw logits,
        each decision under the margin guard (the module docstring). Greedy
        turns are one request (top-2 logits per position) until a guarded
        decision changes a token; sampled ones, and any turn under a ``rule``
        that reads all the logits (penalties, a nucleus, constraints), a
        request per token (all logits)."""
        self._use(lineage)
        self.budget.spare(lineage)
        max_new_tokens = self._check_generate(max_new_tokens, temperature, seed, assist or Assist())
        lin = self._use(lineage)
        if not lin.has_logits:
            raise RuntimeError(f"generate on lineage {lineage!r}: no logits to continue from; "
                               "prefill first (a new lineage or a crop has none)")
        stops = set(self.lm.eos_ids if stop_ids is None else (int(s) for s in stop_ids))
        if len(lin.tokens) + max_new_tokens > self._max_len():
            raise ValueError(f"generate: {len(lin.tokens)} + {max_new_tokens} tokens exceed "
                             f"max_model_len={self._max_len()}")
        rule = rule or PLAIN
        out: list[int] = []
        while len(out) < max_new_tokens and not (out and (out[-1] in stops or rule.is_done(out))):
            if temperature == 0 and rule.is_plain():
                self._decode_greedy(lin, out, max_new_tokens, stops)
            else:
                out.append(self._decide_sampled(lin, out, temperature, seed, rule))
        lin.tokens.extend(out)
        lin.has_logits = bool(lin.tokens)
        return out

    def logits(self, lineage: str) -> torch.Tensor | None:
        """The cold run's logits after the lineage's tokens (float32, a copy), or None after a crop."""
        lin = self._use(lineage)
        return self.cold_logits(lin.salt, lin.tokens).clone() if lin.has_logits else None

    def digest(self, lineage: str) -> str:
        """sha256 over the token ids (vLLM exposes no KV; the module docstring)."""
        lin = self._use(lineage)
        h = hashlib.sha256(b"unsee-vllm-tokens-v1")
        h.update(f"len={len(lin.tokens)};".encode())
        h.update(b"".join(int(t).to_bytes(4, "little") for t in lin.tokens))
        return h.hexdigest()

    @contextlib.contextmanager
    def prefix_cache(self, sources: Iterable[str] | None = None) -> Iterator[VllmEngine]:
        """vLLM's own prefix cache is always on (under each lineage's salt);
        what it serves is counted as ``reused_tokens``."""
        yield self

    # ------------------------------------------------------------ residue

    def drop(self, lineage: str) -> None:
        """Drop ``lineage``; when none is left (the engine is idle and no request
        can need a block again), release vLLM's prefix cache too."""
        super().drop(lineage)
        if not self._lineages:
            self.release_prefix_cache()

    def release_prefix_cache(self) -> bool:
        """Drop every cached block's hash now (the engine is idle between
        verbs): nothing cached before is hittable afterwards. Sent to vLLM's
        engine core by the engine's loop, after the request it may be running."""
        self._cold.clear()
        return self.scheduler.run(adapter.reset_prefix_cache, self._llm)

    def residue(self) -> dict:
        """What vLLM's pool holds now and the KV-cache events seen so far:
        blocks resident by hash are hittable (under their salt) until evicted
        or released; their memory is overwritten on reuse, never zeroed."""
        events: dict[str, int] = {}
        for kind, blocks in self._events or ():
            events[kind] = events.get(kind, 0) + max(blocks, 1 if kind == "AllBlocksCleared" else 0)
        return {"resident_blocks": adapter.resident_blocks(self._llm), "block_size": self.lm.block_size,
                "events": events, "zeroed": False,
                "statement": "cached blocks stay resident until evicted or release_prefix_cache(); "
                             "a block is hittable only under its lineage's salt and its exact token prefix"}

    # ------------------------------------------------------------ helpers

    def _max_len(self) -> int:
        return self.lm.info["options"].max_model_len - 1  # one position for the logits' request

    def request(self, salt: str, prompt: Sequence[int], max_tokens: int, n_logits: int,
                stops: Iterable[int] = (), skip_cache: bool = False, lin: _Lineage | None = None) -> adapter.Completion:
        """One request, counted: the prompt tokens vLLM computed, those its
        cache served, the tokens decoded and the forwards (one per position);
        ``lin``: the lineage it continues (its restore is noted). The engine's
        loop submits it whole to vLLM's engine core (vLLM schedules its own
        steps), one request at a time as a request alone was measured (the
        guard's bound), the caller's session let go while it runs
        (impl/engines/scheduler.py): on vLLM too the loop is the one caller."""
        c = self.scheduler.run(adapter.complete, self._llm, prompt, salt, max_tokens, n_logits, sorted(stops),
                               skip_cache, release=True)
        if lin is not None:
            self._note_restore(lin, salt, len(prompt), c.cached_tokens, skip_cache)
        self.counters.prefilled_tokens += len(prompt) - c.cached_tokens
        self.counters.reused_tokens += c.cached_tokens
        self.counters.forward_calls += max(1, len(c.ids))
        return c

    def _note_restore(self, lin: _Lineage, salt: str, prompt_tokens: int, cached_tokens: int,
                      skip_cache: bool) -> None:
        """Record the first cache-reading request of ``lin``, if fork made it."""
        if skip_cache or lin.salt != salt or lin.restore is None or "cached_tokens" in lin.restore:
            return
        source, prompt = lin.restore.pop("source"), lin.tokens  # the request's prompt starts with lin.tokens
        matching = next((i for i, (a, b) in enumerate(zip(prompt, source)) if a != b), min(len(prompt), len(source)))
        lin.restore.update(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, matching_tokens=matching)

    def cold_logits(self, salt: str, tokens: Sequence[int], reuse: bool = True) -> torch.Tensor:
        """The logits after ``tokens`` from one run over all of them, no cached block read
        (``reuse``: the last such run's, if it was of the same tokens)."""
        key = tuple(tokens)
        if key not in self._cold or not reuse:
            c = self.request(salt, tokens, 1, -1, skip_cache=True)
            self._cold = {key: self.dense(c.logits[0])}  # keep only the last
        return self._cold[key]

    def dense(self, logits: Mapping[int, float]) -> torch.Tensor:
        out = torch.full((self.lm.vocab_size,), float("-inf"), dtype=torch.float32)
        out[list(logits)] = torch.tensor(list(logits.values()), dtype=torch.float32)
        return out

    def _guarded(self, lin: _Lineage, out: list[int], token: int, margin: float, temperature: float,
                 seed: int | None, rule: Rule = PLAIN) -> int:
        """``token`` if its margin clears the threshold, else the cold run's decision."""
        self.guard_stats["decisions"] += 1
        if margin > get_threshold(self.restore_bound, temperature):
            return token
        self.guard_stats["cold_recomputes"] += 1
        # computed afresh, so a turn's counts do not depend on what ran before it
        cold, _ = pick(get_scores(self.cold_logits(lin.salt, lin.tokens + out, reuse=False), temperature, seed,
                                  len(out), rule, out))
        self.guard_stats["flips"] += int(cold != token)
        return cold

    def _decode_greedy(self, lin: _Lineage, out: list[int], max_new_tokens: int, stops: set[int]) -> None:
        """One request for the rest of the turn; its tokens are kept up to and
        including the first decision the guard changed (the next request
        continues after it)."""
        c = self.request(lin.salt, lin.tokens + out, max_new_tokens - len(out), 2, stops, lin=lin)
        self.counters.decoded_tokens += len(c.ids)
        for token, top in zip(c.ids, c.logits):
            decided = self._guarded(lin, out, token, get_margin(top, token), 0.0, None)
            out.append(decided)
            if decided != token or decided in stops:
                return

    def _decide_sampled(self, lin: _Lineage, out: list[int], temperature: float, seed: int | None,
                        rule: Rule = PLAIN) -> int:
        c = self.request(lin.salt, lin.tokens + out, 1, -1, lin=lin)
        self.counters.decoded_tokens += 1
        logits = self.dense(c.logits[0])
        token, margin = pick(get_scores(logits, temperature, seed, len(out), rule, out))
        token = self._guarded(lin, out, token, margin, temperature, seed, rule)
        if rule.on_decision is not None:
            rule.on_decision(len(out), token, get_scores(logits, 0.0, None, len(out), rule, out))
        return token


__all__ = ["RESTORE_BOUNDS", "VllmEngine", "get_margin", "get_restore_bound"]
