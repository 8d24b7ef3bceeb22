"""The suite's own blind spots, pinned (issue 53, item 6). Each test states
what must hold and, beside it, runs a mutated copy of the code that breaks it
and asserts the same check catches the mutant: a pin that cannot fail is no pin.

- the residue matcher's boundary rules at every edge (impl/util/residue.py);
- ``--max-failures`` above 1: a later passing round never drops a failure found;
- a forget report's invocation count is the transitions actually replayed,
  when a client-tool replay halts at a call too (through ``unsee serve``);
- on transformers, every decision after a context-guess forward is held to
  the guard (impl/engines/turn.py, the procedure its ``generate`` runs).
"""

from __future__ import annotations

import inspect
import textwrap
from importlib.util import find_spec as importlib_find
from pathlib import Path

import pytest
import torch

from unsee.impl.conform import ci
from unsee.impl.conform.harness import EntryPointImplementation, Failure, Outcome
from unsee.impl.engines import turn as turn_module
from unsee.impl.engines.counts import Counters
from unsee.impl.util import residue
from unsee.impl.util.residue import find_hits, get_needles


def mutate(function, old: str, new: str, *more: str):
    """A copy of ``function`` with ``old`` (which must occur) replaced by ``new``
    (and each further pair of ``more``), compiled in a copy of its module's globals."""
    source = textwrap.dedent(inspect.getsource(function))
    pairs = [(old, new), *zip(more[::2], more[1::2], strict=True)]
    for before, after in pairs:
        assert before in source, f"the mutation no longer applies to {function.__name__}: {before!r}"
        source = source.replace(before, after)
    scope = dict(function.__globals__)
    exec(compile(source, f"<mutant of {function.__name__}>", "exec"), scope)  # noqa: S102
    return scope[function.__name__]


# --- the residue matcher at every edge ----------------------------------------------------------

SECRET = "4417 Elm"
#: (kept text, whether the target stands there as its own token)
EDGES = [
    ("4417 Elm", True),  # the whole text
    ("lives at 4417 Elm", True),  # at the end of the text
    ("4417 Elm is home", True),  # at the start
    ("lives at 4417 Elm.", True), ("at 4417 Elm, then", True), ("(4417 Elm)", True), ('"4417 Elm"', True),
    ("at 4417 Elm!", True), ("at 4417 Elm;", True),  # before punctuation
    ("at 4417 Elm-", True), ("at 4417 Elm_", True), ("at 4417 Elm/", True), ("at 4417 Elm+", True),
    ("at 4417 Elm.", True),  # before a joiner with nothing after it
    ("-4417 Elm", True), ("_4417 Elm st", True),  # after a joiner with nothing before it
    ("at 4417 Elm- x", True),  # a joiner, then a space
    ("at 4417 Elmo", False), ("at 4417 Elm-x", False), ("at 4417 Elm_2", False), ("a-4417 Elm", False),
    ("x4417 Elm", False),
]
#: The same for a needle of digits alone (a variant of the value), which also skips number fields.
DIGIT_EDGES = [("code 4417", True), ("code 4417-", True), ("code 4417.", True), ("(4417)", True),
               ("id ab4417", False), ("v0.4417", False), ("4417-x", False), ('{"n": 4417}', False)]


def edge_failures() -> list[str]:
    """Where the value's own needle (and its digit run's) is found, or not, against the edges above."""
    (value, *_), (digits, *_) = get_needles([SECRET]), get_needles(["4417"])
    return [f"{text!r}: expected {'a hit' if hit else 'no hit'}" for needle, edges in ((value, EDGES),
                                                                                        (digits, DIGIT_EDGES))
            for text, hit in edges if bool(find_hits("f", text.encode(), [needle])) != hit]


def test_the_residue_matcher_holds_at_every_edge():
    assert edge_failures() == []


@pytest.mark.parametrize("old, new", [
    # a joiner ties whatever follows, even nothing: drops "4417 Elm-" at the end
    ("return text[at] in ID_JOINERS and 0 <= beyond < len(text) and text[beyond].isalnum()",
     "return text[at] in ID_JOINERS"),
    # the end of the text counted as a neighbouring token
    ("if not 0 <= at < len(text):\n        return False", "if not 0 <= at < len(text):\n        return True"),
    # punctuation treated as a joiner
    ("if text[at].isalnum():", "if text[at].isalnum() or text[at] in '.,;!':"),
])
def test_each_boundary_mutant_is_caught(monkeypatch, old, new):
    monkeypatch.setattr(residue, "is_joined", mutate(residue.is_joined, old, new))
    assert edge_failures() != []


