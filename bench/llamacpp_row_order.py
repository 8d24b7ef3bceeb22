"""What each of llama.cpp's matmul settings costs a decode step and a prefilled token (issue 50;
docs/bench.md, "Repacked Q4_K in decode's order").

    python -m unsee.bench.llamacpp_row_order --model qwen2.5-1.5b [--kernels file,row,repacked]
        [--threads 1,2] [--prompt 512] [--chunk 64] [--steps 32]

The settings:

- ``file``: the file's layout, per-row kernels (the exact kernels before the switch);
- ``row``: Q4_K repacked, batches summed in decode's order (the exact kernels with the
  switch: impl/engines/llamacpp/repack.py);
- ``repacked``: llama.cpp's own repacking (what llama-server and llama_cpp.server run).

The switch is process-wide, so each setting runs in a process of its own, one after the other.
In each, on each thread count: a prompt of ``--prompt`` fixed tokens prefilled in forwards of
``--chunk`` tokens, then ``--steps`` greedy decode steps. Reported: the prefill's wall and CPU
milliseconds per token, and the decode step's median wall and CPU per step (every thread's CPU:
on more than one thread OpenMP's spinning counts too). Timings drift with the machine's load:
compare the settings of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from unsee.bench import options

KERNELS = {"file": {"exact_kernels": True, "row_order": False}, "row": {"exact_kernels": True, "row_order": True},
           "repacked": {"exact_kernels": False}}


def time_kernels(lm, lc, threads: int, prompt: int, chunk: int, steps: int) -> dict:
    """``{prefill_ms, prefill_cpu_ms, decode_ms, decode_cpu_ms}`` on ``threads`` (module docstring)."""
    from unsee.impl.engines.llamacpp.facts import forward

    ctx = lm.new_context(prompt + steps + 8)
    batch = lc.llama_batch_init(prompt + steps + 8, 0, 1)
    try:
        lc.llama_set_n_threads(ctx, threads, threads)
        tokens = [int(t) for t in np.random.default_rng(1).integers(0, lm.vocab_size, prompt)]
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, prompt, chunk):
            logits = forward(lc, ctx, batch, tokens[start:start + chunk], start, False, lm.vocab_size)
        prefill = ((time.perf_counter() - wall) * 1000 / prompt, (time.process_time() - cpu) * 1000 / prompt)
        spent = []
        for i in range(steps):
            wall, cpu = time.perf_counter(), time.process_time()
            logits = forward(lc, ctx, batch, [int(np.argmax(logits))], prompt + i, False, lm.vocab_size)
            spent.append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
        return {"prefill_ms": prefill[0], "prefill_cpu_ms": prefill[1],
                "decode_ms": statistics.median(w for w, _ in spent), "decode_cpu_ms": statistics.median(c for _, c in spent)}
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def run_one(args) -> list[dict]:
    """This process's setting, on each thread count: its rows."""
    from unsee.impl.engines.llamacpp.model import llama_module
    from unsee.impl.engines.registry import load_model_for

    lm = load_model_for("llamacpp", args.model, threads=1, **KERNELS[args.one])
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        rows.append({"kernels": args.one, "threads": threads, "max_forward": lm.max_forward,
                     **time_kernels(lm, llama_module(), threads, args.prompt, args.chunk, args.steps)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def get_table(rows: list[dict]) -> str:
    """The rows as markdown, with each setting's decode and prefill time against ``repacked``'s."""
    ref = {r["threads"]: r for r in rows if r["kernels"] == "repacked"}
    lines = ["| kernels | threads | max_forward | decode ms/step (CPU) | prefill ms/token (CPU) | "
             "decode, against repacked | prefill, against repacked |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        base = ref.get(r["threads"])
        ratio = ((f"{r['decode_ms'] / base['decode_ms']:.2f}x", f"{r['prefill_ms'] / base['prefill_ms']:.2f}x")
                 if base else ("-", "-"))
        lines.append(f"| {r['kernels']} | {r['threads']} | {r['max_forward']} | {r['decode_ms']:.1f} "
                     f"({r['decode_cpu_ms']:.1f}) | {r['prefill_ms']:.1f} ({r['prefill_cpu_ms']:.1f}) | "
                     f"{ratio[0]} | {ratio[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_row_order", __doc__)
    options.add_model(parser)
    parser.add_argument("--kernels", default="file,row,repacked", help=f"settings to time, of {', '.join(KERNELS)}")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--one", choices=tuple(KERNELS), help=argparse.SUPPRESS)
    options.add_out(parser, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.one:
        run_one(args)
        return 0
    wanted = [k.strip() for k in args.kernels.split(",")]
    if set(wanted) - set(KERNELS):
        parser.error(f"--kernels {args.kernels!r}: each of {', '.join(KERNELS)}")
    rows = []
    for kind in wanted:
        child = [sys.executable, "-m", "unsee.bench.llamacpp_row_order", "--model", args.model, "--one", kind,
                 "--threads", args.threads, "--prompt", str(args.prompt), "--chunk", str(args.chunk),
                 "--steps", str(args.steps)]
        done = subprocess.run(child, check=True, capture_output=True, text=True)
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print(get_table(rows))
    options.write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
