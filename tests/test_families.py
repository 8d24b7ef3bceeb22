"""Each model family's call format (issue 51): the family is read from its real chat template
(tests/data/templates, from llama.cpp's test templates), a turn's calls written in the family's
format parse back, ``required``'s grammar lets exactly the family's call through, and through the
server a tiny model under that template calls a tool (forced by the grammar), takes the result,
and a DELETE of an earlier message equals its twin."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from unsee import Settings
from unsee.impl.agent.render import get_renderer
from unsee.impl.agent.tools.families import BY_NAME, get_family, get_tool_format
from unsee.impl.agent.tools.grammars import get_constraints
from unsee.impl.agent.tools.native import FunctionCall, parse_turn
from unsee.impl.engines.registry import make_engine

pytest.importorskip("llguidance")

TEMPLATES = Path(__file__).with_name("data") / "templates"
#: case -> (template file, the tiny tokenizer's three special tokens: BOS, EOS, one more); a case is
#: its family's name (the reasoning ones: the family, then the model)
CASES = {
    "hermes/qwen3": ("Qwen-Qwen3-0.6B", ("<|endoftext|>", "<|im_end|>", "<|im_start|>")),
    "generic/phi3.5": ("microsoft-Phi-3.5-mini-instruct", ("<|endoftext|>", "<|end|>", "<|assistant|>")),
    "hermes": ("Qwen-Qwen2.5-7B-Instruct", ("<|endoftext|>", "<|im_end|>", "<|im_start|>")),
    "llama3_json": ("meta-llama-Llama-3.2-3B-Instruct", ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>")),
    "mistral": ("unsloth-mistral-Devstral-Small-2507", ("<s>", "</s>", "[TOOL_CALLS]")),
    "mistral_list": ("mistralai-Mistral-Nemo-Instruct-2407", ("<s>", "</s>", "[TOOL_CALLS]")),
    "granite": ("ibm-granite-granite-3.3-2B-Instruct", ("<|end_of_text|>", "<|end_of_text|>", "<|tool_call|>")),
    "qwen3_coder": ("Qwen3-Coder", ("<|endoftext|>", "<|im_end|>", "<|im_start|>")),
    "generic": ("google-gemma-2-2b-it", ("<bos>", "<end_of_turn>", "<start_of_turn>")),
}
#: what each template file's text is detected as
DETECTED = {"HuggingFaceTB-SmolLM3-3B": "generic", "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes", "Qwen-QwQ-32B": "hermes",
            "Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes", "Qwen3-Coder": "qwen3_coder",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "generic", "google-gemma-2-2b-it": "generic",
            "ibm-granite-granite-3.3-2B-Instruct": "granite", "meta-llama-Llama-3.1-8B-Instruct": "llama3_json",
            "meta-llama-Llama-3.2-3B-Instruct": "llama3_json", "microsoft-Phi-3.5-mini-instruct": "generic",
            "mistralai-Mistral-Nemo-Instruct-2407": "mistral_list",
            "unsloth-mistral-Devstral-Small-2507": "mistral"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALLS = (FunctionCall("get_weather", '{"city": "Oslo", "unit": "c"}'), FunctionCall("get_time", "{}"))
NAMES = {"get_weather", "get_time"}


def load_render_helpers():
    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def family_model(lm, case: str):
    """The tiny model under the case's real template (its byte tokenizer: three specials)."""
    name, (bos, eos, other) = CASES[case]
    specials = tuple(dict.fromkeys((bos, eos, other)))
    specials += tuple(f"<|unused{i}|>" for i in range(3 - len(specials)))
    return load_render_helpers().with_template(lm, (TEMPLATES / f"{name}.jinja").read_text(), specials, bos, eos)


@pytest.mark.parametrize("name", sorted(DETECTED))
def test_each_real_template_is_read_as_its_family(name):
    assert get_family((TEMPLATES / f"{name}.jinja").read_text()).name == DETECTED[name]


