"""What the framework adapters share: the model, and the episode as messages.

The model is our ``tiny`` checkpoint (the one the reference runs), decoded
greedily with plain ``transformers`` ``generate`` over a ChatML prompt: a
pure function of the messages, so only the framework's forget is judged.
"""

from __future__ import annotations

import hashlib
import json

from unsee.impl.agent.episode import Episode, Step
from unsee.impl.agent.render import render, render_header
from unsee.impl.conform.adapters import MODELS
from unsee.impl.conform.contract import make_answer

#: The step kinds whose model turn the contract reports (``session`` has none).
TURN_KINDS = ("user", "tool", "plan", "remember", "compact")


def get_model(name: str = "tiny"):
    from unsee.impl.engines.hf.models import load_model

    return MODELS.get("transformers", name, lambda: load_model(name))


def complete(messages: list[tuple[str, str]], max_new_tokens: int, name: str = "tiny") -> list[int]:
    """The token ids the model decodes after ``messages`` (``(role, text)``), greedily."""
    import torch

    lm = get_model(name)
    prompt = "".join(render(role, text) for role, text in messages) + render_header()
    ids = torch.tensor([lm.encode(prompt)], device=lm.device)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, eos_token_id=list(lm.eos_ids), pad_token_id=lm.eos_ids[0])
    finally:
        torch.set_num_threads(previous)
    return [int(t) for t in out[0, ids.shape[1]:]]


def decode(ids: list[int], name: str = "tiny") -> str:
    return get_model(name).decode(ids)


def get_step_text(step: Step, without: str | None = None) -> str:
    """A step as the text of one user message (``without``: a source left out)."""
    texts = [i.text for i in step.items if i.source != without and i.text]
    tag = {"user": "", "plan": f"[plan {step.tool or ''}] ", "tool": f"[result of tool {step.tool or ''}] ",
           "memory": "[memory] "}.get(step.kind, f"[{step.kind}]")
    return tag + "\n".join(texts)


def get_sources(step: Step) -> list[str]:
    return [i.source for i in step.items]


def get_tau(episode: Episode, source: str) -> int:
    return next(t for t, s in enumerate(episode.steps, start=1) if source in get_sources(s))


def get_policy_boundary(episode: Episode, tau: int) -> int:
    """The checkpoint the episode's policy guarantees before ``tau`` (a user
    configures how often the framework checkpoints; forks are from those)."""
    from unsee.impl.conform.harness import get_policy_checkpoints

    return max(b for b in get_policy_checkpoints(episode) if b < tau)


def get_digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def get_answer(name: str, run: dict) -> dict:
    return make_answer(name, "transformers-generate", "tiny", run)


__all__ = ["TURN_KINDS", "complete", "decode", "get_answer", "get_digest", "get_model", "get_policy_boundary",
           "get_sources", "get_step_text", "get_tau"]