# --- --max-failures: a later passing round keeps what was found ----------------------------------

def scripted_search(verdicts: list[str]):
    """A ``search`` whose rounds fail with case ``verdicts[i]`` or pass (``""``)."""
    from unsee.impl.agent.episode import parse_episode

    calls = iter(verdicts)
    implementation = EntryPointImplementation("x:y", lambda *a: {})

    def search(implementation_, out, examples, max_steps, seed, reference=True):
        verdict = next(calls)
        if not verdict:
            return Outcome(implementation, examples)
        episode = parse_episode({"format": "unsee.episode", "version": 2, "system": verdict,
                                 "settings": {"max_new_tokens": 1, "temperature": 0.0},
                                 "steps": [{"id": "t1", "kind": "user", "source": "secret", "text": "x"}],
                                 "target": {"source": "secret"}})
        return Outcome(implementation, examples, Failure(episode, error=verdict))

    return implementation, search


def found_after(verdicts: list[str], max_failures: int, search_rounds, monkeypatch):
    implementation, search = scripted_search(verdicts)
    monkeypatch.setitem(search_rounds.__globals__, "search", search)  # ci's globals, or a mutant's copy
    outcomes = search_rounds(implementation, Path("unused"), 1, 1, 0, max_failures)
    return [o.failure.error for o in outcomes if not o.passed]


@pytest.mark.parametrize("verdicts, max_failures, found", [
    (["A", ""], 3, ["A"]),  # a failure, then a passing round: the failure stays
    (["A", "B", ""], 3, ["A", "B"]),
    (["A", "A", "B", ""], 2, ["A", "B"]),  # a repeat is counted once
    ([""], 3, []),
])
def test_a_later_passing_round_never_drops_a_failure(monkeypatch, verdicts, max_failures, found):
    assert found_after(verdicts, max_failures, ci.search_rounds, monkeypatch) == found
    if found and len(found) < max_failures:  # a passing round came: the mutant keeps it alone
        mutant = mutate(ci.search_rounds, "return tuple(outcomes) if outcomes else (outcome,)",
                        "return (outcome,)")
        assert found_after(verdicts, max_failures, mutant, monkeypatch) == []


# --- transformers: every decision after a context-guess forward is guarded -----------------------

VOCAB = 8


def decisive(tok: int) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    row[tok] = 10.0
    return row


def near_tie(tok: int, other: int) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    row[tok], row[other] = 5.0 + 1e-4, 5.0  # a margin of 1e-4, far below the guard's threshold
    return row


class ScriptedLineage:
    """A lineage whose forwards return scripted logits, in order."""

    def __init__(self, tokens: list[int], rows: list[torch.Tensor]):
        self.tokens, self.rows, self.last_logits = list(tokens), list(rows), None
        self.forwards: list[str] = []

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def forward_last(self, ids: list[int]) -> torch.Tensor:
        self.tokens += ids
        self.forwards.append("last")
        return self.rows.pop(0)

    def forward_all(self, ids: list[int]) -> torch.Tensor:
        self.tokens += ids
        self.forwards.append("guess")
        return torch.stack([self.rows.pop(0) for _ in ids])


def guarded_turn(decode) -> tuple[list[int] | None, list[str]]:
    """The lineage [1, 2, 3, 4, 1]: deciding 2 makes the context guess [3, 4, ...]
    (the n-gram [1, 2] seen before). The guess's forward disagrees at once (5,
    decisive), then a plain decode step gives a near tie: on logits after a
    guess forward, the turn must stop as unstable (None)."""
    lineage = ScriptedLineage([1, 2, 3, 4, 1], [decisive(5)] * 6 + [near_tie(6, 0), decisive(7), decisive(7)])
    turn = turn_module.Turn(lineage, Counters(), start=5, header_logits=decisive(2), max_new_tokens=6, stops={7},
                            temperature=0.0, seed=None, draft_bound=0.5)
    return decode(turn, [], turn.header_logits, None, lookup=True), lineage.forwards


