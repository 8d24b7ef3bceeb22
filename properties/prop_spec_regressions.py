"""Bugs found by the spec properties, pinned once found (one test each).

Each was a case where a spec statement returned False, i.e. where the spec
claimed more than it could vouch for. The fixes live in spec/; these keep
them fixed.
"""

from __future__ import annotations

from unsee.properties.strategies import HASH_CHAIN, SELECTIVE_READ, get_initial_state, make_seeded_sampler
from unsee.spec import (
    Item,
    Observation,
    Run,
    StepFunction,
    draw_unseeded_entropy,
    replay_cost_is_optimal,
    run_session,
    splice,
    splice_equals_counterfactual,
)


def test_replay_cost_is_optimal_exempts_any_stored_goal():
    """The counterfactual final state can be a stored state *before* tau (here
    R_0, for a step function that ignores the observation): a zero-cost route
    exists, so the worst-case lower bound does not apply."""
    stream = (Observation("user", (Item("s0", ""),)),)
    assert replay_cost_is_optimal(SELECTIVE_READ, get_initial_state(SELECTIVE_READ), stream, "s0")


def test_splice_equals_counterfactual_rejects_unreproducible_tool_reads():
    """A recorded tool value the environment cannot reproduce (a stale tool):
    replay reads something else, so splice must not claim exactness (A3)."""
    run = Run((Observation("user", (Item("s0", "a"),)), Observation("tool", (Item("s1", "stale", "k0"),))),
              (("k0", "fresh"),), ())
    initial = get_initial_state(HASH_CHAIN)
    assert splice_equals_counterfactual(HASH_CHAIN, initial, run, "s0")
    result = splice(HASH_CHAIN, run, run_session(HASH_CHAIN, initial, run), "s0")
    assert result.assumptions.get_violations() == ("A3",)


def test_splice_equals_counterfactual_probes_determinism_at_every_step():
    """A step declared deterministic that is seeded at the restore point but
    random afterwards: the A1 probe must run at every replayed transition."""
    seeded = make_seeded_sampler(7)

    def apply(state, observation):
        return seeded(state, observation) if state == () else (state, observation, draw_unseeded_entropy())

    step = StepFunction("seeded_then_unseeded", apply, "none")
    run = Run((Observation("user", (Item("s0", "a"),)), Observation("user", (Item("s1", "b"),))))
    assert splice_equals_counterfactual(step, (), run, "s0")
    result = splice(step, run, run_session(step, (), run), "s0")
    assert "A1" in result.assumptions.get_violations()
