"""Shared helpers for the z3 proofs of the paper's statements.

Every proof in ``proofs/`` is a validity check: a claim follows from some
hypotheses iff ``hypotheses and not claim`` is unsatisfiable. Two things make
such a proof trustworthy, and both are enforced here rather than left to each
test:

- *non-vacuity*: the hypotheses alone must be satisfiable, otherwise every
  claim would "follow" from them;
- *no silent timeout*: z3 answering ``unknown`` (a timeout, or an incomplete
  quantifier strategy) is a test failure, never a pass.

Each check returns a :class:`ProofResult` (statement name, verdict, bound, wall
time) and prints it, so ``pytest -s`` shows the numbers recorded in
docs/proofs.md.

The module also holds the vocabulary of the paper's transition system
(Section "Method"): uninterpreted sorts ``State`` and ``Obs``, an
uninterpreted transition ``F : State x Obs -> State``, trajectories as
functions ``Int -> State`` and observation streams as functions ``Int -> Obs``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import z3

# Per-check solver limit. Every check in the suite finishes in well under a
# second; ten seconds leaves room for a slow machine while still turning a
# hang into a failure long before the suite's one-minute budget is gone.
TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class ProofResult:
    """The outcome of one check (or one family of checks) on one statement."""

    statement: str  # the project-wide name, e.g. "prefix_is_shared"
    check: str  # which part: "base case", "inductive step", "false variant: ..."
    verdict: str  # "proved" (negation unsat) or "refuted" (counterexample found)
    bound: str  # "unbounded" or the finite bound the check covers
    seconds: float  # wall time of the z3 calls
    queries: int = 1  # how many solver calls the result summarizes

    def __str__(self) -> str:
        return (
            f"[{self.statement}] {self.check}: {self.verdict} "
            f"({self.bound}; {self.queries} quer{'y' if self.queries == 1 else 'ies'}, "
            f"{self.seconds:.3f} s)"
        )


class ProofFailure(AssertionError):
    """A check did not get the verdict it needs (wrong answer or unknown)."""


def _solver(timeout_ms: int) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    return solver


def _check(formulas: Iterable[z3.BoolRef], timeout_ms: int) -> tuple[z3.CheckSatResult, z3.Solver]:
    solver = _solver(timeout_ms)
    solver.add(*formulas)
    return solver.check(), solver


def _fail_unknown(what: str, solver: z3.Solver) -> ProofFailure:
    return ProofFailure(f"{what}: z3 returned unknown ({solver.reason_unknown()})")


def _assert_hypotheses_consistent(what: str, hypotheses: Sequence[z3.BoolRef], timeout_ms: int) -> None:
    # A proof from inconsistent hypotheses proves nothing: refuse it.
    verdict, solver = _check(hypotheses, timeout_ms)
    if verdict == z3.unknown:
        raise _fail_unknown(f"{what} (consistency of hypotheses)", solver)
    if verdict == z3.unsat:
        raise ProofFailure(f"{what}: the hypotheses are inconsistent, so the proof would be vacuous")


def prove(
    statement: str,
    check: str,
    hypotheses: Sequence[z3.BoolRef],
    claim: z3.BoolRef,
    *,
    bound: str,
    timeout_ms: int = TIMEOUT_MS,
    quiet: bool = False,
) -> ProofResult:
    """Prove ``hypotheses => claim`` valid: its negation must be unsat."""
    what = f"[{statement}] {check}"
    start = time.perf_counter()
    _assert_hypotheses_consistent(what, hypotheses, timeout_ms)
    verdict, solver = _check([*hypotheses, z3.Not(claim)], timeout_ms)
    seconds = time.perf_counter() - start
    if verdict == z3.unknown:
        raise _fail_unknown(what, solver)
    if verdict == z3.sat:
        raise ProofFailure(f"{what}: not valid, counterexample:\n{solver.model()}")
    return _emit(ProofResult(statement, check, "proved", bound, seconds), quiet)


def refute(
    statement: str,
    check: str,
    hypotheses: Sequence[z3.BoolRef],
    claim: z3.BoolRef,
    *,
    bound: str,
    timeout_ms: int = TIMEOUT_MS,
    quiet: bool = False,
) -> ProofResult:
    """Show a deliberately false claim is refuted: z3 must find a counterexample.

    This is the guard against a proof that cannot fail: the same encoding that
    proves the true statement has to reject a false neighbour of it.
    """
    what = f"[{statement}] {check}"
    start = time.perf_counter()
    verdict, solver = _check([*hypotheses, z3.Not(claim)], timeout_ms)
    seconds = time.perf_counter() - start
    if verdict == z3.unknown:
        raise _fail_unknown(what, solver)
    if verdict == z3.unsat:
        raise ProofFailure(f"{what}: the false claim was proved, so the encoding cannot tell true from false")
    return _emit(ProofResult(statement, check, "refuted", bound, seconds), quiet)


def prove_each(
    statement: str,
    check: str,
    instances: Iterable[tuple[Sequence[z3.BoolRef], z3.BoolRef]],
    *,
    bound: str,
    timeout_ms: int = TIMEOUT_MS,
) -> ProofResult:
    """:func:`prove` on every ``(hypotheses, claim)`` of a bounded family, one result."""
    return _each(prove, statement, check, instances, bound, timeout_ms)


def refute_each(
    statement: str,
    check: str,
    instances: Iterable[tuple[Sequence[z3.BoolRef], z3.BoolRef]],
    *,
    bound: str,
    timeout_ms: int = TIMEOUT_MS,
) -> ProofResult:
    """:func:`refute` on every ``(hypotheses, claim)`` of a bounded family, one result."""
    return _each(refute, statement, check, instances, bound, timeout_ms)


def _each(verdict, statement: str, check: str, instances, bound: str, timeout_ms: int) -> ProofResult:
    """The reported time is the wall time of the whole family, building the
    formulas included (for large families that is most of it)."""
    start = time.perf_counter()
    results = [verdict(statement, check, h, c, bound=bound, timeout_ms=timeout_ms, quiet=True) for h, c in instances]
    return summarize(statement, check, results, bound=bound, seconds=time.perf_counter() - start)


def summarize(
    statement: str, check: str, results: Sequence[ProofResult], *, bound: str, seconds: float | None = None
) -> ProofResult:
    """Fold a family of checks (e.g. one per bound instance) into one result.

    ``seconds`` defaults to the summed solver time of the checks.
    """
    verdicts = {r.verdict for r in results}
    if not results:
        raise ProofFailure(f"[{statement}] {check}: empty family, nothing was checked")
    if len(verdicts) != 1:
        raise ProofFailure(f"[{statement}] {check}: mixed verdicts {sorted(verdicts)}")
    total = ProofResult(
        statement,
        check,
        verdicts.pop(),
        bound,
        sum(r.seconds for r in results) if seconds is None else seconds,
        sum(r.queries for r in results),
    )
    return _emit(total, quiet=False)


def _emit(result: ProofResult, quiet: bool) -> ProofResult:
    if not quiet:
        print(result)
    return result


# --- the transition system of Section "Method" --------------------------------


@dataclass(frozen=True)
class TransitionSystem:
    """Uninterpreted vocabulary: sorts, the transition ``F`` and ``R_init``.

    ``F`` is a z3 function, so it is single-valued by construction: this is
    Assumption (A1), deterministic decoding, holding implicitly.
    """

    state: z3.SortRef
    obs: z3.SortRef
    F: z3.FuncDeclRef
    init: z3.ExprRef

    def trajectory(self, name: str) -> z3.FuncDeclRef:
        """A trajectory ``t -> R_t`` (constrained by :meth:`step_eq`)."""
        return z3.Function(name, z3.IntSort(), self.state)

    def stream(self, name: str) -> z3.FuncDeclRef:
        """An observation stream ``t -> o_t``."""
        return z3.Function(name, z3.IntSort(), self.obs)

    def step_eq(
        self, R: z3.FuncDeclRef, o: z3.FuncDeclRef, t: z3.ArithRef | int, first: z3.ArithRef | int = 1
    ) -> z3.BoolRef:
        """The defining equation ``R_t = F(R_{t-1}, o_t)`` instantiated at ``t``.

        The definition only holds from ``first`` on (``t >= 1`` for a session,
        ``t >= b + 1`` for a replay from ``b``), so the instance is guarded:
        a proof cannot use it at a turn where the trajectory is not defined.
        """
        return z3.Implies(t >= first, R(t) == self.F(R(t - 1), o(t)))

    def steps(self, R: z3.FuncDeclRef, o: z3.FuncDeclRef, last: int, first: int = 1) -> list[z3.BoolRef]:
        """All defining equations for ``t = first..last`` (ground)."""
        return [self.step_eq(R, o, t, first) for t in range(first, last + 1)]


def transition_system() -> TransitionSystem:
    state = z3.DeclareSort("State")
    obs = z3.DeclareSort("Obs")
    F = z3.Function("F", state, obs, state)
    return TransitionSystem(state, obs, F, z3.Const("R_init", state))


def counterfactual_stream_at(
    o: z3.FuncDeclRef, ocf: z3.FuncDeclRef, tau: z3.ArithRef | int, t: z3.ArithRef | int
) -> z3.BoolRef:
    """The definition of ``o^-z`` instantiated at ``t``: ``o^-z_t = o_t`` for ``t != tau``."""
    return z3.Implies(t != tau, ocf(t) == o(t))


def z_has_effect(o: z3.FuncDeclRef, ocf: z3.FuncDeclRef, tau: z3.ArithRef | int) -> z3.BoolRef:
    """``o^-z_tau = o_tau \\ {z}`` differs from ``o_tau``: the target was really there."""
    return ocf(tau) != o(tau)


def injective_on(
    ts: TransitionSystem, terms: Sequence[z3.ExprRef], *, injective: bool = True, never_init: bool = True
) -> list[z3.BoolRef]:
    """Ground instances of "F is injective" and "F never returns R_init".

    ``terms`` are the ``F``-applications of a query. Instantiating the two
    universal axioms on exactly these terms is sound (each instance is implied
    by the axiom) and keeps the query quantifier-free, hence decidable. The
    flags drop one axiom, for the false variants that show it is needed.
    """
    apps = [t for t in terms if z3.is_app(t) and t.decl().eq(ts.F)]
    if len(apps) != len(terms):
        raise ValueError("injective_on expects F-applications only")
    facts: list[z3.BoolRef] = [a != ts.init for a in apps] if never_init else []
    if injective:
        for i, a in enumerate(apps):
            for b in apps[i + 1 :]:
                same_args = z3.And(a.arg(0) == b.arg(0), a.arg(1) == b.arg(1))
                facts.append(z3.Implies(a == b, same_args))
    return facts