@pytest.mark.parametrize("family", sorted(BY_NAME))
def test_a_turn_s_calls_in_the_family_s_format_parse_back(family):
    fmt = BY_NAME[family].call
    for calls in (CALLS[:1], CALLS):
        assert parse_turn(fmt, fmt.render_calls(calls), NAMES) == ("", calls, True), fmt.render_calls(calls)
        text = fmt.render_turn("Let me look.", calls)
        # a bare object or list is a call only where it opens the turn (vLLM's llama3_json and pythonic parsers)
        expected = ("Let me look.", calls, True) if fmt.marker and fmt.shape != "pythonic" and fmt.opening.startswith(fmt.marker) \
            else (text, (), True)
        assert parse_turn(fmt, text, NAMES) == expected, text
    assert parse_turn(fmt, fmt.render_calls(CALLS[:1]), {"get_time"})[1] == ()  # an unknown tool is no call


@pytest.mark.parametrize("case", sorted(CASES))
def test_required_lets_the_family_s_call_through_and_nothing_else(lm, case):
    model = family_model(lm, case)
    renderer = get_renderer(model)
    fmt = get_tool_format(renderer, model.chat_template)
    assert fmt.family == case.split("/")[0]
    family = case
    (grammar,) = get_constraints(model, fmt, [WEATHER, TIME], "required", None, True, None)
    written = fmt.render_calls(CALLS[:1])[len(fmt.opening):]
    ids = model.encode(written)
    for k in range(len(ids)):
        allowed = grammar.get_allowed(ids[:k])
        assert allowed is None or bool(allowed[ids[k]]), (family, model.decode(ids[:k]))
    assert bool(grammar.get_allowed(ids)[model.eos_ids[0]])
    bad = model.encode("get_weather" + fmt.between + '{"city": 7')
    assert any(not bool(grammar.get_allowed(bad[:k])[bad[k]]) for k in range(len(bad)))


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


@pytest.mark.parametrize("case", sorted(CASES))
def test_through_the_server_a_forced_call_parses_and_a_forget_equals_its_twin(lm, case, tmp_path):
    """The round trip of issue 51's CI: the template renders the tools, the model writes its call
    (held to the family's grammar), the API returns a function_call, the client's output is
    rendered back, and a DELETE of an earlier message equals the twin that never had it."""
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    model = family_model(lm, case)
    tool = {"type": "function", "name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
        "additionalProperties": False}}

    def run(client, conv_id: str, first: list[dict]) -> list:
        replies = [client.responses.create(model="tiny", conversation=conv_id, input=first, max_output_tokens=8)]
        replies.append(client.responses.create(model="tiny", conversation=conv_id, input="Weather in Oslo?",
                                               tools=[tool], tool_choice="required", parallel_tool_calls=False,
                                               max_output_tokens=120))
        calls = [o for o in replies[-1].output if o.type == "function_call"]
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny."} for c in calls]
        replies.append(client.responses.create(model="tiny", conversation=conv_id, input=outputs, tools=[tool],
                                               tool_choice="none", max_output_tokens=8))
        return replies

    with ServerThread(Pool(make_engine(model), tmp_path, defaults=Settings(max_new_tokens=8)), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create()
        replies = run(client, conv.id, [user("s1", "My locker code is 5-1-9."), user("q1", "Hello.")])
        calls = [o for o in replies[1].output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather", replies[1].output
        assert json.loads(calls[0].arguments)["unit"] in ("c", "f")
        gone = client.conversations.items.delete("s1", conversation_id=conv.id).model_extra
        assert "s1" in gone["removed"] and gone["status"] != "pending", gone
        twin = client.conversations.create()
        run(client, twin.id, [user("q1", "Hello.")])
        digests = [client.conversations.retrieve(c).model_extra["unsee"]["digest"] for c in (conv.id, twin.id)]
        assert digests[0] == digests[1]


def test_a_tool_format_named_by_the_server_overrides_the_template_s(lm):
    model = family_model(lm, "generic")
    renderer = get_renderer(model)
    assert get_tool_format(renderer, model.chat_template, "pythonic").family == "pythonic"
    with pytest.raises(ValueError, match="--tool-format 'nope'"):
        get_tool_format(renderer, model.chat_template, "nope")


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                                  "microsoft-Phi-3.5-mini-instruct", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
                                  "Mistral-Small-3.2-24B-Instruct-2506"])
