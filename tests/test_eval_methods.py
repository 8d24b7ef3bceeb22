"""The methods the evaluation adds or changes (impl/methods/baselines.py): span-only
excision (the paper's Table 4 ablation) and B8/B9's sink policy by sink
class, on the tiny model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from unsee.impl.agent.episode import Episode, Item, Settings, Step
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.agent.tools import ToolAgentRuntime
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.engines.registry import make_engine
from unsee.impl.eval.suites import TOOL_SINKS, get_suite_tools
from unsee.impl.methods.baselines import (
    METHODS,
    PAPER_NAMES,
    _find_token_span,
    apply_method,
    get_blocked_args,
    get_plan_arguments,
)

SECRET = "The host lives at 4417 Elm Street."


def kv(engine: KVEngine, lineage: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(k.clone(), v.clone()) for k, v in adapter.cache_tensors(engine.get_lineage(lineage).cache) if k is not None]


def episode(*steps: Step) -> Episode:
    return Episode("You are an agent.", tuple(steps), Settings(max_new_tokens=4))


def user(sid: str, text: str) -> Step:
    return Step(sid, "user", (Item(sid, text),))


def test_methods_name_the_ablation():
    assert "span-excision" in METHODS and "Table 4" in PAPER_NAMES["span-excision"]


# --- span-only excision -----------------------------------------------------------------


def test_span_excision_cuts_only_the_target_tokens_and_keeps_the_suffix_kv(lm):
    engine = make_engine(lm)
    ep = episode(user("u1", "hi"),
                 Step("t2", "tool", (Item("venues", "Venues: Rosa's."), Item("addr", SECRET)), "fetch"),
                 user("u3", "where is the party?"),
                 Step("m4", "memory", (Item("m4.a", "likes tea"),)))
    base = AgentRuntime.from_episode(engine, ep)
    before_digest, before_kv, before_tokens = base.digest(), kv(engine, base.lineage), engine.tokens(base.lineage)
    out, result = apply_method(base, "span-excision", "addr")
    out.check_invariants()  # the cache holds exactly the edited context blocks' tokens
    assert base.digest() == before_digest  # the base state is untouched (copy-on-write)
    assert result.recomputed_tokens == 0
    tool = base.graph["t2"]
    a, z = _find_token_span(lm, tool.tokens, SECRET)
    start, end = tool.token_span[0] + a, tool.token_span[0] + z
    assert lm.decode(before_tokens[start:end]) == SECRET  # byte tokenizer: the span is exactly the item
    assert engine.tokens(out.lineage) == before_tokens[:start] + before_tokens[end:]
    for (k0, v0), (k1, v1) in zip(before_kv, kv(engine, out.lineage), strict=True):
        # prefix and suffix KV are the base's, bit for bit: nothing was recomputed
        assert torch.equal(k1, torch.cat([k0[..., :start, :], k0[..., end:, :]], dim=-2))
        assert torch.equal(v1, torch.cat([v0[..., :start, :], v0[..., end:, :]], dim=-2))
    # derived artifacts stay, the observation loses the item's text only
    assert out.graph["u3/answer"].text == base.graph["u3/answer"].text
    assert SECRET not in out.graph["t2"].text and "Venues: Rosa's." in out.graph["t2"].text
    assert out.digest() not in (before_digest, apply_method(base, "reset", "addr")[1].digest)


def test_span_excision_reaches_reinjected_memory_and_drops_the_record(lm):
    engine = make_engine(lm)
    ep = episode(Step("m1", "memory", (Item("pet", "Dog: Mochi."), Item("home", SECRET))), user("u2", "hello"),
                 Step("s3", "session"), user("u4", "where do I live?"))
    base = AgentRuntime.from_episode(engine, ep)
    out, _ = apply_method(base, "span-excision", "home")
    out.check_invariants()
    assert [out.graph[m].text for m in out.memory] == ["Dog: Mochi."]
    reinjected = out.graph["s3/memory"]
    assert SECRET not in reinjected.text and "Dog: Mochi." in reinjected.text
    assert len(engine.tokens(out.lineage)) < len(engine.tokens(base.lineage))


def test_span_excision_cannot_reach_a_compacted_target(lm):
    """After a compaction only the summary (a derived artifact) is live, where a user turn came
    after the target's tool round (a compaction keeps the latest round verbatim): span-only
    excision has nothing to cut, the KV is the base's."""
    engine = make_engine(lm)
    ep = episode(Step("t1", "tool", (Item("addr", SECRET),), "fetch"), user("u2", "ok"), Step("c3", "compact"),
                 user("u4", "hi"))
    base = AgentRuntime.from_episode(engine, ep)
    out, _ = apply_method(base, "span-excision", "addr")
    assert engine.tokens(out.lineage) == engine.tokens(base.lineage)
    assert out.digest() == base.digest()


