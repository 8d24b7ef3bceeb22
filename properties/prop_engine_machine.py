"""The engine's verbs as a state machine: every verb on a lineage in the state
earlier verbs left it in, checked after every step against a plain model.

The per-verb properties (prop_engine_verbs.py) run each verb on a freshly fed
lineage. Here Hypothesis runs sequences of the seam's verbs (new, fork, fork
at n, crop as a fork, prefill, generate, digest, drop, and, under a small KV
budget, eviction and a reload by :func:`~unsee.impl.engines.lineage.rebuild`)
on one engine: the lineage resident in llama.cpp's context after a digest or
a fork read its rows out, a lineage parked and reloaded, a fork of a fork.

The model of each lineage is its prefill chunks (a generated turn is one
chunk: the engine's canonical chunk) and whether it has logits. After every
step, for every resident lineage:

* its tokens are the chunks' tokens;
* where the engine's determinism facts promise it, its digest (and its logits,
  where it has them) equal those of a fresh lineage prefilled with the same
  chunks: always under the same chunking (``same_chunking_repeats``, with
  ``crop_continue_is_fresh`` for a fork at a chunk boundary); after a fork
  inside a chunk only where the engine is ``chunk_invariant``, since the kept
  rows were computed in a longer chunk than a fresh prefill would use;
* a generate returns the tokens a fresh lineage of the same chunks generates.

It runs on every engine of :func:`~unsee.properties.engines.verb_engine_names`
(``tiny`` and ``llamacpp-tiny``; ``make test-vllm`` runs it on ``vllm-tiny``),
with more steps under the ``nightly`` profile.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from unsee.impl.engines.lineage import crop, rebuild
from unsee.properties.engines import make_engine, verb_engine_names

pytestmark = pytest.mark.usefixtures("one_thread")

TOKEN_IDS = st.integers(0, 255)
CHUNKS = st.lists(TOKEN_IDS, min_size=1, max_size=8)
MAX_TOKENS = 48  # per lineage: well inside every tiny engine's context
#: KV budgets in bytes: none, only the lineage worked on, and a few lineages' worth
BUDGETS = (None, 0, 6000)


def get_steps() -> int:
    """Steps per run: 30 under ci's profile, more where the profile searches more (nightly)."""
    return 30 if settings().max_examples <= 100 else 80


class Lineage:
    """The plain model of one lineage."""

    def __init__(self, chunks: list[list[int]], has_logits: bool, exact: bool):
        self.chunks = chunks
        self.has_logits = has_logits
        self.exact = exact  # whether a fresh prefill of the chunks is what the lineage must equal

    @property
    def tokens(self) -> list[int]:
        return [t for chunk in self.chunks for t in chunk]

    def cut(self, n: int, chunk_invariant: bool) -> Lineage:
        """The model of a fork at ``n``."""
        chunks, length = [], 0
        for chunk in self.chunks:
            if length >= n:
                break
            chunks.append(chunk[:n - length])
            length += len(chunk)
        at_boundary = length <= n  # n falls where a chunk ends (or at 0): no chunk was cut
        whole = n == len(self.tokens)
        return Lineage(chunks, self.has_logits and whole, self.exact and (at_boundary or chunk_invariant))


