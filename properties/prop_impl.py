"""Differential properties of the runtime on the tiny model (:mod:`unsee.impl`).

Hypothesis draws whole episodes (``impl/conform/episodes.py``: 2-8 steps of
every kind, one target entering at any ``tau``, greedy or seeded sampling,
every checkpoint policy) and runs them on the tiny random Llama; the
comparisons of ``properties/differential.py`` run both sides of each claim
and print every input on a mismatch. Tests are named after the statements of
:mod:`unsee.spec.statements` they check:

======================================  ==========================================================
test                                    checks
======================================  ==========================================================
splice_equals_counterfactual            forget == full reset == a twin that never saw the target
                                        (digest and every generated token id)
splice_equals_counterfactual_in_spec    the runtime's F lifted into the spec: spec ``splice``
                                        lands on forget's digest, tau, boundary and invocations
replay_cost_is_suffix_length            F calls counted from outside are the suffix
                                        ``boundary+1..T``: ``T - tau + 1`` at ``tau - 1``
prefix_is_shared                        R_t == R^-z_t for t < tau, and R_tau != R^-z_tau
influence_is_monotone                   artifact graph lifted into the spec: influence set ==
                                        taint closure, same tau, monotone (Lemma 2 (i))
no_forget_differs_from_counterfactual   B0 (no forget) differs from the reset exactly while
                                        a resident block still carries the target
SpliceEqualsCounterfactualMachine       model vs impl: observe / forget / forget again / probe
                                        in any order; after each, the runtime equals a fresh
                                        runtime that ran the stream without the forgotten sources
======================================  ==========================================================

Example counts are fractions of the profile's ``max_examples`` (see the
``scaled(...)`` decorators), plus the pinned ``@example`` episodes. Under
``UNSEE_PROFILE=ci`` on a shared 2-core machine (one torch thread):

======================================  ===========================  ========
test                                    examples (ci)                 wall
======================================  ===========================  ========
splice_equals_counterfactual            60 + 2 pinned                  5.8 s
replay_cost_is_suffix_length            60 + 1 pinned                  3.7 s
splice_equals_counterfactual_in_spec    30 + 1 pinned                  3.0 s
prefix_is_shared                        60 + 1 pinned                  2.4 s
SpliceEqualsCounterfactualMachine       30 runs of up to 10 rules      2.2 s
no_forget_differs_from_counterfactual   30 + 2 pinned                  1.6 s
influence_is_monotone                   60 + 1 pinned                  1.1 s
======================================  ===========================  ========

about 25 s for the module with imports; ``nightly`` (2000 / 1000 examples)
takes about 11 minutes.
"""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from unsee.impl.agent.episode import Settings, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.conform.episodes import (
    SYSTEMS,
    episodes,
    get_coverage_labels,
    get_tau,
    parse_step,
    runtime_settings,
    scaled,
    step_jsons,
    texts,
)
from unsee.impl.engines.hf.engine import KVEngine
from unsee.properties.differential import (
    check_agreement,
    compare_forget_with_counterfactual,
    compare_forget_with_reset,
    compare_graph_with_spec,
    compare_no_forget_with_reset,
    compare_prefix_with_counterfactual,
    compare_replay_cost,
    compare_with_spec,
    describe_runtime,
    engine_scope,
    get_counterfactual_steps,
    run_episode,
)
from unsee.properties.engines import make_engine


@functools.cache
def tiny_engine() -> KVEngine:
    """One engine per module (loading the tiny model is cheap, but once is enough).
    Runtimes are never shared between examples: each builds its own in an
    :func:`engine_scope` that drops its caches afterwards."""
    return make_engine("tiny")


@functools.cache
def engine_for(name: str):
    """One engine per module and name (see :func:`tiny_engine`)."""
    return make_engine(name)


#: This module's model calls run on one thread (properties/conftest.py, :func:`torch_threads`).
pytestmark = pytest.mark.usefixtures("one_thread")


def note_coverage(episode) -> None:
    for label in get_coverage_labels(episode):
        event(label)


def episode_of(raw: dict):
    return parse_episode({"format": "unsee.episode", "version": 1, **raw})


