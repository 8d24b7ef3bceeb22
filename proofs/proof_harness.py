"""The proof harness itself (proofs/_z3util.py) rejects bad proofs.

Not a paper statement: these tests check that ``prove`` and ``refute`` fail
loudly on the three ways a z3 proof can silently mean nothing -- a false
claim, inconsistent (vacuous) hypotheses, and a timeout.
"""

from __future__ import annotations

import pytest
import z3

from unsee.proofs._z3util import ProofFailure, prove, refute, summarize


def test_prove_rejects_a_false_claim():
    x = z3.Int("x")
    with pytest.raises(ProofFailure, match="counterexample"):
        prove("harness", "false claim", [x >= 0], x >= 1, bound="-")


def test_prove_rejects_vacuous_hypotheses():
    x = z3.Int("x")
    with pytest.raises(ProofFailure, match="vacuous"):
        prove("harness", "vacuous", [x > 0, x < 0], x == 42, bound="-")


def test_prove_treats_timeout_as_failure():
    # Positive cubes summing to a cube: z3's nonlinear integer reasoning cannot
    # settle this (it is Fermat's n = 3 case), so it runs into the timeout.
    x, y, z = z3.Ints("x y z")
    claim = x * x * x + y * y * y != z * z * z
    with pytest.raises(ProofFailure, match="unknown"):
        prove("harness", "timeout", [x > 0, y > 0, z > 0], claim, bound="-", timeout_ms=200)


def test_refute_rejects_a_true_claim():
    x = z3.Int("x")
    with pytest.raises(ProofFailure, match="cannot tell true from false"):
        refute("harness", "true claim", [x >= 1], x >= 0, bound="-")


def test_summarize_rejects_an_empty_family():
    with pytest.raises(ProofFailure, match="empty family"):
        summarize("harness", "nothing", [], bound="-")
