"""``unsee conform`` for CI: reports (JUnit XML, JSON), replay of a stored
case, exit codes on bad input, the pytest plugin, and the versioned test
vectors (checked without torch)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from unsee.impl.cli.main import main
from unsee.impl.conform.checks import AFTERMATH_CHECKS, CHECKS, FORGET_TWIN_DIGEST
from unsee.impl.conform.harness import load_entry_point
from unsee.impl.conform.suite import SUITES_DIR
from unsee.impl.conform.vectors import check_vectors

ADAPTERS = "unsee.impl.conform.adapters"
VECTORS = SUITES_DIR / "1.0.0"
ONE_STEP = {"format": "unsee.episode", "version": 2, "system": "Be brief.",
            "settings": {"max_new_tokens": 2, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
            "steps": [{"id": "t1", "kind": "user", "text": "hi"},
                      {"id": "t2", "kind": "user", "source": "secret", "text": "4417 Elm"}],
            "target": {"source": "secret", "value": "4417 Elm"}}


def check_junit(path: Path) -> dict[str, dict[str, str]]:
    """The structure JUnit consumers read: <testsuites> of <testsuite>s of
    <testcase classname name> with at most one <failure>/<skipped>/<error>,
    the counts on both levels equal to what the cases hold. Returns case ->
    check -> status."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    out: dict[str, dict[str, str]] = {}
    totals = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name")
        counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
        for case in suite:
            assert case.tag == "testcase" and case.get("classname") and case.get("name")
            assert float(case.get("time")) >= 0
            kids = [k.tag for k in case]
            assert len(kids) <= 1 and set(kids) <= {"failure", "skipped", "error"}
            counts["tests"] += 1
            status = {"failure": "fail", "skipped": "n/a", "error": "error"}.get(kids[0] if kids else "", "pass")
            counts.update({k: counts[k] + 1 for k, tag in (("failures", "fail"), ("skipped", "n/a"),
                                                            ("errors", "error")) if status == tag})
            checks = out.setdefault(case.get("classname"), {})
            assert case.get("name") not in checks  # one test case per episode x check
            checks[case.get("name")] = status
        assert {k: int(suite.get(k)) for k in counts} == counts
        totals = {k: totals[k] + counts[k] for k in totals}
    assert {k: int(root.get(k)) for k in totals} == totals
    return out


def test_junit_and_json_reports_and_the_replay_of_a_stored_case(tmp_path, capsys):
    episode = tmp_path / "e.json"
    episode.write_text(json.dumps(ONE_STEP))
    reports = tmp_path / "reports"
    entry = f"{ADAPTERS}:memory"
    assert main(["conform", "--episode", str(episode), "--entry", entry, "--report", "junit,json",
                 "--report-dir", str(reports), "--out", str(tmp_path / "out")]) == 1
    cases = check_junit(reports / "junit.xml")
    [(case, checks)] = cases.items()
    assert set(checks) <= set(CHECKS)  # a test case is named by a check's constant
    assert checks[FORGET_TWIN_DIGEST] == "fail"
    assert {checks[n] for n in AFTERMATH_CHECKS} == {"n/a"}  # memory keeps nothing it reports
    report = json.loads((reports / "report.json").read_text())
    assert report["passed"] is False and [c["case"] for c in report["cases"]] == [case.split(".")[-1]]
    folder = reports / case.split(".")[-1]
    assert f"replay          unsee conform --replay {folder} --entry {entry}" in capsys.readouterr().out
    assert main(["conform", "--replay", str(folder), "--entry", entry, "--out", str(tmp_path / "again")]) == 1
    assert "FAILED forget = counterfactual: digest" in capsys.readouterr().out
    # the reference: every test case passes or is N/A; nothing is written but the reports
    assert main(["conform", "--episode", str(episode), "--entry", f"{ADAPTERS}:reference", "--report", "junit",
                 "--report-dir", str(tmp_path / "ok")]) == 0
    statuses = {s for checks in check_junit(tmp_path / "ok" / "junit.xml").values() for s in checks.values()}
    assert statuses <= {"pass", "n/a"} and "pass" in statuses


@pytest.mark.parametrize("argv, named", [
    (["--entry", "no_such_module_xyz:answer"], "cannot import 'no_such_module_xyz'"),
    (["--", "no-such-unsee-adapter-cmd"], "cannot run 'no-such-unsee-adapter-cmd'"),
    (["--entry", f"{ADAPTERS}:reference", "--report", "xml"], "--report 'xml'"),
    (["--entry", f"{ADAPTERS}:reference", "--max-failures", "0"], "--max-failures 0"),
    (["--entry", f"{ADAPTERS}:reference", "--replay", "no/such/case"], "--replay no/such/case"),
])
def test_bad_input_exits_2_naming_it(argv, named, tmp_path, capsys):
    assert main(["conform", "--episodes", "1", "--out", str(tmp_path), *argv]) == 2
    assert named in capsys.readouterr().err