#: The target enters at the last step of a session that compacted before it:
#: tau = T, the restore boundary sits on the second lineage.
AFTER_COMPACTION = episode_of({
    "system": "Be brief.", "settings": {"max_new_tokens": 3, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "Bob 7"}, {"id": "t2", "kind": "compact"},
              {"id": "t3", "kind": "memory", "records": [{"source": "t3.0", "text": "tea"},
                                                         {"source": "secret", "text": "4417 Elm"}]}],
    "target": {"source": "secret", "value": "4417 Elm"}})

#: A memory target re-injected by a new session, under seeded sampling and
#: the session_start policy (boundary 0, T invocations).
ACROSS_SESSIONS = episode_of({
    "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 4, "temperature": 0.7, "seed": 3, "checkpoint_policy": "session_start"},
    "steps": [{"id": "t1", "kind": "memory", "records": [{"source": "secret", "text": "4417 Elm"}]},
              {"id": "t2", "kind": "plan", "text": "pay 12", "tool": "pay"}, {"id": "t3", "kind": "remember"},
              {"id": "t4", "kind": "session"}, {"id": "t5", "kind": "user", "text": "call Ana"}],
    "target": {"source": "secret", "value": "4417 Elm"}})

#: A user target that a new session drops from the live state: nothing
#: resident carries it any more, so B0's state *is* the counterfactual one.
ERASED_BY_SESSION = episode_of({
    "system": "Be brief.", "settings": {"max_new_tokens": 2, "checkpoint_policy": "before_injection"},
    "steps": [{"id": "t1", "kind": "user", "source": "secret", "text": "4417 Elm"}, {"id": "t2", "kind": "session"},
              {"id": "t3", "kind": "user", "text": "tea"}],
    "target": {"source": "secret", "value": "4417 Elm"}})


# --- Theorem 1 --------------------------------------------------------------------

@given(episode=episodes())
@example(episode=AFTER_COMPACTION)
@example(episode=ACROSS_SESSIONS)
@scaled(1)
def test_splice_equals_counterfactual(episode):
    """forget == full_reset (digest, generated tokens, invocations) and forget == the twin."""
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode)
        assert compare_forget_with_counterfactual(engine, episode) == report.digest


@given(episode=episodes(max_steps=6))
@example(episode=AFTER_COMPACTION)
@scaled(2)
def test_splice_equals_counterfactual_in_spec(episode):
    """The spec's splice over the runtime's lifted F agrees with the runtime's forget."""
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        result = compare_with_spec(engine, episode)
        assert result.is_exact


# --- Corollary 1 ------------------------------------------------------------------

@given(episode=episodes())
@example(episode=ACROSS_SESSIONS)
@scaled(1)
def test_replay_cost_is_suffix_length(episode):
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        invocations = compare_replay_cost(engine, episode)
        assert 1 <= invocations <= len(episode.steps)


# --- Lemma 1 and Lemma 2 (i) ------------------------------------------------------------

@given(episode=episodes())
@example(episode=AFTER_COMPACTION)
@scaled(1)
def test_prefix_is_shared(episode):
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        prefix = compare_prefix_with_counterfactual(engine, episode)
        assert len(prefix) == get_tau(episode)  # R_0 .. R_{tau-1}


@given(episode=episodes())
@example(episode=ACROSS_SESSIONS)
@scaled(1)
def test_influence_is_monotone(episode):
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        runtime = run_episode(engine, episode)
        closure = compare_graph_with_spec(runtime, episode.target.source, episode)
        assert closure  # the source block itself


# --- the property that can fail: no forget (B0) -------------------------------------------

@given(episode=episodes())
@example(episode=ERASED_BY_SESSION)
@example(episode=AFTER_COMPACTION)
@scaled(2)
def test_no_forget_differs_from_counterfactual(episode):
    """Without forget the state is not the counterfactual one while anything
    resident carries the target (and its KV differs while the target's block
    is cached). It is *not* unconditional: a session that re-opens on an
    untainted memory store drops the target from the live state
    (``ERASED_BY_SESSION``), although the log and the checkpoints still hold it."""
    note_coverage(episode)
    engine = tiny_engine()
    with engine_scope(engine):
        differs = compare_no_forget_with_reset(engine, episode)
    event("B0 differs" if differs else "B0 equals the counterfactual: nothing resident carries the target")


# --- model vs impl: repeated forgets ------------------------------------------------------

