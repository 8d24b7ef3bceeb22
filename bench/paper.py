"""The paper's efficiency results, reproduced: Table 1, the tau sweep, the
indep sweep, checkpoint granularity and target position (issue 8, item 4).

    python -m unsee.bench.paper --model smollm2 --device cpu --dtype float32 --rounds 3 --out out/paper
    python -m unsee.bench.paper --model smollm2 --device cuda --dtype bfloat16 --rounds 3 --out out/paper-gpu

Writes ``paper.json`` (every row), one PNG per table and ``paper.md``, a
markdown fragment with each table, the command that made it and the paper's
numbers beside ours. Every method runs on a fork of one contaminated session
per episode (:func:`unsee.impl.methods.baselines.apply_method`), so rows are paired;
wall times are medians (p50) over ``--rounds`` rounds. The compute floor
(:mod:`unsee.bench.floor`) is measured once per round from the full reset's
counterfactual and the forget's restore boundary. Methods this build does
not have (``METHODS`` in impl/methods/baselines.py) are skipped with a note.

This module is the command; the work is split by job: measuring an episode
(:mod:`unsee.bench.paper_measure`), the tables as runs
(:mod:`unsee.bench.paper_tables`), ``paper.md`` (:mod:`unsee.bench.paper_markdown`),
the plots (:mod:`unsee.bench.paper_plots`) and the engines of ``--engines``
(:mod:`unsee.bench.paper_engines`).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.bench import options
from unsee.impl.engines.protocol import Engine, MarginGuard
from unsee.impl.eval.paper import get_paper_figures

from .episodes import HISTORY_KINDS
from .paper_engines import get_engine_specs, load_engines, parse_engines
from .paper_markdown import describe_engine, render_engines, render_header, render_markdown
from .paper_measure import EXACT_METHODS, is_serving_engine
from .paper_plots import plot
from .paper_tables import SHAPES, TABLES


def run_engine(engine: Engine, args, tables: list[str], command: str, out: Path) -> dict:
    """Every table of ``tables`` on ``engine``; writes ``paper.json``,
    ``paper.md`` and the plots into ``out`` and returns the result."""
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    result = {"command": command, "model": engine.lm.name, "device": engine.lm.device, "dtype": engine.lm.dtype,
              "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
              "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "length": args.length,
              "shapes": args.shapes, "history_tokens": args.history_tokens, "history_kind": args.history_kind,
              "paper": get_paper_figures(), "notes": notes, "serving": is_serving_engine(engine), "tables": {}}
    for name in tqdm(tables, desc="tables", unit="table"):
        result["tables"][name] = TABLES[name](engine, args, notes)
    if isinstance(engine, MarginGuard):  # vLLM's margin guard, over the whole run
        result["guard"] = dict(engine.guard_stats)
    result["all_equal_to_reset"] = all(
        m["equal_to_reset"] in (True, None) for t in result["tables"].values()
        for row in (t.get("rows") or [t]) for method, m in row.get("methods", {}).items() if method in EXACT_METHODS)
    (out / "paper.json").write_text(json.dumps(result, indent=2))
    result["plots"] = plot(result, out)
    (out / "paper.md").write_text(render_markdown(result, command))
    return result


def get_parser() -> argparse.ArgumentParser:
    parser = options.get_parser("paper", __doc__)
    options.add_model(parser)
    parser.add_argument("--engines", default="",
                        help="run every table on each of these, comma-separated, in one run: backends "
                             "(transformers, llamacpp, ...: --model on it) or one-word engine names "
                             "(impl/engines/registry.py); all are loaded before any work. Default: transformers")
    options.add_device(parser)
    options.add_dtype(parser)
    parser.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                        help="vLLM engines of --engines: vLLM's tensor parallel size (GPUs per model replica)")
    parser.add_argument("--distributed-executor-backend", default=None, choices=("ray", "mp", "uni"),
                        help="vLLM engines of --engines: vLLM's executor for several GPUs or nodes (ray: nodes)")
    options.add_rounds(parser, help="repeats of every method (wall: p50)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--turns-after", type=int, default=12, help="model turns past the target (Table 1: 12)")
    parser.add_argument("--tau", type=int, default=3, help="where the target enters in the indep episodes")
    parser.add_argument("--length", type=int, default=12, help="T of the tau sweep's and position's episodes")
    parser.add_argument("--taus", default="", help="comma-separated taus of the sweep (default: 1..T)")
    parser.add_argument("--indeps", default="", help="comma-separated indep levels (default: 0,.25,.5,.75,1)")
    parser.add_argument("--tables", default=",".join(t for t in TABLES if t != "table1_paper"),
                        help=f"which of {','.join(TABLES)} (table1: the shapes of --shape)")
    parser.add_argument("--shape", default="current",
                        help="Table 1's session shapes, comma-separated: current (tau = 3) and/or paper "
                             "(about --history-tokens tokens before the target)")
    parser.add_argument("--history-tokens", type=int, default=1000,
                        help="tokens of history before the target in the paper shape (the paper's: ~1,000)")
    parser.add_argument("--history-kind", default="memory", choices=HISTORY_KINDS,
                        help="the paper shape's history: memory records (default) or turns the model answers "
                             "(bench/episodes.py HISTORY_KINDS says why memory)")
    options.add_out(parser, "out/paper")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]):
    """The checked arguments, with ``shapes`` and the expanded ``table_list``."""
    args = parser.parse_args(argv)
    args.shapes = [x.strip() for x in args.shape.split(",") if x.strip()]
    if not args.shapes or any(x not in SHAPES for x in args.shapes):
        parser.error(f"--shape {args.shape!r}: expected some of {','.join(SHAPES)}, comma-separated")
    if args.history_tokens < 1:
        parser.error(f"--history-tokens {args.history_tokens} must be at least 1")
    tables = [t for t in args.tables.split(",") if t]
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        parser.error(f"unknown tables {unknown}; expected some of {list(TABLES)}")
    args.table_list = list(dict.fromkeys(
        x for t in tables for x in ([SHAPES[s] for s in args.shapes] if t == "table1" else [t])))
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = get_parser()
    args = parse_args(parser, argv)
    command = "python -m unsee.bench.paper " + " ".join(shlex.quote(a) for a in argv)
    try:
        engines = load_engines(get_engine_specs(parse_engines(args.engines or "transformers"), args))
    except (ValueError, ImportError) as e:  # an unknown name, or an extra not installed: before any work
        parser.error(str(e))
    out = Path(args.out)
    results = {name: run_engine(engine, args, args.table_list, command, out / name if args.engines else out)
               for name, engine in engines.items()}
    if args.engines:
        shapes = {SHAPES[s]: ("the paper's session shape" if s == "paper" else "the current shape")
                  for s in args.shapes}
        first = next(iter(results.values()))
        engines_line = "Engines: " + "; ".join(describe_engine(n, r) for n, r in results.items()) + "."
        lines = render_header(first, command)
        lines[1] = engines_line + " " + lines[1].split(", ", 2)[-1]  # torch, threads, rounds, tokens per turn
        lines += render_engines(results, shapes)
        for name, result in results.items():
            lines += [f"## {describe_engine(name, result)}", ""] + render_markdown(result, command).splitlines()[1:]
        out.mkdir(parents=True, exist_ok=True)
        (out / "paper.json").write_text(json.dumps({"command": command, "engines": results}, indent=2))
        (out / "paper.md").write_text("\n".join(lines) + "\n")
    print((out / "paper.md").read_text())
    print(f"wrote {out}/paper.json and paper.md" + (f", one folder per engine ({', '.join(results)})"
                                                   if args.engines else ""))
    return 0 if all(r["all_equal_to_reset"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
