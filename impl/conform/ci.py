"""What ``unsee conform`` does for CI (docs/conformance.md, "In CI"): a
search that goes on to ``max_failures`` distinct failures, the failing cases
written as folders ``--replay`` reruns, and the reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from unsee.impl.conform.harness import (
    ConformanceInputError,
    Implementation,
    Outcome,
    check_file,
    search,
    write_failure,
)
from unsee.impl.conform.report import get_case_id, write_reports
from unsee.impl.conform.result import (
    Baseline,
    compare_baseline,
    describe_result,
    get_verdict,
    make_result,
    write_result,
)

#: The file of a case folder that ``--replay`` reruns (what :func:`write_failure` writes).
CASE_FILE = "counterexample.json"


@attrs.frozen
class Run:
    """Every search round (one per failure found, up to ``max_failures``)."""

    implementation: Implementation
    outcomes: tuple[Outcome, ...]
    cases: tuple[Path, ...] = ()  # the failing cases' folders, when a report directory was given

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def records(self) -> tuple:
        return tuple(r for o in self.outcomes for r in o.records)

    def describe(self) -> str:
        if self.passed:
            return f"CONFORMS: {sum(o.examples for o in self.outcomes)} episode(s) checked, every check held"
        text = "\n\n".join(o.describe() for o in self.outcomes if not o.passed)
        if self.cases:
            text += "\n" + "\n".join(f"replay          unsee conform --replay {c} "
                                     f"{' '.join(self.implementation.get_options())}" for c in self.cases)
        return text


def search_rounds(implementation: Implementation, out: Path, examples: int, max_steps: int, seed: int | None,
                  max_failures: int, reference: bool = True) -> tuple[Outcome, ...]:
    """Search; after a failure, search again from the next seed until
    ``max_failures`` distinct shrunk failures are found or a round passes."""
    if max_failures < 1:
        raise ConformanceInputError(f"--max-failures {max_failures}: must be at least 1")
    outcomes: list[Outcome] = []
    seen: set[str] = set()
    for round_ in range(max_failures * 3):  # a round may shrink to a failure already found
        round_seed = seed if round_ == 0 else (seed or 0) + round_
        outcome = search(implementation, out / f"round-{round_}" if round_ else out, examples, max_steps,
                         round_seed, reference=reference)
        if outcome.passed:
            return tuple(outcomes) if outcomes else (outcome,)
        case = get_case_id(outcome.failure.episode)
        if case not in seen:
            seen.add(case)
            outcomes.append(outcome)
        if len(outcomes) >= max_failures:
            break
    return tuple(outcomes)


def get_replay_file(path: str | Path) -> Path:
    """A case folder (or its episode file) -> the episode file to rerun."""
    path = Path(path)
    file = path / CASE_FILE if path.is_dir() else path
    if not file.is_file():
        raise ConformanceInputError(f"--replay {path}: no case there (expected a folder holding {CASE_FILE})")
    return file


def run_conform(implementation: Implementation, out: Path, *, examples: int = 10, max_steps: int = 6,
                seed: int | None = None, max_failures: int = 1, episode: str | Path | None = None,
                reference: bool = True, reports: Sequence[str] = (), report_dir: Path | None = None) -> Run:
    """One ``unsee conform``: an episode file (``episode``, a counterexample or a
    replayed case) or a search; with ``report_dir`` the reports and every
    failing case's folder (``<report_dir>/<case id>/``) are written there."""
    if episode is not None:
        outcomes: tuple[Outcome, ...] = (check_file(implementation, episode, out, reference),)
    else:
        outcomes = search_rounds(implementation, out, examples, max_steps, seed, max_failures, reference)
    cases = []
    if report_dir is not None:
        for outcome in outcomes:
            if not outcome.passed:
                folder = report_dir / get_case_id(outcome.failure.episode)
                write_failure(outcome.failure, folder)
                cases.append(folder)
    run = Run(implementation, outcomes, tuple(cases))
    if reports:
        write_reports(reports, report_dir if report_dir is not None else out, run.records, run)
    return run


@attrs.frozen
class Verdict:
    """A run judged by a suite version: its result file (tier, pass count),
    what it says of the baseline, and whether CI passes."""

    result: dict
    passed: bool
    text: str


def judge_run(run: Run, version: str, mode: str, directory: Path, baseline: Baseline | None = None,
              strict: bool = False, vectors: Path | None = None, manifest: dict | None = None) -> Verdict:
    """The run's result by release ``version``, written with its badge to
    ``directory``; CI passes when nothing failed beyond ``baseline``."""
    result = make_result(run.records, run.implementation.get_options(), version, mode, vectors, manifest)
    if baseline is not None:
        result["baseline"] = {"file": baseline.path, **compare_baseline(result["checks"], baseline)}
    written = write_result(directory, result)
    return Verdict(result, get_verdict(result, baseline, strict), describe_result(result, baseline, written))


__all__ = ["CASE_FILE", "Run", "Verdict", "get_replay_file", "judge_run", "run_conform", "search_rounds"]
