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
from unsee.bench.restore import build, get_tokens, restore
from unsee.impl.kv import KVEngine
from unsee.impl.models import load_model
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
        engine = KVEngine(load_model("tiny"))
        source = build(engine, get_tokens(engine, n + 64), 64)
        held = engine.memory().held_bytes
        shared = restore(engine, "share", source, n)
        assert engine.memory().held_bytes == held and engine.length(shared) == n
        cloned = restore(engine, "clone", source, n)
        assert engine.memory().held_bytes > 1.9 * held  # the old restore copied the whole lineage
        assert engine.digest(shared) == engine.digest(cloned)
