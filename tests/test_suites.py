"""The evaluation suites (impl/eval/suites.py): seeded generators, the suite
folder (episode files plus the label sidecar), label consistency, and each
generated suite run on the tiny model."""

from __future__ import annotations

import json
import sys

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.tools import ToolAgentRuntime
from unsee.impl.conform.episodes import scaled
from unsee.impl.engines.registry import make_engine
from unsee.impl.eval.cases import SINK_CLASSES, Fact, Sink, SuiteError, find_label_leaks
from unsee.impl.eval.suites import (
    TOOL_SINKS,
    check_case,
    generate_suite,
    get_case_tools,
    get_suite_tools,
    load_suite,
    write_suite,
)

GENERATED = ("memory", "tool", "behavioral")


def seeds() -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=2**31)


def suite_names() -> st.SearchStrategy[str]:
    return st.sampled_from(GENERATED)


# --- determinism and variety ------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED)
def test_generators_are_deterministic_and_prefix_stable(name):
    five = generate_suite(name, 5, seed=7)
    assert five == generate_suite(name, 5, seed=7)
    assert generate_suite(name, 3, seed=7) == five[:3]  # case i does not depend on n
    assert [c.episode for c in generate_suite(name, 5, seed=8)] != [c.episode for c in five]
    assert len({c.id for c in five}) == 5


@pytest.mark.parametrize("name", GENERATED)
def test_generators_vary_names_facts_and_target_positions(name):
    cases = generate_suite(name, 40, seed=0)
    systems = {c.episode.system for c in cases}
    values = {c.episode.target.value for c in cases}
    # where the target sits: (step index, index within the step's items)
    positions = {next((si, ii) for si, s in enumerate(c.episode.steps) for ii, i in enumerate(s.items)
                      if i.source == c.episode.target.source) for c in cases}
    assert len(systems) > 5 and len(values) > 5 and len(positions) > 3


def test_memory_target_is_a_memory_record_re_injected_after_compaction():
    for case in generate_suite("memory", 20, seed=1):
        ep = case.episode
        kinds = [s.kind for s in ep.steps]
        entered = next(s for s in ep.steps if any(i.source == ep.target.source for i in s.items))
        assert entered.kind == "memory"
        assert "compact" in kinds and "remember" in kinds
        assert kinds.index("session") > kinds.index(entered.kind)  # a later session re-injects it
        assert ep.steps[-1].items[0].text == case.task  # the question that solicits the target comes last
        assert len(case.facts) >= 3 and not case.sinks


def test_tool_target_is_a_tool_field_and_a_plan_follows():
    scenarios = set()
    for case in generate_suite("tool", 30, seed=2):
        ep = case.episode
        entered = next(i for i, s in enumerate(ep.steps) if any(it.source == ep.target.source for it in s.items))
        assert ep.steps[entered].kind == "tool"
        assert any(s.kind == "plan" for s in ep.steps[entered + 1:])
        assert {s.sink_class for s in case.sinks} <= set(SINK_CLASSES)
        scenarios.add(case.meta["scenario"])
    assert scenarios == {"message", "pay", "book"}


def test_behavioral_cases_come_in_counterbalanced_pairs():
    cases = generate_suite("behavioral", 6, seed=3)
    for first, second in zip(cases[::2], cases[1::2]):
        a, b = first.behavior, second.behavior
        assert (a.order, b.order) == (0, 1)
        assert a.options == b.options and a.avoided == b.avoided and a.offered == b.offered[::-1]
        assert a.other != a.avoided and {a.other, a.avoided} == set(a.options)
        listing = next(s for s in first.episode.steps if s.kind == "tool")
        assert [i.text.split(":")[0] for i in listing.items] == list(a.offered)
        # the revoked preference names the avoided option; its reason is the target value
        target = next(i for s in first.episode.steps for i in s.items if i.source == first.episode.target.source)
        assert a.avoided in target.text and first.episode.target.value in target.text


# --- labels -------------------------------------------------------------------------------


@given(suite_names(), seeds())
@scaled(2)
def test_labels_are_consistent(name, seed):
    """The target value is in the target item and in no other item; every
    fact's value is in its source; every sink names a real argument of a
    consequential tool a plan step uses (check_case)."""
    for case in generate_suite(name, 2, seed):
        check_case(case)
        assert find_label_leaks(case) == []
        assert parse_episode(case.episode.to_json()) == case.episode