def test_every_decision_after_a_context_guess_forward_is_guarded():
    out, forwards = guarded_turn(turn_module.decode)
    assert forwards[0] == "guess" and "last" in forwards[1:]  # the premise: a guess forward, then a plain one
    assert out is None
    # the mutant that guards only the guess's own rows decides the near tie after them
    mutant = mutate(turn_module.decode, "        threshold = turn.get_threshold()\n        fed =",
                    "        guard = turn.get_threshold()\n        fed =", "out, threshold, fed)", "out, guard, fed)")
    out, _ = guarded_turn(mutant)
    assert out is not None and out[:2] == [2, 5]


def test_transformers_turns_run_the_guarded_procedure(lm):
    """The procedure above is what transformers runs: its engine has no
    ``max_forward`` (a multi-token forward differs from decoding in the last
    bits), so ``generate`` picks ``decode_guarded`` and ``decode``, never ``speculate``."""
    from unsee.impl.engines.book import LineageBook
    from unsee.impl.engines.registry import make_engine

    engine = make_engine(lm)
    assert isinstance(engine, LineageBook) and engine.max_forward is None


# --- a forget report's invocations: the transitions actually replayed ---------------------------

def load_serve_helpers():
    """tests/test_serve_items.py's server helpers and fixtures (a Qwen-style tiny model whose
    turns call a tool when offered one), loaded as tests/test_serve_items.py loads its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_serve_items_helpers",
                                                  Path(__file__).with_name("test_serve_items.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SERVE = load_serve_helpers() if importlib_find("fastapi") and importlib_find("openai") else None
if SERVE is not None:
    render_helpers, qwen_style, calls_when_offered = SERVE.render_helpers, SERVE.qwen_style, SERVE.calls_when_offered


@pytest.mark.skipif(SERVE is None, reason="unsee serve's extras (fastapi, openai) are not installed")
def test_a_forget_counts_the_transitions_it_replayed_when_a_client_tool_replay_halts(
        qwen_style, tmp_path, calls_when_offered, monkeypatch):
    """A DELETE whose replay stops at a call no recorded output answers: the report's
    ``invocations`` is the transitions ``F`` actually ran in the replay (counted here by a spy on
    ``AgentRuntime.step``), fewer than the recorded ``T - boundary``; the report's ``length`` is
    the ``T`` the state stands at (the held inputs wait for the client). A report that said what a
    whole replay would have run (3 here, the Corollary's count over the recorded steps) fails the
    first assert; the second, with nothing halted, is the whole suffix, counted the same way."""
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.registry import make_engine
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    ran = []
    original = AgentRuntime.step
    monkeypatch.setattr(AgentRuntime, "step", lambda self, step, wait=True: (ran.append(step.id),
                                                                               original(self, step, wait))[1])
    with ServerThread(Pool(make_engine(qwen_style), tmp_path, defaults=SERVE.SETTINGS), "tiny") as srv:
        client = SERVE.connect(srv)
        conv, _ = SERVE.run_calls(client, [SERVE.user("q1", "Weather in Oslo?")], SERVE.EXTRA)
        before = len(srv.pool.get(conv).session.runtime.steps)
        ran.clear()
        gone = client.conversations.items.delete("q1", conversation_id=conv).model_extra
        report = gone["report"]
        assert gone["status"] == "pending" and report["tau"] == 1 and before == 3
        # halted at the new call: one transition replayed, and the report's T is where the state stands
        assert report["invocations"] == len(ran) == 1 and report["length"] == 1, (report, ran)
        assert len(ran) < before - report["tau"] + 1  # the premise: a whole replay would have counted 3
        # nothing halts: the whole suffix, counted the same way
        other, _ = SERVE.run_calls(client, [SERVE.user("q1", "Weather in Oslo?")], SERVE.EXTRA)
        ran.clear()
        gone = client.conversations.items.delete("x2", conversation_id=other).model_extra
        assert gone["status"] == "completed"
        assert gone["report"]["invocations"] == len(ran) == gone["report"]["length"] - gone["report"]["tau"] + 1
