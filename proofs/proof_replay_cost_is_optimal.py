"""``replay_cost_is_optimal``: Corollary 1 (recomputation lower bound) of the paper.

Lower bound: an operator that may only read the stored real trajectory
``R_0..R_T`` (and the observation log) and invoke ``F`` needs at least
``T - tau + 1`` invocations of ``F`` to output ``R^-z_T``, in the worst case.
Upper bound: the splice from ``R_{tau-1}`` with ``o^-z_tau..o^-z_T`` uses
exactly ``T - tau + 1`` and reaches ``R^-z_T``, so the bound is tight.

The worst case is an *injective* ``F`` that never returns ``R_init`` (a
runtime whose state keeps its whole history, as a KV cache does), and a
target with an effect, ``o^-z_tau != o_tau``. Any state an operator can build
is a term ``F(...F(F(R_s, x_1), x_2)..., x_k)``: ``F`` has one state argument,
so a program's output is one such chain, whatever else it computed. The
check takes the start ``R_s`` among all stored states and the observations
``x_i`` as *free* Obs constants, which covers the recorded ``o_t``,
``o^-z_t``, and anything else an operator could feed in.

Bounded check: every ``T <= MAX_T``, ``1 <= tau <= T``, ``0 <= s <= T`` and
every chain length ``k < T - tau + 1``. The two universal axioms on ``F`` are
instantiated on the ground ``F``-terms of each query (sound: each instance
is implied by the axiom), so every query is quantifier-free and decidable.

False variants z3 must refute, one per hypothesis, showing none is idle:
a lower bound of ``T - tau + 2`` (one more than the splice needs); no effect
of z; a non-injective ``F``; an ``F`` that may return ``R_init``.

Unbounded version, for symbolic ``T``, ``tau``, ``s``, ``k``: three lemmas,
each by induction (base and step valid, ground hypotheses), then one ground
combination that uses their instances.

- ``depth``: a state's depth (a ghost turn counter: ``depth(R_init) = 0``,
  ``depth(F(r, x)) = depth(r) + 1``) grows by one per application, so a chain
  of ``k`` steps from ``R_s`` has depth ``s + k`` and ``R^-z_T`` has depth
  ``T``. The counter is this version's form of "F never returns R_init"
  (every runtime state knows its turn index; the KV cache only grows).
- ``divergence``: ``R_t != R^-z_t`` for every ``t >= tau`` (injectivity and
  ``o_tau != o^-z_tau``).
- ``peel``: if ``k`` steps reach ``R^-z_m`` (``k <= m``), the chain started
  at ``R^-z_{m-k}`` (injectivity, downward induction).

Combination: depth forces ``s = T - k >= tau``, peel gives
``R_s = R^-z_s``, divergence forbids it.
"""

from __future__ import annotations

import z3

from unsee.proofs._z3util import (
    counterfactual_stream_at,
    injective_on,
    prove,
    prove_each,
    refute,
    refute_each,
    transition_system,
    z_has_effect,
)

STATEMENT = "replay_cost_is_optimal"

# Longest session checked; every tau, start state and shorter chain under it.
MAX_T = 6

BOUND = f"T <= {MAX_T}, 1 <= tau <= T, start R_0..R_T, k < T - tau + 1"


def _instance(T: int, tau: int, s: int, chain_obs, *, injective=True, never_init=True, z_effect=True):
    """Hypotheses and the chain ``F^k(R_s, x_1..x_k)`` for one (T, tau, s, k).

    ``chain_obs(ts, ocf)`` gives the observations ``x_1..x_k`` fed to ``F``.
    """
    ts = transition_system()
    R, Rcf = ts.trajectory("R"), ts.trajectory("Rcf")
    o, ocf = ts.stream("o"), ts.stream("ocf")

    chain = R(s)
    f_terms = [ts.F(R(t - 1), o(t)) for t in range(1, T + 1)]
    f_terms += [ts.F(Rcf(t - 1), ocf(t)) for t in range(1, T + 1)]
    for x in chain_obs(ts, ocf):
        chain = ts.F(chain, x)
        f_terms.append(chain)

    hypotheses = [R(0) == ts.init, Rcf(0) == ts.init]
    hypotheses += ts.steps(R, o, T) + ts.steps(Rcf, ocf, T)
    hypotheses += [counterfactual_stream_at(o, ocf, tau, t) for t in range(1, T + 1)]
    if z_effect:
        hypotheses.append(z_has_effect(o, ocf, tau))
    hypotheses += injective_on(ts, f_terms, injective=injective, never_init=never_init)
    return hypotheses, chain, Rcf(T)


def _free_obs(k: int):
    """``k`` unconstrained observations: the operator may feed in anything."""
    return lambda ts, _ocf: [z3.Const(f"x_{i}", ts.obs) for i in range(1, k + 1)]


