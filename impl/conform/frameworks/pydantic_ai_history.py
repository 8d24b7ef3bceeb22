"""Pydantic AI's message history through the conformance contract.

The agent is a Pydantic AI ``Agent`` over a ``FunctionModel`` whose function
is our tiny checkpoint (``frameworks/common.py``: greedy ``generate`` over the
ChatML of the messages it is sent); the conversation is the message history
the user owns and passes back each run (``message_history=``, then
``all_messages()``), persisted as the JSON Pydantic AI serialises it to
(``ModelMessagesTypeAdapter``). A step without a model turn is appended as a
request the next run sends.

The forget is the one Pydantic AI's docs offer for privacy: filter the history
(what a ``history_processors`` entry does before each request, here applied to
the stored list), dropping the target's prompt part (the request rewritten
without it where it carried other items). Nothing is re-run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, load_episode
from unsee.impl.conform.frameworks.common import (
    complete,
    decode,
    get_answer,
    get_digest,
    get_step_text,
    get_tau,
)

NAME = "pydantic-ai message history"


def make_agent(episode: Episode) -> Agent:
    """An agent whose model is the tiny checkpoint over the messages it is sent."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        chat = [("system", episode.system)]
        for message in messages:
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    chat.append(("user", str(part.content)))
                elif isinstance(part, TextPart):
                    chat.append(("assistant", part.content))
        ids = complete(chat, episode.settings.max_new_tokens)
        return ModelResponse(parts=[TextPart(decode(ids))], provider_details={"token_ids": ids})

    return Agent(FunctionModel(respond, model_name="tiny"))


def run_step(agent: Agent, history: list[ModelMessage], step, without: str | None = None) -> list[ModelMessage]:
    text = get_step_text(step, without)
    if step.kind in MODEL_TURN_KINDS:
        return agent.run_sync(text, message_history=history).all_messages()
    return [*history, ModelRequest(parts=[UserPromptPart(text)])]


def get_state(history: list[ModelMessage], episode: Episode) -> dict:
    steps = iter(s.id for s in episode.steps if s.kind in MODEL_TURN_KINDS)
    turns = {next(steps, f"extra-{i}"): list((m.provider_details or {}).get("token_ids", []))
             for i, m in enumerate(m for m in history if isinstance(m, ModelResponse))}
    content = [(m.kind, [(p.part_kind, str(getattr(p, "content", ""))) for p in m.parts]) for m in history]
    return {"turns": turns, "digest": get_digest([content, turns])}


def forget_filter(history: list[ModelMessage], episode: Episode, source: str) -> list[ModelMessage]:
    """The history without the target's prompt part (a request left empty is dropped)."""
    step = episode.steps[get_tau(episode, source) - 1]
    target, rest = get_step_text(step), get_step_text(step, source)
    rest_kept = any(i.source != source and i.text for i in step.items)
    out = []
    for message in history:
        if isinstance(message, ModelRequest):
            parts = [UserPromptPart(rest) if isinstance(p, UserPromptPart) and p.content == target and rest_kept
                     else p for p in message.parts
                     if not (isinstance(p, UserPromptPart) and p.content == target and not rest_kept)]
            if not parts:
                continue
            message = ModelRequest(parts=parts, instructions=message.instructions)
        out.append(message)
    return out


def save(history: list[ModelMessage], path: Path) -> list[dict]:
    """Persist the history as the user does; the contract's ``kept``: the file's text."""
    path.write_bytes(ModelMessagesTypeAdapter.dump_json(history))
    return [{"name": path.name, "text": path.read_text(encoding="utf-8")}]


def load(path: Path) -> list[ModelMessage]:
    return list(ModelMessagesTypeAdapter.validate_json(path.read_bytes()))


def _answer(episode_path: str, forget: str | None) -> dict:
    episode = load_episode(episode_path)
    agent = make_agent(episode)
    history: list[ModelMessage] = []
    for step in episode.steps:
        history = run_step(agent, history, step)
    with tempfile.TemporaryDirectory(prefix="unsee-pydantic-ai-") as tmp:
        path = Path(tmp) / "history.json"
        run = {"T": len(episode.steps), **get_state(history, episode), "kept": save(history, path)}
        if forget is None:
            return get_answer(NAME, run)
        T, tau = len(episode.steps), get_tau(episode, forget)
        history = forget_filter(history, episode, forget)
        kept = save(history, path)
        state = get_state(history, episode)
        out = get_answer(NAME, {k: v for k, v in run.items()})
        reopened = get_state(load(path), episode)
        again = get_state(forget_filter(load(path), episode, forget), episode)
    out["forget"] = {"source": forget, "tau": tau, "boundary": T, "invocations": 0, "digest_before": run["digest"],
                     "digest_after": state["digest"], "turns": state["turns"], "kept": kept,
                     "reopened": reopened, "again": {"digest_after": again["digest"], "turns": again["turns"]}}
    reset: list[ModelMessage] = []  # the user's full reset: a new history, every input again without the target
    for step in episode.steps:
        reset = run_step(agent, reset, step, forget)
    state = get_state(reset, episode)
    out["reset"] = {"invocations": T, "digest_before": run["digest"], "digest_after": state["digest"],
                    "turns": state["turns"]}
    return out


def filter_history(episode: str, forget: str | None = None) -> dict:
    """Pydantic AI, forgetting by filtering the message history (nothing re-run)."""
    return _answer(episode, forget)


__all__ = ["NAME", "filter_history", "forget_filter", "get_state", "load", "make_agent", "run_step", "save"]
