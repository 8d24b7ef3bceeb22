"""Reports of a conformance run for CI (docs/conformance.md, "In CI"):
JUnit XML (one test case per episode x check) and JSON, and each failing
case as a folder that ``unsee conform --replay`` reruns.

Pure Python (no torch): a vector check writes them too.
"""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from unsee.impl.agent.episode import Episode, episode_to_json
from unsee.impl.conform.checks import ANSWERED, FAIL, NA, PASS
from unsee.impl.conform.contract import CONTRACT, CONTRACT_VERSION

#: The report formats ``--report`` takes.
FORMATS = ("junit", "json")


def get_case_id(episode: Episode) -> str:
    """A stable name for an episode: a hash of its file's canonical JSON."""
    text = json.dumps(episode_to_json(episode), sort_keys=True, separators=(",", ":"))
    return "case-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def get_rows(records: Sequence) -> list[dict]:
    """One row per distinct episode checked (a search may check one twice while
    it shrinks): its case id, the episode, and each check's status."""
    rows, seen = [], set()
    for record in records:
        case = get_case_id(record.episode)
        if case in seen:
            continue
        seen.add(case)
        if record.error is not None:
            checks = [{"name": ANSWERED, "status": FAIL, "detail": record.error}]
        else:
            checks = [{"name": c.name, "status": c.status,
                       "detail": c.na if c.status == NA else "" if c.status == PASS else c.describe()}
                      for c in record.checks]
        rows.append({"case": case, "episode": episode_to_json(record.episode), "checks": checks})
    return rows


def get_junit(rows: list[dict], suite: str) -> ET.Element:
    """JUnit XML: ``<testsuites>`` of one ``<testsuite>``; a ``<testcase>`` per
    episode x check (classname the case id, name the check), with
    ``<failure>`` for a failed check and ``<skipped>`` for an N/A one. A
    test case's name is the check's constant (:data:`~unsee.impl.conform.checks.CHECKS`),
    or :data:`~unsee.impl.conform.checks.ANSWERED` for an episode not answered."""
    root = ET.Element("testsuites", name="unsee conform")
    element = ET.SubElement(root, "testsuite", name=suite)
    counts = {PASS: 0, FAIL: 0, NA: 0}
    for row in rows:
        for check in row["checks"]:
            counts[check["status"]] += 1
            case = ET.SubElement(element, "testcase", classname=f"unsee.conform.{row['case']}", name=check["name"],
                                 time="0")
            if check["status"] == FAIL:
                ET.SubElement(case, "failure", message=check["detail"].splitlines()[0][:200],
                              type="conformance").text = check["detail"]
            elif check["status"] == NA:
                ET.SubElement(case, "skipped", message=f"N/A: {check['detail']}")
    total = sum(counts.values())
    for node in (root, element):
        node.set("tests", str(total))
        node.set("failures", str(counts[FAIL]))
        node.set("errors", "0")
        node.set("skipped", str(counts[NA]))
    element.set("time", "0")
    return root


def write_reports(formats: Sequence[str], directory: Path, records: Sequence, outcome) -> list[Path]:
    """Write the requested reports (``junit.xml``, ``report.json``) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = get_rows(records)
    name = " ".join(outcome.implementation.get_options())
    written = []
    if "junit" in formats:
        path = directory / "junit.xml"
        tree = ET.ElementTree(get_junit(rows, f"unsee conform {name}"))
        ET.indent(tree)
        tree.write(path, encoding="utf-8", xml_declaration=True)
        written.append(path)
    if "json" in formats:
        path = directory / "report.json"
        summary = {"contract": CONTRACT, "version": CONTRACT_VERSION, "implementation": name,
                   "passed": outcome.passed, "episodes": len(rows),
                   "failures": [str(p) for p in getattr(outcome, "cases", ())], "cases": rows}
        path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


def parse_formats(text: str) -> tuple[str, ...]:
    """``junit,json`` -> the formats; an unknown one is bad input, named."""
    formats = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"--report {text!r}: unknown format(s) {unknown}; the formats are {', '.join(FORMATS)}")
    return formats


__all__ = ["ANSWERED", "FORMATS", "get_case_id", "get_junit", "get_rows", "parse_formats", "write_reports"]
