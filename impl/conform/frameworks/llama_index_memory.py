"""LlamaIndex's chat memory (``llama_index.core.memory.Memory``) through the
conformance contract.

The conversation lives in a ``Memory`` whose short-term store is an SQLite
file (``async_database_uri``), as a chat engine or an agent keeps it: each
model turn puts the user message, reads ``get()`` (what the model is given),
decodes with our tiny checkpoint (``frameworks/common.py``) and puts the
answer; a step without a model turn is put as a user message. Token counts
use a whitespace tokenizer (LlamaIndex's default needs a download).

The forget: read the whole history (``get_all``), drop the target's message
(rewritten without it where it carried other items) and ``set`` the rest, the
memory's own way to replace its history. Nothing is re-run.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.memory import Memory

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, load_episode
from unsee.impl.conform.frameworks.common import complete, decode, get_answer, get_digest, get_step_text, get_tau

NAME = "llama-index Memory.set"


def open_memory(path: Path | None) -> Memory:
    """A memory on the SQLite file ``path`` (None: LlamaIndex's in-memory default)."""
    uri = None if path is None else f"sqlite+aiosqlite:///{path}"
    return Memory.from_defaults(session_id="session", async_database_uri=uri, tokenizer_fn=str.split)


def run_step(memory: Memory, episode: Episode, step, without: str | None = None) -> None:
    memory.put(ChatMessage(role=MessageRole.USER, content=get_step_text(step, without)))
    if step.kind not in MODEL_TURN_KINDS:
        return
    chat = [("system", episode.system)] + [(m.role.value, m.content or "") for m in memory.get()]
    ids = complete(chat, episode.settings.max_new_tokens)
    memory.put(ChatMessage(role=MessageRole.ASSISTANT, content=decode(ids), additional_kwargs={"token_ids": ids}))


def get_state(memory: Memory, episode: Episode) -> dict:
    messages = memory.get_all()
    steps = iter(s.id for s in episode.steps if s.kind in MODEL_TURN_KINDS)
    turns = {next(steps, f"extra-{i}"): list(m.additional_kwargs.get("token_ids", []))
             for i, m in enumerate(m for m in messages if m.role == MessageRole.ASSISTANT)}
    return {"turns": turns, "digest": get_digest([[m.role.value, m.content] for m in messages] + [turns])}


def forget_set(memory: Memory, episode: Episode, source: str) -> None:
    """``set`` the history without the target's message."""
    step = episode.steps[get_tau(episode, source) - 1]
    target, rest = get_step_text(step), get_step_text(step, source)
    rest_kept = any(i.source != source and i.text for i in step.items)
    kept = []
    for message in memory.get_all():
        if message.role == MessageRole.USER and message.content == target:
            if not rest_kept:
                continue
            message = ChatMessage(role=MessageRole.USER, content=rest)
        kept.append(message)
    memory.set(kept)


def get_kept(folder: Path) -> list[dict]:
    return [{"name": p.name, "base64": base64.b64encode(p.read_bytes()).decode("ascii")}
            for p in sorted(folder.iterdir()) if p.is_file()]


def _answer(episode_path: str, forget: str | None) -> dict:
    episode = load_episode(episode_path)
    with tempfile.TemporaryDirectory(prefix="unsee-llamaindex-") as tmp:
        path = Path(tmp) / "memory.sqlite"
        memory = open_memory(path)
        for step in episode.steps:
            run_step(memory, episode, step)
        run = {"T": len(episode.steps), **get_state(memory, episode), "kept": get_kept(Path(tmp))}
        if forget is None:
            return get_answer(NAME, run)
        T = len(episode.steps)
        forget_set(memory, episode, forget)
        state = get_state(memory, episode)
        out = get_answer(NAME, run)
        out["forget"] = {"source": forget, "tau": get_tau(episode, forget), "boundary": T, "invocations": 0,
                         "digest_before": run["digest"], "digest_after": state["digest"], "turns": state["turns"],
                         "kept": get_kept(Path(tmp))}
        reopened = open_memory(path)
        out["forget"]["reopened"] = get_state(reopened, episode)
        forget_set(reopened, episode, forget)
        again = get_state(reopened, episode)
        out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
    reset = open_memory(None)  # the user's full reset: a new memory, every input again without the target
    for step in episode.steps:
        run_step(reset, episode, step, forget)
    state = get_state(reset, episode)
    out["reset"] = {"invocations": T, "digest_before": run["digest"], "digest_after": state["digest"],
                    "turns": state["turns"]}
    return out


def set_history(episode: str, forget: str | None = None) -> dict:
    """LlamaIndex's ``Memory``, forgetting by ``set`` of the history without the target."""
    return _answer(episode, forget)


__all__ = ["NAME", "forget_set", "get_state", "open_memory", "run_step", "set_history"]
