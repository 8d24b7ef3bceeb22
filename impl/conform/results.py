"""The results table (docs/results.md): one row per result file committed
under docs/results/, and the check that re-verifies each one.

A submission is a result file (``result.json`` of ``unsee conform
--suite-version X``, renamed) in a pull request. :func:`verify_result`
re-derives everything the table shows from the file's own cases, and checks
those cases against the release's vectors: the same suite digest, the same
cases, each case's digest, the release's checks and nothing else. CI runs it
over every committed file (tests/test_conform_results.py), and reruns our
reference against its vectors.

``python -m unsee.impl.conform.results [DIR]`` rewrites ``DIR/../results.md``
from ``DIR`` (default docs/results).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from unsee.impl.conform.checks import ANSWERED
from unsee.impl.conform.result import RESULT_FORMAT, RESULT_VERSION
from unsee.impl.conform.suite import RELEASES, compute_tally, get_suite_dir

HEADER = """# Conformance results

Each row is a result file under [results/](results/), made by `unsee conform
--suite-version X` against release X's vectors (docs/conformance.md, "Suite
versions, tiers and baselines"). The tier and the pass count are re-derived
from the file's cases, and the cases checked against the release's digests, by
`tests/test_conform_results.py` in CI; our reference is also rerun there.

**Submitting a result**: run `unsee conform --suite-version X --entry
your.adapter:answer --out out/`, copy `out/result.json` to
`docs/results/<your-implementation>.json`, run `python -m
unsee.impl.conform.results` to regenerate this page, and open a pull request
with both. A file whose counts, tier or case digests do not follow from its
own cases and the release is refused by CI, naming what differs.

This page is generated; do not edit it by hand.

"""


def verify_result(result: Mapping) -> list[str]:
    """What is wrong with a submitted result file (empty: it stands)."""
    if (result.get("format"), result.get("version")) != (RESULT_FORMAT, RESULT_VERSION):
        return [f"format {result.get('format')!r} version {result.get('version')!r}; expected "
                f"{RESULT_FORMAT!r} version {RESULT_VERSION}"]
    suite = result.get("suite") or {}
    if suite.get("version") not in RELEASES:
        return [f"suite version {suite.get('version')!r} is no release ({', '.join(RELEASES)})"]
    if suite.get("mode") != "vectors":
        return [f"made by a {suite.get('mode')} run: a submission is checked against a release's vectors"]
    manifest = json.loads((get_suite_dir(suite["version"]) / "manifest.json").read_text(encoding="utf-8"))["suite"]
    problems = []
    if suite.get("digest") != manifest["digest"]:
        problems.append(f"suite digest {suite.get('digest')} is not release {suite['version']}'s {manifest['digest']}")
    cases = result.get("cases") or {}
    if sorted(cases) != sorted(manifest["digests"]):
        problems.append(f"cases {sorted(cases)} are not the release's {sorted(manifest['digests'])}")
    names = {ANSWERED, *manifest["checks"]}
    for case, row in cases.items():
        if row.get("digest") != manifest["digests"].get(case):
            problems.append(f"case {case}: digest {row.get('digest')} is not the release's")
        extra = set(row.get("checks", {})) - names
        if extra:
            problems.append(f"case {case}: checks {sorted(extra)} are not in suite {suite['version']}")
    tally = compute_tally({c: r.get("checks", {}) for c, r in cases.items()}, manifest["checks"])
    derived = {"checks": tally.statuses, "passed": tally.passed, "applicable": tally.applicable, "tier": tally.tier}
    problems += [f"{key}: the file says {result.get(key)!r}, its cases give {value!r}"
                 for key, value in derived.items() if result.get(key) != value]
    return problems


def load_results(directory: Path) -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(directory.glob("*.json"))]


def render_results(results: list[tuple[Path, dict]], link_dir: str = "results") -> str:
    """The table: implementation, suite, tier, pass count, failed checks, result file."""
    lines = ["| implementation | suite | tier | checks passed | failed checks | result |",
             "|---|---|---:|---:|---|---|"]
    ordered = sorted(results, key=lambda r: (r[1]["tier"], -r[1]["passed"], r[1]["implementation"].get("name", "")))
    for path, result in ordered:
        impl = result["implementation"]
        name = impl.get("name") or impl.get("options", path.stem)
        failed = ", ".join(f"`{n}`" for n, s in result["checks"].items() if s == "fail") or "-"
        lines.append(f"| {name} (`{impl.get('options', '')}`) | {result['suite']['version']} | {result['tier']} | "
                     f"{result['passed']}/{result['applicable']} | {failed} | [{path.name}]({link_dir}/{path.name}) |")
    return "\n".join(lines) + "\n"


def render_page(directory: Path) -> str:
    return HEADER + render_results(load_results(directory))


def main(argv: list[str] | None = None) -> int:
    directory = Path(argv[0]) if argv else Path("docs/results")
    bad = {p.name: verify_result(r) for p, r in load_results(directory)}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        for name, problems in bad.items():
            print(f"error: {directory / name}: " + "; ".join(problems), file=sys.stderr)
        return 2
    (directory.parent / "results.md").write_text(render_page(directory), encoding="utf-8")
    print(f"wrote {directory.parent / 'results.md'}")
    return 0


__all__ = ["HEADER", "load_results", "main", "render_page", "render_results", "verify_result"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
