"""A run's result file, its badge and an adopter's baseline (docs/conformance.md,
"Suite versions, tiers and baselines").

- ``result.json``: the suite version (and, for a vectors run, the release's
  digest and each case's), the implementation, each check's one status, the
  pass count, the tier, and every case's statuses, from which the rest is
  re-derived (:func:`unsee.impl.conform.results.verify_result`);
- ``badge.svg``: the tier and the pass count, for a README;
- a baseline (``--baseline FILE``, YAML or JSON): the checks an adopter
  expects to fail. A listed check that fails does not fail the run; one not
  listed does; a listed check that passes (or is N/A) is reported as stale,
  and fails the run under ``--strict``.

Pure Python: no torch, no runtime import.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import attrs

from unsee.impl.conform.answers import ConformanceInputError
from unsee.impl.conform.checks import ANSWERED, FAIL, NA, PASS
from unsee.impl.conform.contract import CONTRACT_VERSION
from unsee.impl.conform.report import get_rows
from unsee.impl.conform.suite import TIERS, Tally, compute_case_digest, compute_tally, get_release

RESULT_FORMAT = "unsee.conformance.result"
RESULT_VERSION = 1
RESULT_FILE, BADGE_FILE = "result.json", "badge.svg"
#: The badge's colour per tier (shields.io's palette).
TIER_COLOURS = {1: "#4c1", 2: "#a4a61d", 3: "#e05d44"}


# --- the result file ----------------------------------------------------------------------

def get_case_statuses(records: Sequence) -> dict[str, dict[str, str]]:
    """case id -> check -> status, one row per distinct episode (the reports' rows)."""
    return {row["case"]: {c["name"]: c["status"] for c in row["checks"]} for row in get_rows(records)}


def get_declared(records: Sequence) -> dict:
    """The implementation as its first answer declared it (name, engine, model)."""
    for record in records:
        for answer in record.answers.values():
            if isinstance(answer, dict) and isinstance(answer.get("implementation"), dict):
                return dict(answer["implementation"])
    return {}


def make_result(records: Sequence, options: Sequence[str], version: str, mode: str,
                vectors: Path | None = None, manifest: Mapping | None = None) -> dict:
    """The result of one run, judged by release ``version``'s checks. ``mode``:
    ``vectors`` (``vectors``/``manifest`` the folder checked), ``search`` or ``episode``."""
    release = get_release(version)
    cases = get_case_statuses(records)
    tally = compute_tally(cases, release.checks)
    suite = {"version": version, "mode": mode, "digest": None}
    if vectors is not None and manifest is not None and manifest.get("suite"):
        suite["digest"] = manifest["suite"]["digest"]
    digests = {case: (compute_case_digest(vectors / case) if vectors is not None and (vectors / case).is_dir()
                      else None) for case in cases}
    return {"format": RESULT_FORMAT, "version": RESULT_VERSION, "contract_version": CONTRACT_VERSION,
            "suite": suite, "implementation": {**get_declared(records), "options": " ".join(options)},
            "checks": tally.statuses, "passed": tally.passed, "applicable": tally.applicable, "tier": tally.tier,
            "tier_rule": TIERS[tally.tier],
            "cases": {case: {"digest": digests[case], "checks": checks} for case, checks in cases.items()}}


def get_tally(result: Mapping) -> Tally:
    return Tally(dict(result["checks"]), result["passed"], result["applicable"], result["tier"])


# --- the badge ----------------------------------------------------------------------------

def _text_width(text: str) -> int:
    return 7 * len(text) + 10  # Verdana 11px averages about 7 px a character


def render_badge(result: Mapping) -> str:
    """A flat SVG badge: ``unsee conform X.Y.Z | tier N · P/A``."""
    label = f"unsee conform {result['suite']['version']}"
    message = f"tier {result['tier']} \u00b7 {result['passed']}/{result['applicable']}"
    left, right = _text_width(label), _text_width(message)
    colour = TIER_COLOURS[result["tier"]]
    title = escape(f"{label}: {message} ({result['tier_rule']})")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + right}" height="20" role="img" '
            f'aria-label="{title}"><title>{title}</title>'
            f'<rect width="{left}" height="20" fill="#555"/><rect x="{left}" width="{right}" height="20" '
            f'fill="{colour}"/><g fill="#fff" text-anchor="middle" font-family="Verdana,sans-serif" '
            f'font-size="11"><text x="{left / 2}" y="14">{escape(label)}</text>'
            f'<text x="{left + right / 2}" y="14">{escape(message)}</text></g></svg>\n')


