"""Hypothesis properties of the executable specification (:mod:`unsee.spec`).

Each test is named after the statement of :mod:`unsee.spec.statements` it
checks (Lemma 1, Lemma 2 (i)/(ii), Theorem 1, Corollary 1 upper/lower bound);
tests whose names extend a statement's name are companions that show where the
statement stops binding (its boundary). The necessity of assumptions A1-A3
lives in ``prop_spec_assumptions.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import example, find, given
from hypothesis import strategies as st

from unsee.properties.strategies import (
    BAD_SANITIZERS,
    CORRECT_SANITIZER,
    HASH_CHAIN,
    SELECTIVE_READ,
    SpliceCase,
    any_step_functions,
    check_splice,
    effectful_runs,
    get_initial_state,
    hash_chains,
    missing_targets,
    observations,
    print_case,
    provenance_graphs,
    read_patterns,
    read_patterns_skipping,
    runs,
    sanitizers,
    scaled_settings,
    search_settings,
    selective_readers,
    splice_cases,
    targets,
    unseeded_samplers,
)
from unsee.spec import (
    CommittedEffect,
    Item,
    Observation,
    build_conservative_graph,
    build_selective_graph,
    certified_clean_is_prefix,
    compute_gain,
    compute_replay_invocations,
    counterfactual_stream,
    counterfactual_trajectory,
    first_entry,
    first_entry_turn,
    full_reset,
    get_certified_clean_set,
    get_replay_environment,
    influence_is_monotone,
    is_item_of,
    prefix_is_shared,
    record_observations,
    replay_cost_is_optimal,
    replay_cost_is_suffix_length,
    replay_tools,
    run_session,
    splice,
    trajectory,
)

# --- pinned cases ------------------------------------------------------------

#: Target at the first step of a one-step run: tau = 1, the only boundary is 0.
FIRST_STEP = SpliceCase(HASH_CHAIN, get_initial_state(HASH_CHAIN),
                        record_observations((Observation("user", (Item("s0", "a"),)),), (), ()), "s0", (0,))

#: An effect committed exactly at the boundary step is inside the snapshot, so
#: A3 holds at boundary 1 and the replayed read of ``k0`` at step 2 is the recorded one.
EFFECT_AT_BOUNDARY = SpliceCase(
    HASH_CHAIN, get_initial_state(HASH_CHAIN),
    record_observations((Observation("event"), Observation("tool", (Item("s0", "", "k0"),)),
                         Observation("user", (Item("s1", "a"),))),
                        (("k0", "a"),), (CommittedEffect(1, "k0", "new!"),)),
    "s1", (1,))

#: The target shares its observation with a clean item; the selective reader
#: ignores memory values, so the real and counterfactual states still differ (counter).
SHARED_MEMORY = SpliceCase(
    SELECTIVE_READ, get_initial_state(SELECTIVE_READ),
    record_observations((Observation("memory", (Item("s0", "a"), Item("s1", "b"))),
                         Observation("event"), Observation("user", (Item("s2", "c"),))), (), ()),
    "s1", (0, 1), CORRECT_SANITIZER)


def split(case: SpliceCase) -> tuple:
    return case.step, case.initial, case.run.observations, case.target


# --- Lemma 1 -----------------------------------------------------------------

@given(case=splice_cases())
@example(case=FIRST_STEP)
@example(case=SHARED_MEMORY)
def test_prefix_is_shared(case):
    """prefix_is_shared (Lemma 1): R_t = R^-z_t for t <= tau - 1, for the hash
    chain, the selective reader and the seeded sampler."""
    if not prefix_is_shared(*split(case)):
        print_case(case, "prefix_is_shared fails")
    assert prefix_is_shared(*split(case))


@given(case=splice_cases(steps=unseeded_samplers()))
def test_prefix_is_shared_needs_determinism(case):
    """prefix_is_shared (Lemma 1) rests on F being a function: with fresh
    entropy per call even the shared prefix differs as soon as tau > 1."""
    assert prefix_is_shared(*split(case)) == (case.tau == 1)


# --- Lemma 2 -----------------------------------------------------------------

@given(stream=observations(), data=st.data())
def test_influence_is_monotone(stream, data):
    """influence_is_monotone (Lemma 2 (i)): I_t(z) ⊆ I_{t+1}(z) on the
    conservative graph and on a selective (attributed) graph of the same stream."""
    target = data.draw(targets(stream), label="target")
    reads = data.draw(read_patterns(len(stream)), label="reads")
    assert influence_is_monotone(build_conservative_graph(stream), target)
    assert influence_is_monotone(build_selective_graph(stream, reads), target)


@given(graph=provenance_graphs(), target=st.sampled_from(("s0", "s1")))
def test_influence_is_monotone_on_any_append_only_graph(graph, target):
    """influence_is_monotone (Lemma 2 (i)) for arbitrary graphs built with add_artifact."""
    assert influence_is_monotone(graph, target)


@given(stream=observations(), data=st.data())
def test_first_entry_turn_matches_stream(stream, data):
    """Algorithm 1 line 2 agrees with the stream: FirstEntry on either graph is tau = first_entry."""
    target = data.draw(targets(stream), label="target")
    reads = data.draw(read_patterns(len(stream)), label="reads")
    tau = first_entry(stream, target)
    assert is_item_of(stream[tau - 1], target)
    assert first_entry_turn(build_conservative_graph(stream), target) == tau
    assert first_entry_turn(build_selective_graph(stream, reads), target) == tau


@given(stream=observations(), data=st.data())
def test_certified_clean_is_prefix(stream, data):
    """certified_clean_is_prefix (Lemma 2 (ii)): on the conservative graph
    A_T minus I_T(z) = {a : turn(a) < tau}, tau from first_entry."""
    target = data.draw(targets(stream), label="target")
    graph = build_conservative_graph(stream)
    assert certified_clean_is_prefix(graph, target, first_entry(stream, target))


def get_prefix_ids(graph, tau: int) -> frozenset[str]:
    return frozenset(a.id for a in graph.artifacts if a.turn < tau)


@given(stream=observations(), data=st.data())
def test_certified_clean_is_prefix_only_without_attribution(stream, data):
    """certified_clean_is_prefix (Lemma 2 (ii)) is about certifiability: with
    attribution (a selective graph whose turns never read the target's block)
    the clean set contains the prefix and every later turn, so it is strictly
    larger than the prefix whenever tau < T."""
    target = data.draw(targets(stream), label="target")
    tau = first_entry(stream, target)
    graph = build_selective_graph(stream, data.draw(read_patterns_skipping(len(stream), tau), label="reads"))
    clean, prefix = get_certified_clean_set(graph, target), get_prefix_ids(graph, tau)
    later = frozenset(f"{kind}:{t}" for t in range(tau + 1, len(stream) + 1) for kind in ("obs", "turn"))
    assert clean == prefix | later
    assert (clean > prefix) == (tau < len(stream))
    assert certified_clean_is_prefix(graph, target, tau) == (tau == len(stream))


def test_certified_clean_exceeds_prefix_example():
    """certified_clean_is_prefix (Lemma 2 (ii)) fails on an attributed graph:
    the smallest such stream and read pattern, found by search."""
    def exceeds(args):
        stream, reads, target = args
        graph = build_selective_graph(stream, reads)
        return get_certified_clean_set(graph, target) > get_prefix_ids(graph, first_entry(stream, target))
    cases = observations().flatmap(lambda s: st.tuples(st.just(s), read_patterns(len(s)), targets(s)))
    stream, reads, target = find(cases, exceeds, settings=search_settings())
    print("clean set larger than the prefix:", stream, reads, target)
    assert len(stream) >= 2


# --- Theorem 1 ---------------------------------------------------------------

@given(case=splice_cases(steps=any_step_functions(),
                         run_strategy=st.one_of(runs(), runs(with_effects=True), effectful_runs()),
                         sanitizer_strategy=sanitizers()))
@example(case=FIRST_STEP)
@example(case=EFFECT_AT_BOUNDARY)
@example(case=SHARED_MEMORY)
def test_splice_equals_counterfactual(case):
    """splice_equals_counterfactual (Theorem 1): whenever splice claims
    exactness, ~R_t = R^-z_t for all t >= c*. Checked at every single boundary
    b in 0..tau-1 and at the drawn checkpoint set, over any step function
    (unseeded ones included), runs with committed effects and bad sanitizers."""
    for boundary in range(case.tau):
        check_splice(case, (boundary,))
    check_splice(case)


@given(case=splice_cases())
@example(case=FIRST_STEP)
@example(case=EFFECT_AT_BOUNDARY)
@example(case=SHARED_MEMORY)
def test_splice_equals_counterfactual_is_exact_under_assumptions(case):
    """splice_equals_counterfactual (Theorem 1), constructive side: under A1-A3
    (deterministic or seeded F, the correct sanitizer, no effects after c*)
    splice claims exactness from every boundary b < tau, and its states are
    R^-z_b..R^-z_T; its final state is full_reset's."""
    step, initial, stream, target = split(case)
    stored = run_session(step, initial, case.run)
    twin = counterfactual_trajectory(step, initial, stream, target)
    reset = full_reset(step, initial, case.run, target)
    assert reset.state == twin[-1]
    assert reset.is_exact == (not case.run.effects)  # a full reset cannot undo a committed effect
    for checkpoints in [case.checkpoints] + [(b,) for b in range(case.tau)]:
        if any(e.step > max([c for c in checkpoints if c < case.tau], default=0) for e in case.run.effects):
            continue  # only EFFECT_AT_BOUNDARY has effects; A3 binds at its boundary 1 only
        result = splice(step, case.run, stored, target, checkpoints)
        assert result.is_exact, result.assumptions
        assert result.states == twin[result.boundary:]
        assert result.state == twin[-1]


@given(case=splice_cases(run_strategy=runs(with_effects=True)))
def test_replay_tools_reproduces_recorded_run(case):
    """The premise that lets splice check A2 before ReplayTools: on a recorded
    run, re-reading every tool after a boundary c with no later effects returns
    what the real run saw, ReplayTools(o_t) = o_t for t > c."""
    stream = case.run.observations
    for boundary in range(case.run.length):
        if all(effect.step <= boundary for effect in case.run.effects):
            environment = get_replay_environment(case.run, boundary)
            assert tuple(replay_tools(o, environment) for o in stream[boundary:]) == stream[boundary:]


def predict_violations(case: SpliceCase, boundary: int) -> tuple[str, ...]:
    """Which of A1-A3 fail, computed from the case, not by splice."""
    stream, target = case.run.observations, case.target
    a1 = case.step.randomness != "unseeded" and case.step.name != "undeclared_sampler"
    sanitized = [case.sanitizer(o, target) for o in stream]
    a2 = sanitized[boundary:] == list(counterfactual_stream(stream, target))[boundary:]
    a3 = all(effect.step <= boundary for effect in case.run.effects)
    return tuple(name for name, ok in (("A1", a1), ("A2", a2), ("A3", a3)) if not ok)


@given(case=splice_cases(steps=any_step_functions(),
                         run_strategy=st.one_of(runs(), runs(with_effects=True), effectful_runs()),
                         sanitizer_strategy=sanitizers()))
@example(case=EFFECT_AT_BOUNDARY)
def test_splice_equals_counterfactual_reports_violations(case):
    """splice_equals_counterfactual (Theorem 1) binds exactly when A1-A3 hold:
    splice's assumption report names the violated assumptions, no more, no less."""
    stored = run_session(case.step, case.initial, case.run)
    for boundary in range(case.tau):
        result = splice(case.step, case.run, stored, case.target, (boundary,), sanitizer=case.sanitizer)
        assert result.assumptions.get_violations() == predict_violations(case, boundary)
        assert result.is_exact == (predict_violations(case, boundary) == ())


@pytest.mark.parametrize("sanitizer", BAD_SANITIZERS, ids=lambda s: s.name)
def test_splice_equals_counterfactual_flags_bad_sanitizer(sanitizer):
    """splice_equals_counterfactual (Theorem 1), A2 check: every bad sanitizer is
    caught on a stream where the target shares its observation with another
    item that is followed by more content."""
    stream = (Observation("user", (Item("s0", "a"), Item("s1", "b"))), Observation("user", (Item("s2", "c"),)))
    run = record_observations(stream, (), ())
    stored = run_session(HASH_CHAIN, get_initial_state(HASH_CHAIN), run)
    result = splice(HASH_CHAIN, run, stored, "s0", (0,), sanitizer=sanitizer)
    assert result.assumptions.get_violations() == ("A2",)


# --- Corollary 1 -------------------------------------------------------------

@given(case=splice_cases(steps=any_step_functions(), sanitizer_strategy=sanitizers()), data=st.data())
@example(case=FIRST_STEP, data=None)
def test_replay_cost_is_suffix_length(case, data):
    """replay_cost_is_suffix_length (Corollary 1, upper bound): splice invokes F
    T - c* times, T - tau + 1 with a checkpoint at tau - 1; full_reset invokes
    it T times; the gain is T / (T - tau + 1)."""
    step, initial, _stream, target = split(case)
    length, tau = case.run.length, case.tau
    stored = run_session(step, initial, case.run)
    assert replay_cost_is_suffix_length(step, initial, case.run, target, case.checkpoints)
    result = splice(step, case.run, stored, target, case.checkpoints, sanitizer=case.sanitizer)
    assert result.invocations == length - result.boundary == compute_replay_invocations(length, result.boundary)
    assert len(result.states) == result.invocations + 1

    at_tau = tuple(sorted(set(case.checkpoints) | {tau - 1}))
    if data is not None:
        at_tau = tuple(sorted(set(data.draw(st.sets(st.integers(0, length), max_size=2), label="more"))
                              | {tau - 1}))
    assert replay_cost_is_suffix_length(step, initial, case.run, target, at_tau)
    best = splice(step, case.run, stored, target, at_tau, sanitizer=case.sanitizer)
    assert best.boundary == tau - 1
    assert best.invocations == length - tau + 1

    reset = full_reset(step, initial, case.run, target)
    assert reset.invocations == length
    assert compute_gain(length, tau) == length / (length - tau + 1)
    assert compute_gain(length, tau) == reset.invocations / best.invocations


@given(case=splice_cases(steps=hash_chains(), run_strategy=runs(max_size=4)))
@scaled_settings(0.5)
def test_replay_cost_is_optimal(case):
    """replay_cost_is_optimal (Corollary 1, lower bound) for the injective hash
    chain, T <= 4, by exhaustive search: no composition of fewer than
    T - tau + 1 applications of F from a stored state reaches R^-z_T."""
    if not replay_cost_is_optimal(*split(case)):
        print_case(case, "replay_cost_is_optimal fails")
    assert replay_cost_is_optimal(*split(case))


def test_replay_cost_is_optimal_is_worst_case():
    """replay_cost_is_optimal (Corollary 1, lower bound) is a worst-case
    statement: for the non-injective selective reader a shorter composition
    reaches R^-z_T (search finds the smallest such case). The goal state is not
    itself stored, so the shortcut is a composition of at least one F call."""
    def has_shortcut(case: SpliceCase) -> bool:
        real = run_session(case.step, case.initial, case.run)
        goal = counterfactual_trajectory(*split(case))[-1]
        return goal not in real and not replay_cost_is_optimal(*split(case))
    cases = splice_cases(steps=selective_readers(), run_strategy=runs(max_size=3))
    case = find(cases, has_shortcut, settings=search_settings(2))
    print_case(case, "replay_cost_is_optimal fails for a non-injective F")
    assert case.step.name == "selective_read" and case.run.length - case.tau >= 1


# --- error behaviour ----------------------------------------------------------

@given(stream=observations(), data=st.data())
def test_first_entry_rejects_missing_target(stream, data):
    """first_entry / FirstEntry raise ValueError naming a target that never enters."""
    target = data.draw(missing_targets(stream), label="target")
    with pytest.raises(ValueError) as caught:
        first_entry(stream, target)
    assert repr(target) in str(caught.value)
    with pytest.raises(ValueError) as caught:
        first_entry_turn(build_conservative_graph(stream), target)
    assert repr(target) in str(caught.value)


@given(case=splice_cases(), data=st.data())
def test_splice_rejects_missing_target(case, data):
    """splice (and so splice_equals_counterfactual) raises ValueError naming a target not in the stream."""
    target = data.draw(missing_targets(case.run), label="target")
    stored = run_session(case.step, case.initial, case.run)
    with pytest.raises(ValueError) as caught:
        splice(case.step, case.run, stored, target, case.checkpoints)
    assert repr(target) in str(caught.value)


@given(case=splice_cases(), data=st.data())
def test_splice_rejects_wrong_stored_length(case, data):
    """splice raises ValueError when the stored trajectory is not R_0..R_T."""
    stored = run_session(case.step, case.initial, case.run)
    cut = data.draw(st.integers(-len(stored), -1) | st.integers(1, 2), label="length change")
    wrong = stored[:cut] if cut < 0 else stored + stored[-1:] * cut
    with pytest.raises(ValueError, match="stored trajectory"):
        splice(case.step, case.run, wrong, case.target, case.checkpoints)


def test_spec_data_rejects_unknown_names():
    """Observation kinds and randomness declarations are closed vocabularies."""
    with pytest.raises(ValueError, match="kind"):
        Observation("email")
    with pytest.raises(ValueError, match="randomness"):
        type(HASH_CHAIN)("f", lambda s, o: s, "sometimes")


@given(stream=observations())
def test_trajectory_has_one_state_per_step(stream):
    """Equation (1) bookkeeping: T observations give R_0..R_T; the counterfactual
    stream differs from the real one at tau only, by exactly the target."""
    assert len(trajectory(HASH_CHAIN, "", stream)) == len(stream) + 1
    for t, observation in enumerate(stream, start=1):
        for source in observation.get_source_ids():
            twin = counterfactual_stream(stream, source)
            assert [u for u, (a, b) in enumerate(zip(stream, twin), start=1) if a != b] == [t]
            assert twin[t - 1].get_source_ids() == tuple(s for s in observation.get_source_ids() if s != source)
