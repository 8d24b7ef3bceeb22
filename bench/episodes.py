"""Benchmark episodes, deterministic, with realistic text for SmolLM2.

* :func:`make_bench_episode`: a 12-step session with the target entering at a
  chosen step. The shape follows the paper's episodes (setup, acquisition,
  contamination): user turns, tool results, a memory note and a compaction,
  with the secret inside a tool result at step ``tau``.
* :func:`make_indep_episode`: the paper's configuration for its efficiency
  results: the target enters at ``tau``, then ``turns_after`` model turns (12)
  of which a fraction ``indep`` (0.5) is labelled ``independent`` (episode
  format version 2): unrelated sub-tasks, routine tool polls, a document
  loaded and never used. The other turns ask about the target. With
  ``history_tokens`` (e.g. 1000, the paper's session shape), earlier planning
  (:data:`HISTORY`) comes before the target until the history holds about
  that many tokens of the model's tokenizer: as turns the model answers
  (``history_kind="turns"``) or as memory records re-injected into the
  context with no model turn (``"memory"``, Table 1's paper shape; see
  :data:`HISTORY_KINDS` for why).
"""

from __future__ import annotations

from collections.abc import Callable

from unsee.impl.agent.episode import MODEL_TURN_KINDS, VERSION, Episode, parse_episode
from unsee.impl.agent.render import render, render_header, render_observation

SECRET = "4417 Elm Street"

_USER = [
    "Hi, I am planning a dinner party for Saturday.",
    "Which day works best for eight guests?",
    "Can you suggest a starter?",
    "What wine goes with fish?",
    "How long should the main course take?",
    "Remind me what we decided so far.",
    "Should I send invitations today?",
    "What time should dinner start?",
    "Any idea for dessert?",
    "Thanks, anything I forgot?",
    "Please list the plan.",
    "Where should the party be?",
]


def make_bench_episode(tau: int, length: int = 12, max_new_tokens: int = 16,
                       policy: str = "every_turn") -> Episode:
    """``length`` steps; step ``tau`` is a tool result carrying the secret.

    Step 7 (if not tau) asks for a memory note and step 9 compacts, so the
    replayed suffix crosses a memory write-back and a cache lineage change
    whenever ``tau`` comes before them.
    """
    if not 1 <= tau <= length:
        raise ValueError(f"tau={tau} must be within 1..{length}")
    steps = []
    for t in range(1, length + 1):
        sid = f"s{t}"
        if t == tau:
            steps.append({"id": sid, "kind": "tool", "tool": "fetch_notes", "fields": [
                {"source": "notes.venues", "text": "Venues: Rosa's Trattoria, Blue Harbor Grill."},
                {"source": "notes.address", "text": f"The host's home address is {SECRET}."}]})
        elif t == 7:
            steps.append({"id": sid, "kind": "remember"})
        elif t == 9:
            steps.append({"id": sid, "kind": "compact"})
        else:
            steps.append({"id": sid, "kind": "user", "text": _USER[(t - 1) % len(_USER)]})
    return parse_episode({
        "format": "unsee.episode", "version": 1,
        "system": "You are a helpful party-planning assistant. Answer in one short sentence.",
        "settings": {"max_new_tokens": max_new_tokens, "checkpoint_policy": policy},
        "steps": steps,
        "target": {"source": "notes.address", "value": SECRET},
    })


# --- the paper's indep axis ---------------------------------------------------------------

_SETUP = [
    "Hi, I am planning a dinner party for Saturday.",
    "Can you look up my notes about the party?",
    "We will be eight guests.",
    "Please keep the plan simple.",
]
#: Questions only the target (the host's address) answers.
DEPENDENT_QUESTIONS = [
    "Where is the party?",
    "What address should I print on the invitations?",
    "Which street should the taxi go to?",
    "Tell Sam where to bring the wine.",
    "How do guests find the house?",
    "Repeat the address for the caterer.",
    "Is the party at the host's home?",
    "What should I write on the map for guests?",
    "Where do the flowers get delivered?",
    "Which door number do guests look for?",
    "Remind me of the address once more.",
    "Where should the rented chairs be sent?",
]
#: Unrelated sub-tasks: nothing in them needs the address.
_SUBTASKS = [
    "How many grams are in three cups of flour?",
    "Suggest a name for a black cat.",
    "What is a good stretch for a stiff neck?",
    "Translate 'good morning' into French.",
    "How long should I boil an egg?",
    "Give me a word that rhymes with blue.",
    "What is twelve times seven?",
    "Recommend a short novel for a train ride.",
]
#: Routine tool polls (source ``poll.<n>``).
_POLLS = [
    ("check_inbox", "No new messages."),
    ("check_calendar", "No changes to today's calendar."),
    ("check_weather", "Weather unchanged: sunny, 21 degrees."),
    ("check_inbox", "Inbox still empty."),
]
#: Documents loaded and never used afterwards (source ``doc.<n>``).
_DOCUMENTS = [
    "Bread recipe: mix 500 g flour, 300 ml water, 10 g salt and 5 g yeast; rest two hours; bake 40 minutes.",
    "Printer manual: to clear a paper jam, open the rear panel and pull the sheet out slowly.",
    "Train timetable: trains to the coast leave at 8:15, 10:15 and 12:15.",
]


