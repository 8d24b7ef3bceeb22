"""The OpenAI Agents SDK through the conformance contract (the extra
``unsee[agents]``).

An agent as an SDK user writes one: an ``Agent`` with the episode's system
prompt as instructions, one ``Runner.run`` per episode step with a
``SQLiteSession`` on a file (a memory record or a session mark is added to
the session with ``add_items``, no model call). The model
(:class:`TinyModel`) is an SDK ``Model`` over our tiny checkpoint, greedy
(:mod:`.common`); the token ids it decoded ride in its message's id.

The forget is the SDK's own ``pop_item``: pop items until the target's
message is gone, back to the step the episode's checkpoint policy allows,
then run the later inputs again without the target. ``kept`` is the
session's database file, ``reopened`` a new ``SQLiteSession`` on it,
``again`` the same forget once more (a no-op when no item holds the target).
"""

from __future__ import annotations

import asyncio
import base64
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, Runner, SQLiteSession, Usage, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, load_episode
from unsee.impl.conform.frameworks.common import (
    complete,
    decode,
    get_answer,
    get_digest,
    get_policy_boundary,
    get_step_text,
    get_tau,
)

set_tracing_disabled(True)  # nothing leaves the machine
ID_PREFIX = "tiny-"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


class TinyModel(Model):
    """An Agents SDK ``Model`` over our tiny checkpoint, greedy."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None,
                           **kwargs) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        messages = [("system", system_instructions or "")] + [(item.get("role", "user"), _text(item.get("content")))
                                                             for item in items if item.get("role")]
        ids = complete(messages, self.max_new_tokens)
        reply = ResponseOutputMessage(id=ID_PREFIX + "-".join(map(str, ids)), role="assistant", type="message",
                                      status="completed", content=[ResponseOutputText(
                                          type="output_text", text=decode(ids), annotations=[])])
        return ModelResponse(output=[reply], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the conformance adapter does not stream")


def run_step(agent: Agent, session: SQLiteSession, step, without: str | None = None) -> None:
    text = get_step_text(step, without)
    if step.kind in MODEL_TURN_KINDS:
        Runner.run_sync(agent, text, session=session)
    else:
        asyncio.run(session.add_items([{"role": "user", "content": text}]))


def get_state(session: SQLiteSession, episode: Episode) -> dict:
    items = asyncio.run(session.get_items())
    steps = iter(s.id for s in episode.steps if s.kind in MODEL_TURN_KINDS)
    turns = {}
    for item in items:
        if item.get("role") == "assistant" and str(item.get("id", "")).startswith(ID_PREFIX):
            ids = item["id"][len(ID_PREFIX):]
            turns[next(steps, f"extra-{len(turns)}")] = [int(i) for i in ids.split("-")] if ids else []
    return {"turns": turns, "digest": get_digest(items), "items": items}


def holds(items: list, text: str) -> bool:
    return any(text in _text(item.get("content")) for item in items if item.get("role") == "user")


def forget_pop(agent: Agent, session: SQLiteSession, episode: Episode, source: str) -> int:
    """Pop items until the target's message is gone and the session is back at
    the policy's boundary; run the later inputs again without the target."""
    tau = get_tau(episode, source)
    target = get_step_text(episode.steps[tau - 1])
    if not holds(asyncio.run(session.get_items()), target):
        return len(episode.steps)
    boundary = get_policy_boundary(episode, tau)
    keep = sum(1 + (s.kind in MODEL_TURN_KINDS) for s in episode.steps[:boundary])  # items of steps 1..boundary
    while len(asyncio.run(session.get_items())) > keep:
        asyncio.run(session.pop_item())
    for step in episode.steps[boundary:]:
        run_step(agent, session, step, source)
    return boundary


def get_kept(db: Path) -> list[dict]:
    """The session's database and its side files, as they are on disk now."""
    return [{"name": p.name, "base64": base64.b64encode(p.read_bytes()).decode("ascii")}
            for p in sorted(db.parent.iterdir()) if p.is_file()]


