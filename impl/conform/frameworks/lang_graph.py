"""LangGraph through the conformance contract (the extra ``unsee[langgraph]``).

An agent as a LangGraph user writes one: a ``StateGraph`` over
``MessagesState`` with one node that calls a chat model, compiled with a
``SqliteSaver`` checkpointer, one ``invoke`` per episode step on one thread.
The chat model (:class:`TinyChatModel`) is a LangChain ``BaseChatModel``
over our tiny model, greedy (:mod:`.common`). Two forgets, each LangGraph's own:

- ``remove``: ``update_state`` with ``RemoveMessage`` of the message that
  carried the target (a message that also carried other items is replaced,
  by id, with one without it). Nothing is re-run.
- ``travel``: time travel. Fork from the checkpoint after the step before the
  target (the latest the episode's policy guarantees; the thread's start is a
  new thread) and re-run the later inputs without the target.

Either way ``kept`` is the checkpointer's database (and the file naming the
active thread), ``reopened`` a new ``SqliteSaver`` on it, ``again`` the same
forget once more (a no-op when no message carries the source).
"""

from __future__ import annotations

import base64
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, Step, load_episode
from unsee.impl.conform.frameworks.common import (
    complete,
    decode,
    get_answer,
    get_digest,
    get_policy_boundary,
    get_sources,
    get_step_text,
    get_tau,
)

ROLES = {"system": "system", "human": "user", "ai": "assistant"}