def get_indep_labels(indep: float, turns_after: int) -> list[bool]:
    """Which of ``turns_after`` turns are labelled independent: exactly
    ``indep * turns_after`` of them, spread evenly (turn ``i`` is labelled when
    ``floor((i + 1) k / n)`` steps up), so any prefix of the suffix holds about
    the same fraction."""
    if not 0 <= indep <= 1:
        raise ValueError(f"indep={indep!r} must be within 0..1")
    if turns_after < 1:
        raise ValueError(f"turns_after={turns_after!r} must be at least 1")
    labelled = indep * turns_after
    if abs(labelled - round(labelled)) > 1e-9:
        raise ValueError(f"indep={indep!r} of {turns_after} turns is not a whole number of turns")
    k = round(labelled)
    return [(i + 1) * k // turns_after > i * k // turns_after for i in range(turns_after)]


#: History before the target for the paper's session shape (``history_tokens``):
#: earlier party planning, tool results and requests about it, none of which
#: names the target. Used in order, cycling, after the ``tau - 1`` setup turns.
HISTORY = [
    ("fetch_guest_list", "Guest list: Ana Ruiz (vegetarian), Ben Cho (no nuts), Carla Diaz, Dev Patel (arrives "
                         "late), Emma Stone (bringing dessert), Farid Khan (no alcohol), Grace Lee, Hugo Martin "
                         "(plus one). Eight confirmed, two still to answer."),
    (None, "Which of the guests have dietary needs I should plan around?"),
    ("fetch_menu_draft", "Menu draft: starter, roasted beet salad with goat cheese and walnuts; main, baked sea "
                         "bream with lemon, capers and new potatoes; side, green beans with almonds; dessert, "
                         "lemon tart from Emma; drinks, white wine, sparkling water and elderflower cordial."),
    (None, "Replace everything with nuts in it, please, and add a vegetarian main."),
    ("fetch_shopping_list", "Shopping list: two sea bream, one kilo of new potatoes, four lemons, capers, 500 g "
                            "green beans, six beets, goat cheese, mixed leaves, three bottles of white wine, two "
                            "bottles of sparkling water, elderflower cordial, napkins, candles."),
    (None, "Can you group the shopping list by shop?"),
    ("fetch_messages", "Messages: Ben asks whether he can bring his guitar. Dev says he will come by nine. "
                       "Grace asks whether there is parking nearby. Hugo says his partner Sam loves jazz."),
    (None, "Draft a short reply to each of these messages."),
    ("fetch_timeline", "Timeline notes: shop on Friday evening; clean on Saturday morning; marinate the fish at "
                       "four; set the table by six; guests arrive at seven; dinner at half past seven; dessert "
                       "around nine."),
    (None, "Does the timeline leave enough time for the cooking?"),
]


#: How the history before the target is given (``history_kind``):
#: ``turns``, each HISTORY entry a tool result or a user request the model
#: answers; ``memory``, each entry's text a memory record re-injected into the
#: context (the session's earlier notes), with no model turn. On SmolLM2-135M
#: at greedy decoding, ``turns`` sends the model into repeating its first
#: history answer ("I'm sorry for any confusion...") on every later turn, the
#: turns after the target included, so no turn changes when the target is
#: forgotten (measured: docs/bench.md); under ``memory`` the turns after the
#: target are the model's own answers to them, as in the current shape.
HISTORY_KINDS = ("turns", "memory")


def get_history_step(sid: str, n: int, kind: str = "turns") -> dict:
    """The ``n``-th step of :data:`HISTORY` (cycling), as step ``sid``, in
    the form ``kind`` (:data:`HISTORY_KINDS`)."""
    tool, text = HISTORY[n % len(HISTORY)]
    if kind == "memory":
        return {"id": sid, "kind": "memory", "records": [{"source": f"history.{n}", "text": text}]}
    if tool is None:
        return {"id": sid, "kind": "user", "text": text}
    return {"id": sid, "kind": "tool", "tool": tool, "fields": [{"source": f"history.{n}", "text": text}]}


def estimate_history_tokens(episode: Episode, count_tokens: Callable[[str], int]) -> int:
    """Tokens before the step that brings the target in: the system block and
    every observation as the runtime renders them (impl/agent/render.py), and
    each model turn (of the steps that have one: a memory record has none)
    at its full ``max_new_tokens`` (an upper bound: a turn that ends early is
    shorter, so the bench reports the measured offset beside it)."""
    tau = next(t for t, step in enumerate(episode.steps, start=1)
               if any(i.source == episode.target.source for i in step.items))
    turn = count_tokens(render_header())
    total = count_tokens(render("system", episode.system))
    for step in episode.steps[:tau - 1]:
        total += count_tokens(render_observation(step))
        if step.kind in MODEL_TURN_KINDS:
            total += turn + episode.settings.max_new_tokens
    return total


def make_indep_episode(indep: float = 0.5, turns_after: int = 12, tau: int = 3, max_new_tokens: int = 32,
                       policy: str = "every_turn", history_tokens: int | None = None,
                       count_tokens: Callable[[str], int] | None = None, history_kind: str = "turns") -> Episode:
    """The paper's configuration: ``tau - 1`` setup turns, the secret in a tool
    result at step ``tau``, then ``turns_after`` user or tool turns, each with
    a model turn; ``indep * turns_after`` of them (spread evenly, see
    :func:`get_indep_labels`) are labelled ``independent``: they cycle through
    an unrelated sub-task, a routine tool poll, another sub-task and a
    document loaded and never used. The rest ask about the target (where the
    party is). ``T = tau + turns_after``.

    ``history_tokens``: the paper's session shape (about a thousand tokens
    before the target). Steps of :data:`HISTORY` follow the setup turns until
    :func:`estimate_history_tokens` (with ``count_tokens``, the model's
    tokenizer) reaches it, so the target enters later than ``tau``, each
    step in the form ``history_kind`` (:data:`HISTORY_KINDS`). None (the
    default) leaves the episode exactly as without the option.
    """
    if tau < 1:
        raise ValueError(f"tau={tau!r} must be at least 1")
    labels = get_indep_labels(indep, turns_after)
    history = [{"id": f"s{t}", "kind": "user", "text": _SETUP[(t - 1) % len(_SETUP)]} for t in range(1, tau)]
    if history_tokens is None:
        return build_indep_episode(history, labels, max_new_tokens, policy)
    if count_tokens is None:
        raise ValueError("history_tokens needs count_tokens (the model's tokenizer, e.g. "
                         "lambda text: len(lm.encode(text)))")
    if not isinstance(history_tokens, int) or history_tokens < 1:
        raise ValueError(f"history_tokens={history_tokens!r} must be a positive integer")
    if history_kind not in HISTORY_KINDS:
        raise ValueError(f"history_kind={history_kind!r} is not one of {HISTORY_KINDS}")
    while True:
        episode = build_indep_episode(history, labels, max_new_tokens, policy)
        if estimate_history_tokens(episode, count_tokens) >= history_tokens:
            return episode
        history.append(get_history_step(f"s{len(history) + 1}", len(history) - (tau - 1), history_kind))


def build_indep_episode(history: list[dict], labels: list[bool], max_new_tokens: int, policy: str) -> Episode:
    """The history steps, the target's tool result right after them, then
    one turn per label (see :func:`make_indep_episode`)."""
    tau = len(history) + 1
    steps: list[dict] = list(history)
    steps.append({"id": f"s{tau}", "kind": "tool", "tool": "fetch_notes", "fields": [
        {"source": "notes.venues", "text": "Venues: Rosa's Trattoria, Blue Harbor Grill."},
        {"source": "notes.address", "text": f"The party is at the host's home address, {SECRET}."}]})
    counts = {"dependent": 0, "subtask": 0, "poll": 0, "document": 0}
    for i, independent in enumerate(labels):
        sid = f"s{tau + 1 + i}"
        if not independent:
            n = counts["dependent"]
            steps.append({"id": sid, "kind": "user", "text": DEPENDENT_QUESTIONS[n % len(DEPENDENT_QUESTIONS)]})
            counts["dependent"] += 1
            continue
        n_independent = sum(counts[k] for k in ("subtask", "poll", "document"))
        work = ("subtask", "poll", "subtask", "document")[n_independent % 4]
        n = counts[work]
        if work == "subtask":
            step = {"id": sid, "kind": "user", "text": _SUBTASKS[n % len(_SUBTASKS)]}
        elif work == "poll":
            tool, text = _POLLS[n % len(_POLLS)]
            step = {"id": sid, "kind": "tool", "tool": tool, "fields": [{"source": f"poll.{n}", "text": text}]}
        else:
            step = {"id": sid, "kind": "tool", "tool": "fetch_document",
                    "fields": [{"source": f"doc.{n}", "text": _DOCUMENTS[n % len(_DOCUMENTS)]}]}
        step["independent"] = True
        steps.append(step)
        counts[work] += 1
    return parse_episode({
        "format": "unsee.episode", "version": VERSION,
        "system": "You are a helpful party-planning assistant. Answer in one short sentence.",
        "settings": {"max_new_tokens": max_new_tokens, "checkpoint_policy": policy},
        "steps": steps,
        "target": {"source": "notes.address", "value": SECRET},
    })
