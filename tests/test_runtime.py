"""AgentRuntime on the tiny model: the transition F, forget (Algorithm 1),
full_reset (B5), checkpoints, provenance closures, probe, fork."""

from __future__ import annotations

import dataclasses
import json

import attrs
import pytest

from unsee.impl.agent.episode import OBSERVED_KINDS, parse_episode
from unsee.impl.agent.provenance import DERIVED_TYPES, UnknownSourceError
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import make_engine
from unsee.properties.differential import compare_forget_with_reset, engine_scope, run_counterfactual

SECRET = "4417 Elm"


@pytest.fixture(scope="module")
def engine(lm):
    """One engine for the module (each test scopes its lineages: ``eng``)."""
    return make_engine(lm)


@pytest.fixture
def eng(engine):
    with engine_scope(engine):
        yield engine


def episode(steps, policy="every_turn", max_new_tokens=4, temperature=0.0, seed=0, target="secret"):
    return parse_episode({"format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
                          "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                                       "checkpoint_policy": policy},
                          "steps": steps, "target": {"source": target, "value": SECRET}})


#: Every observed kind, a memory write, no session: tau = 2 (the memory step).
FIXED = [
    {"id": "t1", "kind": "user", "text": "hello, I am Ana 12"},
    {"id": "t2", "kind": "memory", "records": [{"source": "secret", "text": f"lives at {SECRET}"},
                                               {"source": "m2", "text": "likes tea 7"}]},
    {"id": "t3", "kind": "tool", "tool": "search", "fields": [{"source": "f1", "text": "weather 21 C"}]},
    {"id": "t4", "kind": "plan", "tool": "send_message", "text": "email Bob 55"},
    {"id": "t5", "kind": "remember"},
    {"id": "t6", "kind": "user", "text": "what now 3"},
]

#: The target (a tool field) comes after a step without external content, so
#: before_injection registers no checkpoint at boundary 1 but one at tau - 1 = 2.
POLICY_STEPS = [
    {"id": "t1", "kind": "user", "text": "hi 7"},
    {"id": "t2", "kind": "remember"},
    {"id": "t3", "kind": "tool", "fields": [{"source": "secret", "text": SECRET}, {"source": "f2", "text": "Oak"}]},
    {"id": "t4", "kind": "compact"},
    {"id": "t5", "kind": "user", "text": "bye 90"},
]


def run(eng, steps, **kwargs) -> AgentRuntime:
    return AgentRuntime.from_episode(eng, episode(steps, **kwargs))


# --- a fixed episode -----------------------------------------------------------------

def test_fixed_episode_runs_and_forget_equals_reset(eng):
    ep = episode(FIXED)
    runtime = AgentRuntime.from_episode(eng, ep)
    assert runtime.t == runtime.transitions == 6
    assert [s.id for s in runtime.steps] == [s["id"] for s in FIXED]
    assert runtime.memory == ["t2/secret", "t2/m2", "t5/note"]
    assert runtime.plans == ["t4/plan"]
    assert [b for b, _ in runtime.generated_tokens() if b.endswith(("/answer", "/plan", "/note"))] == \
        ["t1/answer", "t3/answer", "t4/plan", "t5/note", "t6/answer"]
    runtime.check_invariants()
    before = runtime.digest()
    assert AgentRuntime.from_episode(eng, ep).digest() == before  # F is deterministic

    report = compare_forget_with_reset(eng, ep)
    assert (report.tau, report.boundary, report.invocations, report.length) == (2, 1, 5, 6)
    assert report.expected_invocations == 5
    assert report.method == "replay" and report.source_id == "secret"

    runtime.forget("secret")
    runtime.check_invariants()
    assert runtime.digest() != before
    assert runtime.digest() == report.digest
    assert not any(SECRET in text for _, text in runtime.texts())
    assert "t2/secret" not in runtime.memory
    assert runtime.steps[1].items == (runtime.steps[1].items[0],) and runtime.steps[1].items[0].source == "m2"


def test_forget_under_seeded_sampling_equals_counterfactual(eng):
    ep = episode(FIXED, temperature=0.7, seed=11)
    runtime = AgentRuntime.from_episode(eng, ep)
    report = runtime.forget("secret")
    twin = run_counterfactual(eng, ep.system, ep.settings, ep.steps, "secret")
    assert report.digest == twin.digest()
    assert runtime.generated_tokens() == twin.generated_tokens()


# --- unknown and repeated sources ---------------------------------------------------------

