"""Drafts decided by what they cost on the model at hand (issue 54): the policy built
from a measured cost table (impl/engines/speculation.py, ``DraftPolicy.from_costs``),
drafts off by default where that table says they cannot pay, and a replay that stops
drafting once its own forwards say its drafts lose (impl/agent/drafts.py,
``Drafts.with_turn``). The costs are injected: no assertion reads a clock."""

from __future__ import annotations

import attrs
import pytest

from unsee.bench.episodes import make_bench_episode
from unsee.impl.agent.drafts import Draft, Drafts, TurnCost, compute_balance, compute_turn_saving
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.llamacpp import engine as llamacpp
from unsee.impl.engines.protocol import Assist
from unsee.impl.engines.speculation import DraftPolicy, compute_credit, compute_proposals, get_loss_ratio
from unsee.properties.differential import compare_forget_with_reset, engine_scope

#: a model whose forwards are cheap beyond the first token (Qwen2.5-Coder-1.5B on an Intel Xeon)
PAYING = {2: 1.45, 3: 1.85, 4: 2.4, 6: 3.3, 8: 4.2, 16: 7.8}
#: a model whose short forwards cost about a decode step a token (Gemma 3 270M here: its
#: 262,144-entry logits copied for every row)
LOSING = {2: 2.7, 3: 4.7, 4: 3.7, 6: 4.55, 8: 4.97, 16: 9.25}


def test_a_measured_table_that_pays_turns_drafts_on_and_opens_at_its_best_size():
    policy = DraftPolicy.from_costs(PAYING, "injected")
    assert policy.pays and policy.costs[0] == (2, 1.45)
    # the opening is the risk of the size whose loss over its saving is lowest: 3 tokens, 0.85 / 1.15
    assert policy.opening == pytest.approx(0.85)
    assert compute_proposals(policy, policy.opening, 50) == 2
    # a forward that holds earns its saving, one that fails loses its cost beyond the first token
    assert compute_credit(policy, policy.opening, 2, 2) == pytest.approx(2.0)
    assert compute_credit(policy, policy.opening, 2, 0) == pytest.approx(0.0)
    assert policy.to_json()["pays"] is True and policy.to_json()["costs"]["16"] == 7.8


def test_a_measured_table_that_loses_says_drafts_cannot_pay_and_why():
    policy = DraftPolicy.from_costs(LOSING, "injected")
    assert not policy.pays
    assert "a ratio above 1 at every opening size" in policy.why
    assert get_loss_ratio(policy.get_cost(8), 8) > 1


def test_the_cost_between_and_beyond_measured_sizes_is_read_off_the_table():
    policy = DraftPolicy.from_costs({2: 2.0, 4: 3.0, 8: 5.0})
    assert [policy.get_cost(n) for n in (1, 3, 6, 10)] == pytest.approx([1.0, 2.5, 4.0, 6.0])
    with pytest.raises(ValueError, match="2 tokens or more"):
        DraftPolicy.from_costs({1: 1.0})


def turn(block, generated, timings, draft=4):
    return TurnCost(block, draft, Counters(), generated=generated, timings=timings)


def test_a_turn_saving_counts_its_forwards_at_the_replays_own_measured_costs():
    policy = DraftPolicy.from_costs(PAYING)
    # 6 tokens decoded one by one (5 steps and a one-token commit): the same as decoding, saved 0
    decoded = turn("a", 6, [(1, 0.1, False)] * 6)
    assert compute_turn_saving(policy, decoded, {}) == pytest.approx(0.0)
    # 6 tokens in two forwards of 3, the last fed as a proposal (no commit forward): 6 - 2 x 1.9
    held = turn("b", 6, [(3, 0.19, False), (3, 0.19, False)])
    assert compute_turn_saving(policy, held, {}) == pytest.approx(6 - 3.7)
    # at the costs this replay measured (3 tokens at 0.3 s where a step took 0.1 s) it lost
    dear = turn("c", 6, [(3, 0.3, False), (3, 0.3, False), (1, 0.1, False)])
    assert compute_balance(policy, [dear]) == pytest.approx(6 - 3.0 - 3.0 - 1.0)
    # a commit that re-prefills the turn is the same work with drafts and without: left out
    refed = turn("d", 70, [(1, 0.1, False)] * 69 + [(70, 3.0, True)])
    assert compute_turn_saving(policy, refed, {}) == pytest.approx(0.0)


def test_a_replay_stops_drafting_once_its_drafts_lose_more_than_a_turns_opening():
    policy = DraftPolicy.from_costs(PAYING)
    drafts = Drafts({"t1": Draft((5, 6, 7)), "t2": Draft((8, 9)), "t3": Draft((1, 2))}, 0.0, policy=policy)
    assert drafts.get_assist(drafts.get("t2")).draft == (8, 9)
    # one turn whose opening failed: it lost its opening, which the policy allows
    failed = turn("t1", 4, [(3, 0.185, False), (1, 0.1, False), (1, 0.1, False), (1, 0.1, False)])
    once = drafts.with_turn(failed)
    assert once.stopped is None and compute_balance(policy, once.turns) == pytest.approx(-0.85)
    # a second: the drafts have now lost more than an opening over the replay, so the rest is decoded
    twice = once.with_turn(attrs.evolve(failed, block="t2"))
    assert twice.stopped is not None and "stopped after turn t2" in twice.stopped
    assert twice.get_assist(twice.get("t3")) == Assist()
    # a turn whose draft held pays for a failed one: no stop
    held = turn("t2", 12, [(3, 0.19, False), (9, 0.5, False)])
    assert once.with_turn(held).stopped is None


@pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed")
@pytest.mark.parametrize(("costs", "mode"), [(LOSING, "off"), (PAYING, "verify")])
def test_the_default_forget_drafts_only_where_the_models_measured_costs_pay(engine_factory, costs, mode):
    engine = engine_factory("llamacpp-tiny", n_ctx=512)
    saved = engine.draft_policy
    engine.draft_policy = DraftPolicy.from_costs(costs, "injected")
    try:
        with engine_scope(engine):
            report = compare_forget_with_reset(engine, make_bench_episode(2, 5, max_new_tokens=6))
    finally:
        engine.draft_policy = saved
    assert report.drafts.mode == mode
    if mode == "off":
        assert "drafts cannot pay" in report.drafts.why and "injected" in report.drafts.why
        assert report.draft_accepted_tokens == 0 and report.drafts.policy is None
    else:
        assert report.drafts.policy.pays and len(report.drafts.turns) > 0
        assert all(t.timings for t in report.drafts.turns if not t.trusted) or report.drafts.stopped