@given(st.text(alphabet="ab xy.", min_size=0, max_size=12), st.text(alphabet="XYZ 12", min_size=1, max_size=6),
       st.text(alphabet="ab xy.", min_size=0, max_size=12))
def test_token_span_is_the_item_on_a_byte_tokenizer(lm, before, item, after):
    tokens = tuple(lm.encode(before + item + after))
    a, z = _find_token_span(lm, tokens, item)
    assert lm.decode(list(tokens[a:z])) == item
    assert _find_token_span(lm, tokens, item + "!") is None


def test_engine_excise_refuses_bad_spans(lm):
    engine = make_engine(lm)
    lin = engine.new_lineage()
    engine.prefill(lin, lm.encode("hello there"))
    for start, end in ((-1, 2), (3, 2), (0, 99), ("a", 2)):
        with pytest.raises(ValueError, match="excise"):
            engine.excise(lin, start, end)
    assert len(engine.tokens(lin)) == len(lm.encode("hello there"))


# --- B8 / B9 by sink class --------------------------------------------------------------------


def tool_episode(target_first: bool = True) -> Episode:
    read = Step("t1", "tool", (Item("contact.email", "E-mail: maria@mailbox.example"), Item("contact.name", "Maria")),
                "lookup_contact")
    plan = Step("p2", "plan", (Item("p2", "Tell Maria the dinner moved."),), "send_message")
    return episode(read, plan, user("u3", "thanks")) if target_first else episode(plan, read, user("u3", "thanks"))


def test_ifc_blocks_identifier_sinks_of_tainted_plans_and_lets_free_text_pass(lm):
    base = ToolAgentRuntime.from_episode(make_engine(lm), tool_episode(), tools=get_suite_tools())
    out, b8 = apply_method(base, "ifc", "contact.email", sinks=TOOL_SINKS)
    assert b8.blocked_args == (("p2/plan", "to"),) and b8.blocked_plans == ("p2/plan",)  # body (free text) passes
    assert out.digest() == apply_method(base, "none", "contact.email")[1].digest  # no state cleanup
    # the routing argument the policy blocks is the target the scaffold copied
    assert get_plan_arguments(base, {})["p2/plan"]["to"] == "maria@mailbox.example"
    _, conservative = apply_method(base, "ifc", "contact.email")  # no sink labels: the whole plan
    assert conservative.blocked_args == (("p2/plan", "*"),)
    _, b9 = apply_method(base, "ifc-replay", "contact.email", sinks=TOOL_SINKS)
    assert b9.blocked_args == () and b9.blocked_plans == ()  # after replay no plan carries the target
    selection = {"send_message": {"to": "free_text", "body": "selection"}}
    assert get_blocked_args(base, "contact.email", selection) == (("p2/plan", "body"),)


def test_ifc_leaves_plans_made_before_the_target_alone(lm):
    base = ToolAgentRuntime.from_episode(make_engine(lm), tool_episode(target_first=False), tools=get_suite_tools())
    _, b8 = apply_method(base, "ifc", "contact.email", sinks=TOOL_SINKS)
    assert b8.blocked_args == ()


def test_plan_arguments_are_parsed_without_a_tool_layer(lm):
    base = AgentRuntime.from_episode(make_engine(lm), tool_episode())
    args = get_plan_arguments(base, {"send_message": ("to", "body")})
    assert set(args["p2/plan"]) == {"to", "body"}
