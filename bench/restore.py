"""Restore cost against context length (issue 8, item 5).

The overhead of a restore is measured as the issue defines it:

    overhead(n) = time(restore to n tokens + the first prefill after it)
                - time(the same prefill on a lineage of n tokens that was never restored)

so a lazy copy cannot hide its cost in the next step, and attention's own
growth with the context is not counted against the restore. Two restores
are compared:

* ``share``: :meth:`KVEngine.share_prefix` (copy-on-write views; what
  ``AgentRuntime._restore`` does now);
* ``clone``: :meth:`KVEngine.clone` then :meth:`KVEngine.crop` (a deep copy
  of the checkpoint's whole lineage; what it did before).

The checkpoint's lineage holds ``n + tail`` tokens (the session went on
after the checkpoint), built in ``build_chunk``-token prefill chunks; the
first prefill after the restore is one ``chunk``-token block. Each repeat
times the restored case and the never-restored case back to back
(alternating which goes first), so slow drifts of a shared machine hit both;
the overhead is the median of the paired differences.

Run quietly, one thread (the lead's command)::

    .venv/bin/python -m unsee.bench.restore --model smollm2 --lengths 1024 7168 \\
        --repeats 21 --out bench/results/restore.json

It prints a table and writes JSON; the goal is overhead(7k) <= 1.5 x overhead(1k).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from unsee.impl.kv import KVEngine
from unsee.impl.models import load_model

METHODS = ("share", "clone")


def get_tokens(engine: KVEngine, n: int) -> list[int]:
    """n token ids of ordinary chat text (cycled), valid for the engine's model."""
    text = ("<|im_start|>user\nPlease plan a dinner for eight guests on Saturday, with a starter, "
            "a fish course and a dessert; list what to buy.<|im_end|>\n<|im_start|>assistant\n"
            "Starter: a tomato salad. Main: baked cod with lemon. Dessert: a pear tart.<|im_end|>\n")
    ids = engine.lm.encode(text)
    return (ids * (n // len(ids) + 1))[:n]


def build(engine: KVEngine, tokens: list[int], build_chunk: int) -> str:
    """A new lineage holding ``tokens``, prefilled ``build_chunk`` at a time."""
    handle = engine.new_lineage()
    for i in range(0, len(tokens), build_chunk):
        engine.prefill(tokens[i:i + build_chunk])
    return handle


def restore(engine: KVEngine, method: str, lineage: str, n: int) -> str:
    if method == "share":
        return engine.share_prefix(lineage, n)
    if method == "clone":
        handle = engine.clone(lineage)
        engine.crop(n, handle)
        return handle
    raise ValueError(f"restore method {method!r}: expected one of {METHODS}")


def measure_restore_overhead(engine: KVEngine, n: int, methods=METHODS, repeats: int = 15, chunk: int = 32,
                             tail: int = 256, build_chunk: int = 256) -> list[dict]:
    """The restore overhead at ``n`` tokens for each method (see the module
    docstring), in seconds. The checkpoint's lineage and the never-restored
    one are built once and serve every method."""
    if n % build_chunk:
        raise ValueError(f"n={n} must be a multiple of build_chunk={build_chunk} (checkpoints sit on chunk ends)")
    tokens = get_tokens(engine, n + tail + chunk)
    source = build(engine, tokens[:n + tail], build_chunk)  # the checkpoint's lineage, longer than n
    reference = build(engine, tokens[:n], build_chunk)  # never restored
    block = tokens[n + tail:n + tail + chunk]  # the first block after the restore

    def restored(method: str) -> tuple[float, float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        handle = restore(engine, method, source, n)
        t1 = time.perf_counter()
        engine.use(handle)
        engine.prefill(block)
        t2, c2 = time.perf_counter(), time.thread_time()
        engine.drop(handle)
        return t2 - t0, t1 - t0, c2 - c0

    def never_restored() -> tuple[float, float]:
        engine.use(reference)
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.prefill(block)
        t1, c1 = time.perf_counter(), time.thread_time()
        engine.crop(n, reference)
        return t1 - t0, c1 - c0

    rows = []
    for method in methods:
        restored(method), never_restored()  # warm-up: allocator and kernels
        with_restore, restore_only, without, paired, paired_cpu = [], [], [], [], []
        for i in range(repeats):
            if i % 2:
                b, b_cpu = never_restored()
                a, r, a_cpu = restored(method)
            else:
                a, r, a_cpu = restored(method)
                b, b_cpu = never_restored()
            with_restore.append(a)
            restore_only.append(r)
            without.append(b)
            paired.append(a - b)
            paired_cpu.append(a_cpu - b_cpu)
        rows.append({"n": n, "method": method, "repeats": repeats, "chunk": chunk, "tail": tail,
                     "overhead_s": statistics.median(paired),
                     # the calling thread's CPU time (one torch thread does the model work in it):
                     # time the machine gives to other work does not count, page faults do
                     "overhead_cpu_s": statistics.median(paired_cpu),
                     "restore_only_s": statistics.median(restore_only),
                     "with_restore_s": statistics.median(with_restore),
                     "never_restored_s": statistics.median(without)})
    engine.drop(source)
    engine.drop(reference)
    return rows


def run(model: str = "smollm2", lengths=(1024, 7168), methods=METHODS, repeats: int = 15, threads: int = 1,
        chunk: int = 32, tail: int = 256) -> dict:
    torch.set_num_threads(threads)
    engine = KVEngine(load_model(model))
    rows = [row for n in lengths for row in measure_restore_overhead(engine, n, methods, repeats, chunk, tail)]
    out = {"model": engine.lm.name, "threads": threads, "lengths": list(lengths), "rows": rows,
           "command": None, "ratio": {}}
    out["ratio_cpu"] = {}
    for method in methods:
        for key, ratios in (("overhead_s", out["ratio"]), ("overhead_cpu_s", out["ratio_cpu"])):
            by_n = {r["n"]: r[key] for r in rows if r["method"] == method}
            lo, hi = by_n[min(lengths)], by_n[max(lengths)]
            ratios[method] = hi / lo if lo > 0 and hi > 0 else None  # a median <= 0 is noise around zero
    return out


def format_table(result: dict) -> str:
    lines = [f"restore overhead on {result['model']} ({result['threads']} thread(s)), median of paired "
             "differences:",
             f"{'method':<8}{'tokens':>8}{'overhead ms':>14}{'cpu ms':>10}{'restore ms':>12}{'with ms':>10}"
             f"{'without ms':>12}"]
    for r in result["rows"]:
        lines.append(f"{r['method']:<8}{r['n']:>8}{r['overhead_s'] * 1e3:>14.3f}{r['overhead_cpu_s'] * 1e3:>10.3f}"
                     f"{r['restore_only_s'] * 1e3:>12.3f}{r['with_restore_s'] * 1e3:>10.2f}"
                     f"{r['never_restored_s'] * 1e3:>12.2f}")
    lo, hi = min(result["lengths"]), max(result["lengths"])
    for method in result["ratio"]:
        shown = ["n/a (a median overhead <= 0: below the noise)" if r is None else f"{r:.2f}x"
                 for r in (result["ratio"][method], result["ratio_cpu"][method])]
        lines.append(f"{method}: overhead({hi}) / overhead({lo}) = {shown[0]} (wall), {shown[1]} (cpu)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unsee.bench.restore", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 7168])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=32, help="tokens of the first prefill after the restore")
    parser.add_argument("--tail", type=int, default=256, help="tokens the checkpoint's lineage holds past n")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    result = run(args.model, tuple(args.lengths), tuple(args.methods), args.repeats, args.threads, args.chunk,
                 args.tail)
    result["command"] = "python -m unsee.bench.restore " + " ".join(argv if argv is not None else [])
    print(format_table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
