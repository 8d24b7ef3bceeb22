"""Command line: ``unsee run EPISODE.json`` and ``unsee demo``.

Exit codes: 0 success, 2 bad input (the message names it), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys

from .baselines import METHODS, PAPER_NAMES, apply_method
from .demo import _bar, run_demo
from .episode import EpisodeError, load_episode
from .provenance import UnknownSourceError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="unsee", description="Exact forgetting for stateful LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an episode, optionally forget a source, print the report")
    run.add_argument("episode", help="path to an episode JSON file (docs/episode-format.md)")
    run.add_argument("--forget", metavar="SOURCE_ID", help="source id to forget (default: the episode's target)")
    run.add_argument("--method", default="replay", choices=METHODS,
                     help="replay (B7, Algorithm 1), reset (B5), none (B0), or another baseline")
    _model_options(run)
    run.add_argument("--probe", action="append", default=[], help="ask this question of the final state")
    run.add_argument("--json", action="store_true", help="machine-readable output")

    demo = sub.add_parser("demo", help="the leak, the forget and its cost on the default model")
    _model_options(demo)
    demo.add_argument("--json", action="store_true", help="machine-readable output")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            run_demo(args.model, args.device, args.dtype, as_json=args.json)
            return 0
        return _run(args)
    except (EpisodeError, UnknownSourceError, ValueError) as exc:
        print(f"unsee: error: {exc}", file=sys.stderr)
        return 2


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (embedded default), tiny, or a local checkpoint folder / .gguf file")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")


def _run(args: argparse.Namespace) -> int:
    from .kv import KVEngine
    from .models import load_model
    from .runtime import AgentRuntime

    episode = load_episode(args.episode)
    source = args.forget or (episode.target.source if episode.target else None)
    if args.method != "none" and source is None:
        raise EpisodeError(f"{args.episode}: no --forget given and the episode names no target")
    if source is not None and source not in episode.get_sources():
        raise UnknownSourceError(f"unknown source id {source!r}: the episode has {list(episode.get_sources())}")
    value = episode.target.value if episode.target and episode.target.source == source else None
    engine = KVEngine(load_model(args.model, device=args.device, dtype=args.dtype))
    runtime = AgentRuntime.from_episode(engine, episode, _bar("run", not args.json))
    output: dict = {"episode": args.episode, "model": engine.lm.name, "T": runtime.t,
                    "digest_before": runtime.digest()}
    if source is not None:
        runtime, result = apply_method(runtime, args.method, source, value)
        output["result"] = result.to_json()
    output["digest"] = runtime.digest()
    output["probes"] = {q: runtime.probe(q) for q in args.probe}
    if args.json:
        print(json.dumps(output, indent=2, default=str))
        return 0
    print(f"episode {args.episode}: T = {runtime.t} transitions on {engine.lm.name}")
    if "result" in output:
        r = output["result"]
        print(f"method   {PAPER_NAMES[args.method]} on source {source!r}")
        if r["report"]:
            rep = r["report"]
            print(f"tau      {rep['tau']}   restored checkpoint at boundary {rep['boundary']} "
                  f"({rep['checkpoint_bytes']} bytes of metadata)")
            print(f"closure  {len(rep['closure'])} blocks: {', '.join(rep['closure'][:8])}"
                  f"{' ...' if len(rep['closure']) > 8 else ''}")
            print(f"A1-A3    " + "; ".join(f"{k}: {'holds' if v['holds'] else 'FAILS'}"
                                           for k, v in rep["assumptions"].items()))
        print(f"cost     {r['invocations']} transitions, {r['prefilled_tokens']} prefilled + "
              f"{r['decoded_tokens']} decoded tokens, {r['wall_s']:.2f} s")
    print(f"digest   {output['digest']}")
    for q, a in output["probes"].items():
        print(f"probe    {q!r} -> {a!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
