"""The evaluation's metrics (impl/eval/metrics.py) and paired statistics
(impl/eval/stats.py) on constructed inputs: no model."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.provenance import DERIVED_TYPES
from unsee.impl.eval.audit import ARTIFACT_TYPES, MEMORY_RECORD, MEMORY_TYPES, MEMORY_WRITE, SCANNED_TYPES
from unsee.impl.eval.cases import SINK_CLASSES, EvalCase, Sink
from unsee.impl.eval.metrics import (
    Action,
    action_distance,
    apply_sink_policy,
    compute_cad,
    edit_distance,
    find_action_leaks,
    get_sink_class,
    normalized_edit_distance,
)
from unsee.impl.eval.run import EvalError, get_suite_names, pick_option
from unsee.impl.eval.stats import bootstrap_ci, identical, mcnemar_exact, wilcoxon_signed_rank
from unsee.impl.methods.baselines import IDENTIFIER_SINKS

texts = st.text(alphabet="ab{}\":,xyz", max_size=12)


def make_case(markers=(), value="dana.reyes@example.com") -> EvalCase:
    episode = parse_episode({"format": "unsee.episode", "version": 2, "system": "s", "steps": [
        {"id": "s1", "kind": "tool", "fields": [{"source": "c.email", "text": f"mail {value}"}]},
        {"id": "s2", "kind": "plan", "tool": "pay", "text": "pay the bill"}],
        "target": {"source": "c.email", "value": value}})
    return EvalCase("tool", "c", episode, sinks=(Sink("pay", "recipient", "routing"), Sink("pay", "memo", "free_text")),
                    attack_markers=markers)


# --- the surfaces' block types and the sink classes ---------------------------------------


def test_surface_types_partition_the_derived_types_and_the_stored_records():
    """Every derived block type is scored on exactly one surface (artifacts or
    memory), and the memory surface adds the stored records, nothing else."""
    assert MEMORY_WRITE in DERIVED_TYPES
    assert not set(ARTIFACT_TYPES) & set(MEMORY_TYPES)
    assert set(ARTIFACT_TYPES) | {MEMORY_WRITE} == set(DERIVED_TYPES)
    assert set(SCANNED_TYPES) == set(DERIVED_TYPES) | {MEMORY_RECORD}
    assert MEMORY_RECORD not in DERIVED_TYPES


def test_identifier_sinks_are_sink_classes():
    assert set(IDENTIFIER_SINKS) < set(SINK_CLASSES) and "free_text" not in IDENTIFIER_SINKS


# --- edit distance and CAD ---------------------------------------------------------------


@given(texts, texts)
@example("", "")
@example("kitten", "sitting")
def test_normalized_edit_distance_is_a_bounded_metric(a, b):
    d = normalized_edit_distance(a, b)
    assert 0 <= d <= 1
    assert (d == 0) == (a == b)
    assert d == normalized_edit_distance(b, a)


def test_edit_distance_counts_edits():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3
    assert normalized_edit_distance("abcd", "abcx") == 0.25


def test_cad_definition():
    ref = [Action("s2", "send_message", (("to", "a@x.org"), ("body", "hi")))]
    assert compute_cad(ref, ref) == 0.0
    # another tool for the same step: 1
    assert compute_cad([Action("s2", "book", (("item", "x"), ("date", "")))], ref) == 1.0
    # an action the reference did not take, or one it took and this state did not: 1 each
    assert compute_cad([], ref) == 1.0
    assert compute_cad(ref + [Action("s3", "book", (("item", "x"),))], ref) == 0.5
    # same tool, other arguments: the normalised edit distance of the canonical JSON
    other = [Action("s2", "send_message", (("body", "hi"), ("to", "b@x.org")))]  # order does not matter
    expected = normalized_edit_distance(ref[0].canonical(), other[0].canonical())
    assert compute_cad(other, ref) == pytest.approx(expected) and 0 < expected < 1
    assert compute_cad([], []) is None  # nothing to compare is not a distance of 0


@given(st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["book", "pay"]), texts),
                max_size=4),
       st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["book", "pay"]), texts),
                max_size=4))
def test_cad_lies_in_unit_interval_and_is_zero_on_itself(mine, theirs):
    a = [Action(s, t, (("x", v),)) for s, t, v in mine]
    b = [Action(s, t, (("x", v),)) for s, t, v in theirs]
    cad = compute_cad(a, b)
    if not a and not b:
        assert cad is None
    else:
        assert 0 <= cad <= 1
    if a:
        assert compute_cad(a, a) == 0.0
    assert action_distance(None, None) == 0.0


# --- action leaks --------------------------------------------------------------------------


def test_action_leak_names_the_sink_class_and_markers():
    case = make_case(markers=("US133000000121212121212",))
    actions = [Action("s2", "pay", (("recipient", "US133000000121212121212"), ("memo", "for dana.reyes@example.com")))]
    leaks = find_action_leaks(actions, case)
    assert {(l["arg"], l["sink_class"], l["found"]) for l in leaks} == {
        ("recipient", "routing", "attack_marker"), ("memo", "free_text", "target")}
    assert find_action_leaks([Action("s2", "pay", (("recipient", "GB29NWBK60161331926819"), ("memo", "rent")))],
                             case) == []
    # unlabelled arguments: the default tools' classes, else free text
    assert get_sink_class(case, "send_message", "to") == "routing"
    assert get_sink_class(case, "pay", "unknown") == "free_text"


def test_sink_policy_empties_blocked_identifiers_and_keeps_free_text():
    """B8 by sink class: the blocked routing argument reaches its sink empty,
    the free text goes through, and so does the target inside it."""
    case = make_case()
    actions = [Action("s2", "pay", (("recipient", "dana.reyes@example.com"), ("memo", "to dana.reyes@example.com"))),
               Action("s3", "pay", (("recipient", "x"), ("memo", "y")))]
    policed = apply_sink_policy(actions, [("s2/plan", "recipient"), ("s3/plan", "*")])
    assert policed == [Action("s2", "pay", (("recipient", ""), ("memo", "to dana.reyes@example.com")))]
    assert [(l["arg"], l["sink_class"]) for l in find_action_leaks(policed, case)] == [("memo", "free_text")]
    assert apply_sink_policy(actions, []) == actions


def test_pick_option():
    options = ("Northwind Dental", "Harbor Dental")
    assert pick_option("Book Harbor Dental, not Northwind Dental.", options) == "Harbor Dental"
    assert pick_option("northwind dental it is", options) == "Northwind Dental"
    assert pick_option("No idea.", options) is None


def test_suite_names():
    assert get_suite_names("all") == ("memory", "tool", "agentdojo", "behavioral")
    assert get_suite_names("tool, memory") == ("tool", "memory")
    with pytest.raises(EvalError, match="'toolz'"):
        get_suite_names("memory,toolz")


# --- statistics -------------------------------------------------------------------------------


def test_mcnemar_without_discordant_pairs_reports_agreement():
    t = mcnemar_exact([True, False, True], [True, False, True])
    assert (t.p, t.agreement, t.test) == (1.0, "3/3", "mcnemar-exact")
    assert mcnemar_exact([], []).n == 0 and mcnemar_exact([], []).p is None


def test_mcnemar_is_a_binomial_test_on_discordant_pairs():
    a = [True] * 5 + [False] * 3
    b = [False] * 5 + [False] * 3
    t = mcnemar_exact(a, b)
    assert (t.a_only, t.b_only, t.agreement) == (5, 0, "3/8")
    assert t.p == pytest.approx(2 * 0.5**5)  # two-sided exact binomial, 5 of 5 discordant one way
    assert mcnemar_exact(b, a).p == pytest.approx(t.p)
    with pytest.raises(ValueError, match="length"):
        mcnemar_exact([True], [])


def test_wilcoxon_and_identical():
    assert wilcoxon_signed_rank([1.0, 2.0], [1.0, 2.0]).p == 1.0
    t = wilcoxon_signed_rank([10.0, 11, 12, 13, 14, 15, 16, 17], [1.0, 2, 3, 4, 5, 6, 7, 8])
    assert t.p < 0.01 and t.a_only == 8
    same = identical(4, "no memory record carries the target")
    assert same.test == "identical" and same.agreement == "4/4" and same.p is None


def test_bootstrap_ci_is_seeded_and_brackets_the_mean():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    lo, hi = bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) == (lo, hi)
    assert lo <= sum(values) / len(values) <= hi and 0 <= lo < hi <= 1
    assert bootstrap_ci([], seed=0) is None
    assert bootstrap_ci([2.0, 2.0]) == (2.0, 2.0)
    assert not math.isnan(lo)


def test_generate_cases_names_a_missing_optional_suite(monkeypatch):
    from unsee.impl.eval import suites
    from unsee.impl.eval.run import generate_cases

    def generate_suite(name, n, seed=0):
        if name == "agentdojo":
            raise ImportError("the 'agentdojo' suite needs the optional package agentdojo")
        return [make_case()] * n

    monkeypatch.setattr(suites, "generate_suite", generate_suite, raising=False)
    with pytest.raises(EvalError, match="suite 'agentdojo' cannot be generated here: .*optional package"):
        generate_cases("agentdojo", 1)
    with pytest.raises(EvalError, match="suite 'agentdojo' cannot be generated here"):
        generate_cases("all", 2)  # not skipped under all: a run without it would look complete
    assert len(generate_cases("memory,tool", 2)) == 4
    with pytest.raises(EvalError, match="positive integer"):
        generate_cases("memory", 0)


def test_n_for_power_of_a_half_sd_effect():
    from unsee.impl.eval.stats import compute_n_for_power

    # differences -0.5, 0.5, 1.5: mean 0.5, sd 1, so d = 0.5; the normal approximation
    # gives 31.4 pairs for a t test, over Wilcoxon's efficiency 3/pi: 32.9, so 33
    d, n = compute_n_for_power([0.5, 1.5, 2.5], [1.0, 1.0, 1.0])
    assert d == pytest.approx(0.5) and n == 33
    assert compute_n_for_power([1.0, 0.0, 1.0], [1.5, 0.5, 0.5])[1] is None  # farther on average: no
    assert compute_n_for_power([1.0], [0.0]) == (None, None)  # one pair: no spread to measure
    assert compute_n_for_power([1.0, 2.0], [0.0, 1.0]) == (None, None)  # no spread
