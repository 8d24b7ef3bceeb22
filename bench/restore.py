"""Restore cost against context length (issue 8, item 5).

The overhead of a restore is measured as the issue defines it:

    overhead(n) = time(restore to n tokens + the first prefill after it)
                - time(the same prefill on a lineage of n tokens that was never restored)

so a lazy copy cannot hide its cost in the next step, and attention's own
growth with the context is not counted against the restore. Two restores
are compared:

* ``share``: :meth:`~unsee.impl.engines.protocol.Engine.fork` (copy-on-write views; what
  ``AgentRuntime._restore`` does now);
* ``clone``: :meth:`~unsee.impl.engines.protocol.DeepCopy.copy_lineage` then :func:`~unsee.impl.engines.lineage.crop` (a deep copy
  of the checkpoint's whole lineage; what it did before).

The checkpoint's lineage holds ``n + tail`` tokens (the session went on
after the checkpoint), built in ``build_chunk``-token prefill chunks; the
first prefill after the restore is one block of each of ``chunks`` tokens
(32: a short turn; 1: a decode step). Each repeat times the restored case
and the never-restored case back to back (alternating which goes first), so
slow drifts of a shared machine hit both; the overhead is the median of the
paired differences, with a 95% bootstrap interval, since a prefill's own
spread on a shared machine is larger than what a restore adds.

Beside the times, two counts that no noise moves:

* ``copied_bytes``: KV bytes the restore itself allocated (the engine's
  held bytes after it minus before it): 0 for ``share`` at any length;
* page faults (``faults_*``): minor faults while the restored and the
  never-restored prefill ran. ``warmup`` pairs run first and their faults are
  reported apart: the first restores at a new size grow the heap once.

Run quietly, one thread (the lead's command)::

    .venv/bin/python -m unsee.bench.restore --model smollm2 --lengths 1024 7168 \\
        --chunks 32 1 --repeats 31 --out bench/results/restore.json

It prints a table and writes JSON; the goal is overhead(7k) <= 1.5 x overhead(1k).
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.bench import options
from unsee.impl.engines.lineage import crop
from unsee.impl.engines.protocol import DeepCopy, Engine
from unsee.impl.engines.registry import load_engine

METHODS = ("share", "clone")
BOOTSTRAP_RESAMPLES = 2000


def get_tokens(engine: Engine, n: int) -> list[int]:
    """n token ids of ordinary chat text (cycled), valid for the engine's model."""
    text = ("<|im_start|>user\nPlease plan a dinner for eight guests on Saturday, with a starter, "
            "a fish course and a dessert; list what to buy.<|im_end|>\n<|im_start|>assistant\n"
            "Starter: a tomato salad. Main: baked cod with lemon. Dessert: a pear tart.<|im_end|>\n")
    ids = engine.lm.encode(text)
    return (ids * (n // len(ids) + 1))[:n]


def build(engine: Engine, tokens: list[int], build_chunk: int) -> str:
    """A new lineage holding ``tokens``, prefilled ``build_chunk`` at a time."""
    handle = engine.new_lineage()
    for i in range(0, len(tokens), build_chunk):
        engine.prefill(handle, tokens[i:i + build_chunk])
    return handle


def restore(engine: Engine, method: str, lineage: str, n: int) -> str:
    if method == "share":
        return engine.fork(lineage, n)
    if method == "clone":
        if not isinstance(engine, DeepCopy):
            raise ValueError(f"restore method 'clone' needs an engine that copies KV; {type(engine).__name__} cannot")
        return crop(engine, engine.copy_lineage(lineage), n)
    raise ValueError(f"restore method {method!r}: expected one of {METHODS}")


def get_minor_faults() -> int:
    """Minor page faults of this process so far (the model work runs in this
    thread, so a difference around one step is that step's)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def get_median_interval(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> list[float]:
    """A 95% percentile-bootstrap interval of the median of ``values``
    (seeded, so a report repeats)."""
    if not values:
        raise ValueError("get_median_interval: no values")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]]


def wait(engine: Engine) -> None:
    """Let the device finish queued work, so a timer around a step times the
    step (a no-op on the CPU)."""
    if engine.lm.device.startswith("cuda"):
        torch.cuda.synchronize()


def time_restored(engine: Engine, method: str, source: str, n: int, block: list[int]) -> dict:
    """Restore ``source`` at ``n`` by ``method`` and prefill ``block`` on it:
    wall and CPU seconds of the two steps, the restore alone, the page faults
    of the prefill and the bytes the restore copied (measured outside the
    timed spans). The restored lineage is dropped."""
    held = engine.budget.memory().held_bytes
    t0, c0 = time.perf_counter(), time.process_time()
    handle = restore(engine, method, source, n)
    wait(engine)
    t1, c1 = time.perf_counter(), time.process_time()
    copied = engine.budget.memory().held_bytes - held  # outside the timed spans
    f2, t2, c2 = get_minor_faults(), time.perf_counter(), time.process_time()
    engine.prefill(handle, block)
    wait(engine)
    t3, c3, f3 = time.perf_counter(), time.process_time(), get_minor_faults()
    engine.drop(handle)
    return {"wall": (t1 - t0) + (t3 - t2), "restore": t1 - t0, "cpu": (c1 - c0) + (c3 - c2),
            "faults": f3 - f2, "copied": copied}


def time_never_restored(engine: Engine, reference: str, n: int, block: list[int]) -> dict:
    """Prefill ``block`` on ``reference`` (``n`` tokens, never restored), then
    crop it back to ``n``: wall and CPU seconds and page faults of the prefill."""
    # the engine has no crop in place: the prefill runs on a whole fork of the
    # reference (made and dropped outside the timed span), the reference is kept
    branch = engine.fork(reference)
    f0, t0, c0 = get_minor_faults(), time.perf_counter(), time.process_time()
    engine.prefill(branch, block)
    wait(engine)
    t1, c1, f1 = time.perf_counter(), time.process_time(), get_minor_faults()
    engine.drop(branch)
    return {"wall": t1 - t0, "cpu": c1 - c0, "faults": f1 - f0}


def measure_pairs(engine: Engine, method: str, source: str, reference: str, n: int, block: list[int],
                  repeats: int, warmup: int) -> tuple[list[tuple[dict, dict]], int]:
    """``repeats`` (restored, never restored) timings of one cell, their order
    alternating so that neither side always runs first; with the page faults
    of the ``warmup`` untimed pairs that bring allocator and kernels to their
    steady state."""
    warm_faults = 0
    for _ in range(warmup):
        warm_faults += (time_restored(engine, method, source, n, block)["faults"]
                        + time_never_restored(engine, reference, n, block)["faults"])
    pairs = []
    for i in range(repeats):
        if i % 2:
            b = time_never_restored(engine, reference, n, block)
            a = time_restored(engine, method, source, n, block)
        else:
            a = time_restored(engine, method, source, n, block)
            b = time_never_restored(engine, reference, n, block)
        pairs.append((a, b))
    return pairs, warm_faults


def summarize_pairs(pairs: list[tuple[dict, dict]]) -> dict:
    """A row's figures from its (restored, never restored) pairs: medians of
    the paired differences with their bootstrap intervals, medians of each
    side, the most bytes a restore copied and the page faults of each side."""
    paired = [a["wall"] - b["wall"] for a, b in pairs]
    paired_cpu = [a["cpu"] - b["cpu"] for a, b in pairs]
    return {"overhead_s": statistics.median(paired),
            "overhead_ci_s": get_median_interval(paired),
            # the calling thread's CPU time (one torch thread does the model work in it):
            # time the machine gives to other work does not count, page faults do
            "overhead_cpu_s": statistics.median(paired_cpu),
            "overhead_cpu_ci_s": get_median_interval(paired_cpu),
            "restore_only_s": statistics.median(a["restore"] for a, _ in pairs),
            "with_restore_s": statistics.median(a["wall"] for a, _ in pairs),
            "never_restored_s": statistics.median(b["wall"] for _, b in pairs),
            "copied_bytes": max(a["copied"] for a, _ in pairs),
            "faults_restored": sum(a["faults"] for a, _ in pairs),
            "faults_never_restored": sum(b["faults"] for _, b in pairs)}


def measure_restore_overhead(engine: Engine, n: int, methods=METHODS, repeats: int = 15, chunks=(32,),
                             tail: int = 256, build_chunk: int = 256, warmup: int = 5,
                             progress: bool = False) -> list[dict]:
    """The restore overhead at ``n`` tokens for each method and first-prefill
    size (see the module docstring), in seconds. The checkpoint's lineage and
    the never-restored one are built once and serve every row."""
    if n % build_chunk:
        raise ValueError(f"n={n} must be a multiple of build_chunk={build_chunk} (checkpoints sit on chunk ends)")
    if repeats < 1 or warmup < 0 or not chunks or min(chunks) < 1:
        raise ValueError(f"repeats={repeats}, warmup={warmup}, chunks={list(chunks)}: need repeats >= 1, "
                         "warmup >= 0 and chunks of at least one token")
    tokens = get_tokens(engine, n + tail + max(chunks))
    source = build(engine, tokens[:n + tail], build_chunk)  # the checkpoint's lineage, longer than n
    reference = build(engine, tokens[:n], build_chunk)  # never restored
    rows = []
    cells = [(chunk, method) for chunk in chunks for method in methods]
    for chunk, method in tqdm(cells, desc=f"restore at {n} tokens", unit="row", disable=not progress):
        block = tokens[n + tail:n + tail + chunk]  # the first block after the restore
        pairs, warm_faults = measure_pairs(engine, method, source, reference, n, block, repeats, warmup)
        rows.append({"n": n, "method": method, "chunk": chunk, "repeats": repeats, "warmup": warmup, "tail": tail,
                     **summarize_pairs(pairs), "faults_warmup": warm_faults})
    engine.drop(source)
    engine.drop(reference)
    return rows


def get_ratios(rows: list[dict], key: str) -> dict:
    """``{method: {chunk: overhead(longest) / overhead(shortest)}}``; None
    where either median is at or below zero (noise around no overhead)."""
    out: dict = {}
    for r in rows:
        out.setdefault(r["method"], {}).setdefault(str(r["chunk"]), {})[r["n"]] = r[key]
    for by_chunk in out.values():
        for chunk, by_n in by_chunk.items():
            lo, hi = by_n[min(by_n)], by_n[max(by_n)]
            by_chunk[chunk] = hi / lo if lo > 0 and hi > 0 else None
    return out


def run(model: str = "smollm2", lengths=(1024, 7168), methods=METHODS, repeats: int = 15, threads: int = 1,
        chunks=(32,), tail: int = 256, warmup: int = 5, device: str = "cpu", dtype: str = "float32") -> dict:
    torch.set_num_threads(threads)
    engine = load_engine(model, "transformers", device=device, dtype=dtype)
    rows = [row for n in lengths
            for row in measure_restore_overhead(engine, n, methods, repeats, chunks, tail, warmup=warmup,
                                                progress=True)]
    return {"model": engine.lm.name, "device": engine.lm.device, "dtype": engine.lm.dtype, "threads": threads,
            "lengths": list(lengths), "chunks": list(chunks), "rows": rows, "command": None,
            "ratio": get_ratios(rows, "overhead_s"), "ratio_cpu": get_ratios(rows, "overhead_cpu_s")}


def format_table(result: dict) -> str:
    lines = [f"restore overhead on {result['model']} ({result['device']} {result['dtype']}, {result['threads']} "
             "thread(s)), median of paired differences [95% bootstrap interval]:",
             f"{'method':<8}{'tokens':>8}{'chunk':>7}{'overhead ms':>13}{'interval ms':>18}{'cpu ms':>9}"
             f"{'restore ms':>12}{'with ms':>10}{'without ms':>12}{'copied MB':>11}{'faults r/n/warm':>18}"]
    for r in result["rows"]:
        lo, hi = (x * 1e3 for x in r["overhead_ci_s"])
        faults = f"{r['faults_restored']}/{r['faults_never_restored']}/{r['faults_warmup']}"
        lines.append(f"{r['method']:<8}{r['n']:>8}{r['chunk']:>7}{r['overhead_s'] * 1e3:>13.2f}"
                     f"{f'[{lo:.1f}, {hi:.1f}]':>18}{r['overhead_cpu_s'] * 1e3:>9.2f}{r['restore_only_s'] * 1e3:>12.3f}"
                     f"{r['with_restore_s'] * 1e3:>10.1f}{r['never_restored_s'] * 1e3:>12.1f}"
                     f"{r['copied_bytes'] / 2**20:>11.1f}{faults:>18}")
    lo, hi = min(result["lengths"]), max(result["lengths"])
    for method, by_chunk in result["ratio"].items():
        for chunk, ratio in by_chunk.items():
            shown = ["n/a (a median overhead <= 0: below the noise)" if r is None else f"{r:.2f}x"
                     for r in (ratio, result["ratio_cpu"][method][chunk])]
            lines.append(f"{method}, {chunk}-token first prefill: overhead({hi}) / overhead({lo}) = {shown[0]} "
                         f"(wall), {shown[1]} (cpu)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("restore", __doc__)
    options.add_model(parser)
    options.add_device(parser)
    options.add_dtype(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 7168])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5, help="untimed restore/prefill pairs before each row")
    options.add_threads(parser)
    parser.add_argument("--chunks", type=int, nargs="+", default=[32],
                        help="sizes of the first prefill after the restore (one row each)")
    parser.add_argument("--tail", type=int, default=256, help="tokens the checkpoint's lineage holds past n")
    options.add_out(parser, help="write the JSON here")
    args = parser.parse_args(argv)
    result = run(args.model, tuple(args.lengths), tuple(args.methods), args.repeats, args.threads,
                 tuple(args.chunks), args.tail, args.warmup, args.device, args.dtype)
    result["command"] = "python -m unsee.bench.restore " + " ".join(argv if argv is not None else [])
    print(format_table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
