"""Forget with drafts against forget without them and the full reset, on the
llama.cpp engine: one episode, the same base state, digests and tokens compared.

    python -m unsee.bench.llamacpp_drafts [--engine llamacpp|NAME|FILE.gguf] [--tau 3] [--length 12]
                                          [--max-new-tokens 24]

Prints one line per method (tokens decoded and prefilled, forwards, draft
tokens accepted, wall time) and whether each equals the reset (digest and
every generated token). Drafts run where the engine measured decode ==
prefill for the file (impl/engines/llamacpp/facts.py).
"""

from __future__ import annotations

from unsee.bench import options
from unsee.bench.episodes import make_bench_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import load_engine


def run(engine_name: str, tau: int, length: int, max_new_tokens: int) -> list[dict]:
    """The three methods on one base state; rows for the table."""
    engine = load_engine(engine_name, backend="llamacpp" if engine_name.endswith(".gguf") else None)
    episode = make_bench_episode(tau, length, max_new_tokens=max_new_tokens)
    base = AgentRuntime.from_episode(engine, episode)
    target = episode.target.source
    rows = []
    runtimes = {}
    for method in ("reset", "forget, drafts off", "forget, drafts on"):
        runtime = base.fork()
        if method == "reset":
            report = runtime.full_reset(target)
        else:
            report = runtime.forget(target, drafts=method.endswith("on"))
        runtimes[method] = runtime
        rows.append({"method": method, "context": len(engine.tokens(runtime.lineage)),
                     "decoded": report.decoded_tokens, "prefilled": report.prefilled_tokens,
                     "forwards": report.forward_calls, "accepted": report.draft_accepted_tokens,
                     "wall_s": report.wall_s, "digest": report.digest,
                     "bound_source": report.drafts.to_json().get("bound_source", "")})
    reset = runtimes["reset"]
    for row in rows:
        other = runtimes[row["method"]]
        row["equals_reset"] = (row["digest"] == rows[0]["digest"]
                               and other.generated_tokens() == reset.generated_tokens())
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_drafts", __doc__)
    options.add_engine(parser)
    parser.add_argument("--tau", type=int, default=3)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    rows = run(args.engine, args.tau, args.length, args.max_new_tokens)
    print(f"engine {args.engine}, tau {args.tau}, T {args.length}, max_new_tokens {args.max_new_tokens}, "
          f"context after the forget {rows[0]['context']} tokens")
    print(f"{'method':<20} {'decoded':>8} {'prefilled':>9} {'forwards':>8} {'accepted':>8} {'wall s':>7}  = reset")
    for r in rows:
        print(f"{r['method']:<20} {r['decoded']:>8} {r['prefilled']:>9} {r['forwards']:>8} {r['accepted']:>8} "
              f"{r['wall_s']:>7.2f}  {r['equals_reset']}")
    print("bound:", rows[-1]["bound_source"])
    return 0 if all(r["equals_reset"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
