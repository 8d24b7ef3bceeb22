"""Memory under many long conversations (issue 40, item 6; docs/serve.md,
"The KV budget").

Starts ``unsee serve``'s pool in-process under the default KV budget (half
of the memory the machine has left once the model is loaded:
impl/serve/budget.py) or ``--kv-budget``, opens ``--conversations``
conversations through the ``openai`` client, each with a first message of
``--history-tokens`` tokens and a short answer, and records after each the
bytes the engine holds, the process's resident memory (RSS) and the
evictions. The claim: the held bytes stay under the budget, and RSS is the
loaded model plus about the KV held. ::

    python -m unsee.bench.serve_memory --engine llamacpp --model gemma3-270m --conversations 64 \\
        --history-tokens 2000 --out out/serve-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from unsee import Settings, load_engine
from unsee.bench import options
from unsee.bench.serve_peer import get_document
from unsee.impl.serve.budget import get_default_kv_budget, get_physical_bytes, get_resident_bytes


def run(args: argparse.Namespace, progress=print) -> dict:
    import openai

    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    rss_before = get_resident_bytes()
    engine = load_engine(args.model, args.engine)
    rss_model = get_resident_bytes()
    budget = args.kv_budget if args.kv_budget is not None else get_default_kv_budget()
    engine.budget.set(budget)
    pool = Pool(engine, args.store or tempfile.mkdtemp(prefix="serve-memory-"), kv_budget=budget, busy_wait=60,
                defaults=Settings(max_new_tokens=args.max_output_tokens))
    document = get_document(args.history_tokens, lambda text: len(engine.lm.encode(text)))
    rows, started = [], time.perf_counter()
    with ServerThread(pool, args.model) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)
        for j in range(args.conversations):
            conv = client.conversations.create().id
            text = f"Conversation {j}. {document}"
            client.responses.create(model="m", conversation=conv, input=text)
            row = {"conversations": j + 1, "held_bytes": pool.get_held_bytes(), "rss_bytes": get_resident_bytes(),
                   "evictions": pool.stats["evictions"], "seconds": time.perf_counter() - started}
            rows.append(row)
            progress(f"{j + 1}/{args.conversations}: held {row['held_bytes'] / 2**20:.0f} MiB, "
                     f"RSS {row['rss_bytes'] / 2**20:.0f} MiB, evictions {row['evictions']}")
    return {"model": args.model, "engine": args.engine, "conversations": args.conversations,
            "history_tokens": args.history_tokens, "prompt_tokens": len(engine.lm.encode(document)),
            "physical_bytes": get_physical_bytes(), "kv_budget": budget, "budget_given": args.kv_budget is not None,
            "rss_before_model_bytes": rss_before, "rss_model_bytes": rss_model,
            "peak_held_bytes": max(r["held_bytes"] for r in rows), "peak_rss_bytes": max(r["rss_bytes"] for r in rows),
            "under_budget": budget is None or all(r["held_bytes"] <= budget for r in rows),
            "wall_s": time.perf_counter() - started, "cores": os.cpu_count(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("serve_memory", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--history-tokens", type=int, default=2000, metavar="N",
                        help="the first message's length in the model's tokens (at least)")
    parser.add_argument("--max-output-tokens", type=int, default=4)
    parser.add_argument("--kv-budget", type=int, default=None, metavar="BYTES",
                        help="default: unsee serve's (half of the memory left once the model is loaded)")
    parser.add_argument("--store", help="the server's folder (default: a new temporary one)")
    options.add_out(parser, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    out = run(args)
    summary = {k: v for k, v in out.items() if k != "rows"}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0 if out["under_budget"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
