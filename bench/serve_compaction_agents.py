"""The Agents SDK phase of bench/serve_compaction.py: a conversation of several times the
server's context, run by the SDK's own ``Runner`` with a ``conversation_id`` and a function tool.

The agent's ``ModelSettings`` are the ones a user of the SDK sets for a long conversation on the
Responses API: ``truncation="auto"`` and ``context_management`` with a ``compact_threshold``
below the context. The threshold leaves room for a tool round: a turn that answers calls (a
function_call_output) never compacts (it must follow the calls it answers), so the user turn
before it compacts early enough for the call, its output and the answer to fit.

Every response the SDK receives is read on the wire (an ``httpx`` response hook on the client the
SDK is given), since the SDK keeps no server extension: each turn's cost of staying under the
context is its responses' ``unsee.compaction`` (the tokens the summary read, the summary's tokens,
the context it left), its largest prompt, the process's CPU and the wall time.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from unsee.bench.serve_compaction import say, serve

INSTRUCTIONS = ("You are a helpful assistant to a ferry pilot. When a tool response arrives, answer the user's "
                "question in one plain sentence using it.")
HARBOURS = ("Drobak", "Horten", "Moss", "Son", "Tonsberg", "Larvik", "Arendal", "Grimstad", "Mandal", "Farsund",
            "Egersund", "Stavanger", "Haugesund", "Bergen", "Floro", "Alesund")
SHIPS = ("Bastoe", "Fjordbris", "Oscarsborg", "Skagen", "Vesterled")


def tide(harbour: str) -> str:
    """The tide table of a harbour."""
    n = sum(map(ord, harbour)) % 50
    return f"{harbour}: high tide 0{n % 10}:{n + 10:02d}, low tide 1{n % 10}:{n + 5:02d}."


def get_turn_text(n: int) -> str:
    """About 250 tokens: a shift log and a question that needs the tool."""
    harbour = HARBOURS[n % len(HARBOURS)]
    lines = [f"Shift log {n + 1}."]
    for k in range(8):
        ship = SHIPS[(n + k) % len(SHIPS)]
        lines.append(f"At {18 + k % 6}:{(7 * k + n) % 60:02d} the {ship} passed buoy {n * 8 + k} heading "
                     f"{(37 * k + 11 * n) % 360} degrees at {8 + (k + n) % 9} knots; wind {3 + k % 5} m/s from the "
                     f"{('north', 'south', 'east', 'west')[(k + n) % 4]}.")
    lines.append(f"We dock at {harbour} next. When is high tide at {harbour}?")
    return " ".join(lines)


def get_length(encode, items: list[dict]) -> int:
    """The conversation's tokens without compaction: every item's text, template tokens not
    counted (so an underestimate); compaction items left out."""
    texts = []
    for item in items:
        if item["type"] == "message":
            texts += [c.get("text", "") for c in item["content"]]
        elif item["type"] == "function_call":
            texts += [item["name"], item["arguments"]]
        elif item["type"] == "function_call_output":
            texts.append(item["output"] if isinstance(item["output"], str) else json.dumps(item["output"]))
    return sum(len(encode(t)) for t in texts)


def make_client(url: str, seen: list[dict]):
    """The SDK's client, with a hook that keeps every Responses reply's body."""
    import httpx
    import openai

    async def keep(response):
        if response.request.method == "POST" and response.request.url.path.endswith("/responses"):
            await response.aread()
            seen.append(json.loads(response.content))

    http = httpx.AsyncClient(event_hooks={"response": [keep]}, timeout=3600)
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)


def get_turn_row(n: int, replies: list[dict], wall: float, cpu: float, length: int, error: str | None) -> dict:
    compactions = [r["unsee"]["compaction"] for r in replies if (r.get("unsee") or {}).get("compaction")]
    return {"turn": n + 1, "requests": len(replies), "error": error, "wall_s": wall, "cpu_s": cpu,
            "conversation_tokens": length,
            "largest_prompt": max((r["usage"]["input_tokens"] for r in replies if r.get("usage")), default=None),
            "output_tokens": sum(r["usage"]["output_tokens"] for r in replies if r.get("usage")),
            "tool_calls": sum(1 for r in replies for o in r.get("output", []) if o["type"] == "function_call"),
            "compaction": compactions[0] if compactions else None,
            "answer": next((o["content"][0]["text"] for r in replies[-1:] for o in r.get("output", [])
                            if o["type"] == "message"), None)}


async def converse(url: str, encode, ctx_size: int, times: float, max_tokens: int) -> list[dict]:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[dict] = []
    client = make_client(url, seen)
    settings = ModelSettings(truncation="auto", max_tokens=max_tokens, temperature=0, tool_choice="required",
                             context_management=[{"type": "compaction", "compact_threshold": ctx_size * 5 // 8}])
    agent = Agent(name="Pilot", instructions=INSTRUCTIONS, tools=[function_tool(tide)],
                  model=OpenAIResponsesModel("bench", client), model_settings=settings)
    conv = (await client.conversations.create()).id
    rows, length, n = [], 0, 0
    while length < times * ctx_size and n < 40:
        start, wall, cpu, error = len(seen), time.perf_counter(), time.process_time(), None
        try:
            await Runner.run(agent, get_turn_text(n), conversation_id=conv, max_turns=4)
        except Exception as e:  # noqa: BLE001 - the SDK's error is the result: reported, and the run ends
            error = f"{type(e).__name__}: {e}"[:400]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        items = [i.model_dump(exclude_none=True) async for i in client.conversations.items.list(conv, order="asc")]
        length = get_length(encode, items)
        rows.append(get_turn_row(n, seen[start:], wall, cpu, length, error))
        say(f"turn {n + 1}: {length} tokens, compaction {rows[-1]['compaction'] is not None}, error {error}")
        n += 1
        if error:
            break
    await client.close()
    return rows


def run_agents(engine, work: Path, ctx_size: int, times: float, max_tokens: int) -> dict:
    """Phase ``agents``: see the module docstring."""
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    with serve(engine, work / "store", max_tokens) as srv:
        rows = asyncio.run(converse(srv.url, engine.lm.encode, ctx_size, times, max_tokens))
    return {"turns": rows, "errors": [r["error"] for r in rows if r["error"]],
            "conversation_tokens": rows[-1]["conversation_tokens"] if rows else 0,
            "times_the_context": (rows[-1]["conversation_tokens"] / ctx_size) if rows else 0,
            "compactions": sum(1 for r in rows if r["compaction"])}


__all__ = ["get_turn_text", "run_agents", "tide"]
