"""The checks for what stays behind after a forget (impl/conform/checks.py):
residue, reopen, idempotent, effects once (A3); each passes on the reference
and fails on a shipped broken adapter; N/A (not a pass) where an
implementation cannot answer."""

from __future__ import annotations

import base64
import gc
import weakref

import pytest

from unsee.impl.agent.episode import parse_episode
from unsee.impl.conform import adapters
from unsee.impl.conform.checks import (
    AFTERMATH_CHECKS,
    EFFECTS,
    FAIL,
    IDEMPOTENT,
    NA,
    PASS,
    REOPEN,
    RESIDUE,
    check_residue,
)
from unsee.impl.conform.harness import (
    Harness,
    ImplementationError,
    load_entry_point,
    read_result,
    search,
)

ADAPTERS = "unsee.impl.conform.adapters"


def episode(steps, policy="every_turn"):
    return parse_episode({"format": "unsee.episode", "version": 2, "system": "Be brief.",
                          "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0,
                                       "checkpoint_policy": policy},
                          "steps": steps, "target": {"source": "secret", "value": "4417 Elm"}})


#: The target, then a consequential call after it (the effects check applies).
WITH_CALL = episode([{"id": "t1", "kind": "user", "text": "hi"},
                     {"id": "t2", "kind": "user", "source": "secret", "text": "4417 Elm"},
                     {"id": "t3", "kind": "plan", "text": "pay Bob", "tool": "pay"}])


def statuses(name, tmp_path, ep=WITH_CALL):
    """Every check of one episode through the named adapter: name -> status."""
    harness = Harness(load_entry_point(f"{ADAPTERS}:{name}"), tmp_path)
    harness.check_episode(ep)
    return {c.name: c.status for c in harness.records[-1].checks}, harness.records[-1]


def test_the_reference_passes_every_check_for_what_stays_behind(tmp_path):
    got, record = statuses("reference", tmp_path)
    assert {n: got[n] for n in AFTERMATH_CHECKS} == dict.fromkeys(AFTERMATH_CHECKS, PASS)
    assert all(s != FAIL for s in got.values()), got
    answer = record.answers["forget request"]
    assert answer["forget"]["kept"] and answer["run"]["kept"]  # the store's bytes, scanned


@pytest.mark.parametrize("name, failed", [("checkpoint_history", {RESIDUE}), ("uncommitted", {RESIDUE, REOPEN}),
                                          ("resync", {IDEMPOTENT}), ("refire", {EFFECTS})])
def test_each_check_fails_on_its_broken_adapter(name, failed, tmp_path):
    got, _ = statuses(name, tmp_path)
    assert {n for n, s in got.items() if s == FAIL} == failed, got


def test_tools_conforms_and_fires_its_call_once(tmp_path):
    got, record = statuses("tools", tmp_path)
    assert got[EFFECTS] == PASS and all(s != FAIL for s in got.values()), got
    answer = record.answers["forget request"]
    assert answer["run"]["effects"] == ["t3/call"] and answer["forget"]["effects"] == []  # the premise


def test_checkpoint_history_is_rejected_by_residue_on_generated_episodes(tmp_path):
    """The issue's case: the target stays in an earlier checkpoint the forget never reads."""
    outcome = search(load_entry_point(f"{ADAPTERS}:checkpoint_history"), tmp_path, examples=3)
    assert not outcome.passed and outcome.failure.get_names() == (RESIDUE,)
    assert len(outcome.failure.episode.steps) == 1


def test_what_an_implementation_cannot_answer_is_na_not_pass(tmp_path):
    got, _ = statuses("memory", tmp_path, episode([{"id": "t1", "kind": "user", "source": "secret",
                                                     "text": "4417 Elm"}]))
    assert {n: got[n] for n in AFTERMATH_CHECKS} == dict.fromkeys(AFTERMATH_CHECKS, NA)


def kept(text):
    return [{"name": "db", "base64": base64.b64encode(text.encode()).decode()}]


def test_residue_scans_variants_and_subtracts_what_the_counterfactual_keeps():
    values = ["4417 Elm"]
    assert check_residue({"kept": kept("row: 4417   ELM!")}, {"kept": []}, values).actual == [
        "normalised variant '4417 elm' in db at byte 5: b'row: 4417   ELM!'",
        "normalised variant '4417' in db at byte 5: b'row: 4417   ELM!'"]
    assert check_residue({"kept": kept("x 4417 y")}, {"kept": kept("paid 4417")}, values).ok  # another item's number
    assert not check_residue({"kept": kept("x 4417 Elm")}, {"kept": kept("paid 4417")}, values).ok
    assert check_residue({"kept": [{"name": "t", "text": "tea"}]}, {}, values).status == PASS
    assert check_residue({}, {}, values).status == NA


def test_a_malformed_kept_or_effects_names_the_field(tmp_path):
    answer = {"contract": "unsee.conformance", "version": 2, "implementation": dict.fromkeys(
        ("name", "engine", "model"), "x"), "run": {"T": 1, "digest": "d", "turns": {}, "kept": [{"name": 1}]}}
    with pytest.raises(ImplementationError, match=r"result run.kept\[0\]"):
        read_result(answer, (), None)
    answer["run"]["kept"], answer["run"]["effects"] = [], [3]
    with pytest.raises(ImplementationError, match=r"result run.effects"):
        read_result(answer, (), None)


def test_the_model_cache_holds_one_model_and_releases_the_last():
    """Issue 28: the adapters' cache held every model a process loaded."""

    class Model:
        pass

    cache = adapters.ModelCache()
    first = cache.get("transformers", "a", Model)
    assert cache.get("transformers", "a", Model) is first
    gone = weakref.ref(first)
    del first
    cache.get("transformers", "b", Model)
    gc.collect()
    assert gone() is None and len(cache) == 1
    assert isinstance(adapters.MODELS, adapters.ModelCache) and adapters.MODELS.size == 1
