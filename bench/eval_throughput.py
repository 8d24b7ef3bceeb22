"""Eval throughput (issue 27, item 5): episodes of ``unsee eval`` per core-hour,
with every method the engine runs and every audit, on one thread.

    python -m unsee.bench.eval_throughput --model qwen2.5-1.5b --engine llamacpp
                                          [--suites memory,tool,behavioral,agentdojo] [--episodes 1]

Runs ``--episodes`` episodes of each suite (agentdojo only where its package
is installed) through :func:`unsee.impl.eval.run.run_case`, in this process,
on one torch thread and one llama.cpp thread. Per episode and in total it
prints the CPU time (``time.process_time``: what the episodes cost a core,
whatever else the machine runs), the wall time, and the model work the
engine counted (forwards, tokens prefilled and decoded). Episodes per
core-hour is ``3600 * episodes / CPU seconds``; the wall-time figure is given
beside it and is only meaningful on an idle machine.

Model loading (and llama.cpp's decode facts, measured at first load) is
outside the timed span. The CPU time is also split into the base
state's run, the methods (and by method), the audits' generations and the
distributional audit's samples (the rest is metrics and bookkeeping).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from unsee.bench import options
from unsee.impl.engines.counts import Counters

#: the counters printed per episode
WORK = ("forward_calls", "prefilled_tokens", "decoded_tokens")


def get_suites(names: str) -> list[str]:
    """The suites asked for, without agentdojo when its package is missing."""
    from unsee.impl.util.modules import get_missing_module

    suites = [s.strip() for s in names.split(",") if s.strip()]
    if "agentdojo" in suites and get_missing_module("agentdojo", "agentdojo.task_suite.load_suites"):
        suites.remove("agentdojo")
    return suites


def make_config(model: str, engine: str):
    """Every method the engine runs, the audits at their defaults, one worker."""
    from unsee.impl.eval.run import UNSUPPORTED_METHODS, EvalConfig
    from unsee.impl.methods.baselines import METHODS

    refused = UNSUPPORTED_METHODS.get(engine, {})
    return EvalConfig(model=model, backend=engine, methods=tuple(m for m in METHODS if m not in refused))


#: the parts of an episode timed apart: the runner's functions (impl/eval/run.py) that do them
PARTS = {"base": "make_runtime", "methods": "run_method", "audits": "ask_state", "distribution": "sample_distribution"}


@contextlib.contextmanager
def time_parts(engine, parts: dict) -> Iterator[None]:
    """Add each part's CPU seconds and engine work to ``parts`` while open
    (the runner's functions wrapped in its module; unwrapped on exit)."""
    from unsee.impl.eval import run as runner

    originals = {name: getattr(runner, name) for name in PARTS.values()}

    def timed(part: str, fn):
        def wrapper(*args, **kwargs):
            before, cpu = engine.counters.snapshot(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent, took = engine.counters - before, time.process_time() - cpu
                names = [part] + ([f"{part}/{args[1]}"] if part == "methods" else [])  # run_method(base, method, case)
                for name in names:
                    into = parts.setdefault(name, dict.fromkeys(("cpu_s", *WORK), 0))
                    into["cpu_s"] += took
                    for k in WORK:
                        into[k] += getattr(spent, k)
        return wrapper

    for part, name in PARTS.items():
        setattr(runner, name, timed(part, originals[name]))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(runner, name, fn)


def time_episode(engine, case, config) -> dict:
    """One episode's rows, timed: CPU and wall seconds and the engine's work, in all and by part."""
    from unsee.impl.eval.run import run_case

    parts: dict = {}
    before: Counters = engine.counters.snapshot()
    cpu, wall = time.process_time(), time.perf_counter()
    with time_parts(engine, parts):
        rows = list(run_case(engine, case, config))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    spent = engine.counters - before
    return {"suite": case.suite, "case": case.id, "rows": len(rows), "cpu_s": cpu, "wall_s": wall,
            **{k: getattr(spent, k) for k in WORK}, "parts": parts}


def run(model: str, engine_name: str, suites: list[str], episodes: int, seed: int = 0) -> list[dict]:
    """Time ``episodes`` episodes of each suite on one thread."""
    import torch

    from unsee.impl.eval.run import generate_cases, load_engine

    torch.set_num_threads(1)
    config = make_config(model, engine_name)
    engine = load_engine(config)
    cases = [c for s in suites for c in generate_cases(s, episodes, seed=seed)]
    return [time_episode(engine, case, config) for case in cases]


def summarize(records: list[dict]) -> dict:
    """Totals and the throughput figures."""
    cpu = sum(r["cpu_s"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    n = len(records)
    return {"episodes": n, "cpu_s": cpu, "wall_s": wall,
            "episodes_per_core_hour": 3600 * n / cpu if cpu else None,
            "episodes_per_hour_wall": 3600 * n / wall if wall else None,
            "cpu_s_per_episode": cpu / n if n else None,
            **{k: sum(r[k] for r in records) for k in WORK}}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("eval_throughput", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--suites", default="memory,tool,behavioral,agentdojo")
    parser.add_argument("--episodes", type=int, default=1, help="episodes of each suite")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the records and the summary to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("UNSEE_LLAMA_THREADS", "1")
    records = run(args.model, args.engine, get_suites(args.suites), args.episodes, args.seed)
    print(f"model {args.model}, engine {args.engine}, one thread")
    print(f"{'episode':<28} {'rows':>4} {'cpu s':>7} {'wall s':>7} {'forwards':>8} {'prefilled':>9} {'decoded':>8}")
    for r in records:
        print(f"{r['suite'] + '/' + r['case']:<28} {r['rows']:>4} {r['cpu_s']:>7.1f} {r['wall_s']:>7.1f} "
              f"{r['forward_calls']:>8} {r['prefilled_tokens']:>9} {r['decoded_tokens']:>8}")
    total = summarize(records)
    print(f"{'total':<28} {'':>4} {total['cpu_s']:>7.1f} {total['wall_s']:>7.1f} {total['forward_calls']:>8} "
          f"{total['prefilled_tokens']:>9} {total['decoded_tokens']:>8}")
    print(f"episodes per core-hour (CPU time): {total['episodes_per_core_hour']:.1f}; "
          f"per hour of wall time: {total['episodes_per_hour_wall']:.1f}; "
          f"CPU s per episode: {total['cpu_s_per_episode']:.1f}")
    print("where the CPU time goes (all episodes):")
    for part in PARTS:
        got = [r["parts"][part] for r in records if part in r["parts"]]
        cpu = sum(g["cpu_s"] for g in got)
        print(f"  {part:<13} {cpu:>7.1f} s ({100 * cpu / total['cpu_s']:.0f}%)  "
              + "  ".join(f"{k} {sum(g[k] for g in got)}" for k in WORK))
    print("the methods' CPU time, by method:")
    methods = sorted({p.split("/", 1)[1] for r in records for p in r["parts"] if p.startswith("methods/")})
    for method in methods:
        got = [r["parts"][f"methods/{method}"] for r in records if f"methods/{method}" in r["parts"]]
        cpu = sum(g["cpu_s"] for g in got)
        print(f"  {method:<20} {cpu:>7.1f} s ({100 * cpu / total['cpu_s']:.0f}%)  "
              + "  ".join(f"{k} {sum(g[k] for g in got)}" for k in WORK))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as sink:
            json.dump({"records": records, "summary": total}, sink, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