def test_check_case_names_each_bad_label():
    case = generate_suite("tool", 1, seed=0)[0]
    fact = case.facts[0]
    bad = {
        "is not in item": attrs.evolve(case, facts=(attrs.evolve(fact, value="Zanzibar"),)),
        "no item of the episode": attrs.evolve(case, facts=(Fact("nowhere", "x", "?"),)),
        "not an argument": attrs.evolve(case, sinks=(Sink(case.sinks[0].tool, "colour", "routing"),)),
        "sink class": attrs.evolve(case, sinks=(attrs.evolve(case.sinks[0], sink_class="secret"),)),
        "planned by no step": attrs.evolve(case, sinks=(Sink("book", "item", "selection"),)
                                           if case.sinks[0].tool != "book" else (Sink("pay", "memo", "free_text"),)),
        "target value": attrs.evolve(case, episode=attrs.evolve(
            case.episode, target=attrs.evolve(case.episode.target, value="Kilimanjaro"))),
    }
    for words, broken in bad.items():
        with pytest.raises(SuiteError, match=words):
            check_case(broken)


def test_sinks_cover_every_argument_of_the_planned_tools():
    tools = get_suite_tools()
    for name, classes in TOOL_SINKS.items():
        assert tools[name].consequential and set(classes) == set(tools[name].params)


# --- files --------------------------------------------------------------------------------


def test_suite_folder_round_trips(tmp_path):
    cases = [c for name in GENERATED for c in generate_suite(name, 2, seed=4)]
    sidecar = write_suite(cases, tmp_path)
    assert sidecar.name == "suite.json"
    loaded = load_suite(tmp_path)
    assert loaded == cases and [c.meta for c in loaded] == [c.meta for c in cases]
    # the episode files are ordinary episode files
    raw = json.loads((tmp_path / "episodes" / f"{cases[0].id}.json").read_text())
    assert raw["format"] == "unsee.episode" and parse_episode(raw) == cases[0].episode


def test_load_suite_refuses_bad_folders(tmp_path):
    with pytest.raises(SuiteError, match="no suite sidecar"):
        load_suite(tmp_path)
    cases = generate_suite("memory", 2, seed=5)
    sidecar = write_suite(cases, tmp_path)
    raw = json.loads(sidecar.read_text())

    def broken(edit, match):
        data = json.loads(json.dumps(raw))
        edit(data)
        sidecar.write_text(json.dumps(data))
        with pytest.raises(SuiteError, match=match):
            load_suite(tmp_path)

    broken(lambda d: d.update(version=99), "unsupported version 99")
    broken(lambda d: d["cases"][1].update(episode="../x.json"), r"cases\[1\]\.episode")
    broken(lambda d: d["cases"][0]["facts"][0].update(value="Zanzibar"), r"cases\[0\].*Zanzibar")
    broken(lambda d: d["cases"][0].pop("suite"), r"cases\[0\]: malformed labels")
    sidecar.write_text(json.dumps(raw))
    (tmp_path / "episodes" / f"{cases[1].id}.json").write_text("{}")
    with pytest.raises(SuiteError, match=r"cases\[1\].*format"):
        load_suite(tmp_path)


def test_generate_suite_refuses_bad_requests():
    with pytest.raises(SuiteError, match="unknown suite 'lme'"):
        generate_suite("lme", 2)
    for n in (0, -1, 1.5, True):
        with pytest.raises(SuiteError, match="positive integer"):
            generate_suite("memory", n)
    with pytest.raises(SuiteError, match="duplicate case ids"):
        write_suite(generate_suite("memory", 1) * 2, "unused")


def test_agentdojo_suite_names_its_missing_package(monkeypatch):
    """Runs with or without the package: absent, the error names it."""
    monkeypatch.setitem(sys.modules, "agentdojo", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r"agentdojo==0\.1\.35"):
        generate_suite("agentdojo", 1)


# --- on the tiny model ------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED)
def test_generated_episodes_run_and_forget_exactly_on_the_tiny_model(lm, name):
    """Each suite's episodes run through the tool runtime with the suite's
    tools, and a forget of the target equals the full reset."""
    case = generate_suite(name, 1, seed=6)[0]
    engine = make_engine(lm)
    runtime = ToolAgentRuntime.from_episode(engine, case.episode, tools=get_case_tools(case))
    runtime.check_invariants()
    reset = runtime.fork()
    reset.full_reset(case.episode.target.source)
    runtime.forget(case.episode.target.source)
    assert runtime.digest() == reset.digest()