def make_machine(engine_name: str) -> type[RuleBasedStateMachine]:
    class EngineMachine(RuleBasedStateMachine):
        handles = Bundle("handles")

        def __init__(self):
            super().__init__()
            self.engine = None
            self.model: dict[str, Lineage] = {}

        @initialize(budget=st.sampled_from(BUDGETS))
        def start(self, budget):
            self.engine = make_engine(engine_name, kv_budget=budget)
            self.facts = self.engine.determinism

        def resident(self, handle: str) -> bool:
            return handle in self.model and handle in self.engine.budget.lineages

        @rule(target=handles)
        def new(self):
            handle = self.engine.new_lineage()
            self.model[handle] = Lineage([], False, True)
            return handle

        @rule(handle=handles, ids=CHUNKS)
        def prefill(self, handle, ids):
            lin = self.model.get(handle)
            if not self.resident(handle) or len(lin.tokens) + len(ids) > MAX_TOKENS:
                return
            self.engine.prefill(handle, ids)
            lin.chunks.append(ids)
            lin.has_logits = True

        @rule(handle=handles, n=st.integers(1, 6))
        def generate(self, handle, n):
            lin = self.model.get(handle)
            if not self.resident(handle) or not lin.has_logits or len(lin.tokens) + n > MAX_TOKENS:
                return
            out = self.engine.generate(handle, n, stop_ids=())
            assert len(out) == n
            if lin.exact:
                fresh = rebuild(self.engine, lin.chunks)
                assert self.engine.generate(fresh, n, stop_ids=()) == out, "generate: differs from a fresh lineage's"
                self.engine.drop(fresh)
            lin.chunks.append(out)

        @rule(target=handles, handle=handles, n=st.one_of(st.none(), st.integers(0, MAX_TOKENS)))
        def fork(self, handle, n):
            lin = self.model.get(handle)
            if not self.resident(handle):
                return handle  # a handle the bundle already holds: nothing new
            n = None if n is None else min(n, len(lin.tokens))
            child = self.engine.fork(handle, n)
            self.model[child] = lin.cut(len(lin.tokens) if n is None else n, self.facts.chunk_invariant)
            return child

        @rule(target=handles, handle=consumes(handles), n=st.integers(0, MAX_TOKENS))
        def crop(self, handle, n):
            lin = self.model.get(handle)
            if not self.resident(handle):
                return handle
            n = min(n, len(lin.tokens))
            cropped = crop(self.engine, handle, n)
            self.model[cropped] = lin.cut(n, self.facts.chunk_invariant)
            del self.model[handle]
            return cropped

        @rule(handle=handles)
        def digest(self, handle):
            if self.resident(handle):
                self.engine.digest(handle)  # reads a resident lineage's rows out (llama.cpp parks them)

        @rule(handle=consumes(handles))
        def drop(self, handle):
            if handle in self.model:
                self.engine.drop(handle)
                del self.model[handle]
                assert handle not in self.engine.budget.lineages

        @rule(target=handles, handle=consumes(handles))
        def reload(self, handle):
            """An evicted lineage rebuilt from its chunks (a checkpoint's manifest)."""
            if handle not in self.model or not self.engine.budget.is_evicted(handle):
                return handle
            lin = self.model.pop(handle)
            self.engine.drop(handle)  # forget the evicted handle
            rebuilt = rebuild(self.engine, lin.chunks)
            self.model[rebuilt] = Lineage(lin.chunks, bool(lin.chunks), True)
            return rebuilt

        @invariant()
        def every_lineage_is_its_model(self):
            for handle in [h for h in self.model if self.resident(h)]:
                self.check(handle)

        def check(self, handle: str) -> None:
            if not self.resident(handle):  # evicted by an earlier check's fresh lineage
                return
            lin = self.model[handle]
            assert self.engine.tokens(handle) == lin.tokens, f"{handle}: tokens differ from the model"
            promised = self.facts.same_chunking_repeats and self.facts.crop_continue_is_fresh
            if not (lin.exact and promised):
                return
            digest = self.engine.digest(handle)
            logits = self.engine.logits(handle) if lin.has_logits else None
            fresh = rebuild(self.engine, lin.chunks)
            assert self.engine.digest(fresh) == digest, f"{handle}: digest differs from a fresh prefill's"
            if logits is not None:
                assert bool((self.engine.logits(fresh) == logits).all()), f"{handle}: logits differ from a fresh prefill's"
            self.engine.drop(fresh)

    EngineMachine.__name__ = f"EngineMachine_{engine_name.replace('-', '_')}"
    return EngineMachine


@pytest.mark.parametrize("engine_name", verb_engine_names())
def test_the_verbs_as_a_machine(engine_name):
    machine = make_machine(engine_name)
    machine.TestCase.settings = settings(max_examples=max(2, settings().max_examples // 10),
                                         stateful_step_count=get_steps(), deadline=None)
    machine.TestCase().runTest()