class SpliceEqualsCounterfactualMachine(RuleBasedStateMachine):
    """Observe steps, forget sources (one or two at a time, again and again),
    probe; the runtime must always equal a fresh runtime that ran the observed
    stream with every forgotten source removed."""

    sources = Bundle("sources")
    forgotten = Bundle("forgotten")

    #: the engine it runs on (properties/engines.py; prop_impl_engines.py subclasses it per engine)
    engine_name = "tiny"

    def __init__(self):
        super().__init__()
        self.engine = tiny_engine() if self.engine_name == "tiny" else engine_for(self.engine_name)
        self.scope = engine_scope(self.engine)
        self.scope.__enter__()
        self.runtime: AgentRuntime | None = None
        self.twin: AgentRuntime | None = None
        self.observed = []
        self.removed: list[str] = []
        self.pending = 0  # observed sources not forgotten yet

    @initialize(target=sources, raw=runtime_settings(), system=st.sampled_from(SYSTEMS), data=st.data())
    def start(self, raw, system, data):
        """A fresh session that has read two steps with content (so that most
        rules are enabled from the start; Hypothesis gives up on a rule draw
        when too few are)."""
        self.settings, self.system = Settings(**raw), system
        self.runtime = AgentRuntime.start(self.engine, system, self.settings)
        self.twin = AgentRuntime.start(self.engine, system, self.settings)
        found = []
        for _ in range(2):
            kind = data.draw(st.sampled_from(("user", "memory", "tool", "plan")), label="kind")
            found += self.read(data, kind)
        return multiple(*found)

    def read(self, data, kind: str | None = None) -> list[str]:
        step = parse_step(data.draw(step_jsons(f"t{len(self.observed) + 1}", kind), label="step"))
        self.observed.append(step)
        self.runtime.step(step)
        self.twin.step(step)  # its sources are new: nothing to remove
        self.pending += len(step.items)
        return [item.source for item in step.items]

    def rebuild_twin(self) -> None:
        self.twin = AgentRuntime.start(self.engine, self.system, self.settings)
        self.twin.run(get_counterfactual_steps(self.observed, self.removed))

    @rule(target=sources, data=st.data())
    def observe(self, data):
        return multiple(*self.read(data))

    @rule(target=forgotten, source=consumes(sources))
    def forget(self, source):
        report = self.runtime.forget(source)
        self.removed.append(source)
        self.pending -= 1
        self.rebuild_twin()
        assert report.invocations == report.length - report.boundary
        return source

    @precondition(lambda self: self.pending >= 2)
    @rule(target=forgotten, first=consumes(sources), second=consumes(sources))
    def forget_two(self, first, second):
        report = self.runtime.forget_many([first, second])
        self.removed += [first, second]
        self.pending -= 2
        self.rebuild_twin()
        assert report.invocations == report.length - report.boundary
        return multiple(first, second)

    @rule(source=forgotten)
    def forget_again(self, source):
        """A repeated forget is a no-op (the state already is the twin's)."""
        before = self.runtime.digest()
        report = self.runtime.forget(source)
        assert report.already_forgotten and report.invocations == 0
        assert self.runtime.digest() == before

    @rule(question=texts())
    def probe(self, question):
        before = self.runtime.digest()
        answer = self.runtime.probe(question, max_new_tokens=2)
        assert isinstance(answer, str)
        assert self.runtime.digest() == before

    @invariant()
    def equals_counterfactual(self):
        self.runtime.check_invariants()
        check_agreement(
            "runtime after forgets vs counterfactual runtime",
            {"system": self.system, "settings": repr(self.settings),
             "observed": json.dumps([[s.id, s.kind, s.tool, [[i.source, i.text] for i in s.items]]
                                     for s in self.observed]),
             "forgotten": self.removed},
            {"runtime": describe_runtime(self.runtime), "twin": describe_runtime(self.twin)},
            [("digest", self.runtime.digest(), self.twin.digest()),
             ("generated tokens", self.runtime.generated_tokens(), self.twin.generated_tokens()),
             ("t", self.runtime.t, len(self.observed))])

    def teardown(self):
        self.scope.__exit__(None, None, None)


SpliceEqualsCounterfactualMachine.TestCase.settings = settings(
    max_examples=max(1, settings().max_examples // 2), stateful_step_count=10)
TestSpliceEqualsCounterfactualMachine = SpliceEqualsCounterfactualMachine.TestCase
