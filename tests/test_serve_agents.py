"""Real agents through ``unsee serve`` on qwen2.5-1.5b (issue 38): the OpenAI
Agents SDK's own ``Runner`` (its Responses model over a server conversation,
with a function tool and a handoff between two agents with different
instructions; its Chat Completions model; its Responses model keeping its own
history), LangGraph's prebuilt ReAct agent over ``ChatOpenAI(base_url=...)``,
and the ``openai`` client's ``responses.stream()`` helper. Each calls its
tool and answers; then the user item that led to the call is deleted, the
conversation ends in the replayed model's own new call, the client's output
for it resumes the replay of the inputs held after it, and the conversation
equals a twin that never had the item and received the same tool outputs:
same digest, same items. After a restart no file under the store holds a
byte of the deleted text.

Qwen2.5-Coder-1.5B writes a call in its ``<tool_call>`` format where the turn
opens with it (``tool_choice`` ``required``: the SDK's default resets it to
``auto`` after the call, so the next turn answers in words); asked freely it
often writes the call as a JSON code block, which is read as a call too since
issue 49 (tests/test_serve_grammar.py; the frameworks' own defaults, in
``auto``, run in ``make serve-agents``). Marked ``realmodel``; 32 output
tokens a turn, one llama.cpp thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import pytest

pytestmark = pytest.mark.realmodel
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the SDK never reaches OpenAI

from unsee import Settings
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread

MODEL = "qwen2.5-1.5b"
SETTINGS = Settings(max_new_tokens=32)
SYSTEM = ("You are a helpful assistant. When a tool response arrives, answer the user's question in one plain "
          "sentence using it.")
QUESTION = "I am in Qaanaaq. What is the weather here?"
CALLS: list[str] = []


def weather(city: str) -> str:
    CALLS.append(city)
    return f"{city}: -20 C, snow."


@pytest.fixture(scope="module")
def qwen():
    pytest.importorskip("llama_cpp", reason="the llama.cpp engine is the optional extra unsee[llamacpp]")
    from unsee.impl.engines.registry import load_engine

    return load_engine(MODEL, backend="llamacpp")


@contextlib.contextmanager
def serve(engine, root):
    with ServerThread(Pool(engine, root, defaults=SETTINGS), MODEL) as srv:
        srv.root = root
        srv.client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        srv.aclient = openai.AsyncOpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        with asyncio.Runner() as srv.loop:  # one event loop for the async client's connections
            yield srv


@pytest.fixture
def served(qwen, tmp_path):
    with serve(qwen, tmp_path) as srv:
        yield srv


def state(client, conv_id: str) -> dict:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]


def listing(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                     limit=100).data]


def outputs_for(calls: list[dict]) -> list[dict]:
    """The client runs its tool for each pending call."""
    return [{"type": "function_call_output", "call_id": c["call_id"], "output": weather(**json.loads(c["arguments"]))}
            for c in calls]


def find_text(items: list[dict], text: str) -> str:
    return next(i["id"] for i in items if i["type"] == "message" and text in json.dumps(i))


def assert_twins(client, conv_id: str, twin_id: str) -> None:
    assert state(client, conv_id)["digest"] == state(client, twin_id)["digest"]
    assert listing(client, conv_id) == listing(client, twin_id)


def scan(root, texts: list[str]) -> list[str]:
    """Every file under ``root`` that holds one of ``texts``."""
    return [f"{p.relative_to(root)}: {t!r}" for p in root.rglob("*") if p.is_file()
            for t in texts if t.encode() in p.read_bytes()]


def sdk_agents(aclient):
    agents = pytest.importorskip("agents")
    model = agents.OpenAIResponsesModel(MODEL, aclient)
    tool = agents.function_tool(weather, name_override="get_weather", description_override="The weather in a city.")
    forced = agents.Agent(name="Weather", instructions=SYSTEM, tools=[tool], model=model,
                          model_settings=agents.ModelSettings(tool_choice="required"))
    return agents, forced


def run(served, agent, given, conv_id: str | None = None):
    import agents

    return served.loop.run(agents.Runner.run(agent, given, max_turns=6, conversation_id=conv_id))


def test_agents_sdk_runner_with_a_tool_forgets_and_resumes_to_the_twin(qwen, tmp_path):
    """Two runs (a call, its answer; a follow-up), the first question deleted: the replay's first
    turn calls the tool anew (another city), the conversation waits for that call with the
    follow-up held; the client's output resumes it, and it equals a twin that never asked."""
    dropped = "Qaanaaq: -20 C, snow."
    with serve(qwen, tmp_path) as served:
        agents, forced = sdk_agents(served.aclient)
        client, started = served.client, time.perf_counter()
        conv = client.conversations.create().id
        CALLS.clear()
        first = run(served, forced, QUESTION, conv)
        assert CALLS == ["Qaanaaq"] and "Qaanaaq" in first.final_output  # called its tool, then answered
        run(served, forced, "And tomorrow?", conv)
        gone = client.conversations.items.delete(find_text(listing(client, conv), QUESTION), conversation_id=conv)
        gone = gone.model_extra
        # the replayed turn (no city in context) makes a call no recorded output answers: the server does not
        # run the client's tools, so the conversation waits for it, the follow-up held
        assert gone["status"] == "pending" and len(gone["pending_calls"]) == 1, gone
        # held: the follow-up, and the output of the call it led to (reused if the replay makes that call)
        assert [i["type"] for i in gone["unreplayed"]] == ["message", "function_call_output"]
        assert gone["unreplayed"][0]["content"][0]["text"] == "And tomorrow?"
        assert json.loads(gone["pending_calls"][0]["arguments"])["city"] != "Qaanaaq"
        with pytest.raises(openai.BadRequestError, match="pending_tool_calls|no output answers"):
            client.responses.create(model=MODEL, conversation=conv, input="Hello?")  # the calls come first
        # a held input deleted is removed (it was not replayed); this one the replay would drop anyway
        held = client.conversations.items.delete(gone["unreplayed"][1]["id"], conversation_id=conv).model_extra
        assert held["removed"] == [gone["unreplayed"][1]["id"]] and len(held["unreplayed"]) == 1
        plain = forced.clone(model_settings=agents.ModelSettings())  # the SDK's tool choice after a call: auto
        assert run(served, plain, outputs_for(gone["pending_calls"]), conv).final_output
        assert state(client, conv)["held"] == 0 and dropped not in json.dumps(listing(client, conv))
        twin = client.conversations.create().id
        run(served, forced, [], twin)  # the same turn without the question: the same call, the same output
        run(served, forced, "And tomorrow?", twin)
        assert_twins(client, conv, twin)
        digest = state(client, conv)["digest"]
        print(f"\nAgents SDK, Responses model: {time.perf_counter() - started:.0f} s")
    with serve(qwen, tmp_path) as again:  # a restart: every file the server keeps, read back
        assert state(again.client, conv)["digest"] == digest
    assert not scan(tmp_path, [QUESTION, dropped])


