"""Function calls in the model's own format (issue 38): the parse of a turn
into text and calls (a call that does not parse is text), what a stream may
send while a turn is decoded, and a server on the tiny model under a
Qwen-style template (tests/test_render.py's), where tools are rendered in the
system block, a required tool choice opens the turn with the call, the tiny
model's random bytes after it are held to the call's grammar (issue 49;
tests/test_serve_grammar.py), and a call cut by the output cap comes back as
text, not an error."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from unsee import Settings
from unsee.impl.agent.render import get_renderer
from unsee.impl.agent.tools.native import CallFormat, FunctionCall, get_call_format, parse_turn, split_stream_text
from unsee.impl.engines.registry import make_engine

QWEN = CallFormat(marker="<tool_call>\n", opening='<tool_call>\n{"name": "', between='", "arguments": ',
                  after="}\n</tool_call>", end="\n</tool_call>")
NAMES = {"get_weather", "get_time"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("text,expected", [
    ("It is cold.", ("It is cold.", (), True)),
    (CALL, ("", (FunctionCall("get_weather", '{"city": "Oslo"}'),), True)),
    ("Let me look.\n" + CALL, ("Let me look.", (FunctionCall("get_weather", '{"city": "Oslo"}'),), True)),
    (CALL + "\n" + CALL.replace("get_weather", "get_time"),
     ("", (FunctionCall("get_weather", '{"city": "Oslo"}'), FunctionCall("get_time", '{"city": "Oslo"}')), True)),
    # the last call's closing left out where the turn ends after its object (cut at the end of turn)
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}', (
        "", (FunctionCall("get_weather", '{"city": "Oslo"}'),), True)),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>', (
        "", (FunctionCall("get_weather", '{"city": "Oslo"}'),), True)),  # arguments as a JSON string
    # malformed: text, as the model wrote it
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', None),  # cut by the output cap
    ('<tool_call>\n{"name": "send_money", "arguments": {}}\n</tool_call>', None),  # not a tool of the request
    ('<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>', None),  # arguments not an object
    (CALL + " and more words", None),  # text after the last call
    ('<tool_call>\n{"name": "get_weather"}\n</tool_call>', None),
])
def test_a_turn_parses_into_text_and_calls_and_a_malformed_call_is_text(text, expected):
    assert parse_turn(QWEN, text, NAMES) == (expected or (text.strip(), (), False))


def test_a_call_renders_as_the_template_writes_it_and_parses_back():
    calls = (FunctionCall("get_weather", '{"city": "Oslo"}'), FunctionCall("get_time", "{}"))
    assert parse_turn(QWEN, QWEN.render_turn("Checking.", calls), NAMES) == ("Checking.", calls, True)
    assert QWEN.render(calls[0]) == CALL
    assert calls[0].get_signature() == FunctionCall("get_weather", '{ "city":"Oslo" }').get_signature()


@pytest.mark.parametrize("text,expected", [
    ("  Hello wor", ("Hello wor", False)),
    ("Hello \n", ("Hello", False)),  # trailing whitespace waits: the final text is stripped
    ("Hello <tool", ("Hello", False)),  # a prefix of the marker waits
    ("Hello <tool_call>\n{", ("Hello", True)),  # a call began: the rest waits for the turn's end
    ("caf\ufffd", ("caf", False)),  # a character cut between tokens waits
])
def test_a_stream_sends_only_text_that_cannot_turn_into_a_call(text, expected):
    assert split_stream_text(QWEN, text) == expected


@pytest.fixture(scope="module")
def qwen_style(lm):
    """The tiny model under the Qwen-style template tests/test_render.py writes for its tool tests
    (loaded from its file: the tests are imported in importlib mode, not as a package)."""
    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render.chatml_model(lm, render.TOOL_DEFS_TEMPLATE)


def test_the_template_s_call_format_is_read_from_its_segments(qwen_style, lm):
    renderer = get_renderer(qwen_style)
    fmt = get_call_format(renderer.segments, renderer.has_native_calls())
    assert fmt is not None and fmt.marker == "<tool_call>\n" and fmt.opening == '<tool_call>\n{"name": "'
    plain = get_renderer(lm)  # ChatML without a tool format: tools are refused by the server
    assert get_call_format(plain.segments, plain.has_native_calls()) is None


def test_a_server_renders_tools_forces_a_call_and_returns_a_malformed_one_as_text(qwen_style, tmp_path):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}
    pool = Pool(make_engine(qwen_style), tmp_path, defaults=Settings(max_new_tokens=12))
    with ServerThread(pool, "tiny") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        conv = client.conversations.create()
        reply = client.responses.create(model="tiny", conversation=conv.id, input="Weather in Oslo?", tools=[tool],
                                        tool_choice={"type": "function", "name": "get_weather"})
        runtime = pool.get(conv.id).session.runtime
        assert '"name": "get_weather"' in runtime.graph[runtime.context[0]].text  # the tools in the system block
        # the tiny model's random bytes, held to the call's grammar (issue 49), close a call of the tool
        call = reply.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        assert isinstance(json.loads(call.arguments), dict)
        assert reply.tools[0].name == "get_weather" and reply.tool_choice.name == "get_weather"
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                              tools=[{"type": "function", "function": {"name": "get_weather"}}],
                                              tool_choice="required")
        # cut by the output cap inside the tool's name: text, not an error
        assert chat.choices[0].message.content.startswith('<tool_call>\n{"name": "')
        # a client's own call sent back renders in the model's format, and its result in the tool role
        called = [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "Sunny."}]
        answer = client.chat.completions.create(model="tiny", messages=called, tools=[
            {"type": "function", "function": {"name": "get_weather"}}])
        assert answer.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.BadRequestError, match="names no call"):
            client.chat.completions.create(model="tiny", messages=[*called[:1], called[2]])
        answered = [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}]
        assert json.loads(client.responses.create(model="tiny", conversation=conv.id, input=answered,
                                                  tools=[tool]).model_dump_json())["tool_choice"] == "auto"