def _splice_obs(T: int, tau: int):
    """The splice's observations ``o^-z_tau..o^-z_T``."""
    return lambda _ts, ocf: [ocf(t) for t in range(tau, T + 1)]


def _sessions():
    for T in range(1, MAX_T + 1):
        for tau in range(1, T + 1):
            yield T, tau


def _cannot_reach(hypotheses, chain, target):
    return hypotheses, chain != target


def test_replay_cost_is_optimal_lower_bound():
    """replay_cost_is_optimal: fewer than T - tau + 1 applications of F never yield R^-z_T."""

    def instances():
        for T, tau in _sessions():
            for k in range(T - tau + 1):
                for s in range(T + 1):
                    yield _cannot_reach(*_instance(T, tau, s, _free_obs(k)))

    prove_each(STATEMENT, "lower bound, every shorter chain", instances(), bound=BOUND)


def test_replay_cost_is_optimal_splice_attains_bound():
    """replay_cost_is_optimal, tightness: F^(T-tau+1)(R_{tau-1}, o^-z_tau..o^-z_T) = R^-z_T."""

    def instances():
        for T, tau in _sessions():
            hypotheses, chain, target = _instance(T, tau, tau - 1, _splice_obs(T, tau))
            yield hypotheses, chain == target

    prove_each(STATEMENT, "upper bound: the splice reaches R^-z_T", instances(), bound=f"T <= {MAX_T}, 1 <= tau <= T")


def test_replay_cost_is_optimal_false_variant_bound_plus_one_is_refuted():
    """replay_cost_is_optimal must not over-claim: T - tau + 1 applications CAN reach R^-z_T."""

    def instances():
        for T, tau in _sessions():
            yield _cannot_reach(*_instance(T, tau, tau - 1, _free_obs(T - tau + 1)))

    refute_each(STATEMENT, "false variant: lower bound T - tau + 2", instances(), bound=f"T <= {MAX_T}, 1 <= tau <= T")


def test_replay_cost_is_optimal_false_variant_without_z_effect_is_refuted():
    """replay_cost_is_optimal needs o^-z_tau != o_tau: if z changed nothing, R_T itself may be R^-z_T (k = 0)."""

    def instances():
        for T, tau in _sessions():
            yield _cannot_reach(*_instance(T, tau, T, _free_obs(0), z_effect=False))

    refute_each(STATEMENT, "false variant: z without effect", instances(), bound=f"T <= {MAX_T}, 1 <= tau <= T")


def test_replay_cost_is_optimal_false_variant_non_injective_is_refuted():
    """replay_cost_is_optimal is a worst-case bound: a non-injective F may merge R_T into R^-z_T (k = 0)."""

    def instances():
        for T, tau in _sessions():
            yield _cannot_reach(*_instance(T, tau, T, _free_obs(0), injective=False))

    refute_each(STATEMENT, "false variant: F not injective", instances(), bound=f"T <= {MAX_T}, 1 <= tau <= T")


def test_replay_cost_is_optimal_false_variant_returning_to_init_is_refuted():
    """replay_cost_is_optimal needs F != R_init: else the counterfactual can loop back to the stored R_0 (k = 0)."""

    def instances():
        for T, tau in _sessions():
            yield _cannot_reach(*_instance(T, tau, 0, _free_obs(0), never_init=False))

    refute_each(STATEMENT, "false variant: F may return R_init", instances(), bound=f"T <= {MAX_T}, 1 <= tau <= T")


# --- unbounded: induction lemmas and their combination ---------------------------


def _unbounded_vocabulary():
    ts = transition_system()
    depth = z3.Function("depth", ts.state, z3.IntSort())
    R, Rcf, C = ts.trajectory("R"), ts.trajectory("Rcf"), ts.trajectory("Chain")
    o, ocf, x = ts.stream("o"), ts.stream("ocf"), ts.stream("x")
    return ts, depth, R, Rcf, C, o, ocf, x


def _depth_step(ts, depth, r, obs) -> z3.BoolRef:
    """The ghost counter's axiom at one application: depth(F(r, x)) = depth(r) + 1."""
    return depth(ts.F(r, obs)) == depth(r) + 1


def _one_f_step_each(ts, X, y, t, Y, w, u) -> list[z3.BoolRef]:
    """Defining equations of X at t and Y at u, and injectivity on their two F-applications."""
    return [ts.step_eq(X, y, t), ts.step_eq(Y, w, u), *injective_on(ts, [ts.F(X(t - 1), y(t)), ts.F(Y(u - 1), w(u))])]


