"""Every item kind a client writes, through ``unsee serve`` on the tiny model
(issue 49, items 3 and 6), with the real ``openai`` client.

A conversation takes user, assistant, system and developer messages,
``function_call`` and ``function_call_output`` items, in its create, its
``items.create`` and a response's input. Each is an observation: for each
kind, a conversation holding it among other items of a step, the item
deleted, equals a twin that never had it (digest, items, next answer), and
after a restart no file under the store holds a byte of its text. The
Agents SDK's ``OpenAIConversationsSession`` (its server-side memory, which
writes every turn's input and output back with ``items.create``) runs two
turns with a ``Runner`` and the SDK's defaults, and a DELETE through its
client equals a twin. Chat completions take several system and developer
messages anywhere, rendered as the template itself renders them. A step that
answers the model's calls opens with their outputs and any items follow; a
replay that stops at a new call holds those items until the client's output
(the turn's reading stubbed to make calls: the tiny model's bytes never
parse as one).

The tiny model under the Qwen-style template tests/test_render.py writes (it
has a call format, so a client's ``function_call`` renders in it), and
under ChatML for the Agents SDK's run.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the SDK never reaches OpenAI

from unsee import Settings
from unsee.impl.agent.templates import compile_template
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread

SETTINGS = Settings(max_new_tokens=6)
SECRET = "the vault code is 9-4-7-1"


@pytest.fixture(scope="module")
def render_helpers():
    spec = importlib.util.spec_from_file_location("test_render_helpers", Path(__file__).with_name("test_render.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def qwen_style(lm, render_helpers):
    """The tiny model under tests/test_render.py's Qwen-style template (a call format, a system
    message after the first)."""
    return render_helpers.chatml_model(lm, render_helpers.TOOL_DEFS_TEMPLATE)


def connect(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def state(client, conv_id: str) -> dict:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]


def listing(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                     limit=100).data]


def scan(root: Path, text: str) -> list[str]:
    """Every file under ``root`` that holds a byte of ``text``."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


#: one item of each kind, shaped as clients send them (the Agents SDK's session writes the model's
#: message with `output_text` parts and its calls with a status; it strips ids, these keep one)
KINDS = {
    "assistant": {"type": "message", "role": "assistant", "status": "completed", "id": "k1",
                  "content": [{"type": "output_text", "text": SECRET, "annotations": [], "logprobs": []}]},
    "function_call": {"type": "function_call", "call_id": "call_k1", "name": "open_vault", "status": "completed",
                      "arguments": json.dumps({"code": SECRET}), "id": "k1"},
    "function_call_output": {"type": "function_call_output", "call_id": "call_k1", "output": SECRET, "id": "k1"},
    "system": {"type": "message", "role": "system", "content": SECRET, "id": "k1"},
    "developer": {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SECRET}],
                  "id": "k1"},
}


def run_conversation(client, item: dict | None) -> str:
    """Three turns; the second observes user u2, ``item`` (where given), user u3 (added, then the
    response's input), the third a user message."""
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}, user("u1", "Hi.")])
    client.responses.create(model="tiny", conversation=conv.id)
    client.conversations.items.create(conv.id, items=[user("u2", "Hello."), *([item] if item else [])])
    client.responses.create(model="tiny", conversation=conv.id, input=[user("u3", "Go on.")])
    client.responses.create(model="tiny", conversation=conv.id, input=[user("u4", "And then?")])
    return conv.id


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_item_of_each_kind_is_observed_in_its_role_and_forgets_to_the_twin(kind, qwen_style, tmp_path):
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv = run_conversation(client, KINDS[kind])
        held = next(i for i in listing(client, conv) if i["id"] == "k1")
        assert held["type"] == ("message" if kind in ("assistant", "system", "developer") else kind)
        assert SECRET in json.dumps(held) and held.get("role", kind) == kind
        runtime = srv.pool.get(conv).session.runtime
        observed = runtime.graph["turn_2"].text  # the step's block: each item in its role, in order
        rendered = {"assistant": f"<|im_start|>assistant\n{SECRET}<|im_end|>\n",
                    "function_call": '<|im_start|>assistant\n<tool_call>\n{"name": "open_vault", "arguments": '
                                     f'{{"code": "{SECRET}"}}}}\n</tool_call><|im_end|>\n',
                    "function_call_output": f"<|im_start|>user\n<tool_response>\n{SECRET}\n</tool_response>"
                                            "<|im_end|>\n",
                    "system": f"<|im_start|>system\n{SECRET}<|im_end|>\n"}
        assert observed.endswith("<|im_start|>user\nHello.<|im_end|>\n" + rendered.get(kind, rendered["system"])
                                 + "<|im_start|>user\nGo on.<|im_end|>\n")
        before = [i["id"] for i in listing(client, conv)]

        gone = client.conversations.items.delete("k1", conversation_id=conv).model_extra
        after = listing(client, conv)
        assert gone["status"] == "completed" and gone["removed"][0] == "k1" and SECRET not in json.dumps(after)
        assert [r["id"] for r in gone["rewritten"]] == [i["id"] for i in after if i["id"] not in before]
        twin = run_conversation(client, None)
        assert state(client, conv)["digest"] == state(client, twin)["digest"]
        assert after == listing(client, twin)
        nxt = [client.responses.create(model="tiny", conversation=c, input="Who am I?").output_text
               for c in (conv, twin)]
        assert nxt[0] == nxt[1]
        digest = state(client, conv)["digest"]
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        assert state(connect(srv), conv)["digest"] == digest  # a restart: the store, read back
    assert not scan(tmp_path, SECRET) and not scan(tmp_path, "open_vault")


