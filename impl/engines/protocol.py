"""The engine protocol: the verbs the runtime, the baselines and the benches use.

Everything above the engine layer (the agent runtime and its tools, the
baselines, the store, the benches and the properties) is typed
against :class:`Engine` and never asks which engine it runs on. Two engines
implement it:

* :class:`unsee.impl.engines.hf.engine.KVEngine`, HF transformers (``UNSEE_ENGINE=tiny`` or
  ``smollm2``);
* :class:`unsee.impl.engines.llamacpp.engine.LlamaCppEngine`, llama.cpp through
  llama-cpp-python (``UNSEE_ENGINE=llamacpp`` or ``llamacpp-tiny``; the
  optional extra ``unsee[llamacpp]``).

:func:`unsee.impl.engines.registry.load_engine` builds either by name. docs/engines.md lists the
bitwise facts each engine's :attr:`Engine.determinism` states.

A *lineage* is one KV cache named by a string handle; handles are never
reused. Verbs act on the current lineage unless one is named.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
    """

    same_chunking_repeats: bool
    crop_continue_is_fresh: bool
    chunk_invariant: bool
    decode_is_prefill: bool
    thread_invariant: bool
    statement: str
    restore_granularity: int = 1

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
    determinism: str  # the engine's determinism statement in words (ForgetReport's A1)
    source: str  # the weights' file or folder ('' for a model built in memory)
    #: the tokenizer's chat template (Jinja), or None: episodes are then rendered in ChatML
    chat_template: str | None
    #: the special tokens' texts a chat template names (``bos_token``, ``eos_token``...)
    special_tokens: Mapping[str, str]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS; chat markers map to single ids."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""


@runtime_checkable
class Engine(Protocol):
    """Lineages of KV caches over one model, and the verbs on them."""

    #: the model: tokenizer, eos ids, names (see :class:`ModelInfo`)
    lm: ModelInfo
    #: work done so far (:class:`unsee.impl.engines.lineage.Counters`): snapshot and subtract to measure a span
    counters: object
    #: ceiling on |prefill - decode| logits that draft verification needs, or None: drafts off
    draft_bound: float | None
    #: where ``draft_bound`` came from, in words (a shipped measurement, a calibrated file, the engine's own facts)
    draft_bound_source: str | None
    #: what the engine guarantees bitwise (:class:`Determinism`)
    determinism: Determinism
    #: the bound on unpinned KV bytes, or None (see :meth:`set_kv_budget`)
    kv_budget: int | None
    #: lineages evicted by the budget so far, and the most unpinned bytes ever held when a verb returned
    evictions: int
    peak_unpinned_bytes: int

    # --- lineages

    def new_lineage(self) -> str:
        """A new empty lineage; it becomes current."""

    def share_prefix(self, lineage: str | None = None, n_tokens: int | None = None) -> str:
        """A new lineage holding the first ``n_tokens`` (default all) of
        ``lineage``, independent of it from then on (neither side's later
        verbs change the other). The current lineage is not changed."""

    def clone(self, lineage: str | None = None) -> str:
        """A new lineage equal to ``lineage`` (KV, tokens, last logits) and
        independent of it both ways. The current lineage is not changed."""

    def rebuild(self, chunks: Iterable[Sequence[int]]) -> str:
        """A new lineage (made current) holding ``chunks``, one prefill each;
        counted as ``rebuilt_tokens``."""

    def use(self, lineage: str) -> None:
        """Make ``lineage`` current."""

    def drop(self, lineage: str) -> None:
        """Free ``lineage``: its handle is unknown from then on and its KV is
        released (:meth:`memory` no longer counts it)."""

    @property
    def current(self) -> str | None:
        """The current lineage's handle, or None."""

    @property
    def lineages(self) -> tuple[str, ...]:
        """The resident lineages' handles."""

    def is_evicted(self, lineage: str) -> bool:
        """Whether the KV budget evicted ``lineage`` (its handle is known, its KV gone)."""

    def length(self, lineage: str | None = None) -> int:
        """How many tokens the lineage holds."""

    def tokens(self, lineage: str | None = None) -> list[int]:
        """The token ids the lineage holds, in order (a copy)."""

    # --- the verbs that compute

    def prefill(self, token_ids: Iterable[int]) -> None:
        """Exactly one forward over ``token_ids`` (one chunk) on the current
        lineage; keeps the logits after the last token."""

    def generate(self, max_new_tokens: int, stop_ids: Iterable[int] | None = None, temperature: float = 0.0,
                 seed: int | None = None, draft: Sequence[int] | None = None,
                 probe: bool = False, lookup: bool = False) -> list[int]:
        """Decode up to ``max_new_tokens`` on the current lineage by the
        decoding rule of :mod:`unsee.impl.agent.drafts` (greedy at temperature 0,
        else the exponential race seeded by (seed, position in the turn))
        applied to the model's logits, and commit them as the engine's
        canonical chunk. Stops after a stop id (included). A ``draft`` needs
        a ``draft_bound``; ``probe`` (with a draft) checks the draft's second
        token on the reference's own first decode step before verifying
        (docs/drafts.md); ``lookup`` (also needs the bound) verifies guesses
        from the lineage's own tokens where the turn is decoded. None of them
        changes the tokens returned."""

    def crop(self, n_tokens: int, lineage: str | None = None) -> None:
        """Keep the first ``n_tokens``: afterwards the lineage is what
        prefilling those tokens in the same chunks gave. Clears the last
        logits (a prefill must come next)."""

    def logits(self, lineage: str | None = None):
        """The logits after the lineage's last prefill, as a float32 CPU
        torch tensor (a copy), or None where there are none (after a crop):
        what ``generate``'s decoding rule is applied to."""

    def digest(self, lineage: str | None = None) -> str:
        """A hash of the lineage's K and V values by position (not of where
        they sit in memory): equal digests mean bitwise equal KV."""

    # --- memory

    def pin(self, lineage: str) -> object:
        """Keep ``lineage`` out of the KV budget's reach while the returned pin lives."""

    def set_kv_budget(self, kv_budget: int | None) -> None:
        """Bound the bytes of lineages neither pinned nor current (None: no bound)."""

    def enforce_budget(self) -> None:
        """Evict unpinned lineages, least recently used first, until the budget holds."""

    def memory(self) -> object:
        """What the engine holds now (:class:`unsee.impl.engines.lineage.KVMemory`)."""

    def prefix_cache(self, sources: Iterable[str] | None = None) -> contextlib.AbstractContextManager:
        """A block inside which a prefill whose chunk history matches a cached
        lineage's may be served from it (B5'); serving must leave every
        digest as computing would."""


__all__ = ["Determinism", "Engine", "ModelInfo"]
