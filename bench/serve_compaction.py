"""Compaction a DELETE reaches, on a real model through ``unsee serve`` (issue 52; docs/serve.md,
"Long conversations"): the CI test's scenario with a real summary, its cost against the compute
floor, and an Agents SDK conversation of several times the context.

    python -m unsee.bench.serve_compaction --model qwen2.5-1.5b --engine llamacpp --ctx-size 1024

Phase ``delete``: a conversation whose every request carries ``context_management`` (a
``compact_threshold``), the secret's item in its first turn; the server compacts once, the summary
reading the secret (its provenance). The secret's item is deleted: the conversation must equal a
twin given the same requests without it (digest, items, the next answer); after a restart of the
server on the same store no file, summary or receipt holds the secret. The DELETE's cost is the
process's CPU (the engine's loop thread runs the forwards) and the forget's forwards and tokens,
beside the compute floor (impl/methods/floor.py) of the same forget, the re-summary included,
timed on the same engine in the same process.

Phase ``agents`` (bench/serve_compaction_agents.py): the Agents SDK's ``Runner`` with a
``conversation_id`` and a function tool, ``ModelSettings(truncation="auto")``, on a server whose
context is ``--ctx-size`` tokens, until the conversation holds ``--times`` times the context;
each turn's cost of staying under the context. Writes ``results.json`` and ``table.md`` under
``--out``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from unsee import Settings
from unsee.bench import options

SYSTEM = "You are a helpful assistant. Answer in one or two sentences."
SECRET = "Remember this: the vault code is 9-4-7-1."
SECRET_MARKS = ("9-4-7-1", "vault code")
TURNS = (
    [("u1", "Hi, I am Ada and I live in Oslo."), ("s1", SECRET)],
    [("u2", "I work as a ferry pilot on the Oslofjord, mostly night shifts.")],
    [("u3", "My sister Liv visits next week; she is vegetarian and loves mushrooms.")],
    [("u4", "Suggest a dinner the two of us could cook together.")],
)
NEXT = "What do you know about me?"


def say(text: str) -> None:
    print(f"serve_compaction: {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def serve(engine, store: Path, max_tokens: int):
    """The server in this process over ``engine``, on loopback (the CI tests' ServerThread)."""
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    return ServerThread(Pool(engine, store, defaults=Settings(max_new_tokens=max_tokens)), "bench")


def connect(srv):
    import openai

    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=3600)


def run_turns(client, threshold: int, max_tokens: int, secret: bool) -> tuple[str, list[dict]]:
    """The scenario's turns on a new conversation (without ``s1`` for the twin): its id, and per
    turn the output item types and the compaction's cost where one ran."""
    cm = [{"type": "compaction", "compact_threshold": threshold}]
    conv = client.conversations.create(items=[{"role": "system", "content": SYSTEM}]).id
    rows = []
    for turn in TURNS:
        items = [{"type": "message", "role": "user", "content": text, "id": i} for i, text in turn
                 if secret or i != "s1"]
        out = client.responses.create(model="bench", conversation=conv, input=items, context_management=cm,
                                      max_output_tokens=max_tokens, temperature=0)
        rows.append({"types": [o.type for o in out.output], "text": out.output_text,
                     "prompt_tokens": out.usage.input_tokens, "output_tokens": out.usage.output_tokens,
                     "compaction": (out.model_extra.get("unsee") or {}).get("compaction"),
                     "summary": next((o.model_extra["summary"][0]["text"] for o in out.output
                                      if o.type == "compaction"), None)})
    return conv, rows


def get_state(client, conv: str) -> tuple[str, list[dict]]:
    digest = client.conversations.retrieve(conv).model_extra["unsee"]["digest"]
    items = [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv, order="asc", limit=100).data]
    return digest, items


def get_next(client, conv: str, threshold: int, max_tokens: int) -> list[dict]:
    out = client.responses.create(model="bench", conversation=conv, input=NEXT, max_output_tokens=max_tokens,
                                  context_management=[{"type": "compaction", "compact_threshold": threshold}],
                                  temperature=0)
    return [o.model_dump() for o in out.output]


def scan(root: Path) -> list[str]:
    """Files under ``root`` holding any byte string of :data:`SECRET_MARKS`."""
    marks = [m.encode() for m in SECRET_MARKS]
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and any(m in p.read_bytes() for m in marks))


