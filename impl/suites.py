"""Evaluation suites (issue 10): what an evaluation knows about an episode
beyond the episode itself.

An :class:`EvalCase` is an ordinary episode (its ``target`` names the item a
forget removes, with its value) plus the labels the paper's metrics need:
the non-target facts whose preservation measures utility, the sink class of
every consequential tool argument (B8's policy and the action-leak metric),
the attacker's markers (AgentDojo), and the two options of a behavioural
case. The generators of the four suites build these; the evaluation runner
reads only this type, so a suite can be added without touching the runner.
"""

from __future__ import annotations

import attrs

from .episode import Episode

SUITES = ("memory", "tool", "agentdojo", "behavioral")
#: Sink classes of a consequential tool argument (paper, Section 4.1):
#: identifiers that route an action, pick among options, or free text.
SINK_CLASSES = ("routing", "selection", "free_text")


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
