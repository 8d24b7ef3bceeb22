"""pytest-benchmark: forget (B7) against full reset (B5), tau at the start,
middle and end of a 12-step episode.

By default (and in CI) this runs on the tiny model with benchmarking
disabled, so each case executes once as a check. ``make bench`` runs it on
SmolLM2 with timing enabled (``UNSEE_BENCH_MODEL`` picks the model).
"""

from __future__ import annotations

import os

import pytest

from unsee.bench.episodes import make_bench_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import load_engine

MODEL = os.environ.get("UNSEE_BENCH_MODEL", "tiny")
LENGTH = 12
TAUS = {"start": 1, "middle": 6, "end": 12}
DIGESTS: dict[str, set[str]] = {}  # where -> digests reached by every method and round


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine(MODEL, "transformers")


@pytest.fixture(scope="module")
def bases(engine):
    """One contaminated session per tau, shared by both methods (paired)."""
    out = {}
    for name, tau in TAUS.items():
        episode = make_bench_episode(tau, LENGTH, max_new_tokens=16 if MODEL != "tiny" else 4)
        out[name] = (episode, AgentRuntime.from_episode(engine, episode))
    return out


@pytest.mark.bench
@pytest.mark.parametrize("where", list(TAUS))
@pytest.mark.parametrize("method", ["forget", "full_reset"])
def test_forget_cost(benchmark, bases, where, method):
    episode, base = bases[where]
    source = episode.target.source
    reports = []

    def setup():
        return (base.fork(),), {}

    def target(runtime):
        reports.append(getattr(runtime, method)(source))

    benchmark.pedantic(target, setup=setup, rounds=int(os.environ.get("UNSEE_BENCH_ROUNDS", "1")), iterations=1)
    report = reports[-1]
    tau = TAUS[where]
    expected = LENGTH - tau + 1 if method == "forget" else LENGTH
    assert report.invocations == expected
    benchmark.extra_info.update(tau=tau, invocations=report.invocations, prefilled=report.prefilled_tokens,
                                decoded=report.decoded_tokens, digest=report.digest, model=MODEL)
    # all methods and rounds for one tau reach the same state
    digests = {r.digest for r in reports}
    assert len(digests) == 1
    DIGESTS.setdefault(where, set()).update(digests)


@pytest.mark.bench
def test_forget_equals_reset_per_tau():
    """Paired: for each tau, forget and full reset reached one state."""
    if len(DIGESTS) < len(TAUS):
        pytest.skip("run together with test_forget_cost")
    assert all(len(d) == 1 for d in DIGESTS.values()), DIGESTS
