"""Prefill and decode speed of each attention implementation and dtype, in one interleaved run.

    python -m unsee.bench.attention --model smollm2 --context 1024 --decode 32 --rounds 3

Per round, every configuration (``--attns`` x ``--dtypes``) prefills the same
``--context`` tokens as one chunk, then decodes ``--decode`` tokens greedily on a
fresh lineage (after one untimed warm-up each); configurations are visited in turn
inside each round, so a loaded machine slows them alike. Reports the median tok/s over rounds and each one's ratio
to the first configuration of the same round (what stays meaningful on a shared
machine), with the token counts.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from unsee.bench import options
from unsee.impl.engines.registry import load_engine

TEXT = ("The committee met on the first of the month to review the budget, the schedule of the works on the "
        "bridge, and the letters residents had sent about the noise at night. ")


def time_config(engine, ids: list[int], n_decode: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one prefill of ``ids`` and ``n_decode`` decode steps."""
    lin = engine.new_lineage()
    sync = torch.cuda.synchronize if str(engine.lm.device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    engine.prefill(lin, ids)
    sync()  # CUDA kernels run asynchronously: time them to completion
    prefill = len(ids) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = engine.generate(lin, n_decode, stop_ids=())
    decode = len(out) / (time.perf_counter() - t0)
    engine.drop(lin)
    return prefill, decode


def main(argv: list[str] | None = None) -> None:
    p = options.get_parser("attention", __doc__)
    options.add_model(p)
    options.add_device(p)
    p.add_argument("--attns", default="unsee_eager,eager,sdpa")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode", type=int, default=32)
    options.add_rounds(p)
    options.add_threads(p)
    options.add_out(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = [(a, d) for d in args.dtypes.split(",") for a in args.attns.split(",")]
    engines = {c: load_engine(args.model, "transformers", device=args.device, attn=c[0], dtype=c[1])
               for c in configs}
    first = engines[configs[0]]
    ids = (first.lm.encode(TEXT) * (args.context // 8 + 1))[:args.context]
    times: dict = {c: [] for c in configs}
    for c in configs:  # a warm-up, not timed: first calls allocate and pick kernels
        time_config(engines[c], ids[:64], 2)
    for _ in range(args.rounds):
        for c in configs:
            times[c].append(time_config(engines[c], ids, args.decode))
    rows = []
    for c in configs:
        ratio = [(t[0] / r[0], t[1] / r[1]) for t, r in zip(times[c], times[configs[0]])]
        rows.append({"attn": c[0], "dtype": c[1], "prefill_tok_s": round(statistics.median(t[0] for t in times[c]), 1),
                     "decode_tok_s": round(statistics.median(t[1] for t in times[c]), 2),
                     "prefill_ratio": round(statistics.median(r[0] for r in ratio), 2),
                     "decode_ratio": round(statistics.median(r[1] for r in ratio), 2)})
    result = {"model": args.model, "device": args.device, "threads": args.threads, "context_tokens": len(ids),
              "decoded_tokens": args.decode, "rounds": args.rounds, "rows": rows}
    print(f"{args.model} {args.device}, {args.threads} thread(s): prefill {len(ids)} tokens as one chunk, then "
          f"decode {args.decode}; median of {args.rounds} interleaved rounds; ratios to {configs[0]}")
    print("| attn | dtype | prefill tok/s | decode tok/s | prefill ratio | decode ratio |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['attn']} | {r['dtype']} | {r['prefill_tok_s']} | {r['decode_tok_s']} | {r['prefill_ratio']} | "
              f"{r['decode_ratio']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
