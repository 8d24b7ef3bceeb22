"""An evaluation's rows on disk (impl/eval/run.py writes them): the JSONL file a
run appends to and resumes from, and the order a run takes its cases in."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: Version of the row format (bumped when a field changes meaning).
ROW_VERSION = 1
ROWS_FILE = "rows.jsonl"


class EvalError(ValueError):
    """Bad input to the evaluation; the message names it."""


def read_rows(path: Path, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> list[dict]:
    """The rows of a JSONL file. A last line that is cut short (no newline at
    the end of the file and not valid JSON: an interrupted write) is dropped,
    with a warning, and removed from the file so that appends stay valid; any
    other line that is not a row is an error naming it."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            if number < len(lines) and line:  # whitespace inside the file
                raise EvalError(f"{path}:{number}: a blank line inside the rows file; it is not one this "
                                "runner wrote (remove it to resume)")
            continue
        last = number == len(lines)  # no newline after it
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if last:
                warn(f"unsee eval: {path}:{number}: dropped a truncated last row (an interrupted write)")
                path.write_bytes(data[:len(data) - len(line)])
                break
            raise EvalError(f"{path}:{number}: not a JSON row ({exc}); the file is corrupt, not merely "
                            "interrupted: repair or remove it") from None
        if not isinstance(row, dict) or not {"suite", "case", "method", "row_version"} <= set(row):
            raise EvalError(f"{path}:{number}: not an evaluation row (needs suite, case, method, row_version)")
        if row["row_version"] != ROW_VERSION:
            raise EvalError(f"{path}:{number}: row version {row['row_version']!r}; this build writes "
                            f"{ROW_VERSION}: use a new --out folder")
        if last:  # valid JSON but the newline was lost: complete the line
            path.write_bytes(data + b"\n")
        rows.append(row)
    return rows


def check_out_dir(out: Path) -> Path:
    """Create ``out`` if needed and prove it writable, before any work."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise EvalError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out


def rewrite_rows(rows: Sequence[dict], path: Path) -> None:
    """Replace ``path`` by ``rows`` atomically (a temporary file renamed over
    it): an interrupt leaves the old file or the new one, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row, default=str) + "\n")
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, path)


def interleave_suites(cases: Sequence) -> list:
    """The cases taken a suite at a time, round robin (each suite's in its order), so
    that a long run stopped part way, to be resumed in a later sitting, has episodes
    of every suite and not all of the first."""
    by_suite: dict[str, list] = {}
    for case in cases:
        by_suite.setdefault(case.suite, []).append(case)
    queues = list(by_suite.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


__all__ = ["ROWS_FILE", "ROW_VERSION", "EvalError", "check_out_dir", "interleave_suites", "read_rows", "rewrite_rows"]
