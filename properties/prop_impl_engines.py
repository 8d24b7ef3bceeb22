"""The runtime's properties on the other engines: llama.cpp.

``prop_impl.py`` runs the episode-level properties on the tiny transformers
model; this module runs the same comparisons on every engine of
:func:`unsee.properties.engines.other_engine_names`: ``llamacpp-tiny`` (the
tiny random GGUF on llama.cpp) where llama-cpp-python is installed, or the
engines ``UNSEE_ENGINE`` names (``UNSEE_ENGINE=llamacpp`` runs them on the
embedded SmolLM2 GGUF). Nothing here knows which engine it runs on.

======================================  ==========================================================
test                                    checks (as in prop_impl.py)
======================================  ==========================================================
splice_equals_counterfactual            forget == full reset == the twin (digest, every token)
replay_cost_is_suffix_length            invocations == T - boundary, counted from outside
prefix_is_shared                        Lemma 1: R_t == R^-z_t for t < tau, R_tau != R^-z_tau
SpliceEqualsCounterfactualMachine       the state machine of repeated forgets and probes
engines_agree_on_structure              the same episode on this engine and on tiny: same tau,
                                        boundary, invocations and closure
======================================  ==========================================================

Budgets are fractions of the profile's examples: ``splice_equals_counterfactual``
half (30 under ``ci``, 1,000 under ``nightly``), the replay cost and the
prefix a quarter (15, 500), the structure and the machine a sixth (10, 333).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import example, given, settings

from unsee.impl.conform.episodes import episodes, get_tau, scaled
from unsee.properties.differential import (
    compare_forget_with_counterfactual,
    compare_forget_with_reset,
    compare_prefix_with_counterfactual,
    compare_replay_cost,
    engine_scope,
    run_episode,
)
from unsee.properties.engines import make_engine, other_engine_names
from unsee.properties.prop_impl import (
    ACROSS_SESSIONS,
    AFTER_COMPACTION,
    SpliceEqualsCounterfactualMachine,
    engine_for,
    note_coverage,
)

ENGINES = other_engine_names()
pytestmark = pytest.mark.skipif(not ENGINES, reason="no other engine: llama-cpp-python is not installed "
                                                    "(pip install 'unsee[llamacpp]')")
per_engine = pytest.mark.parametrize("engine_name", ENGINES)


@per_engine
@given(episode=episodes())
@example(episode=AFTER_COMPACTION)
@example(episode=ACROSS_SESSIONS)
@scaled(2)
def test_splice_equals_counterfactual(engine_name, episode):
    note_coverage(episode)
    engine = engine_for(engine_name)
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode)
        assert compare_forget_with_counterfactual(engine, episode) == report.digest


@per_engine
@given(episode=episodes())
@example(episode=ACROSS_SESSIONS)
@scaled(4)
def test_replay_cost_is_suffix_length(engine_name, episode):
    note_coverage(episode)
    engine = engine_for(engine_name)
    with engine_scope(engine):
        invocations = compare_replay_cost(engine, episode)
        assert 1 <= invocations <= len(episode.steps)


@per_engine
@given(episode=episodes())
@example(episode=AFTER_COMPACTION)
@scaled(4)
def test_prefix_is_shared(engine_name, episode):
    note_coverage(episode)
    engine = engine_for(engine_name)
    with engine_scope(engine):
        prefix = compare_prefix_with_counterfactual(engine, episode)
        assert len(prefix) == get_tau(episode)


def _machine(name: str):
    machine = type(f"SpliceEqualsCounterfactualMachine_{name.replace('-', '_')}",
                   (SpliceEqualsCounterfactualMachine,), {"engine_name": name})
    machine.TestCase.settings = settings(max_examples=max(1, settings().max_examples // 6),
                                         stateful_step_count=10)
    return machine.TestCase


for _name in ENGINES:
    globals()[f"TestSpliceEqualsCounterfactualMachine_{_name.replace('-', '_')}"] = _machine(_name)


@functools.cache
def _reference_engine():
    return make_engine("tiny")


@per_engine
@given(episode=episodes())
@example(episode=AFTER_COMPACTION)
@scaled(6)
def test_engines_agree_on_structure(engine_name, episode):
    """Cross-engine agreement: the same episode forgotten on this engine and
    on the tiny transformers model gives the same tau, restore boundary,
    invocations and closure (nothing of these depends on numerics; the
    generated tokens, and so checkpoint byte counts, may differ)."""
    note_coverage(episode)
    seen = []
    for engine in (engine_for(engine_name), _reference_engine()):
        with engine_scope(engine):
            runtime = run_episode(engine, episode)
            report = runtime.forget(episode.target.source)
            seen.append((report.tau, report.boundary, report.invocations, report.closure))
    assert seen[0] == seen[1], f"{engine_name} vs tiny: (tau, boundary, invocations, closure) {seen}"