def test_replay_cost_is_optimal_unbounded_depth_lemma():
    """replay_cost_is_optimal, lemma depth: along any trajectory X, depth(X_j) = depth(X_0) + j (induction on j)."""
    ts, depth, _, _, X, _, _, y = _unbounded_vocabulary()
    j = z3.Int("j")
    prove(STATEMENT, "lemma depth, base j = 0", [], depth(X(0)) == depth(X(0)) + 0, bound="unbounded")
    hypotheses = [
        j >= 1,
        depth(X(j - 1)) == depth(X(0)) + j - 1,  # induction hypothesis
        ts.step_eq(X, y, j),
        _depth_step(ts, depth, X(j - 1), y(j)),
    ]
    prove(STATEMENT, "lemma depth, step", hypotheses, depth(X(j)) == depth(X(0)) + j, bound="unbounded")


def test_replay_cost_is_optimal_unbounded_divergence_lemma():
    """replay_cost_is_optimal, lemma divergence: R_t != R^-z_t for all t >= tau (induction on t, injective F)."""
    ts, _, R, Rcf, _, o, ocf, _ = _unbounded_vocabulary()
    t, tau = z3.Ints("t tau")
    base = [tau >= 1, z_has_effect(o, ocf, tau), *_one_f_step_each(ts, R, o, tau, Rcf, ocf, tau)]
    prove(STATEMENT, "lemma divergence, base t = tau", base, R(tau) != Rcf(tau), bound="unbounded")
    step = [
        tau >= 1,
        t >= tau + 1,
        R(t - 1) != Rcf(t - 1),  # induction hypothesis
        *_one_f_step_each(ts, R, o, t, Rcf, ocf, t),
    ]
    prove(STATEMENT, "lemma divergence, step", step, R(t) != Rcf(t), bound="unbounded")


def test_replay_cost_is_optimal_unbounded_peel_lemma():
    """replay_cost_is_optimal, lemma peel: Chain_k = R^-z_m, k <= m imply Chain_j = R^-z_{m-k+j} for j = k..0."""
    ts, _, _, Rcf, C, _, ocf, x = _unbounded_vocabulary()
    j, k, m = z3.Ints("j k m")
    shape = [0 <= k, k <= m, C(k) == Rcf(m)]
    prove(STATEMENT, "lemma peel, base j = k", shape, C(k) == Rcf(m - k + k), bound="unbounded")
    step = [
        *shape,
        1 <= j,
        j <= k,
        C(j) == Rcf(m - k + j),  # induction hypothesis (downward in j)
        *_one_f_step_each(ts, C, x, j, Rcf, ocf, m - k + j),
    ]
    prove(STATEMENT, "lemma peel, step j -> j - 1", step, C(j - 1) == Rcf(m - k + j - 1), bound="unbounded")


def _combination(max_k_offset: int) -> tuple[list[z3.BoolRef], z3.BoolRef]:
    """The lower bound from the lemmas' instances, for chains of ``k <= T - tau + max_k_offset`` steps."""
    ts, depth, R, Rcf, C, _, _, _ = _unbounded_vocabulary()
    T, tau, s, k = z3.Ints("T tau s k")
    hypotheses = [
        1 <= tau,
        tau <= T,
        0 <= s,
        s <= T,
        0 <= k,
        k <= T - tau + max_k_offset,
        C(0) == R(s),  # the operator's chain starts at a stored state
        R(0) == ts.init,
        Rcf(0) == ts.init,
        depth(ts.init) == 0,
        # Lemma instances, each guarded by the lemma's own side conditions.
        # depth at R (j = s), at R^-z (j = T) and at the chain (j = k):
        z3.Implies(s >= 0, depth(R(s)) == depth(R(0)) + s),
        z3.Implies(T >= 0, depth(Rcf(T)) == depth(Rcf(0)) + T),
        z3.Implies(k >= 0, depth(C(k)) == depth(C(0)) + k),
        # peel at j = 0 with m = T:
        z3.Implies(z3.And(C(k) == Rcf(T), 0 <= k, k <= T), C(0) == Rcf(T - k)),
        # divergence at t = s:
        z3.Implies(z3.And(tau >= 1, s >= tau), R(s) != Rcf(s)),
    ]
    return hypotheses, C(k) != Rcf(T)


def test_replay_cost_is_optimal_unbounded_lower_bound():
    """replay_cost_is_optimal: for all T, tau, s and k < T - tau + 1, no k-step chain from R_s is R^-z_T."""
    hypotheses, claim = _combination(max_k_offset=0)
    prove(STATEMENT, "unbounded lower bound, from the three lemmas", hypotheses, claim, bound="unbounded")


def test_replay_cost_is_optimal_unbounded_false_variant_is_refuted():
    """replay_cost_is_optimal, unbounded: the same lemmas do not forbid k = T - tau + 1 (the splice's length)."""
    hypotheses, claim = _combination(max_k_offset=1)
    refute(STATEMENT, "false variant: unbounded, lower bound T - tau + 2", hypotheses, claim, bound="unbounded")