def write_result(directory: Path, result: Mapping) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    path, badge = directory / RESULT_FILE, directory / BADGE_FILE
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    badge.write_text(render_badge(result), encoding="utf-8")
    return path, badge


# --- the baseline -------------------------------------------------------------------------

@attrs.frozen
class Baseline:
    """An adopter's expected failures, for one suite version (None: any)."""

    path: str
    expected: frozenset[str]
    suite: str | None = None


def _parse_baseline(path: Path, text: str):
    if str(path).endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ConformanceInputError(f"--baseline {path}: not JSON ({exc})") from None
    import yaml  # PyYAML: pinned in every venv the project makes

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConformanceInputError(f"--baseline {path}: not YAML ({exc})") from None


def read_baseline(path: Path, version: str) -> Baseline:
    """``expected_failures`` (a list of check names) and an optional ``suite``;
    YAML unless the file ends in ``.json``. Bad input is named (exit 2)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConformanceInputError(f"--baseline {path}: cannot read it ({exc.strerror or exc})") from None
    raw = _parse_baseline(path, text)
    if not isinstance(raw, dict) or not isinstance(raw.get("expected_failures", []), list):
        raise ConformanceInputError(f"--baseline {path}: must be a mapping with 'expected_failures': [check names]")
    unknown = set(raw) - {"suite", "expected_failures"}
    if unknown:
        raise ConformanceInputError(f"--baseline {path}: unknown key(s) {sorted(unknown)}; "
                                    "a baseline holds 'suite' and 'expected_failures'")
    suite = raw.get("suite")
    if suite is not None and str(suite) != version:
        raise ConformanceInputError(f"--baseline {path}: made for suite {suite}, this run is suite {version}")
    names = (ANSWERED, *get_release(version).checks)
    for name in raw.get("expected_failures") or []:
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConformanceInputError(f"--baseline {path}: {name!r} is no check of suite {version}{hint}")
    return Baseline(str(path), frozenset(raw.get("expected_failures") or ()), None if suite is None else str(suite))


def compare_baseline(statuses: Mapping[str, str], baseline: Baseline) -> dict[str, list[str]]:
    """What the run says of the baseline: ``expected`` (listed, still fail),
    ``new`` (fail, not listed), ``now_passing`` and ``not_applicable`` (listed, stale)."""
    order = list(statuses)
    listed = sorted(baseline.expected, key=order.index)
    return {"expected": [n for n in listed if statuses[n] == FAIL],
            "new": [n for n in order if statuses[n] == FAIL and n not in baseline.expected],
            "now_passing": [n for n in listed if statuses[n] == PASS],
            "not_applicable": [n for n in listed if statuses[n] == NA]}


def get_verdict(result: Mapping, baseline: Baseline | None, strict: bool) -> bool:
    """Whether the run passes CI: no failure, or only listed ones (and, under
    ``strict``, no stale baseline entry)."""
    if baseline is None:
        return not any(s == FAIL for s in result["checks"].values())
    found = result["baseline"]
    return not found["new"] and not (strict and (found["now_passing"] or found["not_applicable"]))


def describe_result(result: Mapping, baseline: Baseline | None, written: Sequence[Path] = ()) -> str:
    suite = result["suite"]
    lines = [f"suite {suite['version']} ({suite['mode']}, {len(result['cases'])} case(s)): "
             f"{get_tally(result).describe()}"]
    if baseline is not None:
        found = result["baseline"]
        lines.append(f"baseline {baseline.path}: {len(found['expected'])} expected failure(s) still fail"
                     + "".join(f"; {what}: {', '.join(found[key])}" for key, what in (
                         ("new", "NEW failures"),
                         ("now_passing", "now PASSING (remove them from the baseline)"),
                         ("not_applicable", "N/A on this run (stale in the baseline)")) if found[key]))
    lines += [f"{'result' if p.name == RESULT_FILE else 'badge':<9}{p}" for p in written]
    return "\n".join(lines)


__all__ = ["BADGE_FILE", "RESULT_FILE", "RESULT_FORMAT", "RESULT_VERSION", "TIER_COLOURS", "Baseline",
           "compare_baseline", "describe_result", "get_case_statuses", "get_declared", "get_tally", "get_verdict",
           "make_result", "read_baseline", "render_badge", "write_result"]
