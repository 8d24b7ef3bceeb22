"""What a padded decode step costs against a lone row (issue 50, item 2; docs/bench.md,
"Decode on every core, exactly").

    python -m unsee.bench.llamacpp_pad_cost --model qwen2.5-1.5b [--context 600] [--steps 10] [--threads 1,2]

On each thread count, after a prompt of ``--context`` tokens (one forward), ``--steps`` rounds
of: a lone one-row ``llama_decode`` at the next position, then the engine's padded step
(``facts.forward_padded``: two rows, the second's cell freed) at the same position, each
cropped back after it, so both always attend over the same cells and drifts of the machine's
load fall on both alike. Where the library has the split switch
(impl/engines/llamacpp/kernels.py) the lone row is timed twice: ``whole`` (the split off, as
the engine runs it: one thread's bits) and ``split`` (llama.cpp's own kernel). Reported per kind: the median CPU seconds of the process (every
thread's; on more than one thread OpenMP's spinning counts too) and the median and fastest
wall seconds. ``--flash both`` repeats it without flash attention (a lone row is then
thread-invariant: the option this change weighed against padding).
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from unsee.bench import options


def time_steps(lm, lc, threads: int, flash: bool, context: int, steps: int) -> dict:
    """``{kind: {cpu_p50, wall_p50, wall_min}}`` for ``lone`` (or ``whole`` and ``split``) and
    ``padded`` steps (module docstring)."""
    from unsee.impl.engines.llamacpp.facts import forward, forward_padded
    from unsee.impl.engines.llamacpp.kernels import find_setter, set_lone_row_split

    switch = find_setter(lc) is not None

    ctx = lm.new_context(context + 8, flash_attn=flash)
    batch = lc.llama_batch_init(context + 8, 0, 1)
    try:
        lc.llama_set_n_threads(ctx, threads, threads)
        tokens = [int(t) for t in np.random.default_rng(3).integers(0, lm.vocab_size, context + 1)]
        forward(lc, ctx, batch, tokens[:context], 0, False, lm.vocab_size)
        times: dict[str, list[tuple[float, float]]] = (
            {"whole": [], "split": [], "padded": []} if switch else {"lone": [], "padded": []})
        for _ in range(steps):
            for kind, spent in times.items():
                if switch:
                    set_lone_row_split(lc, kind == "split")
                cpu, wall = time.process_time(), time.perf_counter()
                if kind == "padded":
                    forward_padded(lc, ctx, batch, tokens[context], context, lm.vocab_size)
                else:
                    batch.token[0], batch.pos[0], batch.n_seq_id[0] = tokens[context], context, 1
                    batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
                    if lc.llama_decode(ctx, batch) != 0:
                        raise RuntimeError(f"llama_decode failed at position {context}")
                spent.append((time.perf_counter() - wall, time.process_time() - cpu))
                lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, context, -1)
        return {kind: {"cpu_p50": statistics.median(c for _, c in v), "wall_p50": statistics.median(w for w, _ in v),
                       "wall_min": min(w for w, _ in v)} for kind, v in times.items()}
    finally:
        if switch:
            set_lone_row_split(lc, False)  # as the loader left it
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_pad_cost", __doc__)
    options.add_model(parser)
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--flash", choices=("on", "off", "both"), default="on")
    options.add_out(parser, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    from unsee.impl.engines.llamacpp.model import llama_module
    from unsee.impl.engines.registry import load_engine

    lm = load_engine(args.model, "llamacpp", threads=1).lm
    rows = []
    for flash in {"on": (True,), "off": (False,), "both": (True, False)}[args.flash]:
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"flash_attn": flash, "threads": threads, "context": args.context,
                   **time_steps(lm, llama_module(), threads, flash, args.context, args.steps)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    options.write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
