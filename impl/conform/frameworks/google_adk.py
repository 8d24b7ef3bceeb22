"""Google ADK through the conformance contract (the extra ``unsee[adk]``).

An agent as an ADK user writes one: an ``LlmAgent`` with the episode's system
prompt as its instruction, a ``Runner`` over an ``InMemorySessionService``,
one ``run_async`` per episode step (a memory record or a session mark is
appended as a user event, no model call). The model (:class:`TinyLlm`) is an
ADK ``BaseLlm`` over our tiny checkpoint, greedy (:mod:`.common`); the token
ids it decoded ride in the response's ``custom_metadata``.

The forget is ADK's own ``Runner.rewind_async`` to before the invocation of
the step after the policy's boundary, then the later inputs again without
the target. The state is the live events (those no rewind dropped, as ADK's
prompt builder reads them); ``kept`` is the whole stored session (every
event, rewound ones too). The in-memory service persists nothing, so
``reopen`` is N/A; ``again`` is the same forget once more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.events import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

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

APP, USER, AGENT = "unsee-conform", "user", "assistant"


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text or "" for p in content.parts or [])


class TinyLlm(BaseLlm):
    """An ADK ``BaseLlm`` over our tiny checkpoint, greedy."""

    model: str = "unsee-tiny"
    max_new_tokens: int = 4

    @classmethod
    def supported_models(cls) -> list[str]:
        return [r"unsee-tiny"]

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        system = _text(llm_request.config.system_instruction) if llm_request.config else ""
        messages = [("system", system)] + [("assistant" if c.role == "model" else "user", _text(c))
                                           for c in llm_request.contents]
        ids = complete(messages, self.max_new_tokens)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=decode(ids))]),
                          custom_metadata={"token_ids": ids})


def get_live(events: list[Event]) -> list[Event]:
    """The events no rewind dropped: a rewind event drops itself and every
    event from the first of the invocation it names."""
    live: list[Event] = []
    for event in events:
        rewind = event.actions.rewind_before_invocation_id if event.actions else None
        if rewind:
            first = next((i for i, e in enumerate(live) if e.invocation_id == rewind), len(live))
            del live[first:]
        else:
            live.append(event)
    return live


class Session:
    """One ADK session driven step by step; ``invocations`` per step id."""

    def __init__(self, episode: Episode, session_id: str, service=None):
        self.episode, self.session_id = episode, session_id
        self.service = service or InMemorySessionService()
        agent = LlmAgent(name=AGENT, model=TinyLlm(max_new_tokens=episode.settings.max_new_tokens),
                         instruction=episode.system)
        self.runner = Runner(app_name=APP, agent=agent, session_service=self.service)
        asyncio.run(self.service.create_session(app_name=APP, user_id=USER, session_id=session_id))
        self.invocations: dict[str, str] = {}

    def _session(self):
        return asyncio.run(self.service.get_session(app_name=APP, user_id=USER, session_id=self.session_id))

    def run(self, steps, without: str | None = None) -> None:
        for step in steps:
            message = types.Content(role="user", parts=[types.Part(text=get_step_text(step, without))])
            if step.kind in MODEL_TURN_KINDS:
                self.invocations[step.id] = asyncio.run(self._run(message))
            else:
                invocation = f"append-{step.id}-{len(self.invocations)}"
                event = Event(invocation_id=invocation, author="user", content=message)
                asyncio.run(self.service.append_event(self._session(), event))
                self.invocations[step.id] = invocation

    async def _run(self, message) -> str:
        invocation = ""
        async for event in self.runner.run_async(user_id=USER, session_id=self.session_id, new_message=message):
            invocation = event.invocation_id
        return invocation

    def rewind_before(self, step_id: str) -> None:
        asyncio.run(self.runner.rewind_async(user_id=USER, session_id=self.session_id,
                                             rewind_before_invocation_id=self.invocations[step_id]))

    def get_state(self) -> dict:
        live = get_live(self._session().events)
        steps = iter(s.id for s in self.episode.steps if s.kind in MODEL_TURN_KINDS)
        turns = {next(steps, f"extra-{i}"): list(e.custom_metadata["token_ids"])
                 for i, e in enumerate(e for e in live if e.author == AGENT and e.custom_metadata)}
        digest = get_digest([(e.author, _text(e.content), (e.custom_metadata or {}).get("token_ids")) for e in live])
        return {"turns": turns, "digest": digest, "live": live}

    def get_kept(self) -> list[dict]:
        return [{"name": "session.json", "text": self._session().model_dump_json()}]


def forget_rewind(session: Session, source: str) -> int:
    episode = session.episode
    tau = get_tau(episode, source)
    target = get_step_text(episode.steps[tau - 1])
    if not any(_text(e.content) == target for e in session.get_state()["live"] if e.author == "user"):
        return len(episode.steps)
    boundary = get_policy_boundary(episode, tau)
    session.rewind_before(episode.steps[boundary].id)
    session.run(episode.steps[boundary:], source)
    return boundary


def rewind(episode_path: str, forget: str | None = None) -> dict:
    """Google ADK, forgetting with ``Runner.rewind_async`` and a re-run."""
    episode = load_episode(episode_path)
    session = Session(episode, "session")
    session.run(episode.steps)
    state = session.get_state()
    run = {"T": len(episode.steps), "turns": state["turns"], "digest": state["digest"], "kept": session.get_kept()}
    out = get_answer("google-adk rewind", run)
    if forget is None:
        return out
    boundary = forget_rewind(session, forget)
    state = session.get_state()
    T = len(episode.steps)
    out["forget"] = {"source": forget, "tau": get_tau(episode, forget), "boundary": boundary,
                     "invocations": T - boundary, "digest_before": run["digest"], "digest_after": state["digest"],
                     "turns": state["turns"], "kept": session.get_kept()}
    forget_rewind(session, forget)
    again = session.get_state()
    out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
    reset = Session(episode, "reset")  # the user's full reset: a new session, every input again without the target
    reset.run(episode.steps, forget)
    state = reset.get_state()
    out["reset"] = {"invocations": T, "digest_before": run["digest"], "digest_after": state["digest"],
                    "turns": state["turns"]}
    return out


__all__ = ["TinyLlm", "get_live", "rewind"]
