"""Eval throughput (issue 27, item 5): episodes of ``unsee eval`` per core-hour,
with every method the engine runs and every audit, on one thread.

    python -m unsee.bench.eval_throughput [--model qwen2.5-1.5b] [--engine llamacpp]
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
outside the timed span.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from unsee.impl.engines.lineage import Counters

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


def time_episode(engine, case, config) -> dict:
    """One episode's rows, timed: CPU and wall seconds and the engine's work."""
    from unsee.impl.eval.run import run_case

    before: Counters = engine.counters.snapshot()
    cpu, wall = time.process_time(), time.perf_counter()
    rows = list(run_case(engine, case, config))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    spent = engine.counters - before
    return {"suite": case.suite, "case": case.id, "rows": len(rows), "cpu_s": cpu, "wall_s": wall,
            **{k: getattr(spent, k) for k in WORK}}


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--engine", default="llamacpp")
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
    if args.json:
        with open(args.json, "w", encoding="utf-8") as sink:
            json.dump({"records": records, "summary": total}, sink, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
