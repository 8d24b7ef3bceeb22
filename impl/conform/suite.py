"""The suite's releases and its tiers (docs/conformance.md, "Suite versions,
tiers and baselines"): one versioned artifact per release, the checks it
holds, what changed, and how a run's checks make a tier.

A release is a folder ``suites/<version>/`` beside this module: the test
vectors (:mod:`unsee.impl.conform.vectors`' layout) whose ``manifest.json``
also names the suite version, its checks and a SHA-256 digest per case over
the case's input files. ``unsee conform --suite-version X`` checks an
implementation against release ``X``'s vectors, judged by ``X``'s checks
alone, so an adopter that pinned ``1.0.0`` keeps getting ``1.0.0``'s verdict
after ``1.1.0`` ships.

Pure Python: no torch, no runtime import.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from unsee.impl.conform.answers import ConformanceInputError
from unsee.impl.conform.checks import (
    AFTERMATH_CHECKS,
    ANSWERED,
    ATTENDED_CHECKS,
    CHECKS,
    COUNT_CHECKS,
    DIGEST_BEFORE,
    FAIL,
    FORGET_TWIN_DIGEST,
    FORGET_TWIN_TURNS,
    NA,
    PASS,
    PREFIX,
    RUN_REFERENCE,
    STATE_CHECKS,
    TWIN_REFERENCE,
)

#: Where the releases are (package data).
SUITES_DIR = Path(__file__).parent / "suites"
#: The files of a case its digest covers: the inputs and what the spec says of them
#: (``answers.json``, the reference's own recorded answers, is a record, not an input).
DIGESTED = ("episode.json", "counterfactual.json", "expected.json")


@attrs.frozen
class Release:
    """One suite version: the checks it holds (by their constants) and what
    changed against the release before it."""

    version: str
    checks: tuple[str, ...]
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    notes: str = ""


_V1_0 = (*COUNT_CHECKS, DIGEST_BEFORE, *STATE_CHECKS, PREFIX, *AFTERMATH_CHECKS, RUN_REFERENCE, TWIN_REFERENCE)

#: Every release, oldest first: the changelog of the suite is this table
#: (docs/conformance.md renders it; tests check each folder's manifest against it).
RELEASES: dict[str, Release] = {r.version: r for r in (
    Release("1.0.0", _V1_0, added=_V1_0,
            notes="contract version 2; the 3 generated vector cases the CI checked before releases existed"),
    Release("1.1.0", (*_V1_0, *ATTENDED_CHECKS), added=ATTENDED_CHECKS,
            notes="the attended-span family: 4 episodes in which later turns read, paraphrase or compute from "
                  "the target; a forget that drops only the target's own tokens or KV rows fails them by name"),
)}
#: The release a run without ``--suite-version`` is judged by.
LATEST = "1.1.0"

# --- tiers: the one definition ---------------------------------------------------------

#: Checks a Tier 2 implementation must pass: it answered, its counts are the
#: spec's, and its forget is the counterfactual (Theorem 1, turns and state).
CORE_CHECKS = (ANSWERED, *COUNT_CHECKS, FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST)
#: Tier 2's share of applicable checks passed.
TIER_2_SHARE = 0.8
TIERS = {1: "every applicable check passes",
         2: f"at least {TIER_2_SHARE:.0%} of applicable checks pass, every core check among them",
         3: "scored, below Tier 2"}


@attrs.frozen
class Tally:
    """A run's checks as one verdict each (a check fails when any case failed
    it, passes when some case passed it and none failed, else is N/A), the
    pass count over the applicable (not N/A) checks, and the tier."""

    statuses: dict[str, str]
    passed: int
    applicable: int
    tier: int

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(n for n, s in self.statuses.items() if s == FAIL)

    def describe(self) -> str:
        return f"Tier {self.tier}: {self.passed}/{self.applicable} applicable checks pass ({TIERS[self.tier]})"


def compute_statuses(cases: Mapping[str, Mapping[str, str]], names: Sequence[str]) -> dict[str, str]:
    """Per check of ``names`` (and :data:`ANSWERED`), its one status over
    ``cases`` (case -> check -> status); a case not answered fails ANSWERED."""
    out = {}
    for name in (ANSWERED, *names):
        seen = {checks.get(name, NA) for checks in cases.values()}
        if name == ANSWERED:
            seen = {FAIL if ANSWERED in checks else PASS for checks in cases.values()}
        out[name] = FAIL if FAIL in seen else PASS if PASS in seen else NA
    return out


def compute_tier(statuses: Mapping[str, str]) -> int:
    """:data:`TIERS` over one status per check."""
    applicable = [s for s in statuses.values() if s != NA]
    passed = applicable.count(PASS)
    if applicable and passed == len(applicable):
        return 1
    core = all(statuses.get(n, NA) != FAIL for n in CORE_CHECKS)
    return 2 if core and applicable and passed >= TIER_2_SHARE * len(applicable) else 3


def compute_tally(cases: Mapping[str, Mapping[str, str]], names: Sequence[str]) -> Tally:
    statuses = compute_statuses(cases, names)
    applicable = [s for s in statuses.values() if s != NA]
    return Tally(statuses, applicable.count(PASS), len(applicable), compute_tier(statuses))


# --- the artifacts ------------------------------------------------------------------------

def get_release(version: str) -> Release:
    if version not in RELEASES:
        raise ConformanceInputError(f"--suite-version {version!r}: no such release; the releases are "
                                    f"{', '.join(RELEASES)}")
    return RELEASES[version]


def get_suite_dir(version: str) -> Path:
    """Release ``version``'s vectors folder."""
    get_release(version)
    return SUITES_DIR / version


