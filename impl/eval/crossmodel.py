"""The paper's cross-model paragraph as one table (issue 27, item 6): its two
load-bearing findings, measured on every run given, one row per run.

1. **B3 still leaks.** Redacting the source (B3, ``source-redaction``)
   leaves the target in the state: its any-leak rate against B5's (the
   counterfactual) on the same episodes, with an exact McNemar test, and,
   where a suite has a behaviour, how much more often than B5 it still
   avoids the option the revoked preference excluded (the residue).
2. **B7 equals B5 at a fraction of the cost.** Our forget (B7, ``replay``)
   reaches B5's state: the episodes whose digests are equal, and what it
   recomputed and how long it took as a share of B5's (sums over the paired
   episodes, so a long episode weighs as much as its work). B5' (the prefix
   cache a user would pick instead) is beside it.

A run is one ``unsee eval`` out folder (its ``rows.jsonl``); its rows name
the model and engine. Every figure comes from the rows; nothing is a
constant. ``python -m unsee.impl.eval.crossmodel OUT [OUT ...]`` prints the
table (``--write FILE`` writes it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from unsee.impl.eval.report import REFERENCE, REPLAY, Rows, fmt, fmt_test, get_any_leak, render_table
from unsee.impl.eval.run import ROWS_FILE, EvalError, read_rows
from unsee.impl.eval.stats import mcnemar_exact, mean

REDACTION = "source-redaction"
PREFIX_CACHE = "reset-prefix-cache"
#: the family of a model name that is not a catalogue entry (impl/engines/catalog.py names its own)
BUILT_IN_FAMILIES = {"smollm2": "llama", "tiny": "llama"}
HEADER = ("model (family)", "engine", "episodes", "B3 any-leak vs B5", "B3 avoid residue",
          "B7 digest = B5", "B7 recomputed / B5", "B7 wall / B5", "B5' wall / B5")


def get_family(model: str) -> str:
    """The architecture family of a model name (the catalogue's, else a built-in's, else ``?``)."""
    from unsee.impl.engines.catalog import get_entry

    entry = get_entry(model)
    return entry.family if entry is not None else BUILT_IN_FAMILIES.get(model, "?")


def get_run_identity(rows: Rows, where: str) -> tuple[str, str]:
    """``(model, engine)`` of a run's rows; an :class:`EvalError` naming ``where`` if they mix several."""
    seen = {(r["model"], r.get("backend", "transformers")) for r in rows.rows}
    if len(seen) != 1:
        raise EvalError(f"{where}: a run of one model and engine is needed, its rows name {sorted(seen)}")
    return seen.pop()


def compute_b3_leak(rows: Rows) -> str:
    """B3's any-leak rate against B5's over every paired episode, and the test."""
    pairs = rows.paired(None, REDACTION, REFERENCE)
    if not pairs:
        return "–"
    a = [get_any_leak(x) for x, _ in pairs]
    b = [get_any_leak(y) for _, y in pairs]
    return f"{fmt(mean([float(v) for v in a]))} vs {fmt(mean([float(v) for v in b]))} ({fmt_test(mcnemar_exact(a, b))})"


def compute_b3_residue(rows: Rows) -> str:
    """B3's avoid rate minus B5's on the episodes with a behaviour, and how
    many of those B3 left undecided (it named neither option)."""
    pairs = [(x, y) for x, y in rows.paired(None, REDACTION, REFERENCE) if x.get("behavior") and y.get("behavior")]
    if not pairs:
        return "–"
    residue = mean([float(x["behavior"]["avoid"]) for x, _ in pairs]) - mean([float(y["behavior"]["avoid"])
                                                                           for _, y in pairs])
    undecided = sum(x["behavior"]["pick"] is None for x, _ in pairs)
    return f"{residue:+.2f} (n={len(pairs)}, {undecided} undecided)"


def compute_cost_share(rows: Rows, method: str, field: str) -> str:
    """``method``'s summed ``efficiency[field]`` over B5's on the paired episodes."""
    pairs = rows.paired(None, method, REFERENCE)
    ours = sum(x["efficiency"][field] for x, _ in pairs)
    theirs = sum(y["efficiency"][field] for _, y in pairs)
    return f"{ours / theirs:.2f}x" if pairs and theirs else "–"


def compute_b7_equal(rows: Rows) -> str:
    """The episodes whose B7 digest equals B5's (computed in one process)."""
    eq = [x["equals_reset"] for x, _ in rows.paired(None, REPLAY, REFERENCE) if x.get("equals_reset") is not None]
    return f"{sum(eq)}/{len(eq)}" if eq else "–"


def get_cross_model_row(rows: Rows, where: str) -> list[str]:
    model, engine = get_run_identity(rows, where)
    episodes = len({(r["suite"], r["case"]) for r in rows.rows})
    suites = ", ".join(rows.suites)
    return [f"{model} ({get_family(model)})", engine, f"{episodes} ({suites})", compute_b3_leak(rows),
            compute_b3_residue(rows), compute_b7_equal(rows),
            compute_cost_share(rows, REPLAY, "recomputed_tokens"), compute_cost_share(rows, REPLAY, "wall_s"),
            compute_cost_share(rows, PREFIX_CACHE, "wall_s")]


def render_cross_model(runs: Sequence[tuple[str, Sequence[dict]]]) -> list[str]:
    """The table's lines, one row per ``(where, rows)`` run."""
    if not runs:
        raise EvalError("no runs given: name one or more `unsee eval` out folders")
    body = [get_cross_model_row(Rows(rows), where) for where, rows in runs]
    return list(render_table(HEADER, body))


def read_run(folder: str | Path) -> tuple[str, list[dict]]:
    """``(folder, rows)`` of one ``unsee eval`` out folder; an :class:`EvalError`
    naming it when it holds no rows."""
    path = Path(folder) / ROWS_FILE
    rows = read_rows(path)
    if not rows:
        raise EvalError(f"{folder}: no evaluation rows ({path} is missing or empty)")
    return str(folder), rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unsee.impl.eval.crossmodel", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="`unsee eval` out folders, one per model")
    parser.add_argument("--write", type=Path, help="write the table to this file instead of printing it")
    args = parser.parse_args(argv)
    try:
        lines = render_cross_model([read_run(f) for f in args.runs])
    except EvalError as exc:
        print(f"unsee crossmodel: {exc}", file=sys.stderr)
        return 2
    text = "\n".join(lines) + "\n"
    if args.write is not None:
        args.write.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["compute_b3_leak", "compute_b3_residue", "compute_b7_equal", "compute_cost_share", "get_family",
           "main", "read_run", "render_cross_model"]