def test_forget_of_unknown_source_raises_and_changes_nothing(eng):
    runtime = run(eng, FIXED)
    before, steps, checkpoints = runtime.digest(), list(runtime.steps), runtime.checkpoints.all()
    with pytest.raises(UnknownSourceError) as info:
        runtime.forget("no-such-source")
    assert isinstance(info.value, KeyError)
    assert "no-such-source" in str(info.value)
    with pytest.raises(KeyError, match="no-such-source"):
        runtime.full_reset("no-such-source")
    assert runtime.digest() == before
    assert runtime.steps == steps and runtime.checkpoints.all() == checkpoints


def test_forget_of_a_step_id_that_is_not_a_source_raises(eng):
    runtime = run(eng, FIXED)  # t2 is a memory step: its sources are its records, not the step id
    with pytest.raises(UnknownSourceError, match="t2"):
        runtime.forget("t2")


def test_forget_twice_is_a_no_op(eng):
    runtime = run(eng, FIXED)
    runtime.forget("secret")
    after = runtime.digest()
    again = runtime.forget("secret")
    assert again.already_forgotten and again.invocations == 0
    assert runtime.digest() == after


# --- checkpoint policies ------------------------------------------------------------------

@pytest.mark.parametrize("policy, boundaries, boundary", [
    ("every_turn", [0, 1, 2, 3, 4], 2),
    ("before_injection", [0, 2, 4], 2),  # before t1, t3 and t5: the steps that bring content in
    ("session_start", [0], 0),
])
def test_checkpoint_policy_gives_expected_boundary(eng, policy, boundaries, boundary):
    runtime = run(eng, POLICY_STEPS, policy=policy)
    assert [c.boundary for c in runtime.checkpoints.all()] == boundaries
    assert boundaries == [t - 1 for t, s in enumerate(POLICY_STEPS, 1)
                          if policy == "every_turn" or (policy == "before_injection" and s["kind"] in OBSERVED_KINDS)
                          or t == 1]
    report = compare_forget_with_reset(eng, episode(POLICY_STEPS, policy=policy))
    assert report.tau == 3
    assert report.boundary == boundary
    assert report.invocations == 5 - boundary  # T - tau + 1 = 3 at boundary tau - 1


# --- provenance ---------------------------------------------------------------------------

def test_closure_holds_the_source_and_every_later_generated_block(eng):
    runtime = run(eng, FIXED)
    blocks = runtime.graph.blocks()
    report = runtime.fork().forget("secret")
    closure = set(report.closure)
    assert "t2/secret" in closure  # the source block: the memory record
    assert [b.id for b in runtime.graph.locate_source("secret")] == ["t2/secret"]
    later = {b.id for b in blocks if b.turn >= report.tau and b.type in DERIVED_TYPES}
    assert later and later <= closure
    assert {"t3/answer", "t4/plan", "t5/note", "t6/answer"} <= closure
    assert "t2/m2" not in closure  # a record of another source, stored beside it
    assert not any(b.turn < report.tau and b.id in closure for b in blocks)
    assert list(report.closure) == [b.id for b in blocks if b.id in closure]  # creation order


def test_closure_stops_at_a_session_that_drops_the_target(eng):
    """A user target that no memory write kept is gone from the context a new
    session opens on: later turns do not carry it, and forget still equals reset."""
    steps = [{"id": "t1", "kind": "user", "source": "secret", "text": SECRET},
             {"id": "t2", "kind": "session"}, {"id": "t3", "kind": "user", "text": "tea"}]
    runtime = run(eng, steps)
    resident = runtime.context + runtime.memory + runtime.plans
    assert not any("secret" in runtime.graph[b].source_ids for b in resident)
    report = compare_forget_with_reset(eng, episode(steps))
    assert "t1/answer" in report.closure and "t3/answer" not in report.closure
    assert report.invocations == 3 and report.boundary == 0


# --- compaction ---------------------------------------------------------------------------

def test_compaction_starts_a_new_lineage_and_older_checkpoints_still_restore(eng):
    steps = [{"id": "t1", "kind": "user", "source": "secret", "text": SECRET},
             {"id": "t2", "kind": "user", "text": "Bob 12"},
             {"id": "t3", "kind": "compact"},
             {"id": "t4", "kind": "user", "text": "tea 7"}]
    runtime = run(eng, steps)
    lineages = {c.boundary: c.lineage for c in runtime.checkpoints.all()}
    assert lineages[0] == lineages[1] == lineages[2] != lineages[3]
    assert runtime.lineage == lineages[3] and runtime.context[0] == "t3/system"
    summary = runtime.graph["t3/context"]
    assert "secret" in summary.source_ids  # the summary read the target
    report = compare_forget_with_reset(eng, episode(steps))
    assert (report.tau, report.boundary, report.invocations) == (1, 0, 4)
    assert runtime.forget("secret").checkpoint["lineage"] == lineages[0]  # restored on the first lineage
    assert runtime.digest() == report.digest