def get_release_checks(manifest: Mapping) -> tuple[str, ...]:
    """The checks a vectors folder is judged by: its release's, or every check
    for a folder that names no release (one ``--write-vectors`` made)."""
    suite = manifest.get("suite")
    if suite is None:
        return CHECKS
    release = get_release(suite["version"])
    if tuple(suite.get("checks", ())) != release.checks:
        raise ConformanceInputError(f"suite {release.version}: the manifest's checks are not the release's "
                                    "(a folder edited by hand, or made by another unsee)")
    return release.checks


def compute_case_digest(folder: Path) -> str:
    """SHA-256 over the case's :data:`DIGESTED` files, by name."""
    digest = hashlib.sha256()
    for name in DIGESTED:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def compute_suite_digest(digests: Mapping[str, str]) -> str:
    """One digest for a release: over its cases' digests, by case."""
    return hashlib.sha256(json.dumps(dict(sorted(digests.items())), separators=(",", ":")).encode()).hexdigest()


def verify_digests(directory: Path, manifest: Mapping) -> None:
    """Refuse a release folder whose case files do not match its manifest's digests."""
    digests = (manifest.get("suite") or {}).get("digests")
    if digests is None:
        return
    if sorted(digests) != sorted(manifest["cases"]):
        raise ConformanceInputError(f"--vectors {directory}: the manifest's digests name other cases than it lists")
    for case, want in digests.items():
        if compute_case_digest(directory / case) != want:
            raise ConformanceInputError(f"--vectors {directory}: case {case}'s files do not match the digest "
                                        f"of suite {manifest['suite']['version']} (edited after release?)")


def render_changelog() -> str:
    """The releases as a Markdown table (docs/conformance.md)."""
    lines = ["| suite | checks | added | changed | notes |", "|---|---:|---|---|---|"]
    for r in RELEASES.values():
        added = "all (the first release)" if r.added == _V1_0 else ", ".join(f"`{n}`" for n in r.added)
        lines.append(f"| {r.version} | {len(r.checks)} | {added} | {', '.join(r.changed) or '-'} | {r.notes} |")
    return "\n".join(lines) + "\n"


__all__ = ["CORE_CHECKS", "DIGESTED", "LATEST", "RELEASES", "SUITES_DIR", "TIERS", "TIER_2_SHARE", "Release",
           "Tally", "compute_case_digest", "compute_statuses", "compute_suite_digest", "compute_tally",
           "compute_tier", "get_release", "get_release_checks", "get_suite_dir", "render_changelog",
           "verify_digests"]
