"""One client scenario of bench/serve_agents.py, run in the clients' own venv.

    .venv-clients/bin/python bench/serve_agents_clients.py SCENARIO --base-url URL --served-model NAME

The clients speak only HTTP to the server, so this file imports nothing of
unsee: the frameworks live in ``.venv-clients`` (and LlamaIndex, whose OpenAI
adapter needs an openai client below 3, in ``.venv-llamaindex``), not in the
project's venv. Each framework is set up as its documentation sets it up for
another OpenAI-compatible server: a ``base_url`` and a key, nothing else. No
``tool_choice`` is forced and no output cap is sent unless the framework
sends one by default, since the point is what a new user meets.

The script prints one line ``SERVE_AGENTS_RESULT {json}`` (the last word on
what happened; frameworks print their own chatter before it) and exits 0
whatever the scenario's outcome: a failure is a result, recorded with the
error the framework raised (its HTTP status and message where one is in the
exception's chain).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback

RESULT_MARK = "SERVE_AGENTS_RESULT "
INSTRUCTIONS = ("You are a helpful assistant. Use a tool when the question needs one. "
                "After a tool result, answer in one short sentence.")
QUESTION = "What is the weather in Qaanaaq right now?"
EXTRACT = "Extract the weather report: in Oslo it is 4 degrees Celsius and raining."
SECRET = "My locker code is 4417. Please remember it."
#: the goal's tool-needing prompts (issue 49: at least 9 of 10 give a parsed call in auto)
TOOL_PROMPTS = ("What is the weather in Qaanaaq right now?", "Is it raining in Bergen today?",
                "How cold is it in Yakutsk at the moment?", "Should I take an umbrella in Lima today?",
                "What's the temperature in Nairobi now?", "Tell me the current weather in Hobart.",
                "Is it snowing in Ushuaia?", "How windy is it in Wellington right now?",
                "Do I need sunscreen in Dubai today?", "What are the conditions in Reykjavik now?")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}

#: the cities the tool was called for, in order: what "called its tool" means here
CALLS: list[str] = []
#: what a scenario of several steps learnt before one failed (kept in its record)
SO_FAR: dict = {}


def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city's name
    """
    CALLS.append(city)
    return f"{city}: -20 C, light snow."


def get_report_type():
    """The structured output's schema: a pydantic model (every framework here takes one)."""
    from pydantic import BaseModel

    class WeatherReport(BaseModel):
        city: str
        temperature_c: int
        conditions: str

    return WeatherReport


def get_error(exc: BaseException) -> dict:
    """The error as a user would report it: the first HTTP status and body found along the
    exception's chain (frameworks wrap the openai client's errors), else its type and text."""
    seen, found, visited = exc, None, set()
    while seen is not None and found is None and id(seen) not in visited:
        visited.add(id(seen))
        status = getattr(seen, "status_code", None) or getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(status, int):
            found = seen
        seen = seen.__cause__ or seen.__context__
    where = found or exc
    body = getattr(where, "body", None)
    return {"type": type(exc).__name__, "status": getattr(found, "status_code", None) if found else None,
            "message": (json.dumps(body) if isinstance(body, (dict, list)) else str(where))[:600]}


def get_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str) if value is not None else ""


# ------------------------------------------------------------ OpenAI Agents SDK


def new_async_client(base_url: str):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base_url, api_key="unused")


def new_sdk_agent(model_class: str, base_url: str, model: str, **options):
    import agents

    agents.set_tracing_disabled(True)
    tool = agents.function_tool(get_weather)
    llm = getattr(agents, model_class)(model, new_async_client(base_url))
    return agents.Agent(name="Assistant", instructions=INSTRUCTIONS, tools=[tool], model=llm, **options)


def run_agents_responses(base_url: str, model: str) -> dict:
    import agents

    result = asyncio.run(agents.Runner.run(new_sdk_agent("OpenAIResponsesModel", base_url, model), QUESTION))
    return {"answer": get_text(result.final_output)}


def run_agents_chat(base_url: str, model: str) -> dict:
    import agents

    agent = new_sdk_agent("OpenAIChatCompletionsModel", base_url, model)
    return {"answer": get_text(asyncio.run(agents.Runner.run(agent, QUESTION)).final_output)}


def run_agents_output_type(base_url: str, model: str) -> dict:
    import agents

    report = get_report_type()
    agents.set_tracing_disabled(True)
    agent = agents.Agent(name="Extractor", instructions="Extract the weather report.", output_type=report,
                         model=agents.OpenAIResponsesModel(model, new_async_client(base_url)))
    output = asyncio.run(agents.Runner.run(agent, EXTRACT)).final_output
    return {"answer": get_text(output.model_dump() if isinstance(output, report) else output),
            "structured": isinstance(output, report)}