def test_templates_that_rewrite_history_or_need_helpers_are_served(lm, name):
    """Issue 51's refusals: reasoning templates (earlier turns rewritten) are served with the model's
    turns kept as it wrote them; Hermes' tool_use template and Mistral-Small's strftime_now render."""
    from unsee.impl.agent.templates import HISTORY_KEPT

    model = load_render_helpers().with_template(lm, (TEMPLATES / f"{name}.jinja").read_text(),
                                                ("<|endoftext|>", "<|end|>", "<|assistant|>"), "<|endoftext|>",
                                                "<|end|>")
    roles = dict(get_renderer(model).segments.roles)
    rewrites = name.split("-")[0] in ("Qwen", "deepseek", "microsoft")
    assert roles.get("earlier model turns") == (HISTORY_KEPT if rewrites else None)


@pytest.mark.parametrize("text,expected", [
    ("<think>\nWeigh it.\n</think>\n\nIt is 4.", ("Weigh it.", "It is 4.")),
    ("Weigh it.</think>It is 4.", ("Weigh it.", "It is 4.")),  # the generation prompt opened the block
    ("It is 4.", ("", "It is 4.")),
    ("I write <think> tags.</think> here", ("", "I write <think> tags.</think> here")),
])
def test_a_turn_s_reasoning_is_split_from_its_answer(text, expected):
    from unsee.impl.agent.tools.native import split_reasoning

    assert split_reasoning(text) == expected


def test_a_reasoning_block_opens_the_answer_s_items_and_the_chat_message():
    from unsee.impl.serve import shapes
    from unsee.impl.serve.turns import add_reasoning

    class Runtime:
        def get_reasoning(self, step_id):
            return "Weigh it."

    items = add_reasoning(Runtime(), "turn_1", [shapes.output_message("msg_abc", "It is 4.", True)])
    assert [i["type"] for i in items] == ["reasoning", "message"] and items[0]["id"] == "rs_abc"
    assert shapes.chat_message("It is 4.", [], "Weigh it.")["reasoning_content"] == "Weigh it."


def test_serve_s_flags_name_the_table_s_formats_and_set_the_model_s_template(lm, tmp_path):
    from unsee.impl.cli.serve import TOOL_FORMATS, apply_model_overrides

    assert set(TOOL_FORMATS) == set(BY_NAME)
    model = family_model(lm, "generic")
    path = tmp_path / "t.jinja"
    path.write_text((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    apply_model_overrides(model, str(path), "hermes")
    assert model.chat_template == path.read_text() and model.tool_format == "hermes"
    assert get_tool_format(get_renderer(model), model.chat_template, model.tool_format).family == "hermes"
    with pytest.raises(ValueError, match="--tool-format 'xml'"):
        apply_model_overrides(model, None, "xml")
    with pytest.raises(ValueError, match="--chat-template .*missing.jinja"):
        apply_model_overrides(model, str(tmp_path / "missing.jinja"), None)


def test_a_stream_holds_a_reasoning_block_back_and_sends_the_answer_after_it(lm):
    from unsee.impl.serve.stream import TurnStream

    sent = []
    stream = TurnStream(lm, BY_NAME["generic"].call, sent.append)
    for text in ("<think>Weigh", "<think>Weigh it.</think>", "<think>Weigh it.</think>It is 4."):
        stream.tokens(lm.encode(text))
    assert sent == [("delta", "It is 4.")]
    sent.clear()
    stream.sent, stream.thinking = "", True  # the generation prompt opened the block (R1 distills)
    for text in ("Weigh", "Weigh it.</think>It is"):
        stream.tokens(lm.encode(text))
    assert sent == [("delta", "It is")]
