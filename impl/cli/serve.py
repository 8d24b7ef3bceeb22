"""``unsee serve``: the OpenAI-compatible conversation server (docs/serve.md)."""

from __future__ import annotations

import argparse
import os
import sys

from unsee.impl.cli.exits import Exit
from unsee.impl.cli.options import add_engine_options


def add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve conversations over OpenAI's API; deleting an item is an exact forget")
    add_engine_options(serve, kv_budget_default="half of the memory the machine has left once the model is "
                                                 "loaded (docs/serve.md, 'The KV budget')")
    serve.add_argument("--store", required=True, metavar="DIR",
                       help="the folder of the conversations' session stores (created if missing)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (beyond loopback: needs a key)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key-file", metavar="FILE", help="require 'Authorization: Bearer <key>' of one of "
                                                              "this file's keys (one a line); each key sees only "
                                                              "its own conversations")
    serve.add_argument("--system", default="You are a helpful assistant.",
                       help="the system prompt of a conversation that gives none")
    serve.add_argument("--max-output-tokens", type=int, default=64,
                       help="a conversation's output-token cap when its first response gives none")
    serve.add_argument("--busy-wait", type=float, default=5.0, metavar="SECONDS",
                       help="how long a request waits for its busy conversation before 409")


def do_serve(args: argparse.Namespace) -> int:
    from unsee import Settings
    from unsee.impl.cli.run import build_engine
    from unsee.impl.serve.budget import get_default_kv_budget
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.threads import (
        BATCH_THREADS_ENV,
        SLOTS_ENV,
        THREADS_ENV,
        compute_slot_environment,
        compute_thread_environment,
        get_cores,
    )

    try:
        from unsee.impl.serve.server import check_exposure, read_api_keys, run
    except ModuleNotFoundError as exc:  # a usage error: nothing ran
        raise ValueError(f"unsee serve needs the serve extra ({exc.name} is missing): "
                         "pip install 'unsee[serve]'") from None

    api_keys = read_api_keys(args.api_key_file)
    check_exposure(args.host, api_keys)  # before any model loads
    threads = compute_thread_environment(args.engine, os.environ, get_cores())
    if threads:  # llama.cpp: prefill on every core, decode on one (impl/serve/threads.py)
        os.environ.update(threads)
        print(f"unsee serve: llama.cpp prefills on {threads[BATCH_THREADS_ENV]} threads and decodes on 1 "
              f"(${BATCH_THREADS_ENV} and ${THREADS_ENV} set others)", file=sys.stderr)
    slots = compute_slot_environment(args.engine, os.environ)
    os.environ.update(slots)
    engine = build_engine(args)
    if getattr(engine, "kv", None) is not None and getattr(engine.kv, "slots", 1) > 1:
        batched = ("decodes their next tokens in one forward" if engine.kv.can_batch
                   else "does not batch their steps: decode runs on more than one thread")
        print(f"unsee serve: llama.cpp holds {engine.kv.slots} conversations resident and {batched} "
              f"(${SLOTS_ENV} sets another count)", file=sys.stderr)
    if args.kv_budget is None:  # the default: half of what the machine has left with the model loaded
        args.kv_budget = get_default_kv_budget()
        engine.budget.set(args.kv_budget)
        if args.kv_budget is not None:
            print(f"unsee serve: KV budget {args.kv_budget / 2**30:.1f} GiB (half of the memory left after "
                  "the model; --kv-budget sets another)", file=sys.stderr)
    pool = Pool(engine, args.store, kv_budget=args.kv_budget, busy_wait=args.busy_wait, system=args.system,
                defaults=Settings(max_new_tokens=args.max_output_tokens))
    run(pool, args.model, args.host, args.port, api_keys)
    return int(Exit.OK)
