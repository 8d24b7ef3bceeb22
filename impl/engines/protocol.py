"""The engine protocol: the verbs the runtime, the baselines and the benches use.

Everything above the engine layer (the agent runtime and its tools, the
baselines, the store, the benches and the properties) is typed
against :class:`Engine` and never asks which engine it runs on. Three engines
implement it:

* :class:`unsee.impl.engines.hf.engine.KVEngine`, HF transformers (``UNSEE_ENGINE=tiny`` or
  ``smollm2``);
* :class:`unsee.impl.engines.llamacpp.engine.LlamaCppEngine`, llama.cpp through
  llama-cpp-python (``UNSEE_ENGINE=llamacpp`` or ``llamacpp-tiny``; the
  optional extra ``unsee[llamacpp]``);
* :class:`unsee.impl.engines.vllm.engine.VllmEngine`, vLLM (``UNSEE_ENGINE=vllm`` or
  ``vllm-tiny``; the optional extra ``unsee[vllm]``).

:func:`unsee.impl.engines.registry.load_engine` builds any of them by name. docs/engines.md lists the
bitwise facts each engine's :attr:`Engine.determinism` states.

A *lineage* is one KV cache named by a string handle; handles are never
reused. Every verb names the lineage it acts on; there is no current one, so
an engine shared by many sessions need not serialise calls around a cursor.
The KV budget is a component (``engine.budget``); the prefix cache, span
excision, residue reporting, a restore's report and drafts are optional
capabilities (:class:`PrefixCache`, :class:`SpanExcision`, :class:`Residue`,
:class:`RestoreReport`, :class:`DraftSource`), checked with ``isinstance``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from unsee.impl.engines.speculation import DraftPolicy

if TYPE_CHECKING:
    from unsee.impl.engines.decoding import Rule


@dataclass(frozen=True)
class Determinism:
    """What an engine guarantees bit for bit, as facts the runtime and the
    properties can read (True: guaranteed; False: not guaranteed, which
    does not mean it always differs).

    same_chunking_repeats   the same tokens in the same prefill chunks, from
                            the same state, give the same KV and logits:
                            the identity forget == reset rests on
    crop_continue_is_fresh  crop(n) then prefill == prefilling the first n
                            tokens then the same prefill (Algorithm 1's
                            restore rests on it)
    chunk_invariant         prefilling 40 tokens == prefilling 20 + 20
    decode_is_prefill       decoding tokens one by one == prefilling them
    thread_invariant        the KV does not depend on the thread count
    statement               the same in words, with where it was measured
    restore_granularity     a restore of a lineage's first n tokens keeps the KV of
                            the first n - n % g of them, and the next prefill
                            resumes there, recomputing the rest: 1 where a crop
                            keeps any prefix (transformers, llama.cpp), the block
                            size where the cache is full blocks (vLLM: 128 on the CPU)
    digest                  what equal digests mean: "kv" (bitwise equal K and
                            V by position) or "tokens" (equal token ids, plus
                            the engine's measured bound on what follows)
    """

    same_chunking_repeats: bool
    crop_continue_is_fresh: bool
    chunk_invariant: bool
    decode_is_prefill: bool
    thread_invariant: bool
    statement: str
    restore_granularity: int = 1
    #: what equal digests mean: "kv" (bitwise equal K and V by position) or
    #: "tokens" (equal token ids; decisions after them agree within a measured bound)
    digest: str = "kv"

    def get_restore_split(self, n_tokens: int) -> tuple[int, int]:
        """``(kept, recomputed)`` of a restore of ``n_tokens``: the tokens whose KV
        the restore keeps (rounded down to :attr:`restore_granularity`) and the
        ones the next prefill recomputes."""
        kept = n_tokens - n_tokens % self.restore_granularity
        return kept, n_tokens - kept

    @property
    def canonical_chunking(self) -> str:
        """How the runtime commits a model turn so that a replay redoes it bit
        for bit: ``"turn"`` (the assistant header as one chunk, the generated
        tokens as one more, which ``generate`` canonicalises) where chunking
        matters, ``"block"`` (header and turn as one chunk) where the engine
        is chunk invariant and decode equals prefill."""
        return "block" if self.chunk_invariant and self.decode_is_prefill else "turn"


@runtime_checkable
class ModelInfo(Protocol):
    """What the runtime reads of the engine's model: its tokenizer and names."""

    name: str  # 'smollm2', 'tiny', or the path it came from
    device: str
    dtype: str
    eos_ids: tuple[int, ...]  # ids that end a turn
    vocab_size: int
    #: the engine's determinism in words (ForgetReport's A1); the facts are ``Engine.determinism``
    determinism_statement: str
    source: str  # the weights' file or folder ('' for a model built in memory)
    #: the tokenizer's chat template (Jinja), or None: episodes are then rendered in ChatML
    chat_template: str | None
    #: the special tokens' texts a chat template names (``bos_token``, ``eos_token``...)
    special_tokens: Mapping[str, str]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS; chat markers map to single ids."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""


@dataclass(frozen=True)
class Assist:
    """What ``generate`` may verify instead of decoding; none of it changes
    the tokens returned, and each needs the engine's measured bound
    (:class:`DraftSource`'s ``draft_bound``).

    draft   the tokens this turn had before a forget, verified where the
            decoding rule agrees with them stably (impl/agent/drafts.py)
    probe   with a draft: check the draft's second token on the reference's
            own first decode step before verifying (docs/drafts.md)
    lookup  verify guesses from the lineage's own tokens where the turn is
            decoded (a forget's replay)
    """

    draft: Sequence[int] | None = None
    probe: bool = False
    lookup: bool = False


@runtime_checkable
class KVBudget(Protocol):
    """The KV budget of an engine, a component of its own (``engine.budget``):
    a bound on the bytes of lineages neither pinned nor last worked on,
    evicting least recently used first."""

    #: the bound in bytes, or None: no bound
    limit: int | None
    #: lineages evicted so far, and the most unpinned bytes ever held when a verb returned
    evictions: int
    peak_unpinned_bytes: int

    @property
    def lineages(self) -> tuple[str, ...]:
        """The resident lineages' handles."""

    def is_evicted(self, lineage: str) -> bool:
        """Whether the budget evicted ``lineage`` (its handle is known, its KV gone)."""

    def pin(self, lineage: str) -> object:
        """Keep ``lineage`` out of the budget's reach while the returned pin lives."""

    def set(self, limit: int | None) -> None:
        """Bound the bytes of unpinned lineages (None: no bound), enforced now."""

    def enforce(self) -> None:
        """Evict unpinned lineages, least recently used first, until the budget holds."""

    def get_releases(self, owners) -> list:
        """Which owners of pinned lineages (``(key, handles)``, a server's sessions) must let go,
        least recently used first, for the engine to hold at most the bound: the one evictor's
        decision, which the owners carry out."""

    def memory(self) -> object:
        """What the engine holds now (:class:`unsee.impl.engines.lineage.KVMemory`)."""


@runtime_checkable
class Engine(Protocol):
    """Lineages of KV caches over one model, and the verbs on them. Every
    verb names its lineage: there is no current one."""

    #: the model: tokenizer, eos ids, names (see :class:`ModelInfo`)
    lm: ModelInfo
    #: what the engine guarantees bitwise, and what its digest means (:class:`Determinism`)
    determinism: Determinism
    #: work done so far in the calling thread (:class:`unsee.impl.engines.counts.Counters`): snapshot
    #: and subtract to measure a span
    counters: object
    #: the KV budget (:class:`KVBudget`)
    budget: KVBudget

    def new_lineage(self) -> str:
        """A new empty lineage."""

    def fork(self, lineage: str, n_tokens: int | None = None) -> str:
        """A new lineage holding the first ``n_tokens`` (default all) of
        ``lineage``, independent of it from then on (neither side's later
        verbs change the other): a clone, a shared prefix, or a crop (fork
        at ``n`` and drop the source). Afterwards it is what prefilling
        those tokens in the same chunks gave; the last logits come along
        only when the whole lineage is forked."""

    def prefill(self, lineage: str, token_ids: Iterable[int]) -> None:
        """``token_ids`` as one chunk on ``lineage``, the KV and logits after it those of
        one forward over it; an engine may compute it later, with the chunks after it, in
        one forward where that changes no bit (llama.cpp: at most ``max_forward`` tokens),
        and before any verb that reads the KV or the logits."""

    def generate(self, lineage: str, max_new_tokens: int, stop_ids: Iterable[int] | None = None,
                 temperature: float = 0.0, seed: int | None = None, assist: Assist | None = None,
                 rule: Rule | None = None) -> list[int]:
        """Decode up to ``max_new_tokens`` on ``lineage`` by the decoding
        rule of :mod:`unsee.impl.agent.drafts` (greedy at temperature 0, else
        the exponential race seeded by (seed, position in the turn)) applied
        to the model's logits, and commit them as the engine's canonical
        chunk. Stops after a stop id (included), or where ``rule``'s
        constraints say the turn is done. ``rule``
        (:class:`~unsee.impl.engines.decoding.Rule`) penalises and masks the
        logits by the turn's own tokens so far. ``assist`` (:class:`Assist`)
        changes no token returned."""

    def digest(self, lineage: str) -> str:
        """A hash of the lineage by position (not of where it sits in memory);
        what equal digests mean is ``determinism.digest``."""

    def tokens(self, lineage: str) -> list[int]:
        """The token ids the lineage holds, in order (a copy)."""

    def logits(self, lineage: str):
        """The logits after the lineage's last prefill, as a float32 CPU
        torch tensor (a copy), or None where there are none (after a fork
        short of the whole lineage): what ``generate``'s decoding rule is applied to."""

    def drop(self, lineage: str) -> None:
        """Free ``lineage``: its handle is unknown from then on and its KV is
        released (the budget's memory no longer counts it)."""


# --- optional capabilities, checked with isinstance

@runtime_checkable
class DraftSource(Protocol):
    """An engine whose ``generate`` takes an :class:`Assist` (drafts to verify);
    not :class:`unsee.impl.agent.drafts.Drafts`, the replay's drafts themselves."""

    #: ceiling on |prefill - decode| logits that draft verification needs, or None: drafts off
    draft_bound: float | None
    #: where ``draft_bound`` came from, in words (a shipped measurement, a calibrated file, the engine's own facts)
    draft_bound_source: str | None
    #: how a turn sizes its forwards where they equal decoding's (impl/engines/speculation.py),
    #: or None: a draft is verified in one forward
    draft_policy: DraftPolicy | None


@runtime_checkable
class PendingChunks(Protocol):
    """An engine whose ``prefill`` may leave a chunk pending, computed later with the chunks
    after it (llama.cpp: in one forward of at most ``max_forward`` tokens)."""

    def flush(self, lineage: str) -> None:
        """Compute what ``lineage`` has pending now (nothing if nothing is): a caller that
        times or watches a turn's own forwards calls it first."""


@runtime_checkable
class PrefixCache(Protocol):
    """An engine with a prefix cache (B5')."""

    def prefix_cache(self, sources: Iterable[str] | None = None) -> contextlib.AbstractContextManager:
        """A block inside which a prefill whose chunk history matches a cached
        lineage's may be served from it; serving must leave every digest as
        computing would."""


@runtime_checkable
class SpanExcision(Protocol):
    """An engine that can remove a span of a lineage's KV and keep the rest
    as computed (span-only excision, a baseline; never used by a forget)."""

    def excise(self, lineage: str, start: int, end: int) -> None:
        """Remove the tokens ``[start, end)`` of ``lineage`` from its KV."""


@runtime_checkable
class Residue(Protocol):
    """An engine keeping KV outside its lineages (a block pool) and reporting it."""

    def residue(self) -> dict:
        """What the engine's pool holds now, and what it has seen evicted."""

    def release_prefix_cache(self) -> bool:
        """Drop every cached block now: nothing cached before is hittable afterwards."""


@runtime_checkable
class RestoreReport(Protocol):
    """An engine that reports what a restore's first request was served."""

    def get_restore(self, lineage: str) -> dict | None:
        """What the first request of a forked lineage was served, or None."""


@runtime_checkable
class DeepCopy(Protocol):
    """An engine that can copy a lineage's KV instead of sharing it (a bench's baseline)."""

    def copy_lineage(self, lineage: str) -> str:
        """A new lineage equal to ``lineage`` whose KV is a copy, not shared."""


@runtime_checkable
class MarginGuard(Protocol):
    """An engine that decides each token under a margin guard (vLLM) and counts
    its decisions: ``{"decisions", "cold_recomputes", "flips"}``."""

    guard_stats: dict


@runtime_checkable
class ForwardHooks(Protocol):
    """An engine that can report each model forward (for a profiler)."""

    def hook_forwards(self, on_forward: Callable[[int, float], None],
                      on_commit: Callable[[int, float], None] | None = None) -> contextlib.AbstractContextManager:
        """A block inside which every forward the calling thread makes calls
        ``on_forward(n_tokens, started)`` when it ends (``started``: its ``time.perf_counter()``);
        with ``on_commit``, the forward that commits a decoded turn as its
        canonical chunk calls that instead."""


def get_draft_policy(engine: Engine) -> DraftPolicy | None:
    """The draft policy of an engine with :class:`DraftSource`, or None."""
    return engine.draft_policy if isinstance(engine, DraftSource) else None


def get_draft_bound(engine: Engine) -> tuple[float | None, str | None]:
    """``(draft_bound, draft_bound_source)`` of an engine with :class:`DraftSource`;
    ``(None, None)`` (drafts off) for one without."""
    if isinstance(engine, DraftSource):
        return engine.draft_bound, engine.draft_bound_source
    return None, None


__all__ = ["Assist", "DeepCopy", "Determinism", "DraftSource", "Engine", "ForwardHooks", "KVBudget", "MarginGuard", "ModelInfo", "PrefixCache", "Residue",
           "RestoreReport", "SpanExcision",
           "get_draft_bound", "get_draft_policy"]
