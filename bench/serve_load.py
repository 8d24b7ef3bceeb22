"""A bounded load test of ``unsee serve`` on loopback (issue 30, docs/serve.md).

Many conversations, each driven by the ``openai`` client through its own
script (responses, streamed and not, and a forget of one of its items, by
``DELETE /v1/conversations/{id}/items/{item_id}``), run concurrently by
``--workers`` client threads against one server, under a KV budget smaller
than the conversations' KV together. It reports throughput, p50/p99 latency
per kind of request, the evictions and rebuilds, and then replays every
conversation serially in-process (the same steps and forgets, on the same
engine, one at a time, never stored; with ``--slots`` above 1, on an engine
of one slot, so the batched decode steps are checked against steps alone)
and counts the final digests that differ from the server's (the claim: 0).

    python -m unsee.bench.serve_load --model tiny --conversations 24 --turns 5 --workers 8 --out out/serve_load.json
    python -m unsee.bench.serve_load --engine llamacpp --model tiny --conversations 8 --workers 8 --slots 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from unsee import Item, Settings, Step, load_engine
from unsee.bench import options
from unsee.impl.agent.tools.client import ClientToolRuntime


def get_percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def get_script(j: int, turns: int) -> list[tuple]:
    """Conversation ``j``'s requests: a response per turn (every other one
    streamed), and after turn 2 a forget of turn 2's item, which holds a secret."""
    script = []
    for i in range(1, turns + 1):
        text = f"My code is {1000 + 37 * j}-{i}." if i == 2 else f"Message {i} of conversation {j}."
        script.append(("response", f"c{j}u{i}", text, i % 2 == 0))
        if i == 2:
            script.append(("forget", f"c{j}u{i}"))
    return script


def run_script(client, conv_id: str, script: list[tuple], deadline: float, timings: list, lock) -> list[tuple]:
    """Run the script until done or past ``deadline``; the operations done, in order."""
    done = []
    for op in script:
        if time.monotonic() > deadline:
            break
        start = time.perf_counter()
        if op[0] == "response":
            _, item_id, text, streamed = op
            item = {"type": "message", "role": "user", "content": text, "id": item_id}
            reply = client.responses.create(model="m", conversation=conv_id, input=[item], stream=streamed)
            if streamed:
                kinds = [event.type for event in reply]
                assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
        else:
            client.conversations.items.delete(op[1], conversation_id=conv_id)
        with lock:
            timings.append((op[0] + ("/stream" if op[0] == "response" and op[3] else ""), time.perf_counter() - start))
        done.append(op)
    return done


def replay_serially(engine, system: str, settings: Settings, done: list[tuple]) -> tuple[str, int]:
    """The conversation's operations on a fresh runtime, in-process, one at a time:
    its digest, and the KV bytes its runtime held (the server's runtime: a conversation with no
    tools runs under its system prompt alone)."""
    before = engine.budget.memory().held_bytes
    runtime = ClientToolRuntime.start(engine, system=system, settings=settings)
    n = 0
    for op in done:
        if op[0] == "response":
            n += 1
            runtime.step(Step(f"turn_{n}", "user", (Item(op[1], op[2]),)))
        else:
            runtime.forget(op[1])
    digest, held = runtime.digest(), engine.budget.memory().held_bytes - before
    for lineage in {runtime.lineage} | runtime.checkpoints.lineages():
        if lineage in engine.budget.lineages:
            engine.drop(lineage)
    return digest, held


def run(args: argparse.Namespace) -> dict:
    import openai

    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    slots = getattr(args, "slots", None)
    engine = load_engine(args.model, getattr(args, "engine", None), kv_budget=args.kv_budget, slots=slots)
    settings = Settings(max_new_tokens=args.max_output_tokens)
    pool = Pool(engine, args.store or tempfile.mkdtemp(prefix="serve-load-"), kv_budget=args.kv_budget,
                busy_wait=60, defaults=settings)
    timings, lock, logs, digests = [], threading.Lock(), {}, {}
    with ServerThread(pool, args.model) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        convs = [client.conversations.create().id for _ in range(args.conversations)]
        deadline = time.monotonic() + args.deadline
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.workers) as workers:
            futures = {workers.submit(run_script, client, c, get_script(j, args.turns), deadline, timings, lock): c
                       for j, c in enumerate(convs)}
            for future in concurrent.futures.as_completed(futures):
                logs[futures[future]] = future.result()
        wall = time.perf_counter() - start
        for c in convs:
            digests[c] = client.conversations.retrieve(c).model_extra["unsee"]["digest"]
        stats = pool.get_stats()
    if slots and slots > 1:  # replayed on the layout every fact was measured on: one sequence, steps alone
        engine = load_engine(args.model, getattr(args, "engine", None), kv_budget=args.kv_budget, slots=1)
    serial = {c: replay_serially(engine, pool.system, settings, logs[c]) for c in convs}
    differ = [c for c in convs if serial[c][0] != digests[c]]
    by_kind = {}
    for kind, seconds in timings:
        by_kind.setdefault(kind, []).append(seconds)
    latency = {kind: {"n": len(v), "p50_ms": 1000 * get_percentile(v, 0.5), "p99_ms": 1000 * get_percentile(v, 0.99),
                      "mean_ms": 1000 * statistics.fmean(v)} for kind, v in sorted(by_kind.items())}
    every = [s for _, s in timings]
    return {"model": args.model, "engine": getattr(args, "engine", None) or "transformers",
            "conversations": args.conversations, "turns": args.turns, "workers": args.workers,
            "max_output_tokens": args.max_output_tokens, "kv_budget": args.kv_budget,
            "kv_sum_bytes": sum(held for _, held in serial.values()), "requests": len(timings), "wall_s": wall,
            "requests_per_s": len(timings) / wall, "p50_ms": 1000 * get_percentile(every, 0.5),
            "p99_ms": 1000 * get_percentile(every, 0.99), "forgets": len(by_kind.get("forget", [])),
            "latency": latency, "evictions": stats["evictions"], "rebuilds": stats["rebuilds"],
            "handovers": stats["handovers"], "forwards": stats["forwards"],
            "forward_s": stats["forward_s"], "slots": slots or 1, "decode_batches": stats["decode_batches"],
            "digests_differ": len(differ), "deadline_hit": any(len(logs[c]) < len(get_script(0, args.turns))
                                                               for c in convs)}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("serve_load", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-output-tokens", type=int, default=8)
    parser.add_argument("--kv-budget", type=int, default=262144, metavar="BYTES")
    parser.add_argument("--deadline", type=float, default=300, metavar="SECONDS",
                        help="start no request after this many seconds (the run is bounded in count and time)")
    parser.add_argument("--store", help="the server's folder (default: a new temporary one)")
    parser.add_argument("--slots", type=int, default=None,
                        help="llama.cpp: conversations resident at once, whose decode steps share a forward "
                             "(the serial replay then runs on one slot)")
    options.add_out(parser, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    out = run(args)
    report(out, args.out)
    return 0 if out["digests_differ"] == 0 and out["kv_budget"] < out["kv_sum_bytes"] else 1


def report(out: dict, path: str | None) -> None:
    """Print a serve bench's figures, and write them as JSON to ``path`` where given."""
    print(json.dumps(out, indent=1))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
