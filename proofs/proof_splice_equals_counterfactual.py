"""``splice_equals_counterfactual``: Theorem 1 (splicing equivalence) of the paper.

Restore a checkpoint at a clean boundary ``b <= tau - 1`` (``b = tau - 1`` in
the paper, or any earlier one), then replay:

    ~R_b = R_b,   ~R_t = F(~R_{t-1}, ~o_t)  for t >= b + 1.

If (A2) ``~o_t = o^-z_t`` for every ``t >= b + 1``, then ``~R_t = R^-z_t`` for
all ``t >= b``; in particular ``~R_T = R^-z_T``.

(A1) is implicit: ``F`` is an uninterpreted z3 function, hence single-valued.
(A3) is what makes (A2) achievable at run time (tool observations are
reproducible from a snapshot); logically it only enters through (A2), which is
stated as a hypothesis. Before ``tau``, (A2) asks nothing new: there
``o^-z_t = o_t``, the recorded observation.

Proved by induction over an uninterpreted ``F``: base case and inductive step
each valid, the step for a symbolic ``t`` with ground hypotheses. The base
case uses Lemma 1 (``prefix_is_shared``, proved in proof_prefix_is_shared.py)
at ``b`` as a hypothesis, exactly as the paper's proof does. A cross-check
unrolls the whole splice for every ``T <= MAX_T``, ``tau`` and ``b``, deriving
Lemma 1 on the way instead of assuming it.

False variants that z3 must refute: the step without (A2), a restore from the
tainted checkpoint ``b = tau``, and a replay of the recorded (unsanitized)
stream.
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

STATEMENT = "splice_equals_counterfactual"

# Longest session of the unrolled cross-check (every 1 <= tau <= T and
# 0 <= b <= tau - 1 is checked). The induction proofs are unbounded.
MAX_T = 6
BOUND = f"T <= {MAX_T}, 1 <= tau <= T, 0 <= b < tau"


def _vocabulary():
    ts = transition_system()
    R, Rcf, Rsp = ts.trajectory("R"), ts.trajectory("Rcf"), ts.trajectory("R_tilde")
    o, ocf, osp = ts.stream("o"), ts.stream("ocf"), ts.stream("o_tilde")
    return ts, R, Rcf, Rsp, o, ocf, osp


def a2_at(osp, ocf, b, t) -> z3.BoolRef:
    """(A2) instantiated at ``t``: the replayed observation is the counterfactual one."""
    return z3.Implies(t >= b + 1, osp(t) == ocf(t))


def test_splice_equals_counterfactual_base_case():
    """splice_equals_counterfactual, base t = b: ~R_b = R_b (restore) = R^-z_b (Lemma 1, b <= tau - 1)."""
    _, R, Rcf, Rsp, _, _, _ = _vocabulary()
    b, tau = z3.Ints("b tau")
    hypotheses = [
        0 <= b,
        b <= tau - 1,
        Rsp(b) == R(b),  # the restore operation: crop the cache to the checkpoint at b
        R(b) == Rcf(b),  # prefix_is_shared at b, valid since b <= tau - 1
    ]
    prove(STATEMENT, "base case t = b", hypotheses, Rsp(b) == Rcf(b), bound="unbounded")


def _step(with_a2: bool) -> tuple[list[z3.BoolRef], z3.BoolRef]:
    ts, _, Rcf, Rsp, _, ocf, osp = _vocabulary()
    t, b = z3.Ints("t b")
    hypotheses = [
        b >= 0,
        t >= b + 1,
        Rsp(t - 1) == Rcf(t - 1),  # induction hypothesis
        ts.step_eq(Rsp, osp, t, first=b + 1),  # ~R_t = F(~R_{t-1}, ~o_t), defined from b + 1 on
        ts.step_eq(Rcf, ocf, t),  # R^-z_t = F(R^-z_{t-1}, o^-z_t)
    ]
    if with_a2:
        hypotheses.append(a2_at(osp, ocf, b, t))
    return hypotheses, Rsp(t) == Rcf(t)


def test_splice_equals_counterfactual_inductive_step():
    """splice_equals_counterfactual, step: ~R_{t-1} = R^-z_{t-1}, t >= b + 1 and (A2) imply ~R_t = R^-z_t."""
    hypotheses, goal = _step(with_a2=True)
    prove(STATEMENT, "inductive step, symbolic t", hypotheses, goal, bound="unbounded")


def test_splice_equals_counterfactual_false_variant_without_a2_is_refuted():
    """splice_equals_counterfactual needs (A2): without it the replayed step may leave the counterfactual."""
    hypotheses, goal = _step(with_a2=False)
    refute(STATEMENT, "false variant: step without (A2)", hypotheses, goal, bound="unbounded")


def test_splice_equals_counterfactual_false_variant_tainted_checkpoint_is_refuted():
    """splice_equals_counterfactual needs b <= tau - 1: restoring R_tau (which read z) is not R^-z_tau."""
    ts, R, Rcf, Rsp, o, ocf, _ = _vocabulary()
    tau = z3.Int("tau")
    hypotheses = [
        tau >= 1,
        Rsp(tau) == R(tau),  # restore the checkpoint taken after z was read
        R(tau - 1) == Rcf(tau - 1),  # prefix_is_shared at tau - 1
        ts.step_eq(R, o, tau),
        ts.step_eq(Rcf, ocf, tau),
        z_has_effect(o, ocf, tau),
    ]
    refute(STATEMENT, "false variant: base case at b = tau", hypotheses, Rsp(tau) == Rcf(tau), bound="unbounded")


def _unrolled_splice(T: int, tau: int, b: int, sanitized: bool):
    """A whole session, its counterfactual and the splice from ``b``, all ground."""
    ts, R, Rcf, Rsp, o, ocf, osp = _vocabulary()
    hypotheses = [R(0) == ts.init, Rcf(0) == ts.init, z_has_effect(o, ocf, tau)]
    hypotheses += ts.steps(R, o, T) + ts.steps(Rcf, ocf, T)
    hypotheses += [counterfactual_stream_at(o, ocf, tau, t) for t in range(1, T + 1)]
    hypotheses += [Rsp(b) == R(b)] + ts.steps(Rsp, osp, T, first=b + 1)
    replayed = ocf if sanitized else o  # (A2), or the recorded stream with z still in
    hypotheses += [osp(t) == replayed(t) for t in range(b + 1, T + 1)]
    return hypotheses, Rsp, Rcf


def _all_splices():
    for T in range(1, MAX_T + 1):
        for tau in range(1, T + 1):
            for b in range(tau):
                yield T, tau, b


def test_splice_equals_counterfactual_unrolled_up_to_bound():
    """splice_equals_counterfactual, cross-check: ~R_t = R^-z_t for all b <= t <= T, every T <= MAX_T, tau, b."""

    def instance(T, tau, b):
        hypotheses, Rsp, Rcf = _unrolled_splice(T, tau, b, sanitized=True)
        return hypotheses, z3.And([Rsp(t) == Rcf(t) for t in range(b, T + 1)])

    instances = (instance(*case) for case in _all_splices())
    prove_each(STATEMENT, "unrolled, every T, tau, b", instances, bound=BOUND)


def test_splice_equals_counterfactual_unrolled_false_variant_unsanitized_is_refuted():
    """splice_equals_counterfactual fails when replaying the recorded stream (z not removed)."""

    def instance(T, tau, b):
        hypotheses, Rsp, Rcf = _unrolled_splice(T, tau, b, sanitized=False)
        return hypotheses, Rsp(T) == Rcf(T)

    instances = (instance(*case) for case in _all_splices())
    refute_each(STATEMENT, "false variant: unrolled replay of o, not o^-z", instances, bound=BOUND)
