"""The scorecard of docs/conformance.md: implementation x check -> pass /
fail / N/A, each row from one ``unsee conform`` search, each failure's shrunk
counterexample written small (the episode, the failed checks; no ``kept``).

``python -m unsee.impl.conform.scorecard [ROW ...] [--out DIR]`` reruns the
rows (all by default) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from unsee.impl.conform.checks import (
    COUNT_CHECKS,
    DIGEST_BEFORE,
    EFFECTS,
    FAIL,
    FORGET_TWIN_DIGEST,
    FORGET_TWIN_TURNS,
    IDEMPOTENT,
    NA,
    PASS,
    REOPEN,
    RESIDUE,
)
from unsee.impl.conform.harness import load_entry_point, search

#: The rows: name -> entry point. Ours first; a framework's row needs its extra.
ROWS = {
    "unsee (reference)": "unsee.impl.conform.adapters:reference",
    "unsee with tools": "unsee.impl.conform.adapters:tools",
    "LangGraph RemoveMessage": "unsee.impl.conform.frameworks.lang_graph:remove",
    "LangGraph time travel": "unsee.impl.conform.frameworks.lang_graph:travel",
    "OpenAI Agents SDK pop_item": "unsee.impl.conform.frameworks.agents_sdk:pop_item",
    "OpenAI Agents SDK branch": "unsee.impl.conform.frameworks.agents_sdk:branch",
    "Google ADK rewind": "unsee.impl.conform.frameworks.google_adk:rewind",
    "mem0 delete": "unsee.impl.conform.frameworks.mem0_store:delete",
    "Pydantic AI history filter": "unsee.impl.conform.frameworks.pydantic_ai_history:filter_history",
    "LlamaIndex Memory.set": "unsee.impl.conform.frameworks.llama_index_memory:set_history",
}
#: The columns: the checks each one sums up, by their constants (any failure
#: fails it; all N/A is N/A).
COLUMNS = {"counts": (*COUNT_CHECKS, DIGEST_BEFORE),
           "forget = counterfactual": (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST),
           "residue": (RESIDUE,), "reopen": (REOPEN,), "idempotent": (IDEMPOTENT,), "effects once": (EFFECTS,)}
EPISODES = 10


def get_row(records) -> dict[str, str]:
    """Column -> pass / fail / n/a over every episode checked."""
    row = {}
    for column, names in COLUMNS.items():
        statuses = {c.status for r in records for c in r.checks if c.name in names}
        if any(r.error is not None for r in records):
            statuses.add(FAIL)
        row[column] = FAIL if FAIL in statuses else PASS if PASS in statuses else NA
    return row


def get_command(entry: str) -> str:
    return f"unsee conform --entry {entry} --episodes {EPISODES}"


def run_row(name: str, out: Path) -> dict:
    entry = ROWS[name]
    with tempfile.TemporaryDirectory(prefix="unsee-scorecard-") as tmp:
        outcome = search(load_entry_point(entry), Path(tmp), EPISODES)
    row = {"implementation": name, **get_row(outcome.records), "command": get_command(entry)}
    if not outcome.passed:
        slug = name.lower().replace(" ", "-").replace("(", "").replace(")", "")
        path = out / f"{slug}.json"  # an episode file: unsee conform --episode reruns it
        out.mkdir(parents=True, exist_ok=True)
        from unsee.impl.agent.episode import episode_to_json

        path.write_text(json.dumps(episode_to_json(outcome.failure.episode), indent=1) + "\n", encoding="utf-8")
        (out / f"{slug}.failed.json").write_text(json.dumps({
            "implementation": name, "rerun": f"unsee conform --episode {path} --entry {entry}",
            "failed": [c.name for c in outcome.failure.checks], "error": outcome.failure.error}, indent=1) + "\n",
            encoding="utf-8")
        row["counterexample"] = path.name
    return row


def render(rows: list[dict]) -> str:
    head = ["implementation", *COLUMNS, "counterexample", "command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["implementation"], *(row[c].upper() if row[c] == NA else row[c] for c in COLUMNS),
                 row.get("counterexample", ""), f"`{row['command']}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unsee.impl.conform.scorecard")
    parser.add_argument("rows", nargs="*", metavar="ROW", help=f"default: all of {list(ROWS)}")
    parser.add_argument("--out", default="docs/conformance-counterexamples", help="where counterexamples go")
    args = parser.parse_args(argv)
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; the rows are {list(ROWS)}")
    rows = [run_row(name, Path(args.out)) for name in (args.rows or ROWS)]
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
