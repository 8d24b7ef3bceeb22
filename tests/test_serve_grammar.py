"""Calls as the model writes them and structured outputs (issue 49): every opening a call may
start with is read back, the lazy grammar of ``auto`` holds a started call to the tools'
schemas and leaves text free, ``required`` and one function are held from the first token,
``none`` masks the marker, a response format's answer always matches its schema, the masks
are a function of the turn's tokens alone (asked in any order, the same), and a conversation
decoded under grammars equals its twin after a DELETE, with nothing of the removed item on
disk after a restart."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unsee import Settings
from unsee.impl.agent.tools.grammars import get_constraints
from unsee.impl.agent.tools.native import OPENINGS, CallFormat, FunctionCall, parse_turn, split_stream_text
from unsee.impl.engines.constraints import MAX_BLANK_RUN
from unsee.impl.engines.registry import make_engine

pytest.importorskip("llguidance")

QWEN = CallFormat(marker="<tool_call>\n", opening='<tool_call>\n{"name": "', between='", "arguments": ',
                  after="}\n</tool_call>", end="\n</tool_call>")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
DEFS = [WEATHER, TIME]
NAMES = {"get_weather", "get_time"}
ARGS = '{"city": "Oslo", "unit": "c"}'
#: one call in each opening the lazy grammar and the parser read (native.OPENINGS)
WRITTEN = {
    "marker": f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>',
    "fenced_json": f'Let me check.\n```json\n{{"name": "get_weather", "arguments": {ARGS}}}\n```',
    "fenced_xml": f'```xml\n<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>\n```',
    "function_tag": f"<function=get_weather>{ARGS}</function>",
    "bare_json": f'{{"name": "get_weather", "arguments": {ARGS}}}',
}
ANSWER_SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
                 "required": ["verdict", "sure"], "additionalProperties": False}


def get_blocked(lm, constraints, text: str) -> list[tuple[int, str]]:
    """Where the constraints would not let the turn write ``text``: (token index, the text before it)."""
    ids = lm.encode(text)
    blocked = []
    for k in range(len(ids)):
        for c in constraints:
            allowed = c.get_allowed(ids[:k])
            if allowed is not None and not bool(allowed[ids[k]]):
                blocked.append((k, lm.decode(ids[:k])))
    return blocked


@pytest.mark.parametrize("kind", OPENINGS)
def test_each_opening_is_read_back_as_a_call(kind):
    text, calls, ok = parse_turn(QWEN, WRITTEN[kind], NAMES)
    assert ok and calls == (FunctionCall("get_weather", ARGS),)
    assert text == ("Let me check." if kind == "fenced_json" else "")
    assert parse_turn(QWEN, WRITTEN[kind], NAMES, openings=()) == (WRITTEN[kind].strip(), (), True)


@pytest.mark.parametrize("text", [
    '```json\n{"name": "get_weather", "arguments": {"city": "Os',  # cut by the output cap
    '```json\n{"name": "send_money", "arguments": {}}\n```',  # no tool of the request
    '<function=get_weather>{"city": "Oslo"}</function> and more',  # text after the call
    'Note {"name": "get_weather", "arguments": {}}',  # a JSON object that does not open the turn is text
])
def test_an_opening_whose_call_does_not_parse_is_text(text):
    assert parse_turn(QWEN, text, NAMES)[1] == ()


@pytest.mark.parametrize("text,expected", [
    ("It is ``", ("It is", False)),  # a fence may open: it waits
    ("It is ```json\n{", ("It is", True)),
    ("{", ("", True)),  # a JSON object opening the turn may be a call
    ("See <function", ("See", False)),
])
def test_a_stream_holds_back_any_opening(text, expected):
    assert split_stream_text(QWEN, text) == expected


@pytest.mark.parametrize("kind", OPENINGS)
def test_the_lazy_grammar_lets_each_opening_through_and_then_holds_it(qwen_style, kind):
    auto = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)
    assert get_blocked(qwen_style, auto, WRITTEN[kind]) == []
    wrong = WRITTEN[kind].replace('"c"}', '"kelvin"}')  # an argument outside its enum
    assert get_blocked(qwen_style, auto, wrong), f"{kind}: a started call must follow its schema"


def test_auto_leaves_text_free_and_a_started_call_must_name_a_tool(qwen_style):
    auto = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)
    assert get_blocked(qwen_style, auto, "No tool is needed: it is 4 pm. {braces} `ticks`") == []
    blocked = get_blocked(qwen_style, auto, '```json\n{"name": "send_money", "arguments": {}}\n```')
    assert blocked and blocked[0][1].endswith('"name": "')


def test_required_one_function_and_none(qwen_style):
    required = get_constraints(qwen_style, QWEN, DEFS, "required", None, True, None)
    # after the prefilled opening (up to the name): a name, its arguments, the closing, more calls
    rest = f'get_weather", "arguments": {ARGS}}}\n</tool_call>\n<tool_call>\n{{"name": "get_time", "arguments": {{}}}}'
    assert get_blocked(qwen_style, required, rest) == []
    # a blank after the last call does not commit the turn to another call: it may end there
    (grammar,) = required
    closed = rest + "\n</tool_call>\n"
    assert not bool(grammar.get_allowed(qwen_style.encode(rest))[qwen_style.eos_ids[0]])
    assert bool(grammar.get_allowed(qwen_style.encode(closed))[qwen_style.eos_ids[0]])
    (lazy,) = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)
    assert bool(lazy.get_allowed(qwen_style.encode(WRITTEN["fenced_json"] + "\n"))[qwen_style.eos_ids[0]])
    assert get_blocked(qwen_style, required, "Sure, I can help.")
    one = get_constraints(qwen_style, QWEN, DEFS, "function", "get_weather", False, None)
    assert get_blocked(qwen_style, one, f" {ARGS}}}\n</tool_call>") == []
    assert get_blocked(qwen_style, one, ' {"city": "Oslo"}}')  # a required argument missing
    # the tiny model writes the marker as text: nothing to mask (the marker is masked where it is one token)
    assert get_constraints(qwen_style, QWEN, DEFS, "none", None, True, None) == ()


def test_a_response_format_holds_the_answer_and_may_still_call_in_auto(qwen_style):
    fmt = {"type": "json_schema", "schema": ANSWER_SCHEMA}
    answer = get_constraints(qwen_style, QWEN, [], "auto", None, True, fmt)
    assert get_blocked(qwen_style, answer, '{"verdict": "yes", "sure": true}') == []
    assert get_blocked(qwen_style, answer, "Yes.") and get_blocked(qwen_style, answer, '{"verdict": "maybe"')
    both = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, fmt)
    assert get_blocked(qwen_style, both, WRITTEN["marker"]) == []
    assert get_blocked(qwen_style, both, WRITTEN["fenced_json"])  # with a format, only the template's own calls
    anything = get_constraints(qwen_style, QWEN, [], "auto", None, True, {"type": "json_object"})
    assert get_blocked(qwen_style, anything, '{"x": [1, 2]}') == [] and get_blocked(qwen_style, anything, "[1]")


def test_blank_runs_are_bounded(qwen_style):
    (grammar,) = get_constraints(qwen_style, QWEN, [], "auto", None, True, {"type": "json_object"})
    blank = qwen_style.encode(" ")[0]
    ids = qwen_style.encode("{") + [blank] * MAX_BLANK_RUN
    assert not bool(grammar.get_allowed(ids)[blank]) and bool(grammar.get_allowed(ids[:-1])[blank])


@settings(max_examples=20, deadline=None)
@given(order=st.permutations(list(range(24))))
def test_masks_are_a_function_of_the_prefix_whatever_the_order_asked(qwen_style, order):
    """A verification or a fallback asks for masks out of order; each must be the mask of its
    prefix alone (what a twin's turn asks in order). The marker's 11 bytes open the call, so
    most of these prefixes are inside the grammar."""
    ids = qwen_style.encode(WRITTEN["marker"])[:24]
    auto = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)[0]
    fresh = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)[0]
    for k in order:
        a, b = auto.get_allowed(ids[:k + 1]), fresh.get_allowed(ids[:k + 1])
        assert (a is None) == (b is None) and (a is None or bool((a == b).all())), k
        fresh = get_constraints(qwen_style, QWEN, DEFS, "auto", None, True, None)[0]


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def test_a_server_answers_in_its_schema_and_forced_calls_parse_and_a_forget_equals_its_twin(qwen_style, tmp_path):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    secret = "My locker code is 5-1-9."
    # arguments of an enum only: the random tiny model, held to the grammar, closes its call in the cap
    tool = {"type": "function", "name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
        "additionalProperties": False}}
    fmt = {"format": {"type": "json_schema", "name": "verdict", "schema": ANSWER_SCHEMA, "strict": True}}

    def run(client, conv_id: str, first: list[dict]) -> list:
        replies = [client.responses.create(model="tiny", conversation=conv_id, input=first, text=fmt,
                                           max_output_tokens=200)]
        replies.append(client.responses.create(model="tiny", conversation=conv_id, input="Weather in Oslo?",
                                               tools=[tool], tool_choice="required", parallel_tool_calls=False,
                                               max_output_tokens=200))
        calls = [o for o in replies[-1].output if o.type == "function_call"]
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny."} for c in calls]
        replies.append(client.responses.create(model="tiny", conversation=conv_id, input=outputs or "Thanks.",
                                               tools=[tool], text=fmt, max_output_tokens=200))
        return replies

    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=Settings(max_new_tokens=200)), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create()
        replies = run(client, conv.id, [user("s1", secret), user("q1", "Is it raining?")])
        jsonschema.validate(json.loads(replies[0].output_text), ANSWER_SCHEMA)
        # a closed answer ends on the end of turn: complete, not cut by the cap
        assert replies[0].text.format.type == "json_schema" and replies[0].status == "completed"
        calls = [o for o in replies[1].output if o.type == "function_call"]
        assert calls and all(c.name == "get_weather" for c in calls)
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), tool["parameters"])
        if replies[2].output_text:  # the format's answer, or a call in the template's format
            jsonschema.validate(json.loads(replies[2].output_text), ANSWER_SCHEMA)
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Yes or no?"}],
                                              response_format={"type": "json_schema", "json_schema": {
                                                  "name": "verdict", "schema": ANSWER_SCHEMA}}, max_tokens=200)
        jsonschema.validate(json.loads(chat.choices[0].message.content), ANSWER_SCHEMA)
        assert chat.choices[0].finish_reason == "stop"
        gone = client.conversations.items.delete("s1", conversation_id=conv.id).model_extra
        assert "s1" in gone["removed"]
        if gone["status"] == "pending":  # the replayed turn made other calls: the client answers them
            outputs = [{"type": "function_call_output", "call_id": c["call_id"], "output": "Sunny."}
                       for c in gone["pending_calls"]]
            client.responses.create(model="tiny", conversation=conv.id, input=outputs, tools=[tool], text=fmt,
                                    max_output_tokens=200)
        twin = client.conversations.create()
        run(client, twin.id, [user("q1", "Is it raining?")])
        digest = client.conversations.retrieve(conv.id).model_extra["unsee"]["digest"]
        assert digest == client.conversations.retrieve(twin.id).model_extra["unsee"]["digest"]
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=Settings(max_new_tokens=200)), "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        assert client.conversations.retrieve(conv.id).model_extra["unsee"]["digest"] == digest
    found = [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not found