def test_a_create_takes_every_kind_anywhere_and_a_waiting_one_is_removed(qwen_style, tmp_path):
    """The first system item is the conversation's system prompt; every other item, system ones
    included, waits in order, is listed in its role, and is one step of the first response."""
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        items = [{"role": "developer", "content": "You are terse."}, user("a1", "What is the code?"),
                 {**KINDS["function_call"], "id": "a2"}, {**KINDS["function_call_output"], "id": "a3"},
                 {**KINDS["assistant"], "id": "a4"}, {**KINDS["system"], "id": "a5"}, user("a6", "Thanks.")]
        conv = client.conversations.create(items=items).id
        waiting = listing(client, conv)
        assert [(i["id"], i["type"], i.get("role")) for i in waiting] == [
            ("a1", "message", "user"), ("a2", "function_call", None), ("a3", "function_call_output", None),
            ("a4", "message", "assistant"), ("a5", "message", "system"), ("a6", "message", "user")]
        assert (waiting[1]["call_id"], waiting[1]["name"]) == ("call_k1", "open_vault")
        removed = client.conversations.items.delete("a5", conversation_id=conv).model_extra
        assert removed["removed"] == ["a5"] and removed["receipt"] is None  # it only waited
        answer = client.responses.create(model="tiny", conversation=conv)
        runtime = srv.pool.get(conv).session.runtime
        assert runtime.graph[runtime.context[0]].text == "<|im_start|>system\nYou are terse.<|im_end|>\n"
        assert [s.kind for s in runtime.steps] == ["user"] and len(runtime.steps[0].items) == 5
        assert [i["id"] for i in listing(client, conv)] == ["a1", "a2", "a3", "a4", "a6", answer.output[0].id]
        # the model's own answer is derived: a forget names a source
        with pytest.raises(openai.BadRequestError, match="the model's"):
            client.conversations.items.delete(answer.output[0].id, conversation_id=conv)
        # server ids: an item keeps its id where another of its turn is deleted
        added = client.conversations.items.create(conv, items=[{"role": "user", "content": "x"},
                                                               {"role": "user", "content": "y"}]).data
        client.conversations.items.delete(added[0].id, conversation_id=conv)
        other = client.conversations.create(items=[]).id
        client.responses.create(model="tiny", conversation=other, input="z")
        again = client.conversations.items.create(other, items=[{"role": "user", "content": "y"}]).data
        assert again[0].id == added[1].id


def test_chat_takes_system_messages_anywhere_as_the_template_renders_them(qwen_style, render_helpers, tmp_path):
    """Pydantic AI's shape (one system message per system-prompt part), a developer message, a system
    message mid-conversation and one after the last user message: the prompt is the template's own."""
    messages = [{"role": "system", "content": "Part one."}, {"role": "system", "content": "Part two."},
                {"role": "developer", "content": "Part three."}, {"role": "user", "content": "Hi."},
                {"role": "assistant", "content": "Hello."}, {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "Bye."}, {"role": "system", "content": "Last."}]
    own = compile_template(render_helpers.TOOL_DEFS_TEMPLATE, {})(
        [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages], True)
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        chat = client.chat.completions.create(model="tiny", messages=messages)
        cache = srv.pool.open_chat("")
        expected = qwen_style.encode(own)  # with the assistant header the answer is decoded after
        assert srv.pool.engine.tokens(cache.handles[-1])[:len(expected)] == expected
        # a stateless response reads them alike: `instructions` first, every system item in its place
        reply = client.responses.create(model="tiny", store=False, instructions="Part one.",
                                        input=[{"role": m["role"], "content": m["content"]} for m in messages[1:]])
        assert reply.usage.input_tokens == chat.usage.prompt_tokens
        assert reply.output_text == chat.choices[0].message.content


