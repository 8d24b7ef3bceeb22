"""The draft policy over several models (issue 54): per model, the forget under the default
policy against the forget without drafts, in CPU time, with how often the policy drafted,
what its drafts accepted, and the forget with drafts forced on beside them.

    make drafts-bench    # or, per model:
    OMP_NUM_THREADS=1 python -m unsee.bench.forget_policy --model M --engine llamacpp --episodes 5 \\
        --methods replay,replay-decode,replay-drafts --out out/drafts-bench/M
    python -m unsee.bench.drafts_models out/drafts-bench/* --docs docs/drafts.md

Each folder is one model's run, or one shard of it (``--shard K/N``; a model's shards are
merged, an episode in two of them refused), of ``bench/forget_policy.py`` (its ``rows.jsonl`` and
``label.json``): every episode's methods on forks of one base state in one process, their
order rotating. ``replay`` is B7 under the default policy (drafts where the model's
measured cost table says they pay, stopped partway where the forget's own forwards say
they lose); ``replay-decode`` B7 without drafts; ``replay-drafts`` B7 with drafts forced on
(the cost table's verdict overruled, the stop kept). Writes the labelled table into the
``drafts-models`` region of ``--docs`` and keeps the figures it rendered in
``docs/drafts-models.json`` (``--summary`` renders them again without running anything),
or prints it.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

from unsee.bench import options
from unsee.bench.forget_policy import fmt_share, get_load_label, get_ratio, met, read_rows
from unsee.impl.cli.docs import replace_region
from unsee.impl.eval.report import render_table

REGION = "drafts-models"
#: the per-model figures the committed region was rendered from, and the command that renders
#: it again (tests/test_bench_drafts.py checks the region is that rendering)
SUMMARY_FILE = "docs/drafts-models.json"
COMMAND = f"python -m unsee.bench.drafts_models --summary {SUMMARY_FILE} --docs docs/drafts.md"


def get_model_row(rows: list[dict], label: dict) -> dict:
    """One model's figures: the default policy over no drafts (and forced drafts over no
    drafts), per episode in CPU time; how often it drafted; what drafts accepted."""
    default = [get_ratio(r, "replay", "replay-decode") for r in rows]
    # an episode whose default forget ran exactly the no-drafts forwards did the same work: 1.0x
    by_work = [1.0 if is_same_work(r) else ratio for r, ratio in zip(rows, default)]
    forced = [get_ratio(r, "replay-drafts", "replay-decode") for r in rows if "replay-drafts" in r["methods"]]
    on = [r for r in rows if (r["methods"]["replay"].get("drafts_account") or {}).get("mode") == "verify"]
    same_work = sum(map(is_same_work, rows))

    def accepted(method: str) -> int:
        return sum(((r["methods"].get(method) or {}).get("drafts") or {}).get("totals", {}).get("accepted", 0)
                   for r in rows)

    policy = label.get("policy") or {}
    return {"model": label["model"], "episodes": len(rows), "costs": policy.get("costs"),
            "pays": policy.get("pays"), "why": policy.get("why"), "drafted": len(on),
            "stopped": sum(bool((r["methods"]["replay"].get("drafts_account") or {}).get("stopped")) for r in rows),
            "same_work": same_work, "default_median": statistics.median(default),
            "default_at_most_1": list(fmt_counts(default)), "default_worst": max(default),
            "work_median": statistics.median(by_work), "work_at_most_1": list(fmt_counts(by_work)),
            "accepted": accepted("replay"), "forced_median": statistics.median(forced) if forced else None,
            "forced_at_most_1": list(fmt_counts(forced)) if forced else None, "forced_accepted": accepted("replay-drafts"),
            "forced_stopped": sum(bool((r["methods"].get("replay-drafts", {}).get("drafts_account") or {})
                                       .get("stopped")) for r in rows),
            "exact": sum(all(r["equal_digests"].values()) for r in rows),
            "cpu_s": {m: round(sum(r["methods"][m]["cpu_s"] for r in rows if m in r["methods"]), 1)
                      for m in ("replay", "replay-decode", "replay-drafts")}}


def is_same_work(row: dict) -> bool:
    """Whether the default forget ran the no-drafts forget's forwards: as many, feeding as many tokens."""
    ours, theirs = row["methods"]["replay"], row["methods"]["replay-decode"]
    return ours["forwards"] == theirs["forwards"] and ours["fed"] == theirs["fed"] and ours["turns"] and \
        [t["sizes"] for t in ours["turns"]] == [t["sizes"] for t in theirs["turns"]]


def fmt_counts(values: list[float]) -> tuple[int, int]:
    return sum(v <= 1.0 for v in values), len(values)


