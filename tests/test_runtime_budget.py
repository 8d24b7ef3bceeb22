"""AgentRuntime over the engine's copy-on-write restore and KV budget, on the
tiny model: restores, forks and probes copy no KV; the runtime pins its
lineage; a forget whose checkpoint lineage was evicted rebuilds it and says
what that cost; a failed forget still changes nothing."""

from __future__ import annotations

import gc

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.forget import restore_checkpoint
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import make_engine
from unsee.properties.differential import run_counterfactual

SECRET = "4417 Elm"

#: The target enters before a compaction: its checkpoint (boundary 0) names
#: the first lineage, which no live runtime extends after the compaction.
BEFORE_COMPACTION = [
    {"id": "t1", "kind": "user", "source": "secret", "text": f"I live at {SECRET}"},
    {"id": "t2", "kind": "remember"},
    {"id": "t3", "kind": "compact"},
    {"id": "t4", "kind": "user", "text": "tea 7"},
    {"id": "t5", "kind": "compact"},
    {"id": "t6", "kind": "user", "text": "call Ana"},
]


def episode(steps):
    return parse_episode({"format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
                          "settings": {"max_new_tokens": 4}, "steps": steps,
                          "target": {"source": "secret", "value": SECRET}})


def run(engine, steps=BEFORE_COMPACTION) -> AgentRuntime:
    return AgentRuntime.from_episode(engine, episode(steps))


def reference_digest(lm, steps=BEFORE_COMPACTION) -> str:
    """The counterfactual twin's digest, on an engine without a budget."""
    ep = episode(steps)
    return run_counterfactual(make_engine(lm), ep.system, ep.settings, ep.steps, "secret").digest()


def test_restore_fork_and_probe_copy_no_kv(lm):
    engine = make_engine(lm)
    runtime = run(engine, BEFORE_COMPACTION[:2])
    held = engine.budget.memory().held_bytes
    for checkpoint in runtime.checkpoints.all():
        replay = restore_checkpoint(runtime, checkpoint)
        assert len(engine.tokens(replay.lineage)) == checkpoint.token_offset
        assert engine.budget.memory().held_bytes == held  # views of the checkpoint's lineage only
    other = runtime.fork()
    assert engine.budget.memory().held_bytes == held and other.digest() == runtime.digest()
    runtime.probe("where?", max_new_tokens=2)
    assert engine.budget.memory().held_bytes == held  # the probe's branch is dropped


def test_runtime_pins_its_lineage(lm):
    engine = make_engine(lm, kv_budget=0)
    runtime = run(engine)
    other = runtime.fork()
    assert {runtime.lineage, other.lineage} <= engine.budget.live_lineages()
    lineage = other.lineage
    del other
    gc.collect()
    assert lineage not in engine.budget.live_lineages()
    # Its KV is still all shared with the live lineage, so it costs nothing
    # and may stay; once the live lineage moves on, it would hold bytes of
    # its own, and budget 0 evicts it.
    assert engine.budget.memory().unpinned_bytes == 0
    runtime.step(parse_episode({"format": "unsee.episode", "version": 1, "system": "x",
                                "steps": [{"id": "t9", "kind": "user", "text": "Bob"}]}).steps[0])
    assert engine.budget.is_evicted(lineage) and runtime.lineage in engine.budget.lineages
    assert engine.budget.memory().unpinned_bytes == 0


@pytest.mark.parametrize("budget", [0, 3_000, None])
def test_forget_rebuilds_an_evicted_checkpoint_lineage(lm, budget):
    engine = make_engine(lm, kv_budget=budget)
    runtime = run(engine)
    first = runtime.checkpoints.latest_before(1)
    evicted = engine.budget.is_evicted(first.lineage)
    assert evicted == (budget is not None)  # the first lineage is older than the budget allows
    report = runtime.forget("secret")
    assert report.digest == reference_digest(lm)
    assert report.rebuilt_tokens == (first.token_offset if evicted else 0)
    assert report.to_json()["rebuilt_tokens"] == report.rebuilt_tokens
    if budget is not None:
        assert engine.budget.peak_unpinned_bytes <= budget
        assert engine.budget.memory().unpinned_bytes <= budget


def test_failed_forget_under_budget_zero_leaves_the_session_as_it_was(lm):
    engine = make_engine(lm, kv_budget=0)
    runtime = run(engine)
    before = runtime.digest()

    def interrupt(done, total):
        if done == 3:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        runtime.forget("secret", progress=interrupt)
    gc.collect()  # the abandoned replay's pin goes with it
    engine.budget.set(0)
    assert runtime.digest() == before and engine.budget.memory().unpinned_bytes == 0
    runtime.check_invariants()
    assert runtime.forget("secret").digest == reference_digest(lm)
