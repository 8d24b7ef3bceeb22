"""The suite's releases, tiers and baselines (issue 53; impl/conform/suite.py,
result.py, docs/conformance.md "Suite versions, tiers and baselines").

A third party pins a release in its CI with a baseline and gets a tier, a
badge and a result file: :func:`test_a_third_party_pins_a_release_with_a_baseline`
runs exactly the files docs/conformance.md shows, through the command line,
without torch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unsee.impl.cli.main import main
from unsee.impl.conform.checks import (
    ANSWERED,
    ATTENDED_CHECKS,
    ATTENDED_STATE,
    ATTENDED_TURNS,
    CHECKS,
    FAIL,
    FORGET_TWIN_DIGEST,
    FORGET_TWIN_TURNS,
    NA,
    PASS,
    RESIDUE,
    check_attended,
)
from unsee.impl.conform.result import Baseline, compare_baseline, get_verdict, read_baseline
from unsee.impl.conform.suite import (
    CORE_CHECKS,
    LATEST,
    RELEASES,
    SUITES_DIR,
    compute_case_digest,
    compute_suite_digest,
    compute_tier,
    verify_digests,
)

DOCS = Path(__file__).parent.parent / "docs" / "conformance.md"
#: A release is never rewritten: its digest is pinned here when it ships.
RELEASED = {"1.0.0": "e29cd9950b2cdfcd4258157cfbaa2af01638edaf739133c8cb5865c9a044b11d",
            "1.1.0": "005166fc519cac7dd0b33ff040c6d453e1effccaabeb88ac2e704c77739a70ea"}


def manifest(version: str) -> dict:
    return json.loads((SUITES_DIR / version / "manifest.json").read_text())


@pytest.mark.parametrize("version", list(RELEASES))
def test_each_release_folder_is_the_release(version):
    suite = manifest(version)["suite"]
    assert suite["version"] == version and tuple(suite["checks"]) == RELEASES[version].checks
    assert {c: compute_case_digest(SUITES_DIR / version / c) for c in manifest(version)["cases"]} == suite["digests"]
    assert compute_suite_digest(suite["digests"]) == suite["digest"]
    assert set(RELEASES[version].checks) <= set(CHECKS) and LATEST in RELEASES


def test_a_released_folder_is_never_rewritten(tmp_path):
    """1.1.0 holds every case of 1.0.0 unchanged; 1.0.0's digest is the one it
    shipped with; a case edited after release is refused (exit 2), naming it."""
    old, new = manifest("1.0.0")["suite"], manifest("1.1.0")["suite"]
    assert {v: manifest(v)["suite"]["digest"] for v in RELEASES} == RELEASED
    assert {c: d for c, d in new["digests"].items() if c in old["digests"]} == old["digests"]
    assert set(RELEASES["1.1.0"].checks) - set(RELEASES["1.0.0"].checks) == set(ATTENDED_CHECKS)
    shutil.copytree(SUITES_DIR / "1.0.0", tmp_path / "v")
    case = manifest("1.0.0")["cases"][0]
    expected = tmp_path / "v" / case / "expected.json"
    expected.write_text(expected.read_text().replace('"tau": 1', '"tau": 2'))
    with pytest.raises(ValueError, match=f"case {case}'s files do not match the digest of suite 1.0.0"):
        verify_digests(tmp_path / "v", manifest("1.0.0"))


def test_an_old_release_still_runs_and_is_judged_by_its_own_checks(tmp_path, capsys):
    """``--suite-version 1.0.0`` after 1.1.0 shipped: 1.0.0's vectors, 1.0.0's
    checks (no attended-span check in its result), and the same verdict."""
    entry = "unsee.impl.conform.vectors:recorded"
    for version in ("1.0.0", "1.1.0"):
        assert main(["conform", "--suite-version", version, "--entry", entry, "--out", str(tmp_path / version)]) == 0
        result = json.loads((tmp_path / version / "result.json").read_text())
        assert result["suite"]["version"] == version and result["suite"]["digest"] == manifest(version)["suite"][
            "digest"]
        assert set(result["checks"]) == {ANSWERED, *RELEASES[version].checks}
        assert sorted(result["cases"]) == sorted(manifest(version)["cases"])
        assert (tmp_path / version / "badge.svg").read_text().startswith("<svg")
    out = capsys.readouterr().out
    assert "suite 1.0.0 (vectors, 3 case(s)): Tier 1" in out and "suite 1.1.0 (vectors, 7 case(s)): Tier 1" in out
    assert main(["conform", "--suite-version", "0.9.0", "--entry", entry, "--out", str(tmp_path)]) == 2
    assert "--suite-version '0.9.0': no such release; the releases are 1.0.0, 1.1.0" in capsys.readouterr().err


# --- tiers ------------------------------------------------------------------------------------

def statuses(failed=(), na=(), total=20) -> dict[str, str]:
    names = [ANSWERED, *CHECKS][:total]
    return {n: FAIL if n in failed else NA if n in na else PASS for n in names}


@pytest.mark.parametrize("failed, na, tier", [
    ((), (), 1),
    ((), (RESIDUE,), 1),  # N/A counts neither way
    ((RESIDUE,), (), 2),  # 19/20, core intact
    ((RESIDUE, ATTENDED_TURNS, ATTENDED_STATE, "reopen = forget"), (), 2),  # 16/20 = 80% exactly
    ((RESIDUE, ATTENDED_TURNS, ATTENDED_STATE, "reopen = forget", "idempotent (second forget)"), (), 3),  # 75%
    ((FORGET_TWIN_TURNS,), (), 3),  # 95%, but a core check failed
    ((ANSWERED,), (), 3),
])
def test_the_tiers_at_their_edges(failed, na, tier):
    got = statuses(failed, na, total=len(CHECKS) + 1)
    got = {n: s for n, s in got.items() if n not in ("run turns = reference", "counterfactual turns = reference",
                                                      "effects once (A3)")}  # 20 applicable
    assert len(got) == 20 and compute_tier(got) == tier
    assert set(CORE_CHECKS) >= {ANSWERED, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST}


def test_an_implementation_that_answered_nothing_applicable_is_not_tier_1():
    assert compute_tier({n: NA for n in CHECKS}) == 3


# --- the attended span ---------------------------------------------------------------------------

def test_attended_checks_fail_a_forget_that_keeps_the_later_turns():
    run = {"turns": {"t1": [1], "t2": [5, 6], "t3": [7]}, "digest": "a"}
    twin = {"turns": {"t1": [1], "t2": [8, 9], "t3": [7]}, "digest": "b"}
    kept_later = {"turns": run["turns"], "digest_after": "c"}  # dropped the target's rows, kept what read it
    turns, state = check_attended(run, kept_later, twin, ("t2", "t3"), True)
    assert (turns.status, state.status) == (FAIL, FAIL) and turns.name == ATTENDED_TURNS
    exact = {"turns": twin["turns"], "digest_after": "b"}
    assert [c.status for c in check_attended(run, exact, twin, ("t2", "t3"), True)] == [PASS, PASS]
    # the target changed no later token: tokens cannot show it (N/A), the state still can
    same = {"turns": twin["turns"], "digest": "a"}
    assert [c.status for c in check_attended(same, kept_later, twin, ("t2", "t3"), True)] == [NA, FAIL]
    assert [c.status for c in check_attended(run, exact, twin, (), False)] == [NA, NA]


# --- baselines -------------------------------------------------------------------------------

def test_a_baseline_entry_is_named_and_checked(tmp_path):
    path = tmp_path / "b.yml"
    path.write_text("suite: 1.1.0\nexpected_failures:\n  - residue (kep)\n")
    with pytest.raises(ValueError, match=r"'residue \(kep\)' is no check of suite 1.1.0; did you mean "
                                         r"'residue \(kept\)'"):
        read_baseline(path, "1.1.0")
    path.write_text("suite: 1.0.0\nexpected_failures: []\n")
    with pytest.raises(ValueError, match="made for suite 1.0.0, this run is suite 1.1.0"):
        read_baseline(path, "1.1.0")
    path.write_text(f"expected_failures: [{ATTENDED_TURNS!r}]\n")
    with pytest.raises(ValueError, match="is no check of suite 1.0.0"):  # the family is 1.1.0's
        read_baseline(path, "1.0.0")
    assert read_baseline(path, "1.1.0").expected == {ATTENDED_TURNS}
    (tmp_path / "b.json").write_text(json.dumps({"expected_failures": [RESIDUE]}))
    assert read_baseline(tmp_path / "b.json", "1.0.0").expected == {RESIDUE}


def test_the_baseline_verdict():
    result = {"checks": {RESIDUE: FAIL, FORGET_TWIN_TURNS: PASS, ATTENDED_TURNS: NA}}
    for expected, strict, passes in (({RESIDUE}, False, True), (set(), False, False),
                                     ({RESIDUE, FORGET_TWIN_TURNS}, False, True),
                                     ({RESIDUE, FORGET_TWIN_TURNS}, True, False),
                                     ({RESIDUE, ATTENDED_TURNS}, True, False), ({RESIDUE}, True, True)):
        baseline = Baseline("b.yml", frozenset(expected))
        result["baseline"] = compare_baseline(result["checks"], baseline)
        assert get_verdict(result, baseline, strict) is passes, (expected, strict)
    assert get_verdict(result, None, False) is False


# --- the third party, as docs/conformance.md shows it ---------------------------------------------

def get_docs_block(marker: str) -> str:
    """The fenced block after ``<!-- marker -->`` in docs/conformance.md."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\s*```\w*\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert found, f"docs/conformance.md has no block marked {marker}"
    return found.group(1)