def render(models: list[dict], labels: list[dict]) -> str:
    """The labelled table and the goals, met or not, per model."""
    first = labels[0]
    builds = " ".join(f"`{b}`" for b in dict.fromkeys(b for lb in labels for b in lb["build"].split(", ")))
    loads = "; ".join(f"{lb['model']}: {lb['load']}" for lb in labels)
    label = (f"> build {builds} · attention llama.cpp's own kernels ({first['kernels']}), flash attention on · "
             f"dtype the files' weights, f16 KV · CPU {first['cpu']} (1 thread; {loads}) · command "
             f"`make drafts-bench` ({'; '.join(lb['command'] for lb in labels)})")
    body = [[m["model"], str(m["episodes"]), "yes" if m["pays"] else "no", f"{m['drafted']} of {m['episodes']}",
             str(m["accepted"]), f"{m['default_median']:.3f}x", fmt_share(m["default_at_most_1"]),
             f"{m['default_worst']:.2f}x", f"{m['same_work']} of {m['episodes']}",
             "-" if m["forced_median"] is None else f"{m['forced_median']:.3f}x",
             "-" if m["forced_at_most_1"] is None else fmt_share(m["forced_at_most_1"]),
             f"{m['forced_accepted']} ({m['forced_stopped']} stopped)", f"{m['exact']} of {m['episodes']}"]
            for m in models]
    goals = [[m["model"], fmt_share(m["work_at_most_1"]), met(m["work_at_most_1"][0] >= 0.95 * m["work_at_most_1"][1]),
              f"{m['work_median']:.3f}x", met(m["work_median"] <= 1.0), fmt_share(m["default_at_most_1"]),
              f"{m['default_median']:.3f}x"] for m in models]
    costs = [[m["model"], *(f"{v:g}" for v in (m["costs"] or {}).values()), m["why"] or ""] for m in models]
    sizes = list((models[0]["costs"] or {}).keys())
    lines = [label, "", *render_table(
        ["model", "episodes", "drafts pay (cost table)", "drafted (default)", "accepted (default)",
         "default / no drafts: median", "<= 1.0x", "worst", "same forwards as no drafts",
         "forced / no drafts: median", "<= 1.0x", "accepted, forced", "digests equal"], body),
        "", *render_table(["model (goals: default / no drafts, an episode of the same forwards at 1.0x)",
                           "<= 1.0x in >= 95% of episodes", "", "median <= 1.0x", "", "CPU alone: <= 1.0x",
                           "CPU alone: median"], goals),
        "", *render_table(["model", *(f"c({n})" for n in sizes), "the policy's verdict"], costs)]
    return "\n".join(lines) + "\n"


def get_folder_label(folder: Path, finished: list[Path]) -> dict:
    """A run's label; where the run was cut short of writing one, the label of a finished
    shard of the same model among ``finished``, else of its rows on the model its folder
    names (``MODEL`` or ``MODEL-K``; its facts and cost table read from the cache), its
    command marked as cut."""
    if (folder / "label.json").is_file():
        return json.loads((folder / "label.json").read_text())
    model = re.sub(r"-\d+$", "", folder.name)
    rows = read_rows(folder / "rows.jsonl")
    siblings = [json.loads((f / "label.json").read_text()) for f in finished if (f / "label.json").is_file()]
    label = next((lb for lb in siblings if lb["model"] == model), None) or get_model_label(model)
    return {**label, "command": f"python -m unsee.bench.forget_policy --model {model} ... --out {folder} "
                                f"(cut after {len(rows)} episodes)"}


@functools.cache
def get_model_label(model: str) -> dict:
    """The label of ``model`` as loaded here (its build and load are its rows', set by the caller)."""
    from unsee.bench.forget_policy import get_label
    from unsee.impl.engines.registry import load_engine

    return get_label(load_engine(model, backend="llamacpp"), [], [])


def get_model_runs(folders: list[Path]) -> list[tuple[list[dict], dict]]:
    """Per model, in the order first named: the rows of every folder that ran it (the
    shards of one sample, ``--shard K/N``, each a process of its own; an episode's methods
    always share one) and their label: the builds the rows name, the load they were
    measured under, each folder's command with ``--out`` the folder its rows are read from."""
    runs: dict[str, tuple[list[dict], list[dict]]] = {}
    for folder in folders:
        label = get_folder_label(folder, folders)
        rows, labels = runs.setdefault(label["model"], ([], []))
        new = read_rows(folder / "rows.jsonl")
        if twice := {(r["suite"], r["case"]) for r in rows} & {(r["suite"], r["case"]) for r in new}:
            raise ValueError(f"{folder}: episodes another folder of {label['model']} ran too: {sorted(twice)[:3]}")
        rows.extend(new)
        labels.append({**label, "command": get_moved_command(label["command"], folder)})
    return [(rows, {**labels[0], "build": ", ".join(dict.fromkeys(r.get("build", "not recorded") for r in rows)),
                    "load": get_load_label(rows) if any("load" in r for r in rows) else labels[0]["load"],
                    "command": "; ".join(lb["command"] for lb in labels)})
            for rows, labels in runs.values()]


def get_moved_command(command: str, folder: Path) -> str:
    """``command`` with its ``--out`` the folder its rows are read from now."""
    command, cut, note = command.partition(" (cut after")  # a cut run's note is no argument
    words = shlex.split(command)
    if "--out" in words[:-1]:
        words[words.index("--out") + 1] = str(folder)
    return shlex.join(words) + cut + note


def main(argv: list[str] | None = None) -> None:
    parser = options.get_parser("drafts_models", __doc__)
    parser.add_argument("folders", nargs="*", type=Path, help="bench/forget_policy.py runs: a model's, or its shards")
    parser.add_argument("--summary", type=Path, help=f"render a committed summary ({SUMMARY_FILE}) instead")
    parser.add_argument("--docs", type=Path, help=f"rewrite this page's drafts-models region (and {SUMMARY_FILE})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.summary:
        summary = json.loads(args.summary.read_text())
    elif args.folders:
        runs = get_model_runs(args.folders)
        summary = {"models": [get_model_row(rows, label) for rows, label in runs],
                   "labels": [label for _, label in runs]}
    else:
        parser.error("name the runs' folders, or --summary")
    text = render(summary["models"], summary["labels"])
    if args.docs:
        args.docs.write_text(replace_region(args.docs.read_text(), REGION, text, COMMAND))
        if not args.summary:
            Path(SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