def test_agents_sdk_handoff_between_two_instructions_forgets_to_the_twin(served):
    """A triage agent hands off to the weather agent (other instructions, other tools): the
    context is re-rendered under the new system block, and the forget replays the handoff
    (its recorded output reused: the replayed model makes the same call) exactly, to the
    weather agent's new call, where a twin that never asked ends too.

    The weather agent stops on its tool's output (`tool_use_behavior="stop_on_first_tool"`, the
    SDK's way for an agent whose tool's output is the answer): asked in `auto` after the
    weather came back, qwen2.5-1.5b calls the tool again at every turn (a call it writes is read
    as one since issue 49; the SDK then raises MaxTurnsExceeded)."""
    agents, forced = sdk_agents(served.aclient)
    # after a handoff the model repeats the call it just made: this agent's turn opens with its own tool
    weather_agent = forced.clone(model_settings=agents.ModelSettings(tool_choice="get_weather"),
                                 tool_use_behavior="stop_on_first_tool")
    triage = agents.Agent(name="Triage", instructions="You route each question to the right agent.",
                          handoffs=[weather_agent], model=weather_agent.model,
                          model_settings=agents.ModelSettings(tool_choice="transfer_to_weather"))
    client, started = served.client, time.perf_counter()
    conv = client.conversations.create().id
    CALLS.clear()
    result = run(served, triage, QUESTION, conv)
    assert result.last_agent.name == "Weather" and CALLS == ["Qaanaaq"] and result.final_output == weather("Qaanaaq")
    runtime = served.pool.get(conv).session.runtime
    assert runtime.context[0] == "turn_2/system" and runtime.get_config("turn_2").system == SYSTEM
    gone = client.conversations.items.delete(find_text(listing(client, conv), QUESTION), conversation_id=conv)
    gone = gone.model_extra
    # the handoff's turn and the weather turn replayed (every recorded input: the SDK never sent the last
    # call's output), the conversation ends in the replayed model's call, as the twin's does
    assert gone["status"] == "completed" and gone["report"]["invocations"] == 2, gone
    assert [c["name"] for c in gone["pending_calls"]] == ["get_weather"]
    twin = client.conversations.create().id
    assert run(served, triage, [], twin).last_agent.name == "Weather"
    assert_twins(client, conv, twin)
    print(f"\nAgents SDK handoff: {time.perf_counter() - started:.0f} s")


