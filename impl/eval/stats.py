"""Paired statistics for the evaluation (paper, Section 4.1: "Significance is
paired throughout: exact McNemar (binary), Wilcoxon signed-rank (continuous)").

Every comparison pairs two methods on the same episodes (they branch from one
contaminated base state). Degenerate inputs never raise: two methods that
agree on every pair report their agreement n/n with p = 1; a comparison with
no pairs reports n = 0 and no p. scipy is imported on first use (the ``eval``
extra), so the rest of the package does not need it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs


@attrs.frozen
class PairedTest:
    """The result of one paired comparison of method ``a`` against ``b``."""

    test: str  # "mcnemar-exact", "wilcoxon", "identical" (by construction) or "none" (no pairs)
    n: int  # pairs compared
    agree: int  # pairs with equal outcomes
    p: float | None
    a_only: int = 0  # McNemar discordant pairs: a true, b false
    b_only: int = 0  # ... a false, b true
    note: str = ""

    @property
    def agreement(self) -> str:
        return f"{self.agree}/{self.n}"

    def to_json(self) -> dict:
        return attrs.asdict(self) | {"agreement": self.agreement}


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> PairedTest:
    """Exact McNemar test: a two-sided binomial test (p = 1/2) on the
    discordant pairs. No discordant pairs: agreement n/n, p = 1."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} and {len(b)}")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    n = len(a)
    if n == 0:
        return PairedTest("none", 0, 0, None, note="no pairs")
    discordant = a_only + b_only
    if discordant == 0:
        return PairedTest("mcnemar-exact", n, n, 1.0, note="no discordant pairs")
    from scipy.stats import binomtest

    p = binomtest(a_only, discordant, 0.5, alternative="two-sided").pvalue
    return PairedTest("mcnemar-exact", n, n - discordant, float(min(1.0, p)), a_only, b_only)


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Wilcoxon signed-rank test on the paired differences ``a - b`` (scipy,
    zero differences dropped, the "wilcox" convention). All differences zero:
    agreement n/n, p = 1."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return PairedTest("none", 0, 0, None, note="no pairs")
    diffs = [x - y for x, y in zip(a, b)]
    nonzero = [d for d in diffs if d != 0]
    agree = n - len(nonzero)
    if not nonzero:
        return PairedTest("wilcoxon", n, n, 1.0, note="all differences zero")
    from scipy.stats import wilcoxon

    p = wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided").pvalue
    return PairedTest("wilcoxon", n, agree, float(p), sum(d > 0 for d in nonzero), sum(d < 0 for d in nonzero))


def identical(n: int, why: str) -> PairedTest:
    """Two methods identical by construction on these n pairs: reported as
    such, not as a test."""
    return PairedTest("identical", n, n, None, note=why)


def bootstrap_ci(values: Sequence[float], seed: int = 0, resamples: int = 2000,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the mean (seeded, so a
    report is reproducible). None for no values."""
    values = [float(v) for v in values]
    if not values:
        return None
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * (resamples - 1))]
    hi = means[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def compute_n_for_power(a: Sequence[float], b: Sequence[float], alpha: float = 0.05,
                        power: float = 0.8) -> tuple[float | None, int | None]:
    """How many pairs a two-sided Wilcoxon signed-rank test needs to detect the
    effect these pairs show: the standardised effect ``d`` (mean of the paired
    differences ``a - b`` over their standard deviation) and the n of the normal
    approximation, ``((z(1 - alpha/2) + z(power)) / d)^2`` divided by the test's
    asymptotic efficiency against the t test, 3/pi. ``(d, None)`` where ``d`` is 0
    or not positive (no effect in the direction the test looks for: ``a`` above
    ``b``, a method farther from B5 than the floor); ``(None, None)`` with fewer
    than 2 pairs or no spread."""
    import math
    from statistics import NormalDist

    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if len(diffs) < 2:
        return None, None
    m = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1))
    if sd == 0:
        return None, None
    d = m / sd
    if d <= 0:
        return d, None
    z = NormalDist().inv_cdf
    return d, math.ceil(((z(1 - alpha / 2) + z(power)) / d) ** 2 / (3 / math.pi))


def mean(values: Sequence[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


__all__ = ["PairedTest", "bootstrap_ci", "compute_n_for_power", "identical", "mcnemar_exact", "mean",
           "wilcoxon_signed_rank"]
