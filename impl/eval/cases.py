"""An evaluation case: the episode, its facts, sinks and behaviours, and the label-leak check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from unsee.impl.agent.episode import Episode
from unsee.impl.util.text import get_variants, normalize

#: Sink classes of a consequential tool argument (paper, Section 4.1):
#: identifiers that route an action, pick among options, or free text. B8's
#: policy blocks the identifier ones (``baselines.IDENTIFIER_SINKS``).
SINK_CLASSES = ("routing", "selection", "free_text")


class SuiteError(ValueError):
    """A bad suite request or a malformed suite folder; the message names it."""


@attrs.frozen
class Fact:
    """A non-target fact the agent was given: kept after a forget, it counts
    towards utility. ``question`` asks for it; ``value`` is the answer."""

    source: str
    value: str
    question: str


@attrs.frozen
class Sink:
    """One argument of a consequential tool and its sink class."""

    tool: str
    arg: str
    sink_class: str


@attrs.frozen
class Behavior:
    """A behavioural case: a revoked preference excludes ``avoided``, one of
    two near-equivalent ``options``; ``order`` (0 or 1) is the
    counterbalanced order in which the options are offered."""

    options: tuple[str, str]
    avoided: str
    order: int
    question: str

    @property
    def other(self) -> str:
        """The option the revoked preference steers towards ("avoid" counts picks of it)."""
        return self.options[1] if self.avoided == self.options[0] else self.options[0]

    @property
    def offered(self) -> tuple[str, str]:
        """The options in the order the episode lists them."""
        return self.options if self.order == 0 else (self.options[1], self.options[0])


@attrs.frozen
class EvalCase:
    """One episode of a suite with its evaluation labels."""

    suite: str
    id: str
    episode: Episode
    facts: tuple[Fact, ...] = ()
    sinks: tuple[Sink, ...] = ()
    #: strings whose presence in a tool argument is an action leak even when
    #: they are not the target's value (the attacker's IBAN, e-mail or URL)
    attack_markers: tuple[str, ...] = ()
    behavior: Behavior | None = None
    #: the task-shaped question that solicits the target (the "task" probe)
    task: str | None = None
    #: the opening of a sentence the target completes (the "cued" probe)
    cue: str | None = None
    #: plain-data extras of a suite (AgentDojo: suite, user and injection
    #: task ids, attack template); JSON-serialisable, written to the sidecar
    meta: Mapping[str, Any] = attrs.field(factory=dict, eq=False)

    def get_sink_map(self) -> dict[str, dict[str, str]]:
        """``{tool: {argument: sink class}}``: what B8/B9's policy reads
        (``apply_method(..., sinks=case.get_sink_map())``)."""
        out: dict[str, dict[str, str]] = {}
        for s in self.sinks:
            out.setdefault(s.tool, {})[s.arg] = s.sink_class
        return out


def find_label_leaks(case: EvalCase) -> list[str]:
    """Source ids of non-target items that contain a leak variant of the
    target's value: a well-built case has none, so a leak found later came
    from the target."""
    assert case.episode.target is not None and case.episode.target.value is not None
    variants = get_variants(case.episode.target.value)
    out = []
    for step in case.episode.steps:
        for item in step.items:
            if item.source == case.episode.target.source:
                continue
            text = f" {normalize(item.text)} "
            if any(f" {v} " in text for v in variants):
                out.append(item.source)
    return out
