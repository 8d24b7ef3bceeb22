"""``make flake``'s report: every test that failed in any of the runs.

    python tests/flake_report.py out/flake/run-*.xml

Each file is one run's JUnit XML (pytest ``--junitxml``), named
``<name>-seed-<seed>.xml`` by the Makefile so that a failure can be replayed
with the seed it met. Prints one line per run (tests, failures, errors,
skipped) and then every test that failed or errored in at least one run,
with the runs it failed in, the first line of each message and the command
that replays it; exits 1 if there is any, 0 if every run passed.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read_run(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """One run's counts and its failed tests: node id -> the failure's first line."""
    root = ET.parse(path).getroot()
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: dict[str, str] = {}
    for case in root.iter("testcase"):
        counts["tests"] += 1
        for kid in case:
            if kid.tag in ("failure", "error"):
                counts["failures" if kid.tag == "failure" else "errors"] += 1
                node = get_node_id(case.get("classname", ""), case.get("name", ""))
                failed[node] = (kid.get("message") or kid.text or "").strip().splitlines()[0][:200] \
                    if (kid.get("message") or kid.text) else kid.tag
            elif kid.tag == "skipped":
                counts["skipped"] += 1
    return counts, failed


def get_node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case: the longest dotted prefix of its
    class name that is a file here, then the classes in it, then the test."""
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        if Path("/".join(parts[:k]) + ".py").is_file():
            return "::".join(["/".join(parts[:k]) + ".py", *parts[k:], name])
    return f"{'/'.join(parts)}.py::{name}"


def get_seed(path: Path) -> str | None:
    found = re.search(r"-seed-(\d+)", path.stem)
    return found.group(1) if found else None


def main(argv: list[str]) -> int:
    paths = sorted(Path(a) for a in argv)
    if not paths:
        print("usage: python tests/flake_report.py RUN.xml ...", file=sys.stderr)
        return 2
    flaky: dict[str, list[tuple[Path, str]]] = {}
    for path in paths:
        counts, failed = read_run(path)
        print(f"{path.name}: {counts['tests']} tests, {counts['failures']} failed, {counts['errors']} errors, "
              f"{counts['skipped']} skipped")
        for node, message in failed.items():
            flaky.setdefault(node, []).append((path, message))
    if not flaky:
        print(f"no test failed in any of the {len(paths)} runs")
        return 0
    print(f"\n{len(flaky)} test(s) failed in at least one of the {len(paths)} runs:")
    for node, runs in sorted(flaky.items()):
        print(f"- {node}: failed in {len(runs)} of {len(paths)} runs")
        for path, message in runs:
            seed = get_seed(path)
            replay = f"UNSEE_PROFILE=flake pytest '{node}'" + (f" --hypothesis-seed={seed}" if seed else "")
            print(f"    {path.name}: {message}\n      replay: {replay}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
