"""``unsee serve``: the OpenAI-compatible conversation server (docs/serve.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time

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
    serve.add_argument("--max-output-tokens", type=int, default=None, metavar="N",
                       help="the output cap of a request that names none (default: the rest of the context "
                            "after the prompt, as llama.cpp's and vLLM's servers do)")
    serve.add_argument("--ctx-size", type=int, default=None, metavar="N",
                       help="the tokens a conversation's context holds (llama.cpp's n_ctx, vLLM's max_model_len, "
                            "transformers: at most the model's positions), up to the model's trained length. "
                            "Default: llama.cpp: the trained length, or less where the KV of every slot would "
                            "pass a quarter of the machine's memory (a multiple of 256); vLLM: 4096; "
                            "transformers: the model's positions")
    serve.add_argument("--threads", type=int, default=None, metavar="N",
                       help="llama.cpp: threads of a one-token forward (n_threads). Default: the loader's "
                            "(docs/engines.md); $UNSEE_LLAMA_THREADS where set")
    serve.add_argument("--batch-threads", type=int, default=None, metavar="N",
                       help="llama.cpp: threads of a forward of several tokens (n_threads_batch). Default: "
                            "the loader's; $UNSEE_LLAMA_BATCH_THREADS where set")
    serve.add_argument("--slots", type=int, default=None, metavar="N",
                       help="llama.cpp: conversations resident at once, their decode steps in one forward "
                            "(default: 8, or $UNSEE_LLAMA_SLOTS)")
    serve.add_argument("--busy-wait", type=float, default=5.0, metavar="SECONDS",
                       help="how long a request waits for its busy conversation before 409")
    serve.add_argument("--chat-template", metavar="FILE", default=None,
                       help="a Jinja chat template to render with instead of the model's own (docs/templates.md); "
                            "for Hermes 2 Pro / 3, their `tool_use` template")
    serve.add_argument("--tool-format", metavar="NAME", default=None,
                       help="the call format the model writes, instead of the one read from its template "
                            "(docs/serve.md, 'Model families'): " + ", ".join(TOOL_FORMATS))


#: the names --tool-format takes (impl/agent/tools/families.py's table)
TOOL_FORMATS = ("hermes", "llama3_json", "pythonic", "mistral", "mistral_list", "qwen3_coder", "granite", "generic")


def apply_model_overrides(lm, chat_template: str | None, tool_format: str | None) -> None:
    """``--chat-template``'s text (a file's) becomes the model's template, as a catalogue entry's does
    (transformers: its tokenizer's), and ``--tool-format`` its call format; a name the table does
    not know, or a file that cannot be read, is an error before the server starts."""
    if tool_format is not None and tool_format not in TOOL_FORMATS:
        raise ValueError(f"--tool-format {tool_format!r}: expected one of {', '.join(TOOL_FORMATS)}")
    if chat_template is not None:
        try:
            with open(chat_template, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"--chat-template {chat_template}: {exc.strerror}") from None
        tokenizer = getattr(lm, "tokenizer", None)
        if tokenizer is not None and hasattr(tokenizer, "chat_template"):
            tokenizer.chat_template = text
        else:
            lm.chat_template = text
    lm.tool_format = tool_format


#: the share of the machine's memory llama.cpp's slots may reserve for a default context
CONTEXT_MEMORY_SHARE = 4


def get_context_options(engine: str, ctx_size: int | None, physical: int | None) -> dict:
    """The loader options of ``--ctx-size`` on ``engine`` (passed to the loader, which refuses a
    context past the model's trained length); without it, llama.cpp's context sized by memory
    (a quarter of ``physical`` bytes for the KV of every slot), the others' own defaults."""
    if ctx_size is not None and ctx_size < 1:
        raise ValueError(f"--ctx-size {ctx_size}: expected 1 or more")
    if engine == "vllm":
        return {"max_model_len": ctx_size} if ctx_size else {}
    if engine == "llamacpp" and ctx_size is None:
        return {"ctx_memory": physical // CONTEXT_MEMORY_SHARE} if physical else {}
    return {"n_ctx": ctx_size} if ctx_size else {}


def warm_up(engine) -> float:
    """One forward of one token on a scratch lineage, then dropped; its seconds. The first request
    then finds the weights llama.cpp maps from the file paged in (the repacked ones are copied at
    load, the rest are read on first use) and the loop's threads started, as llama-server's own
    warm-up run does: without it the first conversation's first token came 0.3 to 0.6 s later than
    the next one's (qwen2.5-1.5b, docs/serve.md)."""
    started = time.perf_counter()
    lineage = engine.new_lineage()
    try:
        engine.prefill(lineage, [engine.lm.eos_ids[0] if engine.lm.eos_ids else 0])
    finally:
        engine.drop(lineage)
    return time.perf_counter() - started


def hash_weights(engine) -> float:
    """The loaded weights' sha256 (which every forget's receipt names, computed once per model),
    now; its seconds. Left to the first DELETE, it was a second of that DELETE (qwen2.5-1.5b's
    GGUF, about 1 GB, docs/serve.md), none of it the forget's."""
    from unsee.impl.store.receipt import weights_hash

    started = time.perf_counter()
    weights_hash(engine.lm)
    return time.perf_counter() - started


def do_serve(args: argparse.Namespace) -> int:
    from unsee.impl.agent.tools.client import get_context_length
    from unsee.impl.cli.run import build_engine
    from unsee.impl.serve.budget import get_default_kv_budget, get_physical_bytes
    from unsee.impl.serve.pool import Pool, get_default_settings
    from unsee.impl.serve.threads import get_llamacpp_options

    try:
        from unsee.impl.serve.server import check_exposure, read_api_keys, run
    except ModuleNotFoundError as exc:  # a usage error: nothing ran
        raise ValueError(f"unsee serve needs the serve extra ({exc.name} is missing): "
                         "pip install 'unsee[serve]'") from None

    api_keys = read_api_keys(args.api_key_file)
    check_exposure(args.host, api_keys)  # before any model loads
    llamacpp = get_llamacpp_options(args.engine, args.threads, args.batch_threads, args.slots, os.environ)
    engine = build_engine(args, **get_context_options(args.engine, args.ctx_size, get_physical_bytes()), **llamacpp)
    apply_model_overrides(engine.lm, args.chat_template, args.tool_format)
    print(f"unsee serve: the context holds {get_context_length(engine.lm)} tokens (--ctx-size sets another)",
          file=sys.stderr)
    if args.engine == "llamacpp":
        lm = engine.lm
        batched = ("decodes their next tokens in one forward" if engine.kv.can_batch
                   else "does not batch their steps")
        print(f"unsee serve: llama.cpp decodes on {lm.threads} thread(s) and prefills on "
              f"{lm.batch_threads or lm.threads} (--threads, --batch-threads); it holds {engine.kv.slots} "
              f"conversations resident and {batched} (--slots)", file=sys.stderr)
        print(f"unsee serve: warmed up in {warm_up(engine):.2f} s (one forward, dropped)", file=sys.stderr)
    print(f"unsee serve: hashed the weights for receipts in {hash_weights(engine):.2f} s", file=sys.stderr)
    if args.kv_budget is None:  # the default: half of what the machine has left with the model loaded
        args.kv_budget = get_default_kv_budget()
        engine.budget.set(args.kv_budget)
        if args.kv_budget is not None:
            print(f"unsee serve: KV budget {args.kv_budget / 2**30:.1f} GiB (half of the memory left after "
                  "the model; --kv-budget sets another)", file=sys.stderr)
    pool = Pool(engine, args.store, kv_budget=args.kv_budget, busy_wait=args.busy_wait, system=args.system,
                defaults=get_default_settings(engine, args.max_output_tokens))
    print(f"unsee serve: tools are called in the `{pool.call_format.family}` format (--tool-format sets another)",
          file=sys.stderr)
    run(pool, args.model, args.host, args.port, api_keys)
    return int(Exit.OK)
