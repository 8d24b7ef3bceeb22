"""Versioned test vectors (docs/conformance.md, "Test vectors"): episodes
with what the spec says of them and our reference's answers, in a folder any
implementation can be checked against without torch or our runtime.

Layout, version :data:`VECTORS_VERSION` (also written as README.md beside them)::

    manifest.json                 {"format": "unsee.conformance.vectors", "version": 1,
                                   "contract": ..., "contract_version": ..., "reference": {...}, "cases": [...]}
    <case>/episode.json           the episode; its target is what the forget request names
    <case>/counterfactual.json    the counterfactual episode the harness sends as a plain run
    <case>/expected.json          T, tau, boundary, the steps with a model turn (and before tau), the
                                  target's texts, whether a plan calls a tool, and the reference's turns
    <case>/answers.json           the reference's own answers to both requests (kept omitted)

Checking reads only these files and the implementation's answers; writing
them runs the reference (torch).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from unsee.impl.agent.episode import episode_to_json, load_episode, parse_episode
from unsee.impl.conform.ci import Run
from unsee.impl.conform.contract import CONTRACT, CONTRACT_VERSION, REFERENCE_ENGINE
from unsee.impl.conform.harness import (
    ConformanceInputError,
    Expected,
    Failure,
    Implementation,
    ImplementationError,
    Outcome,
    Record,
    check_answers,
    get_counterfactual_episode,
    read_result,
    write_failure,
)
from unsee.impl.conform.report import get_case_id, write_reports
from unsee.impl.conform.suite import get_release_checks, verify_digests

VECTORS_FORMAT = "unsee.conformance.vectors"
VECTORS_VERSION = 1
#: The model the vectors' reference answers were made with.
VECTORS_MODEL = "tiny"

README = """# unsee conformance test vectors, version {version}

