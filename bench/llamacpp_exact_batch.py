"""Is one ``llama_decode`` over several sequences exact, and do threads change
llama.cpp's bits? (issue 40, items 4 and 5; docs/bench.md, "many sequences in one forward")

    python -m unsee.bench.llamacpp_exact_batch --model qwen2.5-1.5b [--part batch|threads|all] [--out F.json]

**Batch** (``--part batch``). k sequences (``--sequences``, default 2, 4, 8),
each with its own pseudo-random history, sit in one context of k sequences
(cells shared, as ``LlamaCppModel.new_context(n_seq=k)`` makes it). The
histories are prefilled one sequence per ``llama_decode``; then each round is
*one* ``llama_decode`` that feeds every sequence its next tokens. The
reference is what the engine does today: each sequence alone in a context of
one sequence, its history as one forward, then one ``llama_decode`` per feed.
Compared: the logits of every fed token (max |difference|; 0 is bitwise
equal) and, after the last round, each sequence's K and V rows by position,
parsed from its state as the engine parses it (``KVState``). Cases:

    equal      histories of one length, every round one token a sequence
    staggered  histories of different lengths (the longest past 1,000 tokens)
    mixed      continuous batching: in the first round sequence 0 prefills a
               chunk (``--chunks``) while the others decode one token each

Cost: a decode round's CPU seconds (``time.process_time``, every thread's;
waiting threads spin, so 2 threads count their spin too) and wall seconds,
against the sum of the k one-token steps it replaces (the reference's), the
median over rounds.

**Threads** (``--part threads``). One sequence, one context; after a prompt
(``--prompts`` lengths, as one forward) a chunk of each ``--sizes`` length,
then ``--steps`` one-token decode steps, under each ``--threads`` setting
(``n_threads:n_threads_batch``; llama.cpp computes a one-token batch on
``n_threads``, any longer one on ``n_threads_batch``), compared with the first
setting: every logit fed and the KV rows.

Tokens are fixed pseudo-random ids (no tokenizer; the kernels do not look at
them), the same in every run. The kernels are the loader's
(``UNSEE_LLAMA_KERNELS``, exact by default); the table's label says which.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unsee.bench import options
from unsee.impl.engines.llamacpp.state import (
    BlobReader,
    KVState,
    SeqKV,
    check_layers,
    read_header,
    read_k,
    read_positions,
    read_v,
)

HISTORY = 64  # the "equal" case's histories, and the "staggered" case's first
STAGGER = 70  # what each further sequence's history adds in the "staggered" case
ROUNDS = 8
CHUNKS = (16, 100)
SIZES = (1, 8, 63, 64, 200, 512)
PROMPTS = (0, 600)
STEPS = 8


# ----------------------------------------------------------------- contexts


@dataclass
class Context:
    """One llama.cpp context over a model, a batch to feed it, and its timings."""

    lc: object
    ctx: object
    batch: object
    vocab: int
    n_layer: int
    v_trans: bool
    padded: bool = False  # one-token steps fed as two rows (facts.forward_padded), as the engine feeds them
    cpu: list[float] = field(default_factory=list)  # CPU seconds of each llama_decode, in order
    wall: list[float] = field(default_factory=list)

    @property
    def mem(self):
        return self.lc.llama_get_memory(self.ctx)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)


def open_context(lm, n_ctx: int, n_seq: int = 1, threads: int = 1, threads_batch: int | None = None,
                 unified: bool = True, padded: bool = False, flash_attn: bool | None = None) -> Context:
    """A context as the engine makes one (``n_seq`` sequences sharing the cells
    when above 1, or each in a stream of its own of ``n_ctx`` cells when not
    ``unified``), computing on ``threads`` (one-token batches) and
    ``threads_batch`` (longer ones) threads; ``padded``: its one-token steps fed as two rows
    (the engine's way on several decode threads); ``flash_attn``: the model's unless given."""
    from unsee.impl.engines.llamacpp.model import llama_module

    lc = llama_module()
    flash = lm.flash_attn if flash_attn is None else flash_attn
    ctx = lm.new_context(n_ctx if unified else n_ctx * n_seq, n_seq=n_seq, unified=unified, flash_attn=flash)
    lc.llama_set_n_threads(ctx, threads, threads_batch or threads)
    return Context(lc, ctx, lc.llama_batch_init(n_ctx, 0, 1), lm.vocab_size, lm.n_layer, not flash, padded)


def step(c: Context, pos: int, token: int) -> np.ndarray:
    """One decode step of sequence 0: its logits (1, vocab), fed as the engine feeds it
    (:func:`~unsee.impl.engines.llamacpp.facts.forward_padded` where ``c.padded``)."""
    if not c.padded:
        return decode(c, {0: (pos, [token])})[0]
    from unsee.impl.engines.llamacpp.facts import forward_padded

    cpu, wall = time.process_time(), time.perf_counter()
    logits = forward_padded(c.lc, c.ctx, c.batch, token, pos, c.vocab)
    c.cpu.append(time.process_time() - cpu)
    c.wall.append(time.perf_counter() - wall)
    return logits[None]


def decode(c: Context, feeds: dict[int, tuple[int, Sequence[int]]], last_only: bool = False) -> dict[int, np.ndarray]:
    """One ``llama_decode`` of ``feeds`` (sequence -> (first position, tokens)):
    each sequence's logits after every token it was fed (``last_only``: after
    its last), (n, vocab) float32 copies."""
    i, rows = 0, {}
    for seq, (start, tokens) in feeds.items():
        rows[seq] = range(i + len(tokens) - 1 if last_only else i, i + len(tokens))
        for j, tok in enumerate(tokens):
            c.batch.token[i], c.batch.pos[i], c.batch.n_seq_id[i] = tok, start + j, 1
            c.batch.seq_id[i][0], c.batch.logits[i] = seq, int(i in rows[seq])
            i += 1
    c.batch.n_tokens = i
    cpu, wall = time.process_time(), time.perf_counter()
    rc = c.lc.llama_decode(c.ctx, c.batch)
    c.cpu.append(time.process_time() - cpu)
    c.wall.append(time.perf_counter() - wall)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for {i} tokens")
    vocab = c.vocab
    return {seq: np.stack([np.ctypeslib.as_array(c.lc.llama_get_logits_ith(c.ctx, r), shape=(vocab,)) for r in rs])
            for seq, rs in rows.items()}


def read_kv(c: Context, seq: int) -> KVState:
    """Sequence ``seq``'s K and V rows by position, parsed as the engine parses them."""
    import ctypes

    size = c.lc.llama_state_seq_get_size(c.ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    if c.lc.llama_state_seq_get_data(c.ctx, buf, size, seq) != size:
        raise RuntimeError(f"sequence {seq}: the state could not be read")
    return parse_state(bytes(buf), c.n_layer, c.v_trans)


def parse_state(blob: bytes, n_layer: int, v_trans: bool) -> KVState:
    """A sequence's state blob as ``KVState``: the engine's parser for one
    stream; for a context of one stream per sequence (``kv_unified`` off)
    llama.cpp writes every stream, the sequence's cells in one of them."""
    reader = BlobReader(blob)
    read_header(reader)
    (n_stream,) = reader.take("I")
    if n_stream == 1:
        return KVState.parse(blob, n_layer, v_trans)
    found = []
    for _ in range(n_stream):
        (cells,) = reader.take("I")
        if cells:
            positions = read_positions(reader, cells)
            layers = check_layers(reader, n_layer, v_trans)
            ks, kt = read_k(reader, cells, layers)
            vs, vt, ve = read_v(reader, cells, layers, v_trans)
            found.append(SeqKV(positions, tuple(ks), tuple(vs), tuple(kt), tuple(vt), v_trans, tuple(ve)))
    if len(found) != 1 or reader.offset != reader.size:
        raise ValueError(f"a state of {n_stream} streams: the sequence's cells in {len(found)} of them")
    return KVState((found[0],))


def get_kv_digest(kv: KVState) -> str:
    h = hashlib.sha256()
    kv.digest_into(h)
    return h.hexdigest()


def get_first_kv_diff(a: KVState, b: KVState) -> int | None:
    """The first position whose K or V row differs in any layer (None: all equal)."""
    if a.n != b.n or any(not np.array_equal(x.positions, y.positions) for x, y in zip(a.caches, b.caches)):
        return 0
    bad = [int(x.positions[np.flatnonzero((ra != rb).any(axis=1))[0]])
           for x, y in zip(a.caches, b.caches) for ra, rb in zip(x.k + x.v, y.k + y.v)
           if ra.shape == rb.shape and (ra != rb).any()]
    shapes_differ = any(ra.shape != rb.shape for x, y in zip(a.caches, b.caches) for ra, rb in zip(x.k + x.v, y.k + y.v))
    return 0 if shapes_differ else (min(bad) if bad else None)


def get_max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max((float(np.abs(x - y).max()) for x, y in zip(a, b)), default=0.0)


def make_tokens(n: int, vocab: int, salt: int) -> list[int]:
    """Fixed pseudo-random ids in [0, vocab)."""
    return [int(t) for t in np.random.default_rng(salt).integers(0, vocab, n)]


# -------------------------------------------------------------------- batch


@dataclass(frozen=True)
class Plan:
    """What each sequence is fed: its history (one forward), then one feed a round."""

    histories: tuple[tuple[int, ...], ...]
    rounds: tuple[tuple[tuple[int, ...], ...], ...]  # rounds[r][seq]: the tokens fed in round r


def make_plan(case: str, k: int, vocab: int, chunk: int = 0, history: int = HISTORY, stagger: int = STAGGER,
              rounds: int = ROUNDS) -> Plan:
    """The histories and feeds of a case (module docstring) for ``k`` sequences."""
    lengths = [history + s * (stagger if case == "staggered" else 0) for s in range(k)]
    histories = tuple(tuple(make_tokens(n, vocab, 1000 + s)) for s, n in enumerate(lengths))
    feeds = [tuple(make_tokens(rounds, vocab, 2000 + s)) for s in range(k)]
    plan = tuple(tuple((feeds[s][r],) for s in range(k)) for r in range(rounds))
    if case == "mixed":
        plan = ((tuple(make_tokens(chunk, vocab, 3000)),) + plan[0][1:],) + plan[1:]
    return Plan(histories, plan)


def run_alone(lm, plan: Plan, seq: int, threads: int, prefilled: dict) -> tuple[list[np.ndarray], KVState,
                                                                                list[float], list[float]]:
    """Sequence ``seq`` alone in a one-sequence context (the engine's way): the
    logits of each round's feed, its KV after the last, each round's CPU and
    wall seconds. Its history's prefill (one forward) is done once per history
    and thread count, kept in ``prefilled`` as its state, and loaded into the
    fresh context after (as the engine reloads a parked lineage: bitwise a fresh run)."""
    import ctypes

    history = plan.histories[seq]
    n_ctx = len(history) + sum(len(r[seq]) for r in plan.rounds) + 8
    c = open_context(lm, n_ctx, 1, threads)
    try:
        key = (history, threads)
        if key not in prefilled:
            decode(c, {0: (0, history)}, last_only=True)
            prefilled[key] = read_kv(c, 0).to_blob()
        else:
            blob = prefilled[key]
            arr = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
            if c.lc.llama_state_seq_set_data(c.ctx, arr, len(blob), 0) != len(blob):
                raise RuntimeError("a prefilled history could not be loaded")
            c.cpu.append(0.0)
            c.wall.append(0.0)
        pos, out = len(history), []
        for r in plan.rounds:
            out.append(decode(c, {0: (pos, r[seq])})[0])
            pos += len(r[seq])
        return out, read_kv(c, 0), c.cpu[1:], c.wall[1:]
    finally:
        c.close()


def run_batched(lm, plan: Plan, threads: int, unified: bool) -> tuple[list[list[np.ndarray]], list[KVState],
                                                                     list[float], list[float]]:
    """Every sequence in one context (``unified``: sharing the cells, else a
    stream each): histories one sequence per forward, then each round one
    forward of every sequence's feed. Per sequence its logits by round and its
    KV; each round's CPU and wall seconds."""
    k = len(plan.histories)
    lengths = [len(h) + sum(len(r[s]) for r in plan.rounds) for s, h in enumerate(plan.histories)]
    c = open_context(lm, (sum(lengths) if unified else max(lengths)) + 8, k, threads, unified=unified)
    try:
        for s, history in enumerate(plan.histories):
            decode(c, {s: (0, history)}, last_only=True)
        pos = [len(h) for h in plan.histories]
        out = [[] for _ in range(k)]
        for r in plan.rounds:
            logits = decode(c, {s: (pos[s], r[s]) for s in range(k)})
            for s in range(k):
                out[s].append(logits[s])
                pos[s] += len(r[s])
        return out, [read_kv(c, s) for s in range(k)], c.cpu[k:], c.wall[k:]
    finally:
        c.close()


def compare_batch(lm, plan: Plan, threads: int, unified: bool, prefilled: dict,
                  reference_threads: int | None = None) -> dict:
    """One row of the batch table: a plan's k sequences on ``threads`` threads,
    against each alone on ``reference_threads`` (default: the same)."""
    k, reference_threads = len(plan.histories), reference_threads or threads
    alone = [run_alone(lm, plan, s, reference_threads, prefilled) for s in range(k)]
    logits, kvs, cpu, wall = run_batched(lm, plan, threads, unified)
    diffs = [get_max_diff(logits[s], alone[s][0]) for s in range(k)]
    kv_diff = [get_first_kv_diff(kvs[s], alone[s][1]) for s in range(k)]
    mixed = len(plan.rounds[0][0]) > 1
    decode_rounds = range(1 if mixed else 0, len(plan.rounds))  # rounds of one token a sequence
    single_cpu = [sum(alone[s][2][r] for s in range(k)) for r in decode_rounds]
    single_wall = [sum(alone[s][3][r] for s in range(k)) for r in decode_rounds]
    return {"k": k, "threads": threads, "reference_threads": reference_threads, "layout": "unified" if unified else "split",
            "history": [len(h) for h in plan.histories], "rounds": len(plan.rounds),
            "tokens_compared": sum(len(f) for r in plan.rounds for f in r),
            "max_abs_logit_diff": max(diffs), "logits_equal": all(d == 0.0 for d in diffs),
            "kv_equal": all(d is None for d in kv_diff),
            "first_kv_diff": [d for d in kv_diff],
            "kv_digests_equal": all(get_kv_digest(kvs[s]) == get_kv_digest(alone[s][1]) for s in range(k)),
            "batched_cpu_s": statistics.median(cpu[r] for r in decode_rounds),
            "single_cpu_s": statistics.median(single_cpu),
            "batched_wall_s": statistics.median(wall[r] for r in decode_rounds),
            "single_wall_s": statistics.median(single_wall)}


def run_batch_part(lm, sequences: Sequence[int], threads: Sequence[int], chunks: Sequence[int],
                   layouts: Sequence[str], history: int, stagger: int, progress,
                   reference_threads: int | None = None) -> list[dict]:
    rows, prefilled = [], {}
    for layout in layouts:
        for t in threads:
            for k in sequences:
                for case, chunk in [("equal", 0), ("staggered", 0)] + [("mixed", c) for c in chunks]:
                    plan = make_plan(case, k, lm.vocab_size, chunk, history, stagger)
                    rows.append({"case": case, "chunk": chunk} | compare_batch(lm, plan, t, layout == "unified",
                                                                                prefilled, reference_threads))
                    progress(rows[-1])
    return rows


# ------------------------------------------------------------------ threads


def run_size(c: Context, prompt: int, size: int, steps: int) -> tuple[list[np.ndarray], KVState, float]:
    """After the context's prompt (its first ``prompt`` positions, kept): a
    chunk of ``size`` (a decode step where 1), then ``steps`` decode steps; every
    logit fed, the KV and the decode steps' median wall seconds.
    The KV is cropped back to the prompt first (crop + continue is a fresh run: docs/engines.md)."""
    c.lc.llama_memory_seq_rm(c.mem, 0, prompt, -1)
    chunk = make_tokens(size, c.vocab, 20 + size)
    out = [decode(c, {0: (prompt, chunk)})[0] if size > 1 else step(c, prompt, chunk[0])]
    for i, tok in enumerate(make_tokens(steps, c.vocab, 30)):
        out.append(step(c, prompt + size + i, tok))
    return out, read_kv(c, 0), statistics.median(c.wall[-steps:]) if steps else 0.0


def run_threads_part(lm, prompts: Sequence[int], sizes: Sequence[int], steps: int,
                     settings: Sequence[tuple[int, int, bool]], progress, flash_attn: bool | None = None) -> list[dict]:
    """For each prompt length, one context per thread setting (``(n_threads,
    n_threads_batch, padded)``) with the prompt prefilled (one forward) on it; each chunk
    size then runs on every context and is compared with the first setting's."""
    rows = []
    for prompt in prompts:
        contexts = [open_context(lm, prompt + max(sizes) + steps + 8, 1, n, b, padded=p, flash_attn=flash_attn)
                    for n, b, p in settings]
        try:
            prompt_logits = [decode(c, {0: (0, make_tokens(prompt, lm.vocab_size, 10))}, last_only=True)[0]
                             if prompt else None for c in contexts]
            for size in sizes:
                base_logits, base_kv, base_wall = run_size(contexts[0], prompt, size, steps)
                for setting, c, first_logits in zip(settings[1:], contexts[1:], prompt_logits[1:]):
                    logits, kv, wall = run_size(c, prompt, size, steps)
                    if prompt:
                        logits, base = [first_logits, *logits], [prompt_logits[0], *base_logits]
                    else:
                        base = base_logits
                    diff = get_max_diff(logits, base)
                    first = get_first_kv_diff(kv, base_kv)
                    rows.append({"prompt": prompt, "size": size, "steps": steps, "base": format_setting(settings[0]),
                                 "threads": format_setting(setting), "max_abs_logit_diff": diff,
                                 "logits_equal": diff == 0.0, "kv_equal": first is None, "first_kv_diff": first,
                                 "flash_attn": lm.flash_attn if flash_attn is None else flash_attn,
                                 "base_step_wall_s": base_wall, "step_wall_s": wall})
                    progress(rows[-1])
        finally:
            for c in contexts:
                c.close()
    return rows


# ------------------------------------------------------------------- output


def get_cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def format_batch(rows: list[dict]) -> list[str]:
    lines = ["| cells | threads | case | k | histories (tokens) | max abs logit diff | KV rows equal | CPU: k-step / k single steps | wall: same |",
             "|---|---:|---|---:|---|---:|---|---:|---:|"]
    for r in rows:
        case = f"mixed (chunk {r['chunk']})" if r["case"] == "mixed" else r["case"]
        hist = f"{min(r['history'])}-{max(r['history'])}" if len(set(r["history"])) > 1 else str(r["history"][0])
        kv = "yes" if r["kv_equal"] else f"no (first at {min(d for d in r['first_kv_diff'] if d is not None)})"
        threads = r["threads"] if r.get("reference_threads", r["threads"]) == r["threads"] else \
            f"{r['threads']} (alone: {r['reference_threads']})"
        lines.append(f"| {r['layout']} | {threads} | {case} | {r['k']} | {hist} | {r['max_abs_logit_diff']:.3g} | {kv} | "
                     f"{r['batched_cpu_s'] / r['single_cpu_s']:.2f} ({r['batched_cpu_s']:.3f} / {r['single_cpu_s']:.3f} s) | "
                     f"{r['batched_wall_s'] / r['single_wall_s']:.2f} |")
    return lines


def format_threads(rows: list[dict]) -> list[str]:
    lines = ["| flash attention | prompt | chunk | then decode steps | threads (n:batch, p: padded) vs | "
             "max abs logit diff | KV rows equal | decode step wall: this / reference, s |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        kv = "yes" if r["kv_equal"] else f"no (first at {r['first_kv_diff']})"
        lines.append(f"| {'on' if r.get('flash_attn', True) else 'off'} | {r['prompt']} | {r['size']} | {r['steps']} | "
                     f"{r['threads']} vs {r['base']} | {r['max_abs_logit_diff']:.3g} | {kv} | "
                     f"{r.get('step_wall_s', 0):.4f} / {r.get('base_step_wall_s', 0):.4f} |")
    return lines


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def show(row: dict) -> None:
    print(json.dumps(row), flush=True)


def parse_setting(text: str) -> tuple[int, int, bool]:
    """``n:b`` (n_threads, n_threads_batch), ``p`` after it: one-token steps padded to two rows."""
    padded = text.endswith("p")
    n, _, b = text.removesuffix("p").partition(":")
    return int(n), int(b or n), padded


def format_setting(setting: tuple[int, int, bool]) -> str:
    return f"{setting[0]}:{setting[1]}{'p' if setting[2] else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_exact_batch", __doc__)
    options.add_model(parser)  # a llama.cpp model: the measurements' own is qwen2.5-1.5b
    parser.add_argument("--part", choices=("batch", "threads", "all"), default="all")
    parser.add_argument("--sequences", default="2,4,8", help="k, the sequences decoded in one llama_decode")
    parser.add_argument("--batch-threads", default="1,2", help="thread counts the batch part runs at")
    parser.add_argument("--reference-threads", type=int, default=None,
                        help="the threads of each sequence's run alone (default: the batch's)")
    parser.add_argument("--layouts", default="unified,split",
                        help="the batch part's cells: unified (shared by the sequences), split (a stream each)")
    parser.add_argument("--history", type=int, default=HISTORY,
                        help="the histories' length (the staggered case's first)")
    parser.add_argument("--stagger", type=int, default=STAGGER,
                        help="what each further history adds in the staggered case")
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="the mixed case's prefill chunks")
    parser.add_argument("--threads", default="1:1,2:2,1:2,2:1",
                        help="n_threads:n_threads_batch settings of the threads part, the first the reference; "
                             "a trailing p feeds one-token steps as two rows (the engine's padded step)")
    parser.add_argument("--flash", choices=("on", "off", "both"), default="on",
                        help="the threads part's flash attention (both: a run with each)")
    parser.add_argument("--prompts", default=",".join(map(str, PROMPTS)))
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="the threads part's chunk sizes")
    parser.add_argument("--steps", type=int, default=STEPS)
    options.add_out(parser, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    from unsee.impl.engines.registry import load_engine

    lm = load_engine(args.model, "llamacpp", threads=1).lm
    label = {"model": lm.name, "file": os.path.basename(lm.source), "cpu": get_cpu_name(),
             "kernels": "exact" if lm.exact_kernels else "repacked", "flash_attn": lm.flash_attn,
             "llama_cpp_python": lm.info.get("llama_cpp_python"), "tiled_mm": lm.info.get("GGML_CPU_TILED_MM")}
    print(json.dumps(label))
    out: dict = {"label": label}
    if args.part in ("batch", "all"):
        out["batch"] = run_batch_part(lm, ints(args.sequences), ints(args.batch_threads), ints(args.chunks),
                                      args.layouts.split(","), args.history, args.stagger, show,
                                      args.reference_threads)
    if args.part in ("threads", "all"):
        settings = [parse_setting(s) for s in args.threads.split(",")]
        flashes = {"on": (True,), "off": (False,), "both": (True, False)}[args.flash]
        out["threads"] = [row for flash in flashes
                          for row in run_threads_part(lm, ints(args.prompts), ints(args.sizes), args.steps, settings,
                                                      show, flash)]
    print()
    if "batch" in out:
        print("\n".join(format_batch(out["batch"])) + "\n")
    if "threads" in out:
        print("\n".join(format_threads(out["threads"])))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
