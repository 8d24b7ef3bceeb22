"""Making a suite release (:mod:`unsee.impl.conform.suite`): the attended-span
episodes of 1.1.0, and the folder of a release assembled from vector folders.

``python -m unsee.impl.conform.release`` rebuilds ``suites/1.1.0`` from
``suites/1.0.0``'s cases and the attended-span episodes (answered by the
reference: torch). A released folder is never rewritten: a change to its
cases is a new version (tests/test_conform_suite.py pins each folder's digest).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from unsee.impl.agent.episode import parse_episode
from unsee.impl.conform.suite import SUITES_DIR, compute_case_digest, compute_suite_digest, get_release
from unsee.impl.conform.vectors import read_manifest, write_cases

_SETTINGS = {"max_new_tokens": 4, "temperature": 0.0, "seed": 0}
_TARGET = {"source": "secret", "value": "4417 Elm"}


def _episode(policy: str, steps: list[dict]) -> dict:
    return {"format": "unsee.episode", "version": 2, "system": "Be brief.",
            "settings": {**_SETTINGS, "checkpoint_policy": policy}, "steps": steps, "target": dict(_TARGET)}


#: The attended-span episodes: the target enters, and later turns read it,
#: say it in other words, or compute from it. A forget that cuts out only the
#: target's own tokens or KV rows keeps those turns and the positions they wrote.
ATTENDED_EPISODES = {
    "paraphrase": _episode("every_turn", [
        {"id": "t1", "kind": "user", "source": "secret", "text": "I live at 4417 Elm."},
        {"id": "t2", "kind": "user", "text": "Say my address again in other words."},
        {"id": "t3", "kind": "user", "text": "Which street was that?"}]),
    "compute": _episode("before_injection", [
        {"id": "t1", "kind": "user", "text": "Hi."},
        {"id": "t2", "kind": "memory", "records": [{"source": "secret", "text": "4417 Elm"},
                                                   {"source": "m2", "text": "door code 12"}]},
        {"id": "t3", "kind": "user", "text": "Add one to the house number."}]),
    "tool result": _episode("session_start", [
        {"id": "t1", "kind": "tool", "tool": "search", "fields": [{"source": "secret", "text": "4417 Elm"}]},
        {"id": "t2", "kind": "user", "text": "Double the number you found."},
        {"id": "t3", "kind": "user", "text": "Now spell it out."}]),
    "mid-conversation": _episode("every_turn", [
        {"id": "t1", "kind": "user", "text": "Remember things for me."},
        {"id": "t2", "kind": "user", "source": "secret", "text": "My house is 4417 Elm."},
        {"id": "t3", "kind": "user", "text": "What is the number minus ten?"},
        {"id": "t4", "kind": "user", "text": "Thanks."}]),
}


def write_release(version: str, directory: Path, sources: Sequence[Path]) -> list[str]:
    """Assemble release ``version`` in ``directory`` from vector folders
    ``sources`` (their cases, in order): the cases copied, the manifest
    extended with the suite's version, checks and digests."""
    release = get_release(version)
    directory.mkdir(parents=True, exist_ok=True)
    cases: list[str] = []
    first: dict = {}
    for source in sources:
        manifest = read_manifest(source)
        first = first or manifest
        for case in manifest["cases"]:
            if case not in cases:
                shutil.copytree(source / case, directory / case, dirs_exist_ok=True)
                cases.append(case)
    digests = {c: compute_case_digest(directory / c) for c in cases}
    manifest = {**{k: v for k, v in first.items() if k != "suite"}, "cases": cases,
                "suite": {"version": version, "checks": list(release.checks), "digests": digests,
                          "digest": compute_suite_digest(digests)}}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if (sources[0] / "README.md").exists():
        shutil.copyfile(sources[0] / "README.md", directory / "README.md")
    return cases


def main(argv: list[str] | None = None) -> int:
    """Rebuild ``suites/1.1.0`` (default) from 1.0.0 and the attended-span episodes."""
    out = Path(argv[0]) if argv else SUITES_DIR / "1.1.0"
    with tempfile.TemporaryDirectory(prefix="unsee-release-") as tmp:
        attended = Path(tmp) / "attended"
        write_cases(attended, [parse_episode(raw) for raw in ATTENDED_EPISODES.values()])
        cases = write_release("1.1.0", out, [SUITES_DIR / "1.0.0", attended])
    print(f"wrote suite 1.1.0 ({len(cases)} cases) to {out}")
    return 0


__all__ = ["ATTENDED_EPISODES", "main", "write_release"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
