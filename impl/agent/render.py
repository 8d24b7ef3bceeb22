"""How the runtime renders its prompt blocks: ChatML, which SmolLM2 uses.

Every block the runtime prefills is rendered here: observations (user, tool,
plan steps), the memory store, the scaffold's instructions (summary request,
note request) and the assistant header of a model turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from unsee.impl.agent.episode import Step

START, END = "<|im_start|>", "<|im_end|>"
SUMMARY_REQUEST = "List the facts from this conversation."
#: The summary turn opens its list: small models then extract facts from the
#: context instead of writing a generic reply (measured on SmolLM2-135M, which
#: answers a plain "summarize" request with boilerplate).
SUMMARY_OPENING = "1."
NOTE_REQUEST = "Write one short note about the user worth remembering for future sessions."


def render(role: str, text: str) -> str:
    """One ChatML message."""
    return f"{START}{role}\n{text}{END}\n"


def render_header(suffix: str = "") -> str:
    """The assistant header a model turn is decoded after (``suffix`` opens the turn)."""
    return f"{START}assistant\n{suffix}"


def render_observation(step: Step) -> str:
    """The prompt block of an observation (or of a scaffold instruction)."""
    if step.kind in ("user", "plan"):
        return render("user", "\n".join(i.text for i in step.items))
    if step.kind == "tool":
        body = "\n".join(i.text for i in step.items)
        return render("user", f"[result of tool {step.tool}]\n{body}")
    if step.kind == "memory":
        return render_memory([i.text for i in step.items])
    if step.kind == "compact":
        return render("user", SUMMARY_REQUEST)
    if step.kind == "remember":
        return render("user", NOTE_REQUEST)
    raise ValueError(f"step {step.id!r}: kind {step.kind!r} has no observation block")


def render_memory(records: Sequence[str]) -> str:
    """The memory store as one system block."""
    return render("system", "Memory notes:\n" + "\n".join(f"- {r}" for r in records))


__all__ = ["END", "NOTE_REQUEST", "START", "SUMMARY_OPENING", "SUMMARY_REQUEST", "render", "render_header",
           "render_memory", "render_observation"]
