"""A forget through compaction (issue 52): an episode whose secret is summarised by one or two
``compact`` steps, forgotten by Algorithm 1 (:meth:`~unsee.impl.agent.runtime.AgentRuntime.forget`),
set against the full reset's twin (same digest) and the compute floor (impl/methods/floor.py),
the floor including the re-summaries: forwards, tokens recomputed, CPU time of both.

    OMP_NUM_THREADS=1 python -m unsee.bench.compaction_cost --model tiny --compactions 2

Prints one JSON object. The goal (a DELETE through one compaction within 1.15x its floor) is
for ``qwen2.5-1.5b``, where the summary is a real one; on the tiny model the summary is noise.
"""

from __future__ import annotations

import json
import time

from unsee import AgentRuntime, Episode, Item, Settings, Step
from unsee.bench import options
from unsee.impl.engines.registry import load_engine
from unsee.impl.methods.floor import compute_floor

SECRET = "the vault code is 9-4-7-1"


def get_episode(compactions: int, max_new_tokens: int) -> Episode:
    """User turns, the secret in the second, then ``compactions`` times a compaction and a user turn."""
    steps = [Step("u1", "user", (Item("u1", "Hi, I am Ada and I live in Oslo."),)),
             Step("s1", "user", (Item("s1", f"Remember this: {SECRET}."),))]
    for n in range(compactions):
        steps += [Step(f"c{n + 1}", "compact"), Step(f"u{n + 2}", "user", (Item(f"u{n + 2}", "Go on."),))]
    return Episode("You are a helpful assistant.", tuple(steps), Settings(max_new_tokens=max_new_tokens))


def measure(engine, compactions: int, max_new_tokens: int) -> dict:
    """One forget of the secret, its twin and its floor."""
    base = AgentRuntime.from_episode(engine, get_episode(compactions, max_new_tokens))
    summaries = [b.id for b in base.graph.blocks() if b.type == "summary" and "s1" in b.source_ids]
    reset = base.fork()
    reset.full_reset("s1")
    forgot = base.fork()
    started = time.process_time()
    report = forgot.forget("s1")  # as a DELETE runs it: drafts where the engine has a bound
    cpu = time.process_time() - started
    floor = compute_floor(engine, base, reset, report.boundary)
    return {"compactions": compactions, "summaries_that_read_the_secret": len(summaries),
            "tau": report.tau, "length": report.length, "invocations": report.invocations,
            "equals_twin": forgot.digest() == reset.digest(),
            "forget": {"forwards": report.forward_calls, "prefilled": report.prefilled_tokens,
                       "decoded": report.decoded_tokens, "cpu_s": round(cpu, 4)},
            "floor": {"forwards": floor.forwards, "prefilled": floor.prefilled, "decoded": floor.decoded,
                      "cpu_s": round(floor.cpu_s, 4)},
            "forwards_over_floor": round(report.forward_calls / floor.forwards, 3),
            "cpu_over_floor": round(cpu / floor.cpu_s, 3) if floor.cpu_s else None}


def main(argv: list[str] | None = None) -> None:
    parser = options.get_parser("compaction_cost", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--compactions", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    engine = load_engine(args.model, args.engine)
    print(json.dumps(measure(engine, args.compactions, args.max_new_tokens), indent=1))


if __name__ == "__main__":
    main()
