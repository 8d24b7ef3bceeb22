"""Checkpoints, the splicing operator, the full reset and the cost model
(paper, Theorem 1, Corollary 1 and Algorithm 1).

A checkpoint is named by its boundary ``c``: the stored state ``R_c`` can be
restored (in the runtime, by cropping the KV cache). ``R_0 = R_init`` is
always restorable, so the session-start checkpoint is implicit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from .environment import Run, get_environment_at, get_replay_environment, replay_tools
from .transition import (
    InvocationCounter,
    Observation,
    State,
    StepFunction,
    counterfactual_stream,
    first_entry,
    sanitize_observation,
    trajectory,
)

Sanitizer = Callable[[Observation, str], Observation]


# --- assumptions A1-A3 (Theorem 1) -------------------------------------------

def is_deterministic(step: StepFunction, state: State, observation: Observation) -> bool:
    """(A1) decoding is deterministic, or its randomness source is fixed.

    Checked twice over: the step function must not declare unseeded sampling,
    and two evaluations at the restore point must agree. The probe calls
    ``step.apply`` directly, so it is not a counted transition.
    """
    if step.randomness == "unseeded":
        return False
    return step.apply(state, observation) == step.apply(state, observation)


def is_sanitized_counterfactual(sanitized: Sequence[Observation], counterfactual: Sequence[Observation],
                                boundary: int) -> bool:
    """(A2) ``~o_t = o^-z_t`` for every replayed step ``t > boundary``.

    The paper states it for ``t >= tau`` with the checkpoint at ``tau - 1``;
    an earlier boundary replays more steps, so the check covers all of them.
    """
    return all(s == c for s, c in zip(sanitized[boundary:], counterfactual[boundary:], strict=True))


def has_no_committed_effects_after(run: Run, boundary: int) -> bool:
    """(A3) no external side effect was committed after the restore boundary,
    so restoring the environment snapshot makes the tool reads reproducible."""
    return all(effect.step <= boundary for effect in run.effects)


def is_recording_reproducible(run: Run, boundary: int) -> bool:
    """(A3, premise) every recorded tool read after the boundary is what the
    environment held at that step, so re-executing it can reproduce it. A
    hand-built run with a stale or nondeterministic tool fails this."""
    return all(item.value == get_environment_at(run, t).get(item.key, "")
               for t, o in enumerate(run.observations, start=1) if t > boundary
               for item in o.items if item.key is not None)


@attrs.frozen
class AssumptionReport:
    """Which of Theorem 1's assumptions held for one splice."""

    a1_deterministic: bool
    a2_sanitized_counterfactual: bool
    a3_no_committed_effects: bool

    @property
    def holds(self) -> bool:
        return self.a1_deterministic and self.a2_sanitized_counterfactual and self.a3_no_committed_effects

    def get_violations(self) -> tuple[str, ...]:
        names = {"A1": self.a1_deterministic, "A2": self.a2_sanitized_counterfactual,
                 "A3": self.a3_no_committed_effects}
        return tuple(name for name, ok in names.items() if not ok)


# --- checkpoints and cost ----------------------------------------------------

def get_restore_boundary(checkpoints: Iterable[int], tau: int) -> int:
    """Algorithm 1 line 4: ``c* = argmax{c in C : boundary(c) < tau}`` (0 if none)."""
    eligible = [c for c in checkpoints if 0 <= c < tau]
    return max(eligible, default=0)


def compute_replay_invocations(length: int, boundary: int) -> int:
    """Corollary 1: replay from ``boundary`` invokes ``F`` ``T - boundary`` times,
    which is ``T - tau + 1`` at the boundary ``tau - 1``."""
    return length - boundary


def compute_gain(length: int, tau: int) -> float:
    """Corollary 1: the gain of splicing over a full reset, ``T / (T - tau + 1)``."""
    return length / (length - tau + 1)


# --- the operators ----------------------------------------------------------

@attrs.frozen
class SpliceResult:
    """What :func:`splice` returns: the final state and how it got there."""

    state: State
    states: tuple[State, ...]  # ~R_boundary .. ~R_T
    tau: int
    boundary: int
    invocations: int
    sanitized: tuple[Observation, ...]  # ~o_1 .. ~o_T as replay saw them (prefix unchanged)
    assumptions: AssumptionReport

    @property
    def is_exact(self) -> bool:
        """Whether Theorem 1 licenses calling ``state`` the counterfactual ``R^-z_T``."""
        return self.assumptions.holds


def splice(step: StepFunction, run: Run, stored: Sequence[State], target: str,
           checkpoints: Iterable[int] = (), sanitizer: Sanitizer = sanitize_observation) -> SpliceResult:
    """Algorithm 1 and Theorem 1 (``splice_equals_counterfactual``).

    Restore ``R_{c*}`` from the stored real trajectory, then replay
    ``~o_t = ReplayTools(Sanitize(o_t, z))`` for ``t = c*+1..T``. The result
    reports ``tau``, the boundary, the number of ``F`` invocations and which
    assumptions held; only when all hold is the state claimed exact.
    """
    observations = run.observations
    if len(stored) != len(observations) + 1:
        raise ValueError(f"stored trajectory has {len(stored)} states, expected T+1 = {len(observations) + 1}")
    tau = first_entry(observations, target)
    boundary = get_restore_boundary(checkpoints, tau)
    environment = get_replay_environment(run, boundary)
    sanitized = tuple(sanitizer(o, target) for o in observations)
    replayed = observations[:boundary] + tuple(replay_tools(o, environment) for o in sanitized[boundary:])

    counter = InvocationCounter(step)
    states = trajectory(counter, stored[boundary], replayed[boundary:])
    report = AssumptionReport(
        # probed at every replayed transition, not only at the restore point
        a1_deterministic=all(is_deterministic(step, state, o) for state, o in zip(states, replayed[boundary:])),
        a2_sanitized_counterfactual=is_sanitized_counterfactual(
            sanitized, counterfactual_stream(observations, target), boundary),
        a3_no_committed_effects=(has_no_committed_effects_after(run, boundary)
                                 and is_recording_reproducible(run, boundary)),
    )
    return SpliceResult(states[-1], states, tau, boundary, counter.invocations, replayed, report)


def full_reset(step: StepFunction, initial: State, run: Run, target: str) -> SpliceResult:
    """The paper's B5: replay the counterfactual stream from ``R_init`` (``T`` invocations)."""
    return splice(step, run, (initial,) + (None,) * run.length, target, checkpoints=(0,))


def run_session(step: StepFunction, initial: State, run: Run) -> tuple[State, ...]:
    """The real trajectory ``R_0..R_T`` the operator stores."""
    return trajectory(step, initial, run.observations)