def test_agents_sdk_chat_completions_and_its_own_history_call_their_tool(served):
    """The Chat Completions model, and the Responses model that resends its history (the SDK's
    default, no conversation): each calls its tool and answers; nothing of the second turn is stored."""
    agents, forced = sdk_agents(served.aclient)
    started = time.perf_counter()
    for model in (agents.OpenAIChatCompletionsModel(MODEL, served.aclient), forced.model):
        CALLS.clear()
        result = run(served, forced.clone(model=model), QUESTION)
        assert CALLS == ["Qaanaaq"] and "Qaanaaq" in result.final_output, (model, result.final_output)
    print(f"\nAgents SDK, chat and own history: {time.perf_counter() - started:.0f} s")


def test_a_langgraph_react_agent_calls_its_tool_and_goes_on_after_the_forget(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return weather(city)

    llm = langchain_openai.ChatOpenAI(base_url=served.url, api_key="unused", model=MODEL, max_retries=0,
                                      use_responses_api=True, use_previous_response_id=True)

    def pick(state, runtime):  # the first turn must call; after a tool result the model answers
        asked = not any(isinstance(m, ToolMessage) for m in state["messages"])
        return llm.bind_tools([get_weather], tool_choice="required" if asked else None)

    agent = prebuilt.create_react_agent(pick, [get_weather], prompt=SYSTEM)
    client, started = served.client, time.perf_counter()
    CALLS.clear()
    out = agent.invoke({"messages": [HumanMessage(QUESTION)]})
    assert CALLS == ["Qaanaaq"] and "Qaanaaq" in out["messages"][-1].text
    conv = served.pool.responses[out["messages"][-1].response_metadata["id"]]
    gone = client.conversations.items.delete(find_text(listing(client, conv), QUESTION), conversation_id=conv)
    gone = gone.model_extra
    assert gone["status"] == "pending", gone
    call = gone["pending_calls"][0]
    answer = ToolMessage(outputs_for([call])[0]["output"], tool_call_id=call["call_id"])
    after = agent.invoke({"messages": [*out["messages"], answer]})  # the agent goes on from the server's state
    assert after["messages"][-1].text
    definition = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                  "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}
    first = client.responses.create(model=MODEL, input=[{"role": "system", "content": SYSTEM, "type": "message"}],
                                    tools=[definition], tool_choice="required")
    calls = [i.model_dump() for i in first.output if i.type == "function_call"]
    client.responses.create(model=MODEL, previous_response_id=first.id, input=outputs_for(calls), tools=[definition])
    assert_twins(client, conv, first.conversation.id)
    print(f"\nLangGraph ReAct: {time.perf_counter() - started:.0f} s")


def test_the_stream_helper_streams_a_call_then_the_answer_token_by_token(served):
    client, started = served.client, time.perf_counter()
    definition = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    conv = client.conversations.create().id
    with client.responses.stream(model=MODEL, conversation=conv, input=QUESTION, instructions=SYSTEM,
                                 tools=[definition], tool_choice="required") as stream:
        kinds = [e.type for e in stream]
        called = stream.get_final_response()
    call = next(i for i in called.output if i.type == "function_call")
    assert "response.function_call_arguments.delta" in kinds and json.loads(call.arguments) == {"city": "Qaanaaq"}
    deltas, first_at = [], None
    with client.responses.stream(model=MODEL, conversation=conv, instructions=SYSTEM, tools=[definition],
                                 input=outputs_for([call.model_dump()])) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                first_at = first_at or time.perf_counter()
                deltas.append(event.delta)
        answer = stream.get_final_response()
    assert len(deltas) > 3 and "".join(deltas) == answer.output_text and "Qaanaaq" in answer.output_text
    print(f"\nresponses.stream(): {time.perf_counter() - started:.0f} s")