def test_the_agents_sdk_conversations_session_runs_and_its_delete_equals_the_twin(lm, tmp_path):
    """``OpenAIConversationsSession`` with the SDK's defaults: the Runner reads the history from the
    conversation, runs the model on it, and writes the turn back (the user input and the model's
    message) with ``items.create``; two turns, then a DELETE through the session's client, and the
    SDK's own ``pop_item``. The conversation equals a twin whose writes never carried the item.
    The SDK runs the model on the history it reads (a stateless response), so the session's items
    only wait: a DELETE removes one from the sidecar."""
    agents = pytest.importorskip("agents")
    secret = SDK_TURNS[0]
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=Settings(max_new_tokens=120)), "tiny") as srv:
        aclient = openai.AsyncOpenAI(base_url=srv.url, api_key="unused", max_retries=0)
        client = connect(srv)
        agent = agents.Agent(name="Assistant", instructions="Be brief.",
                             model=agents.OpenAIResponsesModel("tiny", aclient))
        session = agents.OpenAIConversationsSession(openai_client=aclient)

        async def turns() -> list[list[dict]]:
            writes = []
            for text in SDK_TURNS:
                before = len(await session.get_items())
                result = await agents.Runner.run(agent, text, session=session)
                assert result.final_output
                writes.append((await session.get_items())[before:])
            return writes
        with asyncio.Runner() as loop:
            writes = loop.run(turns())
            conv = session.session_id
            items = listing(client, conv)
            assert [(i["role"], i["content"][0]["type"]) for i in items] == [
                ("user", "input_text"), ("assistant", "output_text")] * 2
            assert items[0]["content"][0]["text"] == secret
            gone = loop.run(aclient.conversations.items.delete(items[0]["id"], conversation_id=conv))
            assert gone.model_extra["removed"] == [items[0]["id"]]
            history = loop.run(session.get_items())
            assert secret not in json.dumps(history) and len(history) == 3
            popped = loop.run(session.pop_item())  # the SDK's own delete: the last item
            assert popped["role"] == "assistant" and len(loop.run(session.get_items())) == 2
        twin = client.conversations.create(items=[]).id
        strip = [[{k: v for k, v in i.items() if k != "id"} for i in w] for w in writes]
        client.conversations.items.create(twin, items=strip[0][1:])
        client.conversations.items.create(twin, items=strip[1][:-1])
        assert listing(client, conv) == listing(client, twin)
        assert state(client, conv)["digest"] == state(client, twin)["digest"]
        # the first turn's input held none of the model's items: its response was stored (`store`
        # defaults to true), in a conversation of its own that holds the text too; deleted here
        stored = set(srv.pool.conversations) - {conv, twin}
        assert len(stored) == 1 and scan(tmp_path / stored.copy().pop(), secret)
        client.conversations.delete(stored.pop())
    with ServerThread(Pool(make_engine(lm), tmp_path, defaults=SETTINGS), "tiny") as srv:
        assert len(listing(connect(srv), conv)) == 2
    assert not scan(tmp_path, secret)


#: two turns the tiny model answers with its end of turn within 120 tokens under the agent's
#: instructions (a Responses model raises on an `incomplete` response, which a random model's
#: cut answer is)
SDK_TURNS = ("I live at 4415 Elm Street.", "Who?")


@pytest.fixture
def calls_when_offered(monkeypatch):
    """Every turn offered tools makes one call, its arguments a hash of the turn's prompt. The
    tiny model's bytes never parse as a call, so the turn's reading is stubbed: the same for a
    run, its replay and the twin (a turn after another context makes another call)."""
    from unsee.impl.agent.tools.client import ClientToolRuntime
    from unsee.impl.agent.tools.native import FunctionCall

    read = ClientToolRuntime.get_turn

    def get_turn(self, step_id):
        names = self.get_config(step_id).get_names()
        if not names:
            return read(self, step_id)
        city = hashlib.sha256(repr(self.get_prompt(step_id)).encode()).hexdigest()[:8]
        return "", (FunctionCall(min(names), json.dumps({"city": city})),), True
    monkeypatch.setattr(ClientToolRuntime, "get_turn", get_turn)


TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
#: a tool step's other items: they follow the outputs of the calls it answers
EXTRA = [user("x1", "And Bergen?"), {**KINDS["assistant"], "id": "x2"}, {**KINDS["system"], "id": "x3"}]


