"""``prefix_is_shared``: Lemma 1 (prefix sharing) of the paper.

    For all t <= tau - 1:  R_t = R^-z_t.

Proved by induction over an uninterpreted transition ``F`` (any runtime, any
model): the base case and the inductive step are each checked valid by z3.
The step is stated for a symbolic turn ``t`` with the induction hypothesis
and the defining equations of both trajectories instantiated at ``t`` as
ground facts, so every query is quantifier-free; the induction rule that
glues base and step into "for all t" is the only meta-level step.

Assumption (A1) is implicit: ``F`` is a z3 function, hence single-valued.

As a cross-check independent of the induction rule, the lemma is also
unrolled for every ``tau <= MAX_TAU``. Each proof is paired with a
deliberately false variant (the lemma extended to ``t = tau``, where the
observations differ) that z3 must refute.
"""

from __future__ import annotations

import z3

from unsee.proofs._z3util import (
    counterfactual_stream_at,
    prove,
    prove_each,
    refute,
    refute_each,
    transition_system,
    z_has_effect,
)

STATEMENT = "prefix_is_shared"

# Largest injection step of the unrolled cross-check (the induction proofs are
# unbounded; this only bounds the independent cross-check).
MAX_TAU = 8


def _vocabulary():
    ts = transition_system()
    R, Rcf = ts.trajectory("R"), ts.trajectory("Rcf")
    o, ocf = ts.stream("o"), ts.stream("ocf")
    return ts, R, Rcf, o, ocf


def _step_hypotheses(upper_offset: int) -> tuple[list[z3.BoolRef], z3.BoolRef]:
    """Hypotheses and goal of the inductive step for ``1 <= t <= tau - upper_offset``.

    ``upper_offset = 1`` is the lemma; ``upper_offset = 0`` is the false
    variant that also claims the turn ``tau`` itself.
    """
    ts, R, Rcf, o, ocf = _vocabulary()
    t, tau = z3.Ints("t tau")
    hypotheses = [
        t >= 1,
        t <= tau - upper_offset,
        R(t - 1) == Rcf(t - 1),  # induction hypothesis
        ts.step_eq(R, o, t),  # R_t = F(R_{t-1}, o_t)
        ts.step_eq(Rcf, ocf, t),  # R^-z_t = F(R^-z_{t-1}, o^-z_t)
        counterfactual_stream_at(o, ocf, tau, t),  # o^-z_t = o_t unless t = tau
        z_has_effect(o, ocf, tau),  # o^-z_tau != o_tau (keeps the false variant honest)
    ]
    return hypotheses, R(t) == Rcf(t)


def test_prefix_is_shared_base_case():
    """prefix_is_shared, base: R_0 = R_init = R^-z_0 (and t = 0 <= tau - 1 as tau >= 1)."""
    ts, R, Rcf, _, _ = _vocabulary()
    tau = z3.Int("tau")
    hypotheses = [tau >= 1, R(0) == ts.init, Rcf(0) == ts.init]
    prove(STATEMENT, "base case t = 0", hypotheses, z3.And(0 <= tau - 1, R(0) == Rcf(0)), bound="unbounded")


def test_prefix_is_shared_inductive_step():
    """prefix_is_shared, step: R_{t-1} = R^-z_{t-1} and 1 <= t <= tau - 1 imply R_t = R^-z_t."""
    hypotheses, goal = _step_hypotheses(upper_offset=1)
    prove(STATEMENT, "inductive step, symbolic t", hypotheses, goal, bound="unbounded")


def test_prefix_is_shared_false_variant_at_tau_is_refuted():
    """prefix_is_shared must NOT extend to t = tau: there o_tau != o^-z_tau, so the step fails."""
    hypotheses, goal = _step_hypotheses(upper_offset=0)
    refute(STATEMENT, "false variant: step up to t <= tau", hypotheses, goal, bound="unbounded")


def _unrolled(tau: int):
    """Both trajectories written out for turns 0..tau, no induction involved."""
    ts, R, Rcf, o, ocf = _vocabulary()
    hypotheses = [R(0) == ts.init, Rcf(0) == ts.init, z_has_effect(o, ocf, tau)]
    hypotheses += ts.steps(R, o, tau) + ts.steps(Rcf, ocf, tau)
    hypotheses += [counterfactual_stream_at(o, ocf, tau, t) for t in range(1, tau + 1)]
    return hypotheses, R, Rcf


def test_prefix_is_shared_unrolled_up_to_bound():
    """prefix_is_shared, cross-check: for every tau <= MAX_TAU, all of R_0..R_{tau-1} equal R^-z_0..R^-z_{tau-1}."""

    def instance(tau):
        hypotheses, R, Rcf = _unrolled(tau)
        return hypotheses, z3.And([R(t) == Rcf(t) for t in range(tau)])

    instances = (instance(tau) for tau in range(1, MAX_TAU + 1))
    prove_each(STATEMENT, "unrolled, every tau", instances, bound=f"1 <= tau <= {MAX_TAU}")


def test_prefix_is_shared_unrolled_false_variant_is_refuted():
    """prefix_is_shared must NOT hold at t = tau even when unrolled: R_tau may differ from R^-z_tau."""

    def instance(tau):
        hypotheses, R, Rcf = _unrolled(tau)
        return hypotheses, R(tau) == Rcf(tau)

    instances = (instance(tau) for tau in range(1, MAX_TAU + 1))
    refute_each(STATEMENT, "false variant: unrolled, also t = tau", instances, bound=f"1 <= tau <= {MAX_TAU}")
