"""The episode format's version 2: the per-step ``independent`` label, and
version 1 files still read. Also the bench's deterministic indep episodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from unsee.bench.episodes import DEPENDENT_QUESTIONS, SECRET, get_indep_labels, make_bench_episode, make_indep_episode
from unsee.impl.agent.episode import (
    FORMAT,
    MODEL_TURN_KINDS,
    READ_VERSIONS,
    VERSION,
    EpisodeError,
    episode_to_json,
    load_episode,
    parse_episode,
)
from unsee.impl.conform.episodes import get_indep, get_tau

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "secret_in_tool_result.json"

LABELLED = {
    "format": FORMAT, "version": 2, "system": "s",
    "steps": [{"id": "u1", "kind": "user", "text": "hi"},
              {"id": "f2", "kind": "tool", "fields": [{"source": "z", "text": "4417 Elm"}]},
              {"id": "u3", "kind": "user", "text": "name a cat", "independent": True},
              {"id": "m4", "kind": "memory", "records": [{"source": "m4.a", "text": "likes tea"}]},
              {"id": "u5", "kind": "user", "text": "where is it?", "independent": False},
              {"id": "c6", "kind": "compact", "independent": True}],
    "target": {"source": "z", "value": "4417 Elm"},
}


def test_version_1_files_still_read_and_carry_no_labels():
    raw = json.loads(EXAMPLE.read_text())
    assert raw["version"] == 1 in READ_VERSIONS
    episode = load_episode(EXAMPLE)
    assert not any(step.independent for step in episode.steps)
    written = episode_to_json(episode)
    assert written["version"] == VERSION == 2
    assert all("independent" not in step for step in written["steps"])
    assert parse_episode(written) == episode


def test_labels_are_read_and_written_back():
    episode = parse_episode(LABELLED)
    assert [s.independent for s in episode.steps] == [False, False, True, False, False, True]
    written = episode_to_json(episode)
    assert [s.get("independent") for s in written["steps"]] == [None, None, True, None, None, True]
    assert parse_episode(json.loads(json.dumps(written))) == episode


@pytest.mark.parametrize("label", [1, 0, "yes", None, [True], 1.0])
def test_a_label_that_is_not_a_boolean_is_refused(label):
    raw = copy.deepcopy(LABELLED)
    raw["steps"][2]["independent"] = label
    with pytest.raises(EpisodeError, match=r"steps\[2\]\.independent: must be true or false"):
        parse_episode(raw)


@pytest.mark.parametrize("kind", sorted({"memory", "session"}))
def test_a_step_without_a_model_turn_cannot_be_labelled(kind):
    assert kind not in MODEL_TURN_KINDS
    raw = copy.deepcopy(LABELLED)
    step = {"id": "x", "kind": kind, "independent": True}
    if kind == "memory":
        step["records"] = [{"source": "x.a", "text": "a note"}]
    raw["steps"].append(step)
    with pytest.raises(EpisodeError, match=rf"steps\[6\]\.independent: a {kind} step has no model turn"):
        parse_episode(raw)
    step["independent"] = False  # no claim: allowed on any step
    assert not parse_episode(raw).steps[-1].independent


def test_a_version_1_file_with_a_label_is_refused_not_ignored(tmp_path):
    raw = copy.deepcopy(LABELLED)
    raw["version"] = 1
    path = tmp_path / "e.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(EpisodeError, match=r"e\.json: steps\[2\]\.independent: labels need version 2"):
        load_episode(path)
    for step in raw["steps"]:
        step.pop("independent", None)
    assert parse_episode(raw).steps[2].independent is False


@pytest.mark.parametrize("version", [0, 5, "2"])
def test_other_versions_are_refused_by_name(version):
    raw = dict(LABELLED, version=version)
    with pytest.raises(EpisodeError, match=rf"unsupported version {version!r}; this build reads versions 1, 2, 3, 4"):
        parse_episode(raw)


# --- version 3: empty observed steps (the counterfactual of a removed only item) -------------------

EMPTY_STEPS = [{"id": "u", "kind": "user", "text": None}, {"id": "p", "kind": "plan", "text": None},
               {"id": "m", "kind": "memory", "records": []}, {"id": "t", "kind": "tool", "fields": []}]


def test_empty_steps_read_in_version_3_and_round_trip():
    raw = {"format": FORMAT, "version": 3, "system": "s", "steps": EMPTY_STEPS}
    episode = parse_episode(raw)
    assert [s.items for s in episode.steps] == [()] * 4
    assert [s.tool for s in episode.steps] == [None, "send_message", None, "fetch"]
    written = episode_to_json(episode)
    assert written["version"] == 3
    assert parse_episode(written) == episode


@pytest.mark.parametrize("step", EMPTY_STEPS, ids=lambda s: s["kind"])
def test_empty_steps_are_refused_before_version_3(step):
    raw = {"format": FORMAT, "version": 2, "system": "s", "steps": [step]}
    with pytest.raises(EpisodeError, match=r"steps\[0\]: .*\(an empty step needs version 3\)$"):
        parse_episode(raw)


def test_an_empty_step_takes_no_source_and_a_full_episode_is_still_written_as_version_2():
    raw = {"format": FORMAT, "version": 3, "system": "s",
           "steps": [{"id": "u", "kind": "user", "text": None, "source": "x"}]}
    with pytest.raises(EpisodeError, match=r"steps\[0\]: an empty step \('text': null\) takes no 'source'"):
        parse_episode(raw)
    assert episode_to_json(parse_episode(LABELLED))["version"] == VERSION == 2


# --- the bench's indep episodes -------------------------------------------------------------

@pytest.mark.parametrize("indep", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_make_indep_episode_is_the_papers_configuration(indep):
    episode = make_indep_episode(indep)
    tau = get_tau(episode)
    assert (tau, len(episode.steps)) == (3, 3 + 12)  # 12 turns past the target
    after = episode.steps[tau:]
    assert all(s.kind in ("user", "tool") for s in after)  # every one decodes a model turn
    assert sum(s.independent for s in after) == 12 * indep and get_indep(episode) == indep
    assert not any(s.independent for s in episode.steps[:tau])
    # labelled work never names the target; every other turn is a question about it
    for step in after:
        text = " ".join(i.text for i in step.items)
        assert SECRET not in text
        assert step.independent or (step.kind == "user" and text in DEPENDENT_QUESTIONS)
    assert make_indep_episode(indep) == episode  # deterministic
    assert parse_episode(episode_to_json(episode)) == episode


def test_make_indep_episode_spreads_labels_and_refuses_bad_fractions():
    assert get_indep_labels(0.5, 4) == [False, True, False, True]
    assert get_indep_labels(0.25, 8) == [False, False, False, True, False, False, False, True]
    for bad, match in (((0.3, 12), "not a whole number"), ((1.5, 12), "within 0..1"), ((0.5, 0), "at least 1")):
        with pytest.raises(ValueError, match=match):
            get_indep_labels(*bad)
    with pytest.raises(ValueError, match="tau=0"):
        make_indep_episode(tau=0)
    longer = make_indep_episode(0.25, turns_after=4, tau=1, max_new_tokens=8, policy="session_start")
    assert [s.independent for s in longer.steps] == [False, False, False, False, True]
    assert longer.settings.checkpoint_policy == "session_start"


def test_make_bench_episode_is_unchanged():
    episode = make_bench_episode(5)
    assert [s.kind for s in episode.steps] == ["user"] * 4 + ["tool", "user", "remember", "user", "compact"] + \
        ["user"] * 3
    assert not any(s.independent for s in episode.steps)