#: The adopter's process: torch and transformers raise on import, then the documented command line runs.
ADOPTER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
from unsee.impl.cli.main import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if m.startswith(('torch', 'transformers'))]
sys.exit(code)
"""


def run_adopter(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{tmp_path}:" + ":".join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", ADOPTER, *argv], cwd=tmp_path, env=env, check=False,
                          capture_output=True, text=True, timeout=300)


def test_a_third_party_pins_a_release_with_a_baseline(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "unsee_adapter.py").write_text(get_docs_block("adopter-adapter"))
    (tmp_path / "expected-failures.yml").write_text(get_docs_block("adopter-baseline"))
    command = get_docs_block("adopter-ci").strip().splitlines()[-1].split()
    assert command[:2] == ["unsee", "conform"] and "--suite-version" in command and "--baseline" in command
    done = run_adopter(tmp_path, command[1:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "conformance" / "result.json").read_text())
    assert result["suite"]["version"] == "1.1.0" and result["tier"] == 3
    assert result["baseline"]["new"] == [] and set(result["baseline"]["expected"]) >= {FORGET_TWIN_TURNS,
                                                                                        ATTENDED_TURNS}
    assert "suite 1.1.0 (vectors, 7 case(s)): Tier 3:" in done.stdout
    badge = (tmp_path / "conformance" / "badge.svg").read_text()
    assert "unsee conform 1.1.0" in badge and f"tier 3 \u00b7 {result['passed']}/{result['applicable']}" in badge
    # the baseline emptied: the same failures now fail CI, named
    (tmp_path / "expected-failures.yml").write_text("suite: 1.1.0\nexpected_failures: []\n")
    done = run_adopter(tmp_path, command[1:])
    assert done.returncode == 1 and f"NEW failures: {FORGET_TWIN_TURNS}" in done.stdout, done.stdout[-2000:]
    # a listed check that passes: reported; under --strict it fails the run
    listed = [*result["baseline"]["expected"], "tau (first_entry)"]
    (tmp_path / "expected-failures.yml").write_text(json.dumps({"expected_failures": listed}))
    done = run_adopter(tmp_path, command[1:])
    assert done.returncode == 0 and "now PASSING (remove them from the baseline): tau (first_entry)" in done.stdout
    assert run_adopter(tmp_path, [*command[1:], "--strict"]).returncode == 1
    # bad input exits 2 naming it, in the same torch-free process (no traceback from the error path)
    (tmp_path / "expected-failures.yml").write_text("expected_failures: [residue]\n")
    done = run_adopter(tmp_path, command[1:])
    assert done.returncode == 2 and "'residue' is no check of suite 1.1.0; did you mean 'residue (kept)'?" in \
        done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_the_docs_changelog_is_the_releases():
    from unsee.impl.conform.suite import render_changelog

    region = re.search(r"<!-- generated: releases [^\n]*-->\n(.*?)<!-- end: releases -->", DOCS.read_text(), re.DOTALL)
    assert region and region.group(1) == render_changelog()


def test_the_pytest_plugin_pins_a_release_with_a_baseline(tmp_path):
    """``pytest --unsee-suite-version X --unsee-baseline FILE``: the same verdict as the command line."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "unsee_adapter.py").write_text(get_docs_block("adopter-adapter"))
    (tmp_path / "expected-failures.yml").write_text(get_docs_block("adopter-baseline"))

    def pytest_run(*options: str) -> subprocess.CompletedProcess:
        env = {"PYTHONPATH": f"{tmp_path}:" + ":".join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--unsee-entry",
                               "mypkg.unsee_adapter:answer", "--unsee-suite-version", "1.1.0", *options],
                              cwd=tmp_path, env=env, check=False, capture_output=True, text=True, timeout=300)

    done = pytest_run("--unsee-baseline", "expected-failures.yml")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]
    # (without the baseline the same failures fail it, as the command line's run above shows)
    done = pytest_run("--unsee-baseline", "no-such.yml")
    assert done.returncode == 4 and "--baseline no-such.yml: cannot read it" in done.stderr, done.stderr[-2000:]