Each folder is one case: `episode.json` (an episode file, docs/episode-format.md;
its `target.source` is what the forget request names), `counterfactual.json`
(the same episode with the target's item removed, sent as a plain run),
`expected.json` (what the spec says: `T`, `tau`, `boundary`, `turn_steps`,
`prefix_steps`, the target's texts `values`, `calls_tools`; and
`reference_turns`, our runtime's decoded tokens on engine {engine} with model
{model}, compared only when an implementation declares both), and
`answers.json` (the reference's answers to both requests, `kept` left out).

Check an implementation against them (no torch needed):
`unsee conform --vectors DIR --entry mypkg.adapter:answer` (or `-- CMD`).
`manifest.json` names the format, its version and the contract version; a
folder of another version is refused (exit 2).
"""


def _case_expected(expected: Expected, reference: dict) -> dict:
    return {"T": expected.length, "tau": expected.tau, "boundary": expected.boundary,
            "turn_steps": list(expected.turn_steps), "prefix_steps": list(expected.prefix_steps),
            "values": list(expected.values), "calls_tools": expected.calls_tools, "reference_turns": reference}


def _drop_kept(answer: dict) -> dict:
    for part in ("run", "forget"):
        if isinstance(answer.get(part), dict):
            answer[part].pop("kept", None)
    return answer


def write_vectors(directory: Path, count: int, max_steps: int = 3, seed: int | None = None) -> list[Path]:
    """Generate ``count`` episodes (derandomized unless ``seed``), answer them
    with the reference, and write the layout above."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as use_seed

    from unsee.impl.conform.episodes import episode_jsons

    drawn: list[dict] = []

    @settings(max_examples=count, derandomize=seed is None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(episode_jsons(1, max_steps))
    def collect(raw: dict) -> None:
        drawn.append(raw)

    (use_seed(seed)(collect) if seed is not None else collect)()
    return write_cases(directory, [parse_episode(raw) for raw in drawn])


def write_cases(directory: Path, episodes: Sequence) -> list[Path]:
    """Answer ``episodes`` with the reference (torch) and write them as the layout above."""
    from unsee.impl.conform.adapters import reference

    directory.mkdir(parents=True, exist_ok=True)
    cases: list[Path] = []
    for episode in episodes:
        folder = directory / get_case_id(episode)
        if folder in cases:
            continue
        folder.mkdir(exist_ok=True)
        target = episode.target.source
        original, twin = folder / "episode.json", folder / "counterfactual.json"
        original.write_text(json.dumps(episode_to_json(episode), indent=1) + "\n", encoding="utf-8")
        twin.write_text(json.dumps(episode_to_json(get_counterfactual_episode(episode, target)), indent=1) + "\n",
                        encoding="utf-8")
        answers = {"forget request": _drop_kept(reference(str(original), target, VECTORS_MODEL)),
                   "counterfactual run": _drop_kept(reference(str(twin), None, VECTORS_MODEL))}
        turns = {"run": answers["forget request"]["run"]["turns"],
                 "counterfactual": answers["counterfactual run"]["run"]["turns"]}
        _write_json(folder / "expected.json", _case_expected(Expected.of(episode, target), turns))
        _write_json(folder / "answers.json", answers)
        cases.append(folder)
    _write_json(directory / "manifest.json", {
        "format": VECTORS_FORMAT, "version": VECTORS_VERSION, "contract": CONTRACT,
        "contract_version": CONTRACT_VERSION, "reference": {"engine": REFERENCE_ENGINE, "model": VECTORS_MODEL},
        "cases": [c.name for c in cases]})
    (directory / "README.md").write_text(README.format(version=VECTORS_VERSION, engine=REFERENCE_ENGINE,
                                                       model=VECTORS_MODEL), encoding="utf-8")
    return cases


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(directory: Path) -> dict:
    """The manifest, refused (bad input, named) when missing or of another version."""
    path = directory / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConformanceInputError(f"--vectors {directory}: no readable manifest.json ({exc})") from None
    got = (manifest.get("format"), manifest.get("version"), manifest.get("contract_version"))
    if got != (VECTORS_FORMAT, VECTORS_VERSION, CONTRACT_VERSION):
        raise ConformanceInputError(
            f"--vectors {directory}: format {got[0]!r} version {got[1]!r} (contract {got[2]!r}); this unsee reads "
            f"{VECTORS_FORMAT!r} version {VECTORS_VERSION} (contract {CONTRACT_VERSION})")
    return manifest


def _expected(raw: dict, episode) -> Expected:
    at = {s.id: t for t, s in enumerate(episode.steps, start=1)}  # the later steps: by position, after tau
    return Expected(raw["T"], raw["tau"], raw["boundary"], tuple(raw["turn_steps"]), tuple(raw["prefix_steps"]),
                    tuple(raw["values"]), raw["calls_tools"], tuple(s for s in raw["turn_steps"] if at[s] > raw["tau"]),
                    raw["tau"] < raw["T"])


def check_case(implementation: Implementation, folder: Path, names: Sequence[str] | None = None) -> Record:
    """Ask both requests of one case and check the answers against its
    expected.json; ``names``: the checks of the suite version (default all)."""
    episode = load_episode(folder / "episode.json")
    raw = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    expected, target = _expected(raw, episode), episode.target.source
    answers: dict = {}
    try:
        answers["forget request"] = answer = read_result(
            implementation(folder / "episode.json", target), expected.turn_steps, target)
        answers["counterfactual run"] = twin = read_result(
            implementation(folder / "counterfactual.json", None), expected.turn_steps, None)
    except ImplementationError as exc:
        return Record(episode, error=str(exc), answers=answers)
    declared = {(a["implementation"]["engine"], a["implementation"]["model"]) for a in (answer, twin)}
    reference = None
    if declared == {(REFERENCE_ENGINE, VECTORS_MODEL)}:
        reference = (raw["reference_turns"]["run"], raw["reference_turns"]["counterfactual"])
    return Record(episode, tuple(check_answers(expected, answer, twin, reference, names)), answers=answers)


def check_vectors(implementation: Implementation, directory: Path, out: Path, reports: Sequence[str] = (),
                  report_dir: Path | None = None) -> Run:
    """Every case of the vectors; each failing one is written to ``out/<case>``.
    A release's folder (its manifest names a suite version) is checked for its
    case digests first and judged by that version's checks alone."""
    manifest = read_manifest(directory)
    verify_digests(directory, manifest)
    names = get_release_checks(manifest)
    outcomes, cases = [], []
    for name in manifest["cases"]:
        record = check_case(implementation, directory / name, names)
        failed = tuple(c for c in record.checks if not c.ok)
        if record.error is None and not failed:
            outcomes.append(Outcome(implementation, 1, records=(record,)))
            continue
        failure = Failure(record.episode, failed, record.error, record.answers)
        written, answers = write_failure(failure, (report_dir or out) / name)
        cases.append(written.parent)
        outcomes.append(Outcome(implementation, 1, failure, written, answers, records=(record,)))
    run = Run(implementation, tuple(outcomes), tuple(cases))
    if reports:
        write_reports(reports, report_dir if report_dir is not None else out, run.records, run)
    return run


def recorded(episode: str, forget: str | None = None) -> dict:
    """An implementation that answers from a case's answers.json (the
    reference's recorded answers): checks the vector path end to end without torch."""
    answers = json.loads((Path(episode).parent / "answers.json").read_text(encoding="utf-8"))
    return answers["forget request" if forget is not None else "counterfactual run"]



def main(argv: list[str] | None = None) -> int:
    """``python -m unsee.impl.conform.vectors DIR (--entry M:F | -- CMD)``: the
    vector check alone, importing neither torch nor our runtime (``unsee
    conform --vectors`` does the same through the whole CLI). Exit 0/1/2."""
    import argparse

    from unsee.impl.conform.harness import make_implementation
    from unsee.impl.conform.report import parse_formats

    parser = argparse.ArgumentParser(prog="python -m unsee.impl.conform.vectors")
    parser.add_argument("vectors", metavar="DIR")
    parser.add_argument("cmd", nargs="*", metavar="CMD")
    parser.add_argument("--entry", metavar="MODULE:FUNCTION")
    parser.add_argument("--out", default="unsee-conform", metavar="DIR")
    parser.add_argument("--report", metavar="FORMATS")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        reports = parse_formats(args.report) if args.report else ()
        run = check_vectors(make_implementation(args.cmd, args.entry, args.timeout), Path(args.vectors),
                            Path(args.out), reports)
    except ValueError as exc:  # ConformanceInputError: bad input, named
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(run.describe())
    return 0 if run.passed else 1


__all__ = ["README", "VECTORS_FORMAT", "VECTORS_MODEL", "VECTORS_VERSION", "check_case", "check_vectors",
           "main", "read_manifest", "recorded", "write_cases", "write_vectors"]

if __name__ == "__main__":
    sys.exit(main())
