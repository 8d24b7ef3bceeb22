"""Hypothesis strategies over the runtime's episode format (:mod:`unsee.impl.episode`).

Strategies are nouns. ``texts()`` and ``secrets()`` make item contents,
``step_jsons()`` makes one step as the JSON object the episode format holds,
``episode_jsons()`` makes a whole episode file (system prompt, settings,
steps, target) and ``episodes()`` parses it with
:func:`~unsee.impl.episode.parse_episode`, so every generated episode also
exercises the format's validation. ``runtime_settings()`` draws the settings
alone (the state machine of ``prop_impl.py`` uses it).

Everything is small and built from ``sampled_from``/short lists so that a
failing episode shrinks to a couple of ``user`` steps: kinds shrink towards
``user``, texts towards one word, settings towards greedy decoding, two new
tokens and the ``every_turn`` policy, and the target's position ``tau``
towards 1.

Every episode has one target: the source id :data:`TARGET` (a "secret" such as
``4417 Elm``) placed in a ``user``/``memory``/``tool``/``plan`` step at a drawn
position ``tau`` in ``1..T``. Every other item has a source id of its own.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from unsee.impl.episode import (CHECKPOINT_POLICIES, FORMAT, OBSERVED_KINDS, STEP_KINDS, VERSION, Episode, Step,
                                parse_episode)

#: The source id of the forget target in every generated episode.
TARGET = "secret"

#: Words and numbers item texts are made of (digits so that a secret exists).
WORDS = ("tea", "Bob", "paid", "Elm", "at", "room", "blue", "Oak", "call", "Ana")
NUMBERS = ("7", "12", "305", "4417", "90")
STREETS = ("Elm", "Oak", "Pine")
SYSTEMS = ("You are a helpful agent.", "Be brief.")
TOOLS = ("fetch", "search")
PLAN_TOOLS = ("send_message", "pay")

#: Step kinds in shrinking order (the first is the simplest); every kind of the format.
KINDS = STEP_KINDS
#: Kinds a target can enter through, in shrinking order.
TARGET_KINDS = OBSERVED_KINDS


# --- example budgets ----------------------------------------------------------

def scaled(divisor: int, floor: int = 1) -> settings:
    """Settings with ``1/divisor`` of the active profile's ``max_examples``.

    The model-backed properties are expensive; scaling (instead of a fixed
    count) keeps ``ci`` fast while ``nightly`` still searches more.
    """
    return settings(max_examples=max(floor, settings().max_examples // divisor))


# --- contents -----------------------------------------------------------------

def texts() -> st.SearchStrategy[str]:
    """A short text of one to three words or numbers (shrinks to ``'tea'``)."""
    return st.lists(st.sampled_from(WORDS + NUMBERS), min_size=1, max_size=3).map(" ".join)


def secrets() -> st.SearchStrategy[str]:
    """What the target holds: a house number and a street, e.g. ``'4417 Elm'``."""
    return st.builds(lambda n, s: f"{n} {s}", st.sampled_from(("4417",) + NUMBERS), st.sampled_from(STREETS))


def step_kinds() -> st.SearchStrategy[str]:
    return st.sampled_from(KINDS)


def runtime_settings(max_new_tokens: tuple[int, int] = (2, 6),
                     policies: tuple[str, ...] = CHECKPOINT_POLICIES) -> st.SearchStrategy[dict[str, Any]]:
    """The ``settings`` object of an episode: few new tokens, greedy or seeded
    sampling (assumption A1 under sampling), any checkpoint policy."""
    low, high = max_new_tokens
    return st.fixed_dictionaries({
        "max_new_tokens": st.integers(low, high),
        "temperature": st.sampled_from((0.0, 0.7)),
        "seed": st.integers(0, 2**16),
        "checkpoint_policy": st.sampled_from(policies),
    })


# --- steps ----------------------------------------------------------------------

@st.composite
def step_jsons(draw, step_id: str, kind: str | None = None, target: str | None = None) -> dict[str, Any]:
    """One step object of the episode format.

    Sources: a ``user``/``plan`` step's one item takes the step id as its
    source (the format's default), a ``memory``/``tool`` step's items are
    ``<step id>.<j>``. With ``target`` (its text) the step also carries the
    item of source :data:`TARGET`, at a drawn position among its items.
    """
    kind = draw(step_kinds()) if kind is None else kind
    raw: dict[str, Any] = {"id": step_id, "kind": kind}
    if kind in ("user", "plan"):
        if target is not None:
            raw["source"], raw["text"] = TARGET, target
        else:
            raw["text"] = draw(texts())
        if kind == "plan":
            tool = draw(st.none() | st.sampled_from(PLAN_TOOLS))
            if tool is not None:
                raw["tool"] = tool
        return raw
    if kind in ("memory", "tool"):
        others = draw(st.lists(texts(), min_size=0 if target is not None else 1, max_size=2))
        items = [{"source": f"{step_id}.{j}", "text": text} for j, text in enumerate(others)]
        if target is not None:
            items.insert(draw(st.integers(0, len(items))), {"source": TARGET, "text": target})
        if kind == "memory":
            raw["records"] = items
            return raw
        tool = draw(st.none() | st.sampled_from(TOOLS))
        if tool is not None:
            raw["tool"] = tool
        if len(items) == 1 and draw(st.booleans()):
            # the one-field shorthand: {"text": ..., "source": ...}
            raw["text"] = items[0]["text"]
            if items[0]["source"] != step_id:
                raw["source"] = items[0]["source"]
        else:
            raw["fields"] = items
        return raw
    return raw  # remember / compact / session carry no external content


@st.composite
def episode_jsons(draw, min_steps: int = 2, max_steps: int = 8, max_new_tokens: tuple[int, int] = (2, 6),
                  policies: tuple[str, ...] = CHECKPOINT_POLICIES) -> dict[str, Any]:
    """A whole episode file as a JSON object: ``T`` in ``min_steps..max_steps``
    steps of any kind, the target entering at ``tau`` in ``1..T``."""
    length = draw(st.integers(min_steps, max_steps))
    tau = draw(st.integers(1, length))
    secret = draw(secrets())
    steps = []
    for t in range(1, length + 1):
        if t == tau:
            steps.append(draw(step_jsons(f"t{t}", kind=draw(st.sampled_from(TARGET_KINDS)), target=secret)))
        else:
            steps.append(draw(step_jsons(f"t{t}")))
    return {"format": FORMAT, "version": VERSION, "system": draw(st.sampled_from(SYSTEMS)),
            "settings": draw(runtime_settings(max_new_tokens, policies)), "steps": steps,
            "target": {"source": TARGET, "value": secret}}


def episodes(min_steps: int = 2, max_steps: int = 8, max_new_tokens: tuple[int, int] = (2, 6),
             policies: tuple[str, ...] = CHECKPOINT_POLICIES) -> st.SearchStrategy[Episode]:
    """Parsed episodes (see :func:`episode_jsons`); ``episode.target.source`` is :data:`TARGET`."""
    return episode_jsons(min_steps, max_steps, max_new_tokens, policies).map(parse_episode)


def parse_step(raw: dict[str, Any], system: str = SYSTEMS[0]) -> Step:
    """One step object through the episode parser (a one-step episode around it)."""
    return parse_episode({"format": FORMAT, "version": VERSION, "system": system, "steps": [raw]}).steps[0]


def steps(step_id: str, kind: str | None = None) -> st.SearchStrategy[Step]:
    """Parsed steps (see :func:`step_jsons`), without the target."""
    return step_jsons(step_id, kind).map(parse_step)


def get_tau(episode: Episode, source: str | None = None) -> int:
    """The 1-based step at which ``source`` (default: the episode's target) enters."""
    source = episode.target.source if source is None else source
    for t, step in enumerate(episode.steps, start=1):
        if any(item.source == source for item in step.items):
            return t
    raise ValueError(f"source {source!r} is in no step of the episode")


def get_coverage_labels(episode: Episode) -> list[str]:
    """Labels for ``hypothesis.event`` so that ``--hypothesis-show-statistics``
    shows what the examples covered (policy, decoding, where the target sits,
    whether a compaction or a session follows it)."""
    tau = get_tau(episode)
    kinds = [step.kind for step in episode.steps]
    labels = [f"policy={episode.settings.checkpoint_policy}",
              "sampled" if episode.settings.temperature > 0 else "greedy",
              f"target in {kinds[tau - 1]}",
              "tau=1" if tau == 1 else ("tau=T" if tau == len(kinds) else "1<tau<T")]
    labels += [f"{kind} after tau" for kind in ("compact", "session", "remember", "plan") if kind in kinds[tau:]]
    labels += [f"{kind} before tau" for kind in ("compact", "session") if kind in kinds[:tau - 1]]
    return labels
