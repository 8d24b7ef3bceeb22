"""``make flake``'s report (tests/flake_report.py): every test that failed in
any run, with the seed that replays it; exit 1 if there is one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).with_name("flake_report.py")


def junit(path: Path, failed: bool) -> Path:
    failure = '<failure message="AssertionError: assert 1 == 2">trace</failure>' if failed else ""
    path.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2">'
                    '<testcase classname="tests.test_a" name="test_ok" time="0.1"/>'
                    f'<testcase classname="tests.test_a" name="test_sometimes" time="0.1">{failure}</testcase>'
                    '<testcase classname="tests.test_b" name="test_skip" time="0"><skipped message="no"/></testcase>'
                    '</testsuite></testsuites>')
    return path


def report(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *map(str, paths)], capture_output=True, text=True,
                          check=False, timeout=60)


def test_a_test_that_failed_in_one_run_is_reported_with_its_seed(tmp_path):
    done = report(junit(tmp_path / "run-1-seed-11.xml", False), junit(tmp_path / "run-2-seed-22.xml", True))
    assert done.returncode == 1, done.stdout
    assert "run-2-seed-22.xml: 3 tests, 1 failed, 0 errors, 1 skipped" in done.stdout
    assert "- tests/test_a.py::test_sometimes: failed in 1 of 2 runs" in done.stdout
    assert "AssertionError: assert 1 == 2" in done.stdout
    assert "replay: UNSEE_PROFILE=flake pytest 'tests/test_a.py::test_sometimes' --hypothesis-seed=22" in done.stdout


def test_runs_that_all_passed_report_no_flake(tmp_path):
    done = report(junit(tmp_path / "run-1-seed-1.xml", False), junit(tmp_path / "run-2-seed-2.xml", False))
    assert done.returncode == 0 and "no test failed in any of the 2 runs" in done.stdout
