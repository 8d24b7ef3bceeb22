"""What a forward of each size costs, in one-token decode steps, for one
model file and configuration on this machine: the draft policy's cost table
(impl/engines/speculation.py, ``DraftPolicy.from_costs``), measured once and
cached beside the decode facts (facts.py). From it the policy takes its
``per_token``, its opening, and whether drafts can pay on the model at all
(issue 54: the ratio differs by model, and is not a line: on Gemma 3 270M
here a 3-token forward cost 4.8 decode steps and an 8-token one 5.3, its
262,144-entry logits copied for every row).

With exact kernels every forward size takes llama.cpp's per-row kernels, so
a forward of ``n`` tokens costs about ``1 + r (n - 1)`` decode steps, and
``r`` is far from the near-zero a GPU's prefill has: on Qwen2.5-Coder-1.5B
Q4_K_M, one thread, an Intel Xeon, forwards of 2 to 9 tokens with every
row's logits read cost 0.40 to 0.51 decode steps a token beyond the first
(docs/bench.md, "Drafts on real episodes"). The ratio depends on the CPU, the
thread count and the kernels, so it is measured: after a short fixed prompt,
the fastest of a few one-token decode steps, and for each of
:data:`COST_SIZES` the fastest of :data:`COST_REPEATS` forwards of that
size (the KV cut back to the prompt's end each time), every row's logits
read. Each size gives ``t_n / t_1`` (:func:`compute_costs`), the table.
Minima of the process's CPU time, so that a second thread's work is counted
and another process's use of the cores is not (a shared machine's wall time
had a 2-token forward of Qwen2.5-Coder-1.5B at 2.1 decode steps on a quiet
minute and 2.7 under a load average of 10). It only sizes forwards and turns drafts on or
off: no decision depends on it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping

import numpy as np

from unsee.impl.engines.llamacpp.facts import forward, get_cache_key, get_cache_path, read_cache, write_cache
from unsee.impl.engines.speculation import DraftPolicy

#: the prompt's length, the one-token steps timed, the forward sizes and the repeats of each
COST_PROMPT = 48
COST_STEPS = 6
COST_SIZES = (2, 3, 4, 6, 8, 16)
COST_REPEATS = 3
#: the cache entries' prefix before the facts' key; bump its version when the measurement
#: changes (old entries are then ignored)
COST_PREFIX = "cost-v3|"


def compute_per_token(step_s: float, forward_s: Mapping[int, float]) -> float:
    """``per_token`` from the fastest one-token step and the fastest forward
    of each size: the median of ``(t_n / t_1 - 1) / (n - 1)``, rounded up to
    a twentieth and kept within [0.05, 1] (a coarse, cautious figure: it is
    what a proposal is charged)."""
    ratios = [(t / step_s - 1) / (n - 1) for n, t in forward_s.items() if n >= 2]
    median = statistics.median(ratios)
    return min(1.0, max(0.05, math.ceil(round(median * 20, 6)) / 20))


def compute_costs(step_s: float, forward_s: Mapping[int, float]) -> dict[int, float]:
    """The cost table: each size's fastest forward over the fastest one-token step, to a thousandth."""
    return {n: round(t / step_s, 3) for n, t in sorted(forward_s.items()) if n >= 2}


def measure_costs(lm, lc) -> dict[int, float]:
    """Time the forwards of the module docstring on ``lm`` (``lc``: the ``llama_cpp`` module)."""
    n_ctx = COST_PROMPT + max(COST_SIZES) + COST_STEPS + 8
    ctx = lm.new_context(n_ctx)
    batch = lc.llama_batch_init(n_ctx, 0, 1)
    mem = lc.llama_get_memory(ctx)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, lm.vocab_size, COST_PROMPT + max(COST_SIZES))]

    def timed(n: int, all_logits: bool) -> float:
        lc.llama_memory_seq_rm(mem, 0, COST_PROMPT, -1)
        started = time.process_time()
        forward(lc, ctx, batch, ids[COST_PROMPT:COST_PROMPT + n], COST_PROMPT, all_logits, lm.vocab_size)
        return time.process_time() - started

    try:
        lc.llama_memory_clear(mem, True)
        forward(lc, ctx, batch, ids[:COST_PROMPT], 0, False, lm.vocab_size)
        step = min(timed(1, False) for _ in range(COST_STEPS))
        sizes = {n: min(timed(n, True) for _ in range(COST_REPEATS)) for n in COST_SIZES}
        return compute_costs(step, sizes)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def get_costs(lm, lc, cache_dir: str | os.PathLike | None = None) -> dict[int, float]:
    """``lm``'s cost table: from the cache (keyed as the decode facts are), or measured and cached."""
    path = get_cache_path(cache_dir)
    key = COST_PREFIX + get_cache_key(lm)
    cached = read_cache(path)
    if key in cached:
        return {int(n): float(c) for n, c in sorted(cached[key].items(), key=lambda item: int(item[0]))}
    costs = measure_costs(lm, lc)
    cached = read_cache(path)  # another process may have written meanwhile
    cached[key] = {str(n): c for n, c in costs.items()}
    write_cache(path, cached)
    return costs


def get_draft_policy(lm, lc, cache_dir: str | os.PathLike | None = None) -> DraftPolicy:
    """``lm``'s draft policy from its cost table (:func:`get_costs`), saying where it came from."""
    costs = get_costs(lm, lc, cache_dir)
    table = ", ".join(f"{n}: {c:g}" for n, c in costs.items())
    return DraftPolicy.from_costs(costs, f"measured at load: a forward of n tokens costs c(n) decode steps ({table})")


__all__ = ["COST_PREFIX", "COST_SIZES", "compute_costs", "compute_per_token", "get_costs", "get_draft_policy",
           "measure_costs"]