def test_target_after_compaction_restores_on_the_new_lineage(eng):
    steps = [{"id": "t1", "kind": "user", "text": "Bob 12"}, {"id": "t2", "kind": "compact"},
             {"id": "t3", "kind": "user", "source": "secret", "text": SECRET}]
    runtime = run(eng, steps)
    new_lineage = runtime.lineage
    report = compare_forget_with_reset(eng, episode(steps))
    assert (report.tau, report.boundary, report.invocations) == (3, 2, 1)
    assert runtime.forget("secret").checkpoint["lineage"] == new_lineage
    assert runtime.digest() == report.digest


def test_compaction_keeps_the_latest_tool_round_verbatim_and_a_forget_reaches_it(eng):
    """After the summary, the trailing run of answers and tool outputs (the latest tool round),
    copied token for token with its sources; a forget of the tool field in it equals the reset,
    whose compaction keeps the round the replay finds. A round without a tool output keeps nothing."""
    steps = [{"id": "t1", "kind": "user", "text": "Bob 12"},
             {"id": "t2", "kind": "tool", "fields": [{"source": "secret", "text": SECRET}, {"source": "f2", "text": "Oak"}]},
             {"id": "t3", "kind": "compact"}, {"id": "t4", "kind": "user", "text": "tea 7"}]
    runtime = run(eng, steps)
    assert runtime.context[:5] == ["t3/system", "t3/context", "t3/context/1", "t3/context/2", "t3/context/3"]
    kept = [runtime.graph[f"t3/context/{n}"] for n in (1, 2, 3)]
    assert [b.tokens for b in kept] == [runtime.graph[b].tokens for b in ("t1/answer", "t2", "t2/answer")]
    assert [b.parents for b in kept] == [("t1/answer",), ("t2",), ("t2/answer",)]
    assert "secret" in kept[1].source_ids and SECRET in kept[1].text
    report = compare_forget_with_reset(eng, episode(steps))
    assert (report.tau, report.boundary, report.invocations) == (2, 1, 3)
    runtime.forget("secret")
    assert runtime.digest() == report.digest and SECRET not in runtime.graph["t3/context/2"].text
    plain = run(eng, [steps[0] | {"source": "secret"}, steps[2] | {"id": "t2"}])
    assert plain.context == ["t2/system", "t2/context"]


def test_a_new_context_forks_the_system_block_and_equals_a_fresh_prefill(eng, monkeypatch):
    """Compaction and a new session open with the system block: its KV is forked from the
    live lineage, not prefilled, and the state is bitwise the one prefilling it gives
    (the same steps run on the engine with its crop promise taken away)."""
    steps = [{"id": "t1", "kind": "user", "source": "secret", "text": "Bob 12"}, {"id": "t2", "kind": "compact"},
             {"id": "t3", "kind": "session"}, {"id": "t4", "kind": "user", "text": "tea 7"}]

    def run_counted():
        before = eng.counters.snapshot()
        runtime = run(eng, steps)
        return runtime, (eng.counters - before).prefilled_tokens

    forked, forked_tokens = run_counted()
    monkeypatch.setattr(eng, "determinism", dataclasses.replace(eng.determinism, crop_continue_is_fresh=False))
    prefilled, prefilled_tokens = run_counted()
    system = forked.graph[forked.context[0]]
    assert forked.context[0] == "t3/system" and system.tokens == forked.graph["system"].tokens
    assert prefilled_tokens - forked_tokens == 2 * len(system.tokens)  # two new contexts
    assert forked.digest() == prefilled.digest()
    fresh = forked.rebuild_lineage(forked.context)
    assert eng.digest(fresh) == eng.digest(forked.lineage)
    eng.drop(fresh)


def test_a_rewritten_system_block_is_prefilled_again(eng):
    """The fork's guard: where the live lineage's first block is not the system block's
    tokens (B6 redacted it), a new context prefills the block, and its KV is a fresh prefill's."""
    first = {"id": "t1", "kind": "user", "source": "secret", "text": "Bob 12"}
    runtime = run(eng, [first])
    runtime.rebuild_context(keep=lambda b: True,
                            transform=lambda b: b if b.type != "system" else attrs.evolve(
                                b, id="system~edited", text=b.text.replace("helpful", "careful")))
    assert runtime.graph[runtime.context[0]].tokens != tuple(eng.lm.encode(runtime.render_first()))
    runtime.run(episode([first, {"id": "t2", "kind": "compact"}]).steps[1:])
    assert runtime.context[0] == "t2/system"
    fresh = runtime.rebuild_lineage(runtime.context)
    assert eng.digest(fresh) == eng.digest(runtime.lineage)
    eng.drop(fresh)


