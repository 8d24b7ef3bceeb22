"""Sweep the injection step tau and measure forget (B7) against full reset (B5).

Reproduces the paper's "T - tau + 1 law" (Section 4.5): the full reset's
recomputation stays flat while selective replay's falls linearly in tau.
Writes ``sweep.json`` and ``sweep.png`` into ``--out``.

    python -m unsee.bench.sweep --model smollm2 --out out/sweep
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.bench import options
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import load_engine
from unsee.impl.methods.baselines import apply_method

from .episodes import make_bench_episode


def measure(engine: Engine, tau: int, length: int, max_new_tokens: int, policy: str) -> dict:
    """One episode: run it, then forget and reset from the same contaminated state."""
    episode = make_bench_episode(tau, length, max_new_tokens, policy)
    base = AgentRuntime.from_episode(engine, episode)
    row: dict = {"tau": tau, "T": length}
    for method in ("replay", "reset"):
        _, result = apply_method(base, method, episode.target.source)
        row[method] = {k: getattr(result, k) for k in ("invocations", "prefilled_tokens", "decoded_tokens",
                                                       "recomputed_tokens", "wall_s", "digest")}
    row["equal"] = row["replay"]["digest"] == row["reset"]["digest"]
    row["token_ratio"] = row["reset"]["recomputed_tokens"] / row["replay"]["recomputed_tokens"]
    row["wall_ratio"] = row["reset"]["wall_s"] / row["replay"]["wall_s"]
    return row


def fit_r2(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line ``y = a + b x`` and its R^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, (1 - ss_res / ss_tot) if ss_tot else 1.0


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = [r["tau"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(taus, [r["replay"]["invocations"] for r in rows], "o-", label="selective replay (B7)")
    left.plot(taus, [r["reset"]["invocations"] for r in rows], "s--", label="full reset (B5)")
    left.plot(taus, [rows[0]["T"] - t + 1 for t in taus], ":", color="gray", label="T - tau + 1")
    left.set(xlabel="injection step tau", ylabel="transitions of F", title="Corollary 1: transitions")
    left.legend()
    right.plot(taus, [r["replay"]["recomputed_tokens"] for r in rows], "o-", label="selective replay (B7)")
    right.plot(taus, [r["reset"]["recomputed_tokens"] for r in rows], "s--", label="full reset (B5)")
    right.set(xlabel="injection step tau", ylabel="recomputed tokens (prefill + decode)",
              title="recomputed tokens")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("sweep", __doc__)
    options.add_model(parser)
    options.add_device(parser)
    options.add_dtype(parser)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--policy", default="every_turn")
    parser.add_argument("--taus", default="", help="comma-separated taus (default: all of 1..T)")
    options.add_out(parser, "out/sweep")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = load_engine(args.model, "transformers", device=args.device, dtype=args.dtype)
    taus = [int(t) for t in args.taus.split(",")] if args.taus else list(range(1, args.length + 1))
    rows = [measure(engine, tau, args.length, args.max_new_tokens, args.policy)
            for tau in tqdm(taus, desc="tau sweep", unit="episode")]
    _, slope, r2 = fit_r2([r["tau"] for r in rows], [r["replay"]["recomputed_tokens"] for r in rows])
    result = {"model": engine.lm.name, "device": args.device, "dtype": args.dtype, "torch": torch.__version__,
              "machine": platform.machine(), "threads": torch.get_num_threads(), "policy": args.policy,
              "rows": rows, "replay_tokens_vs_tau": {"slope": slope, "r2": r2},
              "all_equal": all(r["equal"] for r in rows)}
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "sweep.png", f"{engine.lm.name}, T={args.length}, {args.device} {args.dtype}")
    print(f"{'tau':>4} {'B7 F':>5} {'B5 F':>5} {'B7 tok':>7} {'B5 tok':>7} {'tok x':>6} {'B7 s':>6} {'B5 s':>6} equal")
    for r in rows:
        print(f"{r['tau']:>4} {r['replay']['invocations']:>5} {r['reset']['invocations']:>5} "
              f"{r['replay']['recomputed_tokens']:>7} {r['reset']['recomputed_tokens']:>7} {r['token_ratio']:>6.2f} "
              f"{r['replay']['wall_s']:>6.2f} {r['reset']['wall_s']:>6.2f} {r['equal']}")
    print(f"replay tokens vs tau: slope {slope:.1f} tokens/step, R^2 = {r2:.3f}; wrote {out}/sweep.json, sweep.png")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
