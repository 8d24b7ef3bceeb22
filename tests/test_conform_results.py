"""The results table takes submissions (issue 53; impl/conform/results.py):
each result file under docs/results/ is re-verified from its own cases and
the release's vectors, docs/results.md is the table generated from them, and
our reference and the span-excision adapter are rerun against their vectors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from unsee.impl.conform.checks import ATTENDED_CHECKS, FAIL, PASS
from unsee.impl.conform.ci import judge_run
from unsee.impl.conform.harness import load_entry_point
from unsee.impl.conform.results import load_results, render_page, verify_result
from unsee.impl.conform.suite import get_suite_dir
from unsee.impl.conform.vectors import check_vectors, read_manifest

DOCS = Path(__file__).parent.parent / "docs"
RESULTS = load_results(DOCS / "results")


@pytest.mark.parametrize("path, result", RESULTS, ids=[p.stem for p, _ in RESULTS])
def test_each_committed_result_is_verified_from_its_cases_and_vectors(path, result):
    assert verify_result(result) == [], path


def test_the_results_page_is_generated_from_the_files():
    assert (DOCS / "results.md").read_text() == render_page(DOCS / "results")
    names = {r["implementation"]["options"] for _, r in RESULTS}
    assert "--entry unsee.impl.conform.adapters:reference" in names


def flip_one_case(result: dict) -> None:
    case = next(iter(result["cases"].values()))
    name = next(n for n, s in case["checks"].items() if s == PASS)
    case["checks"][name] = FAIL


@pytest.mark.parametrize("tamper, named", [
    (lambda r: r.update(passed=r["passed"] + 1), "passed: the file says"),
    (lambda r: r.update(tier=1 if r["tier"] != 1 else 2), "tier: the file says"),
    (flip_one_case, "checks: the file says"),
    (lambda r: next(iter(r["cases"].values())).update(digest="0" * 64), "digest 000"),
    (lambda r: r["cases"].pop(next(iter(r["cases"]))), "are not the release's"),
    (lambda r: r["suite"].update(digest="1" * 64), "suite digest 111"),
    (lambda r: r["suite"].update(mode="search"), "made by a search run"),
    (lambda r: r["suite"].update(version="9.9.9"), "suite version '9.9.9' is no release"),
])
def test_a_doctored_submission_is_refused_naming_what_differs(tamper, named):
    result = next(r for p, r in RESULTS if "reference-1.1.0" in p.name)
    doctored = copy.deepcopy(result)
    tamper(doctored)
    assert any(named in problem for problem in verify_result(doctored)), verify_result(doctored)


@pytest.mark.parametrize("entry, file", [("reference", "unsee-reference-1.1.0.json"),
                                         ("span_excision", "span-excision-1.1.0.json")])
def test_the_shipped_adapters_results_are_rerun(entry, file, tmp_path):
    """Rerun against release 1.1.0's vectors: the same statuses, case by case;
    span excision fails the attended-span family by name, the reference passes it."""
    vectors = get_suite_dir("1.1.0")
    run = check_vectors(load_entry_point(f"unsee.impl.conform.adapters:{entry}"), vectors, tmp_path / "out")
    verdict = judge_run(run, "1.1.0", "vectors", tmp_path, vectors=vectors, manifest=read_manifest(vectors))
    committed = json.loads((DOCS / "results" / file).read_text())
    assert verdict.result["cases"] == committed["cases"]
    assert {n: verdict.result["checks"][n] for n in ATTENDED_CHECKS} == {
        n: FAIL if entry == "span_excision" else PASS for n in ATTENDED_CHECKS}
