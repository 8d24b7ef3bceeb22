"""Frameworks judged against their own promises (issue 53, item 4;
impl/conform/claims.py): the verdicts read the committed result files, the
docs table is the generated one, and where no suite check covers a promise a
probe here drives the framework's own API (skipped without its extra)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.conform.checks import FAIL, FORGET_TWIN_TURNS, PASS, RESIDUE
from unsee.impl.conform.claims import BROKEN, CLAIMS, KEPT, UNTESTED, compute_verdict, render_claims
from unsee.impl.conform.results import load_results

DOCS = Path(__file__).parent.parent / "docs"
RESULTS = {p.name: r for p, r in load_results(DOCS / "results")}
EPISODE = parse_episode({
    "format": "unsee.episode", "version": 2, "system": "Be brief.",
    "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "hi"},
              {"id": "t2", "kind": "user", "source": "secret", "text": "4417 Elm"},
              {"id": "t3", "kind": "user", "text": "where?"}],
    "target": {"source": "secret", "value": "4417 Elm"}})


def test_every_scored_framework_has_a_claim_and_a_result():
    assert {c.result for c in CLAIMS} <= set(RESULTS)
    assert {c.framework for c in CLAIMS} == {"LangGraph", "OpenAI Agents SDK", "Google ADK", "mem0", "Pydantic AI",
                                                "LlamaIndex"}
    assert all(c.url.startswith("https://") and c.promise and c.promised for c in CLAIMS)


def test_the_verdicts():
    claim = next(c for c in CLAIMS if c.framework == "mem0")
    assert compute_verdict(claim, {RESIDUE: FAIL}) == BROKEN
    assert compute_verdict(claim, {RESIDUE: PASS, FORGET_TWIN_TURNS: FAIL}) == KEPT  # silent there: no promise
    assert compute_verdict(claim, {}) == UNTESTED
    assert compute_verdict(claim, RESULTS[claim.result]["checks"]) == BROKEN  # its history table keeps the text


def test_the_docs_table_is_the_generated_one():
    region = re.search(r"<!-- generated: claims [^\n]*-->\n(.*?)<!-- end: claims -->",
                       (DOCS / "conformance.md").read_text(), re.DOTALL)
    assert region and region.group(1) == render_claims(RESULTS)


def test_langgraph_remove_message_does_what_its_docs_promise(tmp_path):
    """The promise: the message a RemoveMessage names leaves the state's message list (and the
    checkpointer persists that); the probe would fail if the update were not applied or not saved."""
    pytest.importorskip("langgraph.checkpoint.sqlite")
    from langgraph.checkpoint.sqlite import SqliteSaver

    from unsee.impl.conform.frameworks import lang_graph as lg

    model = lg.TinyChatModel(max_new_tokens=2)
    conn = sqlite3.connect(tmp_path / "c.sqlite", check_same_thread=False)
    graph = lg.build_graph(model, EPISODE.system, SqliteSaver(conn))
    lg.run_steps(graph, "s", EPISODE.steps)
    assert lg.holds(lg.get_state(graph, "s")["messages"], "secret")  # the premise
    lg.forget_remove(graph, "s", EPISODE, "secret")
    assert lg.holds(lg.get_state(graph, "s")["messages"], "secret") == []
    conn.close()
    reopened = lg.build_graph(model, EPISODE.system, SqliteSaver(sqlite3.connect(tmp_path / "c.sqlite")))
    assert lg.holds(lg.get_state(reopened, "s")["messages"], "secret") == []
    # what it never promised: the checkpoints before the update still hold the target
    history = [s.values.get("messages", []) for s in reopened.get_state_history(lg.thread("s"))]
    assert any(lg.holds(m, "secret") for m in history)


def test_langgraph_time_travel_keeps_the_history_its_docs_say_it_keeps():
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.memory import InMemorySaver

    from unsee.impl.conform.frameworks import lang_graph as lg

    graph = lg.build_graph(lg.TinyChatModel(max_new_tokens=2), EPISODE.system, InMemorySaver())
    after = lg.run_steps(graph, "s", EPISODE.steps)
    active, boundary = lg.forget_travel(graph, "s", EPISODE, "secret", after)
    assert boundary == 1 and lg.holds(lg.get_state(graph, active)["messages"], "secret") == []
    history = [s.values.get("messages", []) for s in graph.get_state_history(lg.thread("s"))]
    assert any(lg.holds(m, "secret") for m in history)  # "the original execution history stays intact"


def test_agents_sdk_pop_item_does_what_its_docs_promise(tmp_path):
    """The promise: pop_item removes the most recent item and returns it."""
    pytest.importorskip("agents")
    from agents import Agent, SQLiteSession

    from unsee.impl.conform.frameworks import agents_sdk as sdk

    agent = Agent(name="assistant", instructions=EPISODE.system, model=sdk.TinyModel(2))
    session = SQLiteSession("s", tmp_path / "s.sqlite")
    for step in EPISODE.steps:
        sdk.run_step(agent, session, step)
    before = asyncio.run(session.get_items())
    popped = asyncio.run(session.pop_item())
    assert popped == before[-1] and asyncio.run(session.get_items()) == before[:-1]
    session.close()
    assert asyncio.run(SQLiteSession("s", tmp_path / "s.sqlite").get_items()) == before[:-1]


def test_pydantic_ai_history_filter_does_what_its_docs_promise():
    """The promise: the filtered history is what the next request sends; the target's part is not in it."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from unsee.impl.conform.frameworks import pydantic_ai_history as pai

    history = []
    for step in EPISODE.steps:
        history = pai.run_step(pai.make_agent(EPISODE), history, step)
    assert "4417 Elm" in str(history)  # the premise
    sent = []

    def record(messages, info):
        sent.append(str(messages))
        return ModelResponse(parts=[TextPart("ok")])

    Agent(FunctionModel(record)).run_sync("and now?", message_history=pai.forget_filter(history, EPISODE, "secret"))
    assert sent and "4417 Elm" not in sent[0] and "where?" in sent[0]


