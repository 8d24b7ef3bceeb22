"""Table 1's forget against reset on several engines, in one run: vLLM beside
transformers and llama.cpp, each loaded by name through the registry.

    python -m unsee.bench.engines_table1 --engines vllm,smollm2,llamacpp --rounds 3 --out out/engines-table1.json

Each engine runs Table 1's episode (bench/paper.py, ``make_table1_episode``,
the ``current`` shape: indep 0.5, 12 turns past the target at tau = 3, 32
tokens a turn) through :func:`unsee.bench.paper.measure_episode`: B5 (reset),
B5' (reset with the prefix cache), B7-oracle and B7 (replay), ``--rounds``
times each on forks of one session. Per method: prefilled, decoded and cached
(reused) tokens, wall p50, and whether the final digest equals B5's. On vLLM a
reset draws a fresh salt (a cold run), so B5' is served nothing either; B7's
restore is served from the checkpoint's cached blocks (``reused_tokens``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from unsee.impl.engines.registry import ENGINE_NAMES, load_engine
from unsee.impl.util.progress import open_bar

from .paper import TABLE1_METHODS, make_table1_episode, measure_episode

FIELDS = ("prefilled_tokens", "decoded_tokens", "reused_tokens", "wall_p50_s", "equal_to_reset")


def measure_engine(name: str, args) -> dict:
    """Table 1's methods on the engine ``name``: one row per method."""
    engine = load_engine(name)
    episode = make_table1_episode(engine, args, "current")
    rounds = []
    for _ in range(args.rounds):
        # one round per session: on vLLM a round's blocks would serve the next one's
        # replay (same salt, same tokens), so its prefix cache is released between rounds
        release = getattr(engine, "release_prefix_cache", None)
        if release is not None:
            release()
        rounds.append(measure_episode(engine, episode, TABLE1_METHODS, 1, floor=False))
    row = rounds[0]
    methods = {m: {k: row["methods"][m].get(k) for k in FIELDS} for m in row["methods"]}
    for m, fields in methods.items():
        walls = [r["methods"][m]["wall_p50_s"] for r in rounds]
        fields["wall_p50_s"], fields["wall_s"] = statistics.median(walls), walls
        fields["same_counts_every_round"] = all(
            r["methods"][m][k] == row["methods"][m][k] for r in rounds for k in FIELDS[:3])
    return {"engine": name, "model": engine.lm.name, "tau": row["tau"], "boundary": row["boundary"],
            "prefix_tokens": row["prefix_tokens"], "suffix_tokens": row["suffix_tokens"], "methods": methods,
            "guard": getattr(engine, "guard_stats", None)}  # vLLM: decisions, cold recomputes, flips


def render(rows: list[dict], command: str) -> str:
    lines = [f"`{command}`", "", "| engine | method | prefilled | decoded | cached | wall p50 (s) | == reset |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        for method, m in r["methods"].items():
            lines.append(f"| {r['engine']} | {method} | {m['prefilled_tokens']} | {m['decoded_tokens']} | "
                         f"{m['reused_tokens']} | {m['wall_p50_s']:.2f} | {m['equal_to_reset']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m unsee.bench.engines_table1", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="vllm,smollm2,llamacpp", help="one-word engine names, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--turns-after", type=int, default=12)
    parser.add_argument("--tau", type=int, default=3)
    parser.add_argument("--out", default="out/engines-table1.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    bad = [n for n in names if n not in ENGINE_NAMES]
    if bad or args.rounds < 1:
        parser.error(f"--engines: {bad} not among {tuple(ENGINE_NAMES)}" if bad else "--rounds must be >= 1")
    args.history_tokens = None
    command = "python -m unsee.bench.engines_table1 " + " ".join(shlex.quote(a) for a in argv)
    rows, bar = [], open_bar("engines", len(names), "engine")
    for name in names:
        rows.append(measure_engine(name, args))
        bar.update(1)
    bar.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": command, "rounds": args.rounds, "rows": rows}, indent=1))
    print(render(rows, command))
    # every exact method must equal the reset; the oracle trusts labels and may not (that is its point)
    return 0 if all(m["equal_to_reset"] in (True, None) for r in rows
                    for name, m in r["methods"].items() if name != "replay-oracle") else 1


if __name__ == "__main__":
    raise SystemExit(main())
