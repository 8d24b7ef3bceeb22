"""The paper's statements as executable predicates.

Each name here is used once across the project: in this docstring-bearing
function, in the Hypothesis property that checks it (properties/), in the z3
proof (proofs/), and in the docs table (docs/statements.md).

| name                          | paper                          |
|-------------------------------|--------------------------------|
| prefix_is_shared              | Lemma 1                        |
| influence_is_monotone         | Lemma 2 (i)                    |
| certified_clean_is_prefix     | Lemma 2 (ii)                   |
| splice_equals_counterfactual  | Theorem 1                      |
| replay_cost_is_suffix_length  | Corollary 1 (upper bound)      |
| replay_cost_is_optimal        | Corollary 1 (lower bound)      |
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .environment import Run
from .provenance import ProvenanceGraph, get_certified_clean_set, get_influence_set, get_prefix_graph
from .splice import compute_replay_invocations, run_session, splice
from .transition import (
    Observation,
    State,
    StepFunction,
    counterfactual_stream,
    counterfactual_trajectory,
    first_entry,
    trajectory,
)


def prefix_is_shared(step: StepFunction, initial: State, observations: Sequence[Observation], target: str) -> bool:
    """Lemma 1: ``R_t = R^-z_t`` for all ``t <= tau - 1``."""
    tau = first_entry(observations, target)
    real = trajectory(step, initial, observations)
    twin = counterfactual_trajectory(step, initial, observations, target)
    return all(real[t] == twin[t] for t in range(tau))


def influence_is_monotone(graph: ProvenanceGraph, target: str) -> bool:
    """Lemma 2 (i): ``I_t(z) ⊆ I_{t+1}(z)`` for every turn of an append-only graph."""
    last = max((a.turn for a in graph.artifacts), default=0)
    sets = [get_influence_set(get_prefix_graph(graph, t), target) for t in range(last + 1)]
    return all(earlier <= later for earlier, later in itertools.pairwise(sets))


def certified_clean_is_prefix(graph: ProvenanceGraph, target: str, tau: int) -> bool:
    """Lemma 2 (ii): in the conservative graph the certified-clean set
    ``A_t \\ I_t(z)`` is exactly the prefix output ``{a : turn(a) < tau}``."""
    prefix = frozenset(a.id for a in graph.artifacts if a.turn < tau)
    return get_certified_clean_set(graph, target) == prefix


def splice_equals_counterfactual(step: StepFunction, initial: State, run: Run, target: str,
                                 checkpoints: Iterable[int] = (), **splice_options) -> bool:
    """Theorem 1: when A1-A3 hold, ``~R_t = R^-z_t`` for every ``t >= boundary``,
    in particular ``~R_T = R^-z_T``. A splice that does not claim exactness
    (an assumption failed) is not held to it."""
    stored = run_session(step, initial, run)
    result = splice(step, run, stored, target, checkpoints, **splice_options)
    if not result.is_exact:
        return True
    twin = trajectory(step, initial, counterfactual_stream(run.observations, target))
    return tuple(twin[result.boundary:]) == tuple(result.states)


def replay_cost_is_suffix_length(step: StepFunction, initial: State, run: Run, target: str,
                                 checkpoints: Iterable[int] = ()) -> bool:
    """Corollary 1 (upper bound): splice invokes ``F`` exactly ``T - boundary``
    times, which is ``T - tau + 1`` when a checkpoint sits at ``tau - 1``."""
    checkpoints = tuple(checkpoints)
    stored = run_session(step, initial, run)
    result = splice(step, run, stored, target, checkpoints)
    expected = compute_replay_invocations(run.length, result.boundary)
    if (result.tau - 1) in checkpoints and expected != run.length - result.tau + 1:
        return False
    return result.invocations == expected


def replay_cost_is_optimal(step: StepFunction, initial: State, observations: Sequence[Observation],
                           target: str) -> bool:
    """Corollary 1 (lower bound), by exhaustive search for small ``T``: no
    composition of fewer than ``T - tau + 1`` applications of ``F``, started
    from any stored real state and fed any recorded or counterfactual
    observation, yields ``R^-z_T`` -- unless ``R^-z_T`` is itself stored
    (then the target had no influence and the worst case does not apply)."""
    tau = first_entry(observations, target)
    length = len(observations)
    real = trajectory(step, initial, observations)
    goal = counterfactual_trajectory(step, initial, observations, target)[-1]
    if goal in real:
        return True  # R^-z_T is stored already (z had no lasting influence): not a worst case
    alphabet = tuple(dict.fromkeys(tuple(observations) + counterfactual_stream(observations, target)))
    for k in range(length - tau + 1):
        for start in real:
            for feed in itertools.product(alphabet, repeat=k):
                if _compose(step, start, feed) == goal:
                    return False
    return True


def _compose(step: StepFunction, state: State, feed: Sequence[Observation]) -> State:
    for observation in feed:
        state = step(state, observation)
    return state