async def drive_session(base_url: str, model: str) -> dict:
    """Two turns through OpenAIConversationsSession (the second needs the tool), the first
    turn's user message deleted (the exact forget), the conversation compared with a twin
    written with the same batches less that item (the same digest and the same items, server
    ids included), then a third turn.

    The session writes a turn's input in one ``items.create`` and the turn's output items
    in another, so the deleted message is a batch alone: the twin never writes that batch
    (a twin that never had the item never sent it). Were the server to keep an emptied
    batch as a step of its own, the digests would differ for that reason alone."""
    import agents

    client = new_async_client(base_url)
    batches: list[list[dict]] = []

    class RecordingSession(agents.OpenAIConversationsSession):
        """The SDK's session, keeping each batch it writes (the twin is written from them)."""

        async def add_items(self, items):
            batches.append([dict(i) if isinstance(i, dict) else i.model_dump(exclude_unset=True) for i in items])
            await super().add_items(items)

    session = RecordingSession(openai_client=client)
    agent = new_sdk_agent("OpenAIResponsesModel", base_url, model)
    out = SO_FAR
    out["first_answer"] = get_text((await agents.Runner.run(agent, SECRET, session=session)).final_output)
    out["answer"] = get_text((await agents.Runner.run(agent, QUESTION, session=session)).final_output)
    conv = session.session_id
    listed = [i.model_dump(exclude_none=True) async for i in client.conversations.items.list(conv, order="asc")]
    secret = next(i["id"] for i in listed if i.get("role") == "user" and "4417" in json.dumps(i))
    out |= {"items": len(listed), "item_types": sorted({i.get("type", "") for i in listed})}
    reply = await client.conversations.items.delete(secret, conversation_id=conv)
    out["delete"] = {k: (reply.model_extra or {}).get(k) for k in ("status", "removed", "digest")}
    twin = (await client.conversations.create()).id
    for batch in batches:
        kept = [i for i in batch if not (i.get("role") == "user" and "4417" in json.dumps(i))]
        if kept:
            await client.conversations.items.create(twin, items=kept)
    digests = [((await client.conversations.retrieve(c)).model_extra or {}).get("unsee", {}).get("digest")
               for c in (conv, twin)]
    items = [[i.model_dump(exclude_none=True) async for i in client.conversations.items.list(c, order="asc")]
             for c in (conv, twin)]
    same_items = items[0] == items[1]
    out["twin"] = {"digests": digests, "items_equal": same_items, "items": [len(i) for i in items],
                   # no digest on either side: no response ran on them, their items only wait
                   "equal": digests[0] == digests[1] and same_items}
    # the next turn on both: the same answer and, a response having run on each, the same digest
    twin_session = agents.OpenAIConversationsSession(conversation_id=twin, openai_client=client)
    answers = [get_text((await agents.Runner.run(agent, "What is my locker code?", session=s)).final_output)
               for s in (session, twin_session)]
    # the session's turns run without `conversation` (its items only wait there): one response in
    # each conversation, so that the server prefills it and each has a digest of that state
    for c in (conv, twin):
        reply = await client.responses.create(model=model, conversation=c, input="Say it once more.")
        answers.append(reply.output_text)
    after = [((await client.conversations.retrieve(c)).model_extra or {}).get("unsee", {}).get("digest")
             for c in (conv, twin)]
    out["after_delete_answer"] = answers[0]
    out["twin"] |= {"next_answers": answers, "digests_after": after,
                    "next_equal": answers[0::2] == answers[1::2] and after[0] == after[1] and bool(after[0])}
    return out


def run_agents_session(base_url: str, model: str) -> dict:
    return asyncio.run(drive_session(base_url, model))


# ----------------------------------------------------------- LangChain, LangGraph


def new_chat_openai(base_url: str, model: str):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=model, base_url=base_url, api_key="unused")


def run_langgraph_react(base_url: str, model: str) -> dict:
    import warnings

    from langchain_core.tools import tool

    with warnings.catch_warnings():  # LangGraph 1 points to langchain.agents.create_agent; this one still ships
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent
    agent = create_react_agent(new_chat_openai(base_url, model), [tool(get_weather)], prompt=INSTRUCTIONS)
    state = agent.invoke({"messages": [("user", QUESTION)]})
    return {"answer": get_text(state["messages"][-1].content), "messages": len(state["messages"])}


def run_langchain_structured(base_url: str, model: str) -> dict:
    report = get_report_type()
    output = new_chat_openai(base_url, model).with_structured_output(report).invoke(EXTRACT)
    return {"answer": get_text(output.model_dump() if isinstance(output, report) else output),
            "structured": isinstance(output, report)}


