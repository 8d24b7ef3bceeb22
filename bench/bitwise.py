"""Measure an engine's bitwise behaviour (the facts docs/engines.md lists).

    python -m unsee.bench.bitwise --engine llamacpp --out out/bitwise-llamacpp.json
    python -m unsee.bench.bitwise --engine smollm2  --out out/bitwise-smollm2.json
    python -m unsee.bench.bitwise --engine tiny --attn sdpa --dtype bfloat16   (transformers only)

Each fact compares two ways of reaching the same tokens, by the KV digest
(position by position, :meth:`Engine.digest`) and by the logits after the
last token (largest absolute difference, 0.0 meaning bitwise equal):

repeat               the same chunks twice
crop_at_boundary     prefill A, B; crop to |A|; prefill C   vs  prefill A, C
crop_mid_chunk       prefill A+B as one chunk; crop to |A|; prefill C  vs  A, C
park_and_reload      prefill A; switch to another lineage and back (llama.cpp:
                     a state copy out of the context and in again); prefill C
                     vs  A, C
clone_continued      clone(A) then prefill C  vs  A, C
chunked              prefill A+B whole  vs  A then B
decode               prefill A, then feed B's tokens one at a time  vs  A, B
threads              A, B on 1 thread  vs  on --threads threads

Only integer facts are stable across machines; the lead re-runs this on a
quiet machine for the numbers in the docs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from unsee.bench import options
from unsee.impl.engines.lineage import crop
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import ENGINE_NAMES, load_engine, parse_engine_name

TEXT = ("<|im_start|>system\nYou are a helpful agent.<|im_end|>\n<|im_start|>user\nMy address is 4417 Elm "
        "Street and I pay the rent on the first of the month.<|im_end|>\n<|im_start|>assistant\nNoted: 4417 "
        "Elm Street, rent on the first.<|im_end|>\n<|im_start|>user\nWhat should I buy for the trip to Oak "
        "Lake next week?<|im_end|>\n")


def build(name: str, threads: int, **options) -> Engine:
    """The engine ``name`` on ``threads`` threads; ``options`` (transformers:
    ``device``, ``dtype``, ``attn``) go to its loader."""
    backend, model = parse_engine_name(name)
    if backend == "llamacpp":
        return load_engine(model, backend, threads=threads)
    torch.set_num_threads(threads)
    return load_engine(model, backend, **options)


def run(engine: Engine, chunks, ops=()) -> tuple[str, torch.Tensor | None, str]:
    handle = engine.new_lineage()
    for c in chunks:
        engine.prefill(handle, c)
    for op in ops:
        handle = op(engine, handle) or handle  # an op that crops (a fork) names the lineage it leaves
    return engine.digest(handle), engine.logits(handle), handle


def compare(a, b) -> dict:
    (da, la, _), (db, lb, _) = a, b
    diff = None if la is None or lb is None else float((la - lb).abs().max())
    return {"kv_equal": da == db, "max_abs_logit_diff": diff}


def measure(name: str, threads: int, **options) -> dict:
    engine = build(name, 1, **options)
    ids = engine.lm.encode(TEXT)
    n = len(ids)
    a, b, c = ids[: n // 2], ids[n // 2: 3 * n // 4], ids[3 * n // 4:]
    facts: dict = {"engine": name, **{k: getattr(engine.lm, k, None) for k in ("device", "dtype", "attn")},
                   "tokens": {"A": len(a), "B": len(b), "C": len(c)}}
    fresh = run(engine, [a, c])
    facts["repeat"] = compare(run(engine, [a, c]), fresh)

    def crop_then_c(eng, h):
        h = crop(eng, h, len(a))
        eng.prefill(h, c)
        return h

    facts["crop_at_boundary"] = compare(run(engine, [a, b], [crop_then_c]), fresh)
    facts["crop_mid_chunk"] = compare(run(engine, [a + b], [crop_then_c]), fresh)

    def park_and_reload(eng, h):
        other = eng.new_lineage()
        eng.prefill(other, b)
        eng.prefill(h, c)
        eng.drop(other)

    facts["park_and_reload"] = compare(run(engine, [a], [park_and_reload]), fresh)

    def clone_then_c(eng, h):
        src = eng.fork(h)
        eng.prefill(h, c)
        eng.drop(src)

    facts["clone_continued"] = compare(run(engine, [a], [clone_then_c]), fresh)
    facts["chunked"] = compare(run(engine, [a + b]), run(engine, [a, b]))
    facts["decode"] = compare(run(engine, [a] + [[t] for t in b]), run(engine, [a, b]))
    other = build(name, threads, **options)
    facts["threads"] = {"threads": threads, **compare(run(other, [a, b]), run(engine, [a, b]))}
    # timing of the verbs (indicative only on a loaded machine)
    h = engine.new_lineage()
    t0 = time.perf_counter()
    engine.prefill(h, ids)
    facts["prefill_tok_per_s"] = round(len(ids) / (time.perf_counter() - t0), 1)
    t0 = time.perf_counter()
    out = engine.generate(h, 32, stop_ids=())
    facts["generate_tok_per_s"] = round(len(out) / (time.perf_counter() - t0), 1)
    engine.drop(h)
    facts["determinism"] = {k: getattr(engine.determinism, k) for k in
                            ("same_chunking_repeats", "crop_continue_is_fresh", "chunk_invariant",
                             "decode_is_prefill", "thread_invariant")}
    return facts


#: The facts of a table row, in order, with their column heads.
TABLE_FACTS = (("repeat", "repeat"), ("crop_at_boundary", "crop+continue"), ("crop_mid_chunk", "crop mid-chunk"),
               ("clone_continued", "clone"), ("chunked", "chunked = whole"), ("decode", "decode = prefill"),
               ("threads", "1 = 2 threads"))


def render_table(rows: list[dict]) -> str:
    """A markdown table of measured facts (``measure``'s output): per fact, "=" where
    KV and logits are bitwise equal, else the largest logit difference. (Speeds are left
    out: bench/attention.py times the configurations against each other in one run.)"""
    head = ["engine", "device", "dtype", "attn", *(h for _, h in TABLE_FACTS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["engine"], str(row.get("device")), str(row.get("dtype")), str(row.get("attn"))]
        for key, _ in TABLE_FACTS:
            fact = row[key]
            equal = fact["kv_equal"] and not fact["max_abs_logit_diff"]
            cells.append("=" if equal else f"{fact['max_abs_logit_diff']:.2g}"
                         + ("" if fact["kv_equal"] else " (KV differs)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = options.get_parser("bitwise", __doc__)
    options.add_engine(p, choices=ENGINE_NAMES)
    p.add_argument("--threads", type=int, default=2, help="the thread count compared with 1")
    p.add_argument("--device", default=None, help="transformers: cpu or cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="transformers: float32, bfloat16 or float16 (default float32)")
    p.add_argument("--attn", default=None, help="transformers: unsee_eager, eager, sdpa, flash_attention_2 "
                   "(default: the device's)")
    options.add_out(p)
    p.add_argument("--table", nargs="+", type=Path, metavar="JSON",
                   help="print the markdown table of earlier --out files instead of measuring")
    args = p.parse_args(argv)
    if args.table:
        print(render_table([json.loads(path.read_text()) for path in args.table]))
        return
    loader_options = {k: v for k, v in (("device", args.device), ("dtype", args.dtype), ("attn", args.attn)) if v}
    facts = measure(args.engine, args.threads, **loader_options)
    text = json.dumps(facts, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