# --- reading the state ----------------------------------------------------------------------

def test_probe_does_not_change_the_state(eng):
    runtime = run(eng, FIXED)
    before, lineage, lineages = runtime.digest(), runtime.lineage, set(eng.budget.lineages)
    answer = runtime.probe("Where does the user live?", max_new_tokens=5)
    assert isinstance(answer, str)
    assert runtime.digest() == before
    assert runtime.lineage == lineage
    assert set(eng.budget.lineages) == lineages  # the branch was dropped
    assert runtime.probe("Where does the user live?", max_new_tokens=5) == answer


def test_checkpoints_are_small_metadata(eng):
    runtime = run(eng, FIXED)
    assert len(eng.budget.lineages) >= 1
    for checkpoint in runtime.checkpoints.all():
        record = checkpoint.get_record()
        encoded = json.dumps(record, separators=(",", ":"))  # plain data only: no tensors
        assert checkpoint.nbytes == len(encoded.encode()) < 4096
        assert isinstance(checkpoint.lineage, str) and isinstance(checkpoint.token_offset, int)
        assert set(record) == {"boundary", "lineage", "token_offset", "context", "memory", "plans", "env_snapshot"}
    # no cache was copied for them: one lineage holds the whole session
    assert {c.lineage for c in runtime.checkpoints.all()} == {runtime.lineage}
    report = runtime.forget("secret")
    assert 0 < report.checkpoint_bytes < 4096
    assert report.checkpoint_bytes == len(json.dumps(report.checkpoint, separators=(",", ":")).encode())


# --- branching and failure ------------------------------------------------------------------

def test_fork_is_independent(eng):
    runtime = run(eng, FIXED)
    other = runtime.fork()
    assert other.digest() == runtime.digest()
    other.forget("secret")
    assert other.digest() != runtime.digest()
    assert runtime.digest() == run(eng, FIXED).digest()  # the original is untouched
    runtime.forget("secret")
    assert runtime.digest() == other.digest()


def test_failed_forget_leaves_the_session_as_it_was(eng):
    runtime = run(eng, FIXED)
    before = runtime.digest()

    def interrupt(done, total):
        if done == 2:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        runtime.forget("secret", progress=interrupt)
    assert runtime.digest() == before
    runtime.check_invariants()
    report = runtime.forget("secret")  # and a later forget still works
    assert report.digest == run_counterfactual(eng, runtime.system, runtime.settings,
                                               run(eng, FIXED).steps, "secret").digest()


# --- problems once found in impl/agent/runtime.py, pinned ---------------------------------------------

def test_fork_remembers_what_was_forgotten(eng):
    runtime = run(eng, FIXED)
    runtime.forget("secret")
    again = runtime.fork().forget("secret")
    assert again.already_forgotten


def test_generated_tokens_are_model_written(eng):
    runtime = run(eng, [{"id": "t1", "kind": "plan", "source": "secret", "text": SECRET}])
    assert [b for b, _ in runtime.generated_tokens()] == ["t1/plan"]


def test_forget_steps_are_values_and_leave_the_runtime_as_it_was(eng):
    """plan_replay, restore_checkpoint and get_replayed return values: the
    runtime's state is the same object until it adopts, the replay's drafts and
    turn costs come back in the value, and adopting them gives what forget gives."""
    from unsee.impl.agent.forget import get_replayed, plan_replay, restore_checkpoint, sanitize_steps

    ep = episode(FIXED)
    runtime, twin = AgentRuntime.from_episode(eng, ep), AgentRuntime.from_episode(eng, ep)
    state = runtime.state
    plan = plan_replay(state, eng, ["secret"], drafts=True)
    assert (plan.tau, plan.checkpoint.boundary, plan.pending) == (2, 1, ("secret",))
    assert plan.drafts is not None and not plan.drafts.turns  # nothing replayed yet
    replay = restore_checkpoint(runtime, plan.checkpoint, plan.pending, plan.drafts)
    restored = replay.lineage
    replay.run(sanitize_steps(state.steps[plan.checkpoint.boundary:], plan.pending))
    replayed = get_replayed(runtime, state, plan, replay, restored, "replay", ["secret"])
    assert runtime.state is state and replayed.base is state and runtime.drafts is None and not runtime.replaying
    turns = replayed.forgotten.drafts.turns
    assert [t.block for t in turns] == ["t3/answer", "t4/plan", "t5/note", "t6/answer"]
    assert replayed.forgotten.invocations == 5 and replayed.forgotten.restore.checkpoint_tokens > 0
    runtime.adopt(replayed, "forget")
    assert runtime.digest() == twin.forget("secret", drafts=True).digest