class TinyChatModel(BaseChatModel):
    """A LangChain chat model over our tiny checkpoint, greedy: a pure
    function of the messages. The decoded token ids ride in ``response_metadata``."""

    max_new_tokens: int = 4

    @property
    def _llm_type(self) -> str:
        return "unsee-tiny"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        ids = complete([(ROLES[m.type], str(m.content)) for m in messages], self.max_new_tokens)
        reply = AIMessage(content=decode(ids), response_metadata={"token_ids": ids})
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build_graph(model: BaseChatModel, system: str, checkpointer):
    def agent(state: MessagesState) -> dict:
        last = state["messages"][-1]
        if last.additional_kwargs.get("kind") not in MODEL_TURN_KINDS:
            return {}  # a memory record or a session mark: no model turn
        reply = model.invoke([SystemMessage(system), *state["messages"]])
        return {"messages": [AIMessage(content=reply.content, id=f"{last.id}/answer",
                                       response_metadata=reply.response_metadata)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    return graph.compile(checkpointer=checkpointer)


def get_message(step: Step, without: str | None = None) -> HumanMessage:
    sources = [s for s in get_sources(step) if s != without]
    return HumanMessage(content=get_step_text(step, without), id=step.id,
                        additional_kwargs={"kind": step.kind, "sources": sources})


def thread(thread_id: str, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread_id} | ({"checkpoint_id": checkpoint_id} if checkpoint_id else {})
    return {"configurable": configurable}


def run_steps(graph, thread_id: str, steps, without: str | None = None, fork: dict | None = None) -> list[dict]:
    """One ``invoke`` per step (the first from ``fork`` when given); the config after each."""
    after = []
    for i, step in enumerate(steps):
        graph.invoke({"messages": [get_message(step, without)]}, fork if (fork and i == 0) else thread(thread_id))
        after.append(graph.get_state(thread(thread_id)).config)
    return after


def get_state(graph, thread_id: str) -> dict:
    messages = graph.get_state(thread(thread_id)).values.get("messages", [])
    turns = {m.id.rpartition("/")[0]: list(m.response_metadata["token_ids"])
             for m in messages if m.type == "ai" and m.id.endswith("/answer")}
    digest = get_digest([(m.type, m.id, m.content, m.additional_kwargs, m.response_metadata) for m in messages])
    return {"turns": turns, "digest": digest, "messages": messages}


def holds(messages, source: str) -> list:
    return [m for m in messages if source in m.additional_kwargs.get("sources", [])]


def forget_remove(graph, thread_id: str, episode: Episode, source: str) -> None:
    """``RemoveMessage`` of each message carrying ``source`` (replaced without it
    when it carries other items too)."""
    for message in holds(get_state(graph, thread_id)["messages"], source):
        step = next(s for s in episode.steps if s.id == message.id)
        rest = [s for s in get_sources(step) if s != source]
        update = get_message(step, source) if rest else RemoveMessage(id=message.id)
        graph.update_state(thread(thread_id), {"messages": [update]})


def forget_travel(graph, thread_id: str, episode: Episode, source: str, after: list[dict]) -> tuple[str, int]:
    """Fork from the checkpoint before the target and re-run the later inputs
    without it; returns the thread now active and the boundary forked from."""
    if not holds(get_state(graph, thread_id)["messages"], source):
        return thread_id, len(episode.steps)
    boundary = get_policy_boundary(episode, get_tau(episode, source))
    later = episode.steps[boundary:]
    if boundary == 0:  # no checkpoint before the first step: the session starts again on a new thread
        thread_id = f"{thread_id}+forget"
        run_steps(graph, thread_id, later, source)
    else:
        run_steps(graph, thread_id, later, source, fork=after[boundary - 1])
    return thread_id, boundary


def get_kept(folder: Path) -> list[dict]:
    return [{"name": p.name, "base64": base64.b64encode(p.read_bytes()).decode("ascii")}
            for p in sorted(folder.iterdir()) if p.is_file()]


def _answer(episode_path: str, forget: str | None, how: str) -> dict:
    episode = load_episode(episode_path)
    model = TinyChatModel(max_new_tokens=episode.settings.max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="unsee-langgraph-") as tmp:
        folder = Path(tmp)
        conn = sqlite3.connect(folder / "checkpoints.sqlite", check_same_thread=False)
        graph = build_graph(model, episode.system, SqliteSaver(conn))
        after = run_steps(graph, "session", episode.steps)
        state = get_state(graph, "session")
        run = {"T": len(after), "turns": state["turns"], "digest": state["digest"]}
        if forget is None:
            conn.close()
            return get_answer(f"langgraph {how}", run | {"kept": get_kept(folder)})
        T, tau = len(episode.steps), get_tau(episode, forget)
        if how == "remove":
            forget_remove(graph, "session", episode, forget)
            active, boundary = "session", T
        else:
            active, boundary = forget_travel(graph, "session", episode, forget, after)
        (folder / "active-thread").write_text(active)
        state = get_state(graph, active)
        conn.close()
        out = get_answer(f"langgraph {how}", run)
        out["forget"] = {"source": forget, "tau": tau, "boundary": boundary, "invocations": T - boundary,
                         "digest_before": run["digest"], "digest_after": state["digest"], "turns": state["turns"],
                         "kept": get_kept(folder)}
        conn = sqlite3.connect(folder / "checkpoints.sqlite", check_same_thread=False)
        graph = build_graph(model, episode.system, SqliteSaver(conn))
        reopened = get_state(graph, active)
        out["forget"]["reopened"] = {"digest": reopened["digest"], "turns": reopened["turns"]}
        if how == "remove":
            forget_remove(graph, active, episode, forget)
        else:
            active, _ = forget_travel(graph, active, episode, forget, [])
        again = get_state(graph, active)
        out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
        conn.close()
    out["reset"] = _reset(model, episode, forget)
    out["reset"]["digest_before"] = run["digest"]
    return out


def _reset(model, episode: Episode, source: str) -> dict:
    """The user's full reset: a new thread, every input again without the target."""
    graph = build_graph(model, episode.system, InMemorySaver())
    run_steps(graph, "reset", episode.steps, source)
    state = get_state(graph, "reset")
    return {"invocations": len(episode.steps), "digest_after": state["digest"], "turns": state["turns"]}


def remove(episode: str, forget: str | None = None) -> dict:
    """LangGraph, forgetting with ``RemoveMessage``."""
    return _answer(episode, forget, "remove")


def travel(episode: str, forget: str | None = None) -> dict:
    """LangGraph, forgetting by time travel (fork before the target, re-run the rest)."""
    return _answer(episode, forget, "travel")


__all__ = ["TinyChatModel", "build_graph", "remove", "travel"]