def _answer(episode_path: str, forget: str | None) -> dict:
    episode = load_episode(episode_path)
    agent = Agent(name="assistant", instructions=episode.system, model=TinyModel(episode.settings.max_new_tokens))
    with tempfile.TemporaryDirectory(prefix="unsee-agents-") as tmp:
        db = Path(tmp) / "session.sqlite"
        session = SQLiteSession("session", db)
        for step in episode.steps:
            run_step(agent, session, step)
        state = get_state(session, episode)
        run = {"T": len(episode.steps), "turns": state["turns"], "digest": state["digest"], "kept": get_kept(db)}
        if forget is None:
            session.close()
            return get_answer("openai-agents pop_item", run)
        boundary = forget_pop(agent, session, episode, forget)
        state = get_state(session, episode)
        session.close()
        out = get_answer("openai-agents pop_item", run)
        T = len(episode.steps)
        kept = get_kept(db)
        out["forget"] = {"source": forget, "tau": get_tau(episode, forget), "boundary": boundary,
                         "invocations": T - boundary, "digest_before": run["digest"],
                         "digest_after": state["digest"], "turns": state["turns"], "kept": kept}
        session = SQLiteSession("session", db)
        reopened = get_state(session, episode)
        out["forget"]["reopened"] = {"digest": reopened["digest"], "turns": reopened["turns"]}
        forget_pop(agent, session, episode, forget)
        again = get_state(session, episode)
        out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
        session.close()
    out["reset"] = get_reset(agent, episode, forget, run["digest"])
    return out


def get_reset(agent: Agent, episode: Episode, forget: str, digest_before: str) -> dict:
    """The user's full reset: a new session, every input again without the target."""
    reset = SQLiteSession("reset")
    for step in episode.steps:
        run_step(agent, reset, step, forget)
    state = get_state(reset, episode)
    return {"invocations": len(episode.steps), "digest_before": digest_before,
            "digest_after": state["digest"], "turns": state["turns"]}


def forget_branch(agent: Agent, session, episode: Episode, source: str) -> int:
    """``AdvancedSQLiteSession.create_branch_from_turn`` at the user message after the policy's
    boundary (each step puts one user message: turn ``boundary + 1``), then the later inputs
    again without the target on the new branch; the original branch stays (``main`` cannot be
    deleted)."""
    tau = get_tau(episode, source)
    if not holds(asyncio.run(session.get_items()), get_step_text(episode.steps[tau - 1])):
        return len(episode.steps)
    boundary = get_policy_boundary(episode, tau)
    branches = {b["branch_id"] for b in asyncio.run(session.list_branches())}
    asyncio.run(session.create_branch_from_turn(boundary + 1, f"forget-{len(branches)}"))
    for step in episode.steps[boundary:]:
        run_step(agent, session, step, source)
    return boundary


def open_advanced(db: Path):
    from agents.extensions.memory import AdvancedSQLiteSession

    return AdvancedSQLiteSession(session_id="session", db_path=db, create_tables=True)


def _branch_answer(episode_path: str, forget: str | None) -> dict:
    episode = load_episode(episode_path)
    agent = Agent(name="assistant", instructions=episode.system, model=TinyModel(episode.settings.max_new_tokens))
    name = "openai-agents AdvancedSQLiteSession branch"
    with tempfile.TemporaryDirectory(prefix="unsee-agents-") as tmp:
        db = Path(tmp) / "session.sqlite"
        session = open_advanced(db)
        for step in episode.steps:
            run_step(agent, session, step)
        state = get_state(session, episode)
        run = {"T": len(episode.steps), "turns": state["turns"], "digest": state["digest"], "kept": get_kept(db)}
        if forget is None:
            session.close()
            return get_answer(name, run)
        T, boundary = len(episode.steps), forget_branch(agent, session, episode, forget)
        state = get_state(session, episode)
        session.close()
        out = get_answer(name, run)
        out["forget"] = {"source": forget, "tau": get_tau(episode, forget), "boundary": boundary,
                         "invocations": T - boundary, "digest_before": run["digest"],
                         "digest_after": state["digest"], "turns": state["turns"], "kept": get_kept(db)}
        session = open_advanced(db)  # reopened: whichever branch a new session object starts on
        reopened = get_state(session, episode)
        out["forget"]["reopened"] = {"digest": reopened["digest"], "turns": reopened["turns"]}
        forget_branch(agent, session, episode, forget)
        again = get_state(session, episode)
        out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
        session.close()
    out["reset"] = get_reset(agent, episode, forget, run["digest"])
    return out


def branch(episode: str, forget: str | None = None) -> dict:
    """The Agents SDK's ``AdvancedSQLiteSession``, forgetting by a branch from the turn before the target."""
    return _branch_answer(episode, forget)


def pop_item(episode: str, forget: str | None = None) -> dict:
    """The Agents SDK, forgetting with ``SQLiteSession.pop_item`` and a re-run."""
    return _answer(episode, forget)


__all__ = ["TinyModel", "branch", "forget_branch", "open_advanced", "pop_item"]