def run_calls(client, first: list[dict], extra: list[dict], checked: bool = False) -> tuple[str, str]:
    """A turn that calls, a tool step (its output, then ``extra``), a user turn; the call's id."""
    conv = client.conversations.create(items=first).id
    called = client.responses.create(model="tiny", conversation=conv, tools=[TOOL])
    call = next(i for i in called.output if i.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Oslo: 4 C.", "id": "o1"}
    for bad, why in (([user("b1", "Well?"), output], "no output answers"),
                     ([output, {**output, "id": "o2"}], "answered twice")) if checked else ():
        with pytest.raises(openai.BadRequestError, match=why):
            client.responses.create(model="tiny", conversation=conv, input=bad, tool_choice="none", tools=[TOOL])
    client.responses.create(model="tiny", conversation=conv, input=[output, *extra], tool_choice="none", tools=[TOOL])
    client.responses.create(model="tiny", conversation=conv, input=[user("q2", "Thanks.")], tool_choice="none",
                            tools=[TOOL])
    return conv, call.call_id


def test_a_step_answering_calls_opens_with_their_outputs_and_any_items_follow(qwen_style, tmp_path,
                                                                             calls_when_offered):
    """Where the last answer made calls, the step opens with one output for each (OpenAI's rule),
    then any items: a user message, an assistant message, a system message. A DELETE of an item
    that follows the outputs replays the tool step without it: equal to the twin."""
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv, call_id = run_calls(client, [user("q1", "Weather in Oslo?")], EXTRA, checked=True)
        runtime = srv.pool.get(conv).session.runtime
        step = runtime.steps[1]
        assert step.kind == "tool" and [i.source for i in step.items] == ["o1", "x1", "x2", "x3"]
        assert runtime.client.roles == {"x1": ("user",), "x2": ("assistant",), "x3": ("system",)}
        listed = listing(client, conv)
        assert [(i["id"], i["type"]) for i in listed[2:6]] == [("o1", "function_call_output"), ("x1", "message"),
                                                              ("x2", "message"), ("x3", "message")]
        assert listed[2]["call_id"] == call_id
        gone = client.conversations.items.delete("x2", conversation_id=conv).model_extra
        assert gone["status"] == "completed" and "x2" not in [i["id"] for i in listing(client, conv)]
        twin, _ = run_calls(client, [user("q1", "Weather in Oslo?")], [EXTRA[0], EXTRA[2]])
        assert state(client, conv)["digest"] == state(client, twin)["digest"]
        assert listing(client, conv) == listing(client, twin)


def test_a_replay_that_stops_at_a_new_call_holds_the_tool_step_s_other_items(qwen_style, tmp_path,
                                                                             calls_when_offered):
    """The question deleted, the replayed turn calls anew (other arguments): the recorded output is
    dropped, and the tool step's other items wait, after the outputs the client sends for the new
    call; then the rest is replayed. Equal to the twin that asked nothing and got that output."""
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SETTINGS), "tiny") as srv:
        client = connect(srv)
        conv, old_call = run_calls(client, [user("q1", "Weather in Oslo?")], EXTRA)
        gone = client.conversations.items.delete("q1", conversation_id=conv).model_extra
        assert gone["status"] == "pending" and [c["type"] for c in gone["pending_calls"]] == ["function_call"]
        new_call = gone["pending_calls"][0]["call_id"]
        assert new_call != old_call and {"q1", "o1"} <= set(gone["removed"])  # o1 answered the old call
        assert [i["id"] for i in gone["unreplayed"]] == ["x1", "x2", "x3", "q2"]
        assert state(client, conv)["held"] == 4
        output = {"type": "function_call_output", "call_id": new_call, "output": "Bergen: 2 C.", "id": "o9"}
        resumed = client.responses.create(model="tiny", conversation=conv, input=[output], tool_choice="none",
                                          tools=[TOOL])
        assert len(resumed.model_extra["unsee"]["steps"]) == 2 and state(client, conv)["held"] == 0
        runtime = srv.pool.get(conv).session.runtime
        assert [i.source for i in runtime.steps[1].items] == ["o9", "x1", "x2", "x3"]
        twin = client.conversations.create().id
        client.responses.create(model="tiny", conversation=twin, input=[], tools=[TOOL])
        client.responses.create(model="tiny", conversation=twin, input=[output, *EXTRA], tool_choice="none",
                                tools=[TOOL])
        client.responses.create(model="tiny", conversation=twin, input=[user("q2", "Thanks.")], tool_choice="none",
                                tools=[TOOL])
        assert state(client, conv)["digest"] == state(client, twin)["digest"]
        assert listing(client, conv) == listing(client, twin)
