"""Behaviour of the engine benchmarks, checked on the tiny model in CI (no
timing is asserted; ``python -m unsee.bench.memory`` and ``... .restore``
produce the figures).

* memory: a long session with a compaction every 5 steps, under a budget of
  4x its live cache's bytes, never holds more unpinned bytes than the budget
  after any step, holds far less than without a budget, and its forget
  (which rebuilds the evicted lineage it restores from) equals the full reset.
  200 steps under ``UNSEE_PROFILE=nightly`` (the issue's figure), 60 otherwise.
* restore: the copy-on-write restore copies nothing, whatever the length.
"""

from __future__ import annotations

import os

import pytest

from unsee.bench.memory import make_compaction_episode, run_memory_bench
from unsee.bench.restore import build, get_median_interval, get_ratios, get_tokens, measure_restore_overhead, restore
from unsee.impl.engines.registry import load_engine
from unsee.properties.differential import torch_threads

STEPS = 200 if os.environ.get("UNSEE_PROFILE") == "nightly" else 60


def test_memory_stays_within_the_budget_and_forget_equals_reset():
    with torch_threads(1):
        result = run_memory_bench("tiny", steps=STEPS, every=5, factor=4.0)
    budget = result["budget"]
    bounded, unbounded = result["with_budget"], result["without_budget"]
    assert len(bounded) == len(unbounded) == STEPS
    assert max(s["unpinned_bytes"] for s in bounded) <= budget
    assert all(s["held_bytes"] <= budget + s["live_bytes"] for s in bounded)
    assert result["peak_unpinned_bytes_with_budget"] <= budget
    # without a budget every compaction's lineage stays: memory grows with T
    assert unbounded[-1]["held_bytes"] > 2 * bounded[-1]["held_bytes"]
    assert unbounded[-1]["lineages"] == 1 + STEPS // 5 and bounded[-1]["evicted_lineages"] > 0
    forget = result["forget"]
    assert forget["equals_reset"] and forget["digest"] == forget["reset_digest"]
    assert forget["rebuilt_tokens"] > 0  # the first lineage (tau = 2) had been evicted
    assert forget["peak_unpinned_bytes"] <= budget


def test_compaction_episode_is_as_described():
    episode = make_compaction_episode(12, every=5)
    kinds = [s.kind for s in episode.steps]
    assert kinds[1] == "tool" and kinds[4] == kinds[9] == "compact" and kinds.count("compact") == 2
    with pytest.raises(ValueError, match="every=1"):
        make_compaction_episode(10, every=1)


@pytest.mark.parametrize("n", [256, 2048])
def test_share_restore_copies_nothing(n):
    with torch_threads(1):
        engine = load_engine("tiny")
        source = build(engine, get_tokens(engine, n + 64), 64)
        held = engine.budget.memory().held_bytes
        shared = restore(engine, "share", source, n)
        assert engine.budget.memory().held_bytes == held and len(engine.tokens(shared)) == n
        cloned = restore(engine, "clone", source, n)
        assert engine.budget.memory().held_bytes > 1.9 * held  # the old restore copied the whole lineage
        assert engine.digest(shared) == engine.digest(cloned)


def test_restore_bench_rows_count_copies_and_bracket_their_medians():
    with torch_threads(1):
        engine = load_engine("tiny")
        rows = [row for n in (64, 256) for row in
                measure_restore_overhead(engine, n, repeats=3, chunks=(1, 4), tail=32, build_chunk=32, warmup=1)]
    assert [(r["n"], r["chunk"], r["method"]) for r in rows] == [
        (n, c, m) for n in (64, 256) for c in (1, 4) for m in ("share", "clone")]
    by = {(r["n"], r["chunk"], r["method"]): r for r in rows}
    for n in (64, 256):
        assert by[n, 1, "share"]["copied_bytes"] == 0  # copy-on-write: nothing, at any length
        # the old restore copied the whole lineage (n + tail tokens), so its copy grows with n
        assert by[n, 1, "clone"]["copied_bytes"] > 0
    assert by[256, 1, "clone"]["copied_bytes"] > 2 * by[64, 1, "clone"]["copied_bytes"]
    for r in rows:
        lo, hi = r["overhead_ci_s"]
        assert lo <= r["overhead_s"] <= hi
        assert min(r["faults_restored"], r["faults_never_restored"], r["faults_warmup"]) >= 0
    assert engine.budget.lineages == ()  # every lineage the bench built is dropped
    ratios = get_ratios(rows, "overhead_s")
    assert set(ratios) == {"share", "clone"} and set(ratios["share"]) == {"1", "4"}


def test_median_interval_brackets_the_median_and_repeats():
    values = [0.3, -0.1, 0.2, 0.25, 0.9, 0.1, 0.15]
    lo, hi = get_median_interval(values)
    assert lo <= 0.2 <= hi and min(values) <= lo and hi <= max(values)
    assert get_median_interval(values) == [lo, hi]  # seeded
    assert get_median_interval([0.5] * 5) == [0.5, 0.5]
    with pytest.raises(ValueError, match="no values"):
        get_median_interval([])


def test_restore_bench_names_a_bad_setting():
    engine = load_engine("tiny")
    with pytest.raises(ValueError, match="multiple of build_chunk"):
        measure_restore_overhead(engine, 100, build_chunk=32)
    with pytest.raises(ValueError, match="chunks=\\[0\\]"):
        measure_restore_overhead(engine, 64, chunks=(0,), build_chunk=32)
    assert engine.budget.lineages == ()  # refused before building anything