def test_vectors_of_another_version_exit_2_naming_the_folder(tmp_path, capsys):
    shutil.copytree(VECTORS, tmp_path / "v")
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    (tmp_path / "v" / "manifest.json").write_text(json.dumps(manifest | {"version": 2}))
    assert main(["conform", "--vectors", str(tmp_path / "v"), "--entry", "unsee.impl.conform.vectors:recorded"]) == 2
    assert f"--vectors {tmp_path / 'v'}: format 'unsee.conformance.vectors' version 2" in capsys.readouterr().err


def test_the_reference_passes_the_committed_vectors(tmp_path):
    run = check_vectors(load_entry_point(f"{ADAPTERS}:reference"), VECTORS, tmp_path)
    assert run.passed, run.describe()
    assert len(run.outcomes) == len(json.loads((VECTORS / "manifest.json").read_text())["cases"]) >= 3
    # the token comparison with the recorded reference turns ran on every case
    assert all("run turns = reference" in {c.name for c in r.checks} for r in run.records)


#: Run in a subprocess: ``import torch`` (and our runtime) raise, then the vector check runs.
NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers') or name == 'unsee.impl.agent.runtime':
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
from unsee.impl.conform.vectors import main
code = main([sys.argv[1], '--entry', 'unsee.impl.conform.vectors:recorded', '--out', sys.argv[2],
             '--report', 'junit'])
assert not [m for m in sys.modules if m.startswith(('torch', 'transformers', 'unsee.impl.agent.runtime'))]
sys.exit(code)
"""


def test_vectors_check_an_implementation_without_torch(tmp_path):
    def run(vectors):
        return subprocess.run([sys.executable, "-c", NO_TORCH, str(vectors), str(tmp_path / vectors.name)],
                              check=False, capture_output=True, text=True, timeout=300)

    done = run(VECTORS)
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.startswith("CONFORMS: 3 episode(s)")
    # a wrong recorded answer is caught on the same path, still without torch
    tampered = tmp_path / "tampered"
    shutil.copytree(VECTORS, tampered)
    case = next(p for p in tampered.iterdir() if p.is_dir())
    answers = json.loads((case / "answers.json").read_text())
    answers["forget request"]["forget"]["digest_after"] = "0" * 64
    (case / "answers.json").write_text(json.dumps(answers))
    done = run(tampered)
    assert done.returncode == 1, done.stderr + done.stdout
    assert "FAILED forget = counterfactual: digest" in done.stdout


#: The same through the command line, ``unsee conform --vectors``: torch and transformers raise.
NO_TORCH_CLI = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
from unsee.impl.cli.main import main
code = main(['conform', '--vectors', sys.argv[1], '--entry', 'unsee.impl.conform.vectors:recorded',
             '--out', sys.argv[2]])
assert not [m for m in sys.modules if m.startswith(('torch', 'transformers'))]
sys.exit(code)
"""


def test_unsee_conform_vectors_needs_no_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_TORCH_CLI, str(VECTORS), str(tmp_path / "out")],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.startswith("CONFORMS: 3 episode(s)")


def pytest_run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    """pytest in an empty folder with the plugin's options (the pytest11 entry point loads it)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--unsee-episodes", "2",
                           *options], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_the_pytest_plugin_passes_the_reference_and_fails_memory(tmp_path):
    done = pytest_run(tmp_path, "--unsee-entry", f"{ADAPTERS}:reference")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]
    done = pytest_run(tmp_path, "--unsee-entry", f"{ADAPTERS}:memory")
    assert done.returncode == 1 and "FAILED ::unsee-conform" in done.stdout, done.stdout[-3000:]
    assert "REJECTED after" in done.stdout and "rerun           unsee conform --episode" in done.stdout
    done = pytest_run(tmp_path, "--unsee-entry", "no_such_module_xyz:answer")
    assert done.returncode == 4 and "cannot import 'no_such_module_xyz'" in done.stderr
    done = pytest_run(tmp_path, "--unsee-command", "no-such-unsee-adapter --x")
    assert done.returncode == 4 and "no command 'no-such-unsee-adapter' found" in done.stderr


def answers_nothing(episode: str, forget: str | None = None) -> dict:
    return {}


def test_max_failures_searches_on_and_counts_a_shrunk_failure_once(tmp_path):
    """Every episode fails the same way, so every round shrinks to the same
    case: it is counted once, and the rounds end (at most 3 per failure asked)."""
    from unsee.impl.conform.ci import search_rounds
    from unsee.impl.conform.harness import EntryPointImplementation

    broken = EntryPointImplementation("tests:answers_nothing", answers_nothing)
    assert len(search_rounds(broken, tmp_path, 2, 2, None, max_failures=1)) == 1
    outcomes = search_rounds(broken, tmp_path, 2, 2, 5, max_failures=2)
    assert len(outcomes) == 1 and not outcomes[0].passed
    assert (tmp_path / "round-1").exists()  # it searched on after the first failure
