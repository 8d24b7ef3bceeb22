"""Real agent frameworks through the conformance contract
(impl/conform/frameworks/; docs/conformance.md, "Scorecard"). Each test
skips when its framework's extra is not installed; CI installs
``unsee[langgraph]`` and so runs LangGraph end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.conform.checks import FAIL, NA, PASS, RESIDUE, get_kept_bytes
from unsee.impl.conform.harness import Harness, load_entry_point, search

#: The target, then a question whose answer the target changes (on tiny: t3's second token).
EPISODE = parse_episode({
    "format": "unsee.episode", "version": 2, "system": "Be brief.",
    "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "hi"},
              {"id": "t2", "kind": "user", "source": "secret", "text": "4417 Elm"},
              {"id": "t3", "kind": "user", "text": "where?"}],
    "target": {"source": "secret", "value": "4417 Elm"}})
STATE = ("forget = counterfactual: turns", "forget = counterfactual: digest")


def check(entry: str, tmp_path: Path):
    harness = Harness(load_entry_point(entry), tmp_path)
    harness.check_episode(EPISODE)
    record = harness.records[-1]
    assert record.error is None, record.error
    return {c.name: c.status for c in record.checks}, record.answers


def test_langgraph_remove_message_keeps_what_the_target_changed(tmp_path):
    pytest.importorskip("langgraph.checkpoint.sqlite")
    got, answers = check("unsee.impl.conform.frameworks.lang_graph:remove", tmp_path)
    assert got["forget = counterfactual: turns"] == FAIL  # t3's answer, decoded with the target in context, stays
    assert answers["forget request"]["forget"]["turns"]["t3"] == answers["forget request"]["run"]["turns"]["t3"]
    assert got[RESIDUE] == FAIL and got["reopen = forget"] == got["idempotent (second forget)"] == PASS


def test_langgraph_time_travel_is_the_counterfactual_but_its_checkpoints_keep_the_target(tmp_path):
    pytest.importorskip("langgraph.checkpoint.sqlite")
    got, _ = check("unsee.impl.conform.frameworks.lang_graph:travel", tmp_path)
    assert {got[n] for n in STATE} == {PASS}
    assert got[RESIDUE] == FAIL
    assert got["reopen = forget"] == got["idempotent (second forget)"] == PASS


def test_langgraph_end_to_end_search_shrinks_to_the_residue(tmp_path):
    """The row CI runs: generated episodes, shrunk to the one-step episode
    whose old checkpoint still holds the target."""
    pytest.importorskip("langgraph.checkpoint.sqlite")
    outcome = search(load_entry_point("unsee.impl.conform.frameworks.lang_graph:travel"), tmp_path, examples=3)
    assert not outcome.passed and outcome.failure.get_names() == (RESIDUE,)
    assert len(outcome.failure.episode.steps) == 1


def test_agents_sdk_pop_item_and_rerun(tmp_path):
    pytest.importorskip("agents")
    got, answers = check("unsee.impl.conform.frameworks.agents_sdk:pop_item", tmp_path)
    assert {got[n] for n in STATE} == {PASS}
    assert got["reopen = forget"] == got["idempotent (second forget)"] == PASS
    # the residue check looked at a file that did hold the target before the forget
    before = get_kept_bytes(answers["forget request"]["run"]["kept"])
    assert any(b"4417 Elm" in raw for raw in before.values())
    assert got[RESIDUE] != NA  # it reports what it keeps


def test_google_adk_rewind_is_the_counterfactual_but_the_session_keeps_the_events(tmp_path):
    pytest.importorskip("google.adk")
    got, _ = check("unsee.impl.conform.frameworks.google_adk:rewind", tmp_path)
    assert {got[n] for n in STATE} == {PASS}
    assert got[RESIDUE] == FAIL  # rewound events stay in session.events
    assert got["reopen = forget"] == NA  # the in-memory session service persists nothing
    assert got["idempotent (second forget)"] == PASS


def test_mem0_delete_leaves_its_history_and_what_the_memory_changed(tmp_path):
    pytest.importorskip("unsee.impl.conform.frameworks.mem0_store", exc_type=ImportError)
    got, answers = check("unsee.impl.conform.frameworks.mem0_store:delete", tmp_path)
    assert got["forget = counterfactual: turns"] == FAIL  # turns answered from the target's memory stay
    assert got[RESIDUE] == FAIL
    residue = next(c for c in answers["forget request"]["forget"]["kept"] if c["name"] == "history.db")
    assert b"4417 Elm" in get_kept_bytes([residue])["history.db"]  # the delete's history row keeps the text
    assert got["reopen = forget"] == got["idempotent (second forget)"] == PASS


COUNTEREXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "conformance-counterexamples"


@pytest.mark.parametrize("name, entry", [("langgraph-removemessage", "lang_graph:remove"),
                                         ("langgraph-time-travel", "lang_graph:travel")])
def test_the_committed_scorecard_counterexamples_rerun_to_the_same_failure(name, entry, tmp_path):
    pytest.importorskip("langgraph.checkpoint.sqlite")
    from unsee.impl.conform.harness import check_file

    failed = json.loads((COUNTEREXAMPLES / f"{name}.failed.json").read_text())["failed"]
    outcome = check_file(load_entry_point(f"unsee.impl.conform.frameworks.{entry}"), COUNTEREXAMPLES / f"{name}.json",
                         tmp_path)
    assert list(outcome.failure.get_names()) == failed