def delete_timed(client, conv: str) -> dict:
    """The DELETE of ``s1``: its reply, with the process's CPU and the wall it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    reply = client.conversations.items.delete("s1", conversation_id=conv).model_extra
    return {"reply": reply, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}


def measure_floor(engine, keep: Path, digest_after: str) -> dict:
    """The compute floor of the DELETE from the copy of the conversation's store taken before
    it (the full reset's digest checked against the server's after the DELETE)."""
    from unsee import PersistentSession
    from unsee.impl.methods.baselines import apply_method
    from unsee.impl.methods.floor import compute_floor

    session = PersistentSession.open(keep / "session.db", engine)
    try:
        base = session.runtime
        boundary = base.checkpoints.latest_before(base.graph.first_entry("s1")).boundary
        reset, _ = apply_method(base, "reset", "s1")
        floor = compute_floor(engine, base, reset, boundary).to_json()
        floor["reset_digest_equal"] = reset.digest() == digest_after
        floor["summaries_that_read_the_secret"] = sum(
            1 for b in base.graph.blocks() if b.type == "summary" and b.id.endswith("/answer") and "s1" in b.source_ids)
    finally:
        session.close()
    return floor


def run_delete(engine, work: Path, threshold: int, max_tokens: int) -> dict:
    """Phase ``delete``: see the module docstring."""
    store, keep = work / "store", work / "before-delete"
    shutil.rmtree(work, ignore_errors=True)
    with serve(engine, store, max_tokens) as srv:
        client = connect(srv)
        say("the conversation with the secret")
        conv, turns = run_turns(client, threshold, max_tokens, secret=True)
        shutil.copytree(store / conv, keep)
        say("DELETE s1")
        deleted = delete_timed(client, conv)
        digest, items = get_state(client, conv)
        say("the twin")
        twin, twin_turns = run_turns(client, threshold, max_tokens, secret=False)
        twin_digest, twin_items = get_state(client, twin)
        say("the next answer on both")
        nxt, twin_nxt = get_next(client, conv, threshold, max_tokens), get_next(client, twin, threshold, max_tokens)
        final = get_state(client, conv)[0]
    say("the floor")
    floor = measure_floor(engine, keep, digest)
    shutil.rmtree(keep)  # the only copy of the secret this bench made, outside the server's store
    with serve(engine, store, max_tokens) as srv:  # a restart: the store read back
        restarted = get_state(connect(srv), conv)[0]
    reply = deleted["reply"]
    report = reply["report"]
    return {
        "turns": turns, "twin_turns": twin_turns,
        "compacted_at": [n for n, t in enumerate(turns, 1) if t["compaction"]],
        "twin_compacted_at": [n for n, t in enumerate(twin_turns, 1) if t["compaction"]],
        "report": report, "status": reply["status"],
        "rewritten_summaries": [i["summary"][0]["text"] for i in reply["rewritten"] if i["type"] == "compaction"],
        "equals_twin": {"digest": digest == twin_digest, "items": items == twin_items, "next_answer": nxt == twin_nxt},
        "next_answer": nxt, "restart_digest_equal": restarted == final,
        "files_holding_secret": scan(store), "reply_holds_secret": any(m in json.dumps(reply) for m in SECRET_MARKS),
        "delete": {"cpu_s": deleted["cpu_s"], "wall_s": deleted["wall_s"], "forwards": report["forward_calls"],
                   "prefilled": report["prefilled_tokens"], "decoded": report["decoded_tokens"]},
        "floor": floor,
        "cpu_over_floor": deleted["cpu_s"] / floor["cpu_s"] if floor["cpu_s"] else None,
        "forwards_over_floor": report["forward_calls"] / floor["forwards"] if floor["forwards"] else None,
        "tokens_over_floor": (report["prefilled_tokens"] + report["decoded_tokens"]) / floor["recomputed"]
        if floor["recomputed"] else None,
    }


def get_label(args, argv: list[str]) -> dict:
    from unsee.bench.serve_peer import get_label as get_peer_label

    label = get_peer_label(argparse_namespace(args), argv)
    return {**label, "command": "python -m unsee.bench.serve_compaction " + " ".join(argv)}


def argparse_namespace(args):
    """serve_peer's label reads threads from these fields: the server's own defaults here."""
    import argparse

    return argparse.Namespace(**vars(args), defaults=True, parallel=None, threads=None, batch_threads=None)


def main(argv: list[str] | None = None) -> int:
    from unsee.bench import serve_compaction_agents, serve_compaction_table
    from unsee.impl.engines.registry import load_engine

    argv = sys.argv[1:] if argv is None else argv
    parser = options.get_parser("serve_compaction", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--ctx-size", type=int, default=1024, help="the server's context, tokens (default 1024)")
    parser.add_argument("--threshold", type=int, default=150,
                        help="the delete phase's compact_threshold, tokens (default 150: qwen2.5-1.5b's fourth "
                             "turn passes it, with the secret or without, and its third does not)")
    parser.add_argument("--max-tokens", type=int, default=48, help="output cap of every turn and summary")
    parser.add_argument("--times", type=float, default=3.0, help="the agents phase: the conversation's length "
                                                                 "in contexts (default 3)")
    parser.add_argument("--phases", nargs="+", default=["delete", "agents"], choices=["delete", "agents"])
    options.add_out(parser, "out/serve-compaction", "where results.json and table.md go")
    parser.add_argument("--table", type=Path, help="print the table of a results.json again, and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(serve_compaction_table.get_table(json.loads(args.table.read_text())))
        return 0
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the SDK never reaches OpenAI
    say(f"loading {args.model} ({args.engine}, n_ctx {args.ctx_size})")
    engine = load_engine(args.model, args.engine, n_ctx=args.ctx_size)
    result = {"label": get_label(args, argv), "ctx_size": args.ctx_size, "threshold": args.threshold, "times": args.times,
              "max_tokens": args.max_tokens}
    if "delete" in args.phases:
        result["delete"] = run_delete(engine, args.out / "delete", args.threshold, args.max_tokens)
    if "agents" in args.phases:
        say("the Agents SDK conversation")
        result["agents"] = serve_compaction_agents.run_agents(engine, args.out / "agents", args.ctx_size,
                                                              args.times, args.max_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    table = serve_compaction_table.get_table(result)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    return 0 if serve_compaction_table.is_ok(result) else 1


if __name__ == "__main__":
    sys.exit(main())