def test_llama_index_memory_set_does_what_its_docs_promise(tmp_path):
    """The promise: set() replaces the history; get() gives the model what was set, nothing of the target."""
    pytest.importorskip("llama_index.core")
    from unsee.impl.conform.frameworks import llama_index_memory as li

    memory = li.open_memory(tmp_path / "m.sqlite")
    for step in EPISODE.steps:
        li.run_step(memory, EPISODE, step)
    assert "4417 Elm" in str(memory.get_all())  # the premise
    li.forget_set(memory, EPISODE, "secret")
    assert "4417 Elm" not in str(memory.get()) and "4417 Elm" not in str(li.open_memory(tmp_path / "m.sqlite").get_all())
    assert [m.content for m in memory.get_all()][:1] == ["hi"]


def test_agents_sdk_branch_does_what_its_docs_promise(tmp_path):
    """The promise: a branch from a user message is an alternative path; the original stays as it was."""
    pytest.importorskip("agents")
    from agents import Agent

    from unsee.impl.conform.frameworks import agents_sdk as sdk

    agent = Agent(name="assistant", instructions=EPISODE.system, model=sdk.TinyModel(2))
    session = sdk.open_advanced(tmp_path / "s.sqlite")
    for step in EPISODE.steps:
        sdk.run_step(agent, session, step)
    before = asyncio.run(session.get_items())
    assert sdk.forget_branch(agent, session, EPISODE, "secret") == 1
    after = asyncio.run(session.get_items())
    assert after[:2] == before[:2] and not sdk.holds(after, "4417 Elm")
    asyncio.run(session.switch_to_branch("main"))
    assert asyncio.run(session.get_items()) == before  # the original path, target included
    session.close()
