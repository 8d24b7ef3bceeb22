"""Hypothesis strategies over the runtime's episode format (:mod:`unsee.impl.agent.episode`).

Strategies are nouns. ``texts()`` and ``secrets()`` make item contents,
``step_jsons()`` makes one step as the JSON object the episode format holds,
``episode_jsons()`` makes a whole episode file (system prompt, settings,
steps, target) and ``episodes()`` parses it with
:func:`~unsee.impl.agent.episode.parse_episode`, so every generated episode also
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
This is the one episode generator of the properties: ``secrets=`` picks what
targets are made of (the store's residue property passes
:func:`rare_secrets`, values no other text can hold) and ``framed=`` embeds
the value in a longer observation.

``indep_episode_jsons()`` builds on it the paper's indep axis: after the
target, ``4k`` model turns of which a set fraction ``indep`` (one of
:data:`INDEP_LEVELS`) is labelled ``independent`` (format version 2) by
construction: unrelated sub-tasks, routine tool polls, a document loaded and
never used; the other turns ask about the target, write a note or compact.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from unsee.impl.agent.episode import (
    CHECKPOINT_POLICIES,
    FORMAT,
    MODEL_TURN_KINDS,
    OBSERVED_KINDS,
    STEP_KINDS,
    VERSION,
    Episode,
    Step,
    parse_episode,
)

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


_default_secrets = secrets  # the generators' parameter `secrets` shadows this strategy's name


#: Invented words of 6+ letters (one non-ASCII) that no :func:`texts` draw holds.
RARE_WORDS = ("Quillmere", "Vantrobe", "Zephyrine", "Marlowick", "Ødegårdsvei", "Brindlecombe")
RARE_FORMS = ("{n} {w}", "{w} {n}", "{n}, {w} Road", "PIN {n}", "{w}")


def rare_secrets() -> st.SearchStrategy[str]:
    """Targets no other generated text can hold: a 6-digit number and/or an
    invented word (:data:`RARE_WORDS`), so that every normalised variant
    (``impl/text.get_variants``: the whole value, runs of 3+ digits, words of
    6+ letters) is the target's alone; :func:`texts` has neither (its longest
    digit run is 4, its longest word 4 letters). A residue scan then knows that
    any hit is residue."""
    return st.builds(lambda form, n, w: form.format(n=n, w=w), st.sampled_from(RARE_FORMS),
                     st.integers(100000, 999999), st.sampled_from(RARE_WORDS))


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
                  policies: tuple[str, ...] = CHECKPOINT_POLICIES, secrets: st.SearchStrategy[str] | None = None,
                  framed: bool = False) -> dict[str, Any]:
    """A whole episode file as a JSON object: ``T`` in ``min_steps..max_steps``
    steps of any kind, the target entering at ``tau`` in ``1..T``.

    ``secrets`` draws the target's value (default :func:`secrets`); with
    ``framed`` the target item's text is a drawn text followed by the value
    (``'Bob paid 4417 Elm'``), as in a real observation, and ``target.value``
    is the value alone.
    """
    length = draw(st.integers(min_steps, max_steps))
    tau = draw(st.integers(1, length))
    secret = draw(_default_secrets() if secrets is None else secrets)
    text = f"{draw(texts())} {secret}" if framed else secret
    steps = []
    for t in range(1, length + 1):
        if t == tau:
            steps.append(draw(step_jsons(f"t{t}", kind=draw(st.sampled_from(TARGET_KINDS)), target=text)))
        else:
            steps.append(draw(step_jsons(f"t{t}")))
    return {"format": FORMAT, "version": VERSION, "system": draw(st.sampled_from(SYSTEMS)),
            "settings": draw(runtime_settings(max_new_tokens, policies)), "steps": steps,
            "target": {"source": TARGET, "value": secret}}


def episodes(min_steps: int = 2, max_steps: int = 8, max_new_tokens: tuple[int, int] = (2, 6),
             policies: tuple[str, ...] = CHECKPOINT_POLICIES, secrets: st.SearchStrategy[str] | None = None,
             framed: bool = False) -> st.SearchStrategy[Episode]:
    """Parsed episodes (see :func:`episode_jsons`); ``episode.target.source`` is :data:`TARGET`."""
    return episode_jsons(min_steps, max_steps, max_new_tokens, policies, secrets, framed).map(parse_episode)


# --- the indep axis -----------------------------------------------------------------

#: The fractions of post-target model turns labelled independent (the paper's indep axis).
INDEP_LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Independent work, by construction: it never names the target, and nothing later refers to it.
SUBTASKS = ("Convert 3 cups to grams.", "Name a blue flower.", "Count to five.", "Spell tea backwards.")
POLL_RESULTS = ("no new mail", "all jobs done", "queue empty", "status ok")
DOCUMENTS = ("Recipe: boil water, add tea, wait.", "Manual: press the red button twice.")
#: Dependent work: a question only the target answers (a note or a compaction reads it too).
QUESTIONS = ("Where was that again?", "Repeat the address.", "Send the address to Bob.")
#: How a labelled turn is made; how an unlabelled one is, in shrinking order.
INDEPENDENT_WORK = ("subtask", "poll", "document", "unrelated-plan")
DEPENDENT_WORK = ("question", "remember", "compact", "plan-with-target")


@st.composite
def independent_step_jsons(draw, step_id: str) -> dict[str, Any]:
    """A step whose model turn is independent of the target by construction,
    labelled ``independent``: an unrelated sub-task, a routine tool poll, a
    document loaded (and never used later), or an unrelated tool plan."""
    work = draw(st.sampled_from(INDEPENDENT_WORK))
    if work == "subtask":
        raw = {"id": step_id, "kind": "user", "text": draw(st.sampled_from(SUBTASKS))}
    elif work == "poll":
        raw = {"id": step_id, "kind": "tool", "tool": "poll",
               "fields": [{"source": f"{step_id}.0", "text": draw(st.sampled_from(POLL_RESULTS))}]}
    elif work == "document":
        raw = {"id": step_id, "kind": "tool", "tool": "fetch_document",
               "fields": [{"source": f"{step_id}.0", "text": draw(st.sampled_from(DOCUMENTS))}]}
    else:
        raw = {"id": step_id, "kind": "plan", "tool": draw(st.sampled_from(PLAN_TOOLS)),
               "text": draw(st.sampled_from(SUBTASKS))}
    raw["independent"] = True
    return raw


@st.composite
def dependent_step_jsons(draw, step_id: str) -> dict[str, Any]:
    """A step whose model turn depends on the target (unlabelled): a question
    about it, a memory note or a compaction (both read the whole context), or
    a plan that sends it on."""
    work = draw(st.sampled_from(DEPENDENT_WORK))
    if work == "question":
        return {"id": step_id, "kind": "user", "text": draw(st.sampled_from(QUESTIONS))}
    if work in ("remember", "compact"):
        return {"id": step_id, "kind": work}
    return {"id": step_id, "kind": "plan", "tool": "send_message", "text": draw(st.sampled_from(QUESTIONS))}


@st.composite
def indep_episode_jsons(draw, indep: float | None = None, groups: tuple[int, int] = (1, 2), max_before: int = 3,
                        max_new_tokens: tuple[int, int] = (2, 6), policies: tuple[str, ...] = CHECKPOINT_POLICIES,
                        secrets: st.SearchStrategy[str] | None = None) -> dict[str, Any]:
    """An episode (format version 2) for the paper's indep axis.

    Built on :func:`episode_jsons`: its steps up to and including the one
    where the target enters (at most ``max_before`` before it), then ``4k``
    steps with a model turn, ``k`` in ``groups``, of which exactly
    ``indep * 4k`` are labelled ``independent`` (:func:`independent_step_jsons`),
    at drawn positions; the others depend on the target
    (:func:`dependent_step_jsons`). ``indep`` is one of :data:`INDEP_LEVELS`,
    drawn when None. Multiples of four make every level exact.
    """
    if indep is not None and indep not in INDEP_LEVELS:
        raise ValueError(f"indep={indep!r} must be one of {INDEP_LEVELS}")
    indep = draw(st.sampled_from(INDEP_LEVELS)) if indep is None else indep
    raw = draw(episode_jsons(1, max_before + 1, max_new_tokens, policies, secrets))
    tau = next(t for t, step in enumerate(raw["steps"], start=1) if TARGET in _sources(step))
    after = 4 * draw(st.integers(*groups))
    labelled = round(indep * after)
    labels = draw(st.permutations([True] * labelled + [False] * (after - labelled)))
    steps = raw["steps"][:tau]
    for t, label in enumerate(labels, start=tau + 1):
        steps.append(draw(independent_step_jsons(f"t{t}") if label else dependent_step_jsons(f"t{t}")))
    return {**raw, "steps": steps}


def indep_episodes(indep: float | None = None, groups: tuple[int, int] = (1, 2), max_before: int = 3,
                   max_new_tokens: tuple[int, int] = (2, 6), policies: tuple[str, ...] = CHECKPOINT_POLICIES,
                   secrets: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Episode]:
    """Parsed :func:`indep_episode_jsons`."""
    return indep_episode_jsons(indep, groups, max_before, max_new_tokens, policies, secrets).map(parse_episode)


def get_indep(episode: Episode) -> float:
    """The fraction of model turns after the target's step that are labelled
    ``independent`` (0.0 when there are none)."""
    after = [s for s in episode.steps[get_tau(episode):] if s.kind in MODEL_TURN_KINDS]
    return sum(s.independent for s in after) / len(after) if after else 0.0


def _sources(raw_step: dict[str, Any]) -> set[str]:
    """The source ids of a step object (before parsing)."""
    if raw_step["kind"] in ("user", "plan") or "text" in raw_step:
        return {raw_step.get("source", raw_step["id"])}
    return {item["source"] for item in raw_step.get("records", raw_step.get("fields", []))}


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