# ------------------------------------------------------------------ Pydantic AI


def new_pydantic_agent(model_class: str, base_url: str, model: str, **options):
    import pydantic_ai.models.openai as models
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    llm = getattr(models, model_class)(model, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    return Agent(llm, **options)


def run_pydantic_chat(base_url: str, model: str) -> dict:
    agent = new_pydantic_agent("OpenAIChatModel", base_url, model, instructions=INSTRUCTIONS, tools=[get_weather])
    return {"answer": get_text(agent.run_sync(QUESTION).output)}


def run_pydantic_responses(base_url: str, model: str) -> dict:
    agent = new_pydantic_agent("OpenAIResponsesModel", base_url, model, instructions=INSTRUCTIONS,
                               tools=[get_weather])
    return {"answer": get_text(agent.run_sync(QUESTION).output)}


def run_pydantic_structured(base_url: str, model: str) -> dict:
    report = get_report_type()
    output = new_pydantic_agent("OpenAIChatModel", base_url, model, output_type=report).run_sync(EXTRACT).output
    return {"answer": get_text(output.model_dump() if isinstance(output, report) else output),
            "structured": isinstance(output, report)}


# -------------------------------------------------------------------- smolagents


def run_smolagents(base_url: str, model: str) -> dict:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key="unused")
    # max_steps bounds the run's length on a slow CPU (default 20); it changes no request
    agent = ToolCallingAgent(tools=[tool(get_weather)], model=llm, max_steps=4)
    return {"answer": get_text(agent.run(QUESTION)), "steps": len(agent.memory.steps)}


# -------------------------------------------------------------------- LlamaIndex


def run_llamaindex(base_url: str, model: str) -> dict:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=model, api_base=base_url, api_key="unused", is_chat_model=True,
                     is_function_calling_model=True)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=llm, system_prompt=INSTRUCTIONS)

    async def drive():
        return await agent.run(user_msg=QUESTION)

    return {"answer": get_text(str(asyncio.run(drive())))}


# --------------------------------------------------------- the goal: 9 of 10 in auto


def run_openai_auto(base_url: str, model: str, **choice) -> dict:
    """Each tool-needing prompt alone, tools given, ``tool_choice`` left out (auto) unless
    ``choice`` names one: how many answers hold a call the client parses (a known name, JSON
    arguments)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused")
    parsed, firsts, errors = 0, [], []
    for prompt in TOOL_PROMPTS:
        try:
            reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                   tools=[WEATHER_TOOL], **choice)
        except Exception as exc:  # noqa: BLE001 (one prompt's failure is a count, not the end)
            errors.append(get_error(exc))
            continue
        message = reply.choices[0].message
        calls = [c for c in message.tool_calls or [] if c.function.name == "get_weather"
                 and isinstance(get_json(c.function.arguments), dict)]
        parsed += bool(calls)
        firsts.append(calls[0].function.arguments if calls else (message.content or "")[:80])
    return {"answer": firsts[0] if firsts else "", "prompts": len(TOOL_PROMPTS), "prompts_with_call": parsed,
            "outputs": firsts, "errors": errors}


def get_json(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


#: scenario name (bench/serve_agents.py's SCENARIOS) -> the function that runs it
RUNNERS = {"agents-responses": run_agents_responses, "agents-chat": run_agents_chat,
           "agents-session": run_agents_session, "agents-output-type": run_agents_output_type,
           "langgraph-react": run_langgraph_react, "langchain-structured": run_langchain_structured,
           "pydantic-ai-chat": run_pydantic_chat, "pydantic-ai-responses": run_pydantic_responses,
           "pydantic-ai-structured": run_pydantic_structured, "smolagents": run_smolagents,
           "llamaindex": run_llamaindex, "openai-auto": run_openai_auto,
           "openai-required": lambda url, model: run_openai_auto(url, model, tool_choice="required")}


def run_scenario(name: str, base_url: str, model: str) -> dict:
    """The scenario's record: what it returned, the tool's calls, and the error if it raised."""
    try:
        out, error = RUNNERS[name](base_url, model), None
    except Exception as exc:  # noqa: BLE001 (every failure is a result to report)
        traceback.print_exc()
        out, error = dict(SO_FAR), get_error(exc)
    return {"scenario": name, **out, "tool_calls": list(CALLS), "error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("scenario", choices=sorted(RUNNERS))
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--served-model", required=True, help="the model name the requests carry")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the SDK never reaches OpenAI
    record = run_scenario(args.scenario, args.base_url, args.served_model)
    sys.stdout.flush()
    print(RESULT_MARK + json.dumps(record, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
