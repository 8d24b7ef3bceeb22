"""Cross-engine agreement and forget/reset on both engines, on the bench episodes.

    python -m unsee.bench.engines --engines smollm2 llamacpp --out out/engines.json

For each tau of :func:`unsee.bench.episodes.make_bench_episode` (12 steps) and
each engine: run the episode, then forget the target (B7) and fully reset
(B5) on two forks of the same session. Reported per engine: tau, restore
boundary, invocations, closure, whether forget == reset (digest and every
generated token), and the wall time of each. Across engines: whether tau,
boundary, invocations and closure agree (they do not depend on numerics),
and how often the generated tokens differ: the share of model turns whose
tokens differ, and where the first difference falls (turn, token index).
Checkpoint byte counts are not compared: they follow token offsets, which
follow generated lengths.

Timings on a shared machine are indicative only.
"""

from __future__ import annotations

import json
import time

from unsee.bench import options
from unsee.bench.episodes import make_bench_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import ENGINE_NAMES, load_engine

STRUCTURAL = ("tau", "boundary", "invocations", "closure")


def run_engine(name: str, taus: list[int], max_new_tokens: int, threads: int) -> dict:
    options = {"threads": threads} if name.startswith("llamacpp") else {}
    if not name.startswith("llamacpp"):
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    engine = load_engine(name, **options)
    out = {"engine": name, "load_s": round(time.perf_counter() - t0, 2), "episodes": {}}
    for tau in taus:
        episode = make_bench_episode(tau, max_new_tokens=max_new_tokens)
        t0 = time.perf_counter()
        base = AgentRuntime.from_episode(engine, episode)
        run_s = time.perf_counter() - t0
        generated = base.generated_tokens()
        forgot, reset = base.fork(), base.fork()
        f = forgot.forget(episode.target.source)
        r = reset.full_reset(episode.target.source)
        out["episodes"][tau] = {
            "tau": f.tau, "boundary": f.boundary, "invocations": f.invocations, "closure": list(f.closure),
            "reset_invocations": r.invocations, "T": f.length,
            "forget_equals_reset": forgot.digest() == reset.digest()
            and forgot.generated_tokens() == reset.generated_tokens(),
            "run_s": round(run_s, 3), "forget_s": round(f.wall_s, 3), "reset_s": round(r.wall_s, 3),
            "forget_prefilled": f.prefilled_tokens, "forget_decoded": f.decoded_tokens,
            "reset_prefilled": r.prefilled_tokens, "reset_decoded": r.decoded_tokens,
            "generated": [[block, list(tokens)] for block, tokens in generated],
            "generated_after_forget": [[block, list(tokens)] for block, tokens in forgot.generated_tokens()],
        }
    return out


def first_difference(a: list, b: list) -> dict | None:
    """Where two runs' model turns first differ: (turn index, block, token index)."""
    for i, ((block_a, ta), (block_b, tb)) in enumerate(zip(a, b)):
        if block_a != block_b or ta != tb:
            k = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            return {"turn": i, "block": block_a, "token": k}
    if len(a) != len(b):
        return {"turn": min(len(a), len(b)), "block": None, "token": 0}
    return None


def agreement(runs: list[dict]) -> dict:
    a, b = runs[0], runs[1]
    rows = {}
    for tau, ea in a["episodes"].items():
        eb = b["episodes"][tau]
        turns = list(zip(ea["generated"], eb["generated"]))
        differ = sum(1 for x, y in turns if x != y)
        rows[tau] = {
            "structural_agree": {k: ea[k] == eb[k] for k in STRUCTURAL},
            "turns": len(turns), "turns_differ": differ,
            "first_difference": first_difference(ea["generated"], eb["generated"]),
            "first_difference_after_forget": first_difference(ea["generated_after_forget"],
                                                              eb["generated_after_forget"]),
        }
    total = sum(r["turns"] for r in rows.values())
    return {"engines": [a["engine"], b["engine"]], "per_tau": rows,
            "structural_agree_all": all(all(r["structural_agree"].values()) for r in rows.values()),
            "turns_differ_share": round(sum(r["turns_differ"] for r in rows.values()) / total, 3) if total else None}


def main(argv=None) -> None:
    p = options.get_parser("engines", __doc__)
    p.add_argument("--engines", nargs=2, default=["smollm2", "llamacpp"], choices=ENGINE_NAMES)
    p.add_argument("--taus", nargs="+", type=int, default=[1, 6, 12])
    p.add_argument("--max-new-tokens", type=int, default=16)
    options.add_threads(p)
    options.add_out(p)
    args = p.parse_args(argv)
    runs = [run_engine(name, args.taus, args.max_new_tokens, args.threads) for name in args.engines]
    result = {"runs": runs, "agreement": agreement(runs), "threads": args.threads,
              "max_new_tokens": args.max_new_tokens}
    for run in runs:
        for tau, e in run["episodes"].items():
            print(f"{run['engine']:>14} tau={tau:>2} boundary={e['boundary']:>2} F={e['invocations']:>2} "
                  f"forget={e['forget_s']:.2f}s reset={e['reset_s']:.2f}s forget==reset={e['forget_equals_reset']}")
    ag = result["agreement"]
    print(f"structural agreement: {ag['structural_agree_all']}; model turns with different tokens: "
          f"{ag['turns_differ_share']}")
    for tau, row in ag["per_tau"].items():
        print(f"  tau={tau}: {row['turns_differ']}/{row['turns']} turns differ; first at {row['first_difference']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
