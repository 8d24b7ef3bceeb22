"""Forget against full reset on one episode file and one model: CPU time (``time.process_time``,
the measure a loaded machine disturbs least), wall time, tokens prefilled and decoded, and the
drafts, in one process on one loaded model (issue 27: the forget's cost on a real model).

The episode runs once; a fork of it forgets the target with the engine's drafts (whatever bound
the configuration has: shipped, calibrated, or none) and another fork resets. They must agree on
the digest. The run's first forward pays one-time costs (allocator, kernels' warm-up), so the
forget and the reset are timed after it, in the order given by ``--order``.

    OMP_NUM_THREADS=1 python -m unsee.bench.forget_cost examples/secret_in_tool_result.json \\
        --model qwen2.5-1.5b --backend transformers
"""

from __future__ import annotations

import json
import time

import torch

from unsee.bench import options
from unsee.impl.agent.episode import load_episode
from unsee.impl.agent.runtime import run_episode
from unsee.impl.engines.registry import load_engine


def time_method(runtime, method: str, target: str) -> dict:
    """One forget (``replay``) or reset on ``runtime``: its times, tokens and draft totals."""
    started, cpu = time.perf_counter(), time.process_time()
    report = runtime.forget(target) if method == "replay" else runtime.full_reset(target)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    totals = report.drafts.totals or {}
    return {"method": method, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "digest": report.digest,
            "invocations": report.invocations, "prefilled": report.prefilled_tokens,
            "decoded": report.decoded_tokens, "drafts_accepted": totals.get("accepted"),
            "drafts_offered": totals.get("draft"), "bound_source": report.drafts.bound_source}


def measure(path: str, model: str, backend: str, order: tuple[str, ...], **options) -> dict:
    """The episode of ``path`` run once, then each method of ``order`` on its own fork."""
    engine = load_engine(model, backend=backend, **options)
    episode = load_episode(path)
    original = run_episode(engine, episode)
    rows = [time_method(original.fork(), method, episode.target.source) for method in order]
    by = {r["method"]: r for r in rows}
    return {"model": model, "backend": backend, "episode": path, "target": episode.target.source,
            "equal_digests": by["replay"]["digest"] == by["reset"]["digest"],
            "cpu_ratio": round(by["replay"]["cpu_s"] / by["reset"]["cpu_s"], 3), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = options.get_parser("forget_cost", __doc__)
    parser.add_argument("episode")
    options.add_model(parser)
    options.add_backend(parser, "--backend")
    parser.add_argument("--order", default="replay,reset", help="the methods, in the order they are timed")
    options.add_threads(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loader_options = {"threads": args.threads} if args.backend == "llamacpp" else {}
    order = tuple(args.order.split(","))
    if sorted(order) != ["replay", "reset"]:
        raise SystemExit(f"--order {args.order!r}: give replay and reset, each once")
    print(json.dumps(measure(args.episode, args.model, args.backend, order, **loader_options), indent=1))


if __name__ == "__main__":
    main()
