"""The runtime's state ``R_t`` as a value (issue 28): the provenance graph
and the checkpoint store are persistent (their changes return a new value),
so a state once made never changes, and two states are equal iff their
fields are."""

from __future__ import annotations

import attrs
import pytest

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore
from unsee.impl.agent.episode import Item, Step, parse_episode
from unsee.impl.agent.provenance import ArtifactGraph, RuntimeBlock
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import make_engine
from unsee.properties.differential import run_counterfactual

STEPS = [
    {"id": "t1", "kind": "user", "text": "hello, I am Ana 12"},
    {"id": "t2", "kind": "memory", "records": [{"source": "secret", "text": "lives at 4417 Elm"},
                                               {"source": "m2", "text": "likes tea 7"}]},
    {"id": "t3", "kind": "tool", "tool": "search", "fields": [{"source": "f1", "text": "weather 21 C"}]},
    {"id": "t4", "kind": "plan", "tool": "send_message", "text": "email Bob 55"},
    {"id": "t5", "kind": "remember"},
]
EPISODE = parse_episode({"format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
                         "settings": {"max_new_tokens": 3, "checkpoint_policy": "every_turn"}, "steps": STEPS})
NEXT = Step("t6", "user", (Item("t6", "what now 3"),))


def run(lm) -> AgentRuntime:
    return AgentRuntime.from_episode(make_engine(lm), EPISODE)


def block(block_id: str, parents: tuple[str, ...] = (), turn: int = 0) -> RuntimeBlock:
    return RuntimeBlock(block_id, "user", block_id, (1, 2), parents, frozenset({block_id}), (0, 2), turn)


def test_a_state_is_not_changed_by_later_steps(lm):
    runtime = run(lm)
    state = runtime.state
    record, blocks, checkpoints = state.get_record(), len(state.graph), len(state.checkpoints)
    runtime.step(NEXT)
    assert state.get_record() == record  # the graph and checkpoints it holds did not grow under it
    assert (len(state.graph), len(state.checkpoints)) == (blocks, checkpoints)
    assert len(runtime.graph) > blocks and runtime.state != state


def test_forget_leaves_the_old_state_as_it_was(lm):
    runtime = run(lm)
    state = runtime.state
    record = state.get_record()
    runtime.forget("secret")
    assert state.get_record() == record and state.graph.locate_source("secret")
    assert runtime.state.forgotten == ("secret",) and runtime.state != state


def test_states_compare_by_value(lm):
    """Two runs of the same episode on fresh engines make equal states (the
    engines name their lineages alike); one more step makes them differ."""
    a, b = run(lm), run(lm)
    assert a.state == b.state and hash(a.state) == hash(b.state)
    assert a.state is not b.state and a.state.graph is not b.state.graph
    b.step(NEXT)
    assert a.state != b.state


def test_forgotten_state_equals_the_twins_but_for_lineage_names(lm):
    """After forget, every field of the state is the twin's that never saw
    the source, except the cache handles and what the forget itself counts."""
    runtime = run(lm)
    runtime.forget("secret")
    twin = run_counterfactual(make_engine(lm), EPISODE.system, EPISODE.settings, EPISODE.steps, "secret")
    mine, theirs = runtime.state, twin.state
    assert mine.graph == theirs.graph
    assert (mine.steps, mine.t, mine.context, mine.memory, mine.plans) == (
        theirs.steps, theirs.t, theirs.context, theirs.memory, theirs.plans)
    unnamed = [attrs.evolve(c, lineage="") for c in mine.checkpoints.all()]
    assert unnamed == [attrs.evolve(c, lineage="") for c in theirs.checkpoints.all()]


def test_graph_changes_return_a_new_graph():
    empty = ArtifactGraph()
    one = empty.with_block(block("a"))
    two = one.with_block(block("b", ("a",), turn=1))
    assert (len(empty), len(one), len(two)) == (0, 1, 2) and "b" not in one
    committed = two.with_replaced(attrs.evolve(two["a"], committed=True))
    assert committed["a"].committed and not two["a"].committed
    assert [b.id for b in committed.blocks()] == ["a", "b"]  # in place, creation order kept
    assert two.truncated(0) == one and two.truncated(0) is not one
    assert two.taint_closure("a") == ["a", "b"] and two == ArtifactGraph(two.blocks())


@pytest.mark.parametrize("bad, message", [(block("a"), "already recorded"),
                                          (block("c", ("zz",)), "unknown parents")])
def test_graph_refuses_a_bad_block_and_changes_nothing(bad, message):
    graph = ArtifactGraph().with_block(block("a"))
    with pytest.raises(ValueError, match=message):
        graph.with_block(bad)
    assert graph.blocks() == [block("a")]
    with pytest.raises(ValueError, match="parents are immutable"):
        graph.with_replaced(block("a", ("a",)))
    with pytest.raises(ValueError, match="already recorded"):
        ArtifactGraph([block("a"), block("a")])


def test_checkpoint_store_changes_return_a_new_store():
    def at(boundary: int, lineage: str = "L0") -> Checkpoint:
        return Checkpoint(boundary, lineage, boundary * 10, (), (), ())

    store = CheckpointStore("every_turn").with_checkpoint(at(0)).with_checkpoint(at(2)).with_checkpoint(at(1))
    assert [c.boundary for c in store.all()] == [0, 1, 2] and store.latest_before(2) == at(1)
    again = store.with_checkpoint(at(1, "L5"))
    assert store.all()[1].lineage == "L0" and again.all()[1].lineage == "L5" and len(again) == 3
    assert store.truncated(1).all() == [at(0), at(1)] and len(store) == 3
    assert store.relabeled("L0", "L9").lineages() == {"L9"} and store.lineages() == {"L0"}
    assert store == CheckpointStore("every_turn", [at(2), at(0), at(1)])
    with pytest.raises(ValueError, match="unknown checkpoint policy 'often'"):
        CheckpointStore("often")
    with pytest.raises(ValueError, match="at most one per boundary"):
        CheckpointStore("every_turn", [at(1), at(1)])


@pytest.mark.parametrize("verb", ["forget", "full_reset"])
def test_a_forget_refuses_a_state_changed_under_its_replay(lm, verb):
    """The session lock is re-entrant, so a progress callback on the forget's
    own thread can step the session; adopting the replay would then lose
    that step, so the forget refuses and the step stays."""
    runtime = run(lm)

    def progress(done: int, total: int) -> None:
        if done == 1:
            runtime.step(NEXT)

    with pytest.raises(RuntimeError, match=f"{'forget' if verb == 'forget' else 'reset'} refused: the session"):
        getattr(runtime, verb)("secret", progress)
    assert runtime.steps[-1] == NEXT and runtime.forgotten == []
