"""The prefill-versus-decode logit discrepancy that bounds draft verification, measured.

For each prompt the reference decodes a greedy turn one token at a time and
keeps every decode step's logits. Two other paths then compute logits for the
same positions, as draft replay does (impl/agent/drafts.py):

- ``verify``: one multi-token forward over the whole turn (the verification
  prefill), logits at every position;
- ``resume``: a verification prefill of the first half, then one-token decode
  steps on the KV it built (decoding after the first disagreement).

:func:`measure_discrepancy` gives the distribution of max |logit_path - logit_decode|
per position, per thread count, and the smallest top-2 margin seen. Both
``python -m unsee.bench.discrepancy`` (the shipped rows of DRAFT_BOUNDS) and
``unsee calibrate`` (a bound for any configuration, engines/bounds.py) run it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from unsee.impl.engines.hf import adapter

TOPICS = ("the history of Paris", "how to bake bread", "planning a dinner party", "the rules of chess",
          "a trip to the mountains", "saving money each month", "learning to swim", "the planets of the solar system",
          "caring for a cat", "writing a short poem")


def get_prompts(n: int) -> list[str]:
    return [f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            f"Tell me about {TOPICS[i % len(TOPICS)]}, part {i // len(TOPICS) + 1}.<|im_end|>\n"
            f"<|im_start|>assistant\n" for i in range(n)]


def measure_prompt(lm, prompt: list[int], n_tokens: int) -> dict[str, list[float]]:
    """Per position: the max element-wise discrepancy of each path, the reference's
    top-2 margin, and its largest |logit| (the scale one rounding step is relative to)."""
    model = lm.model
    cache = adapter.new_cache(model)
    logits = adapter.forward_last_logits(model, prompt, cache)
    tokens, reference = [], []
    for _ in range(n_tokens):
        tok = int(torch.argmax(logits))
        tokens.append(tok)
        logits = adapter.forward_last_logits(model, [tok], cache)
        reference.append(logits.float().cpu())
    reference = torch.stack(reference)  # row i: logits after tokens[: i + 1]

    cache = adapter.new_cache(model)
    adapter.forward_last_logits(model, prompt, cache)
    verify = adapter.forward_all_logits(model, tokens, cache).float().cpu()

    half = n_tokens // 2
    cache = adapter.new_cache(model)
    adapter.forward_last_logits(model, prompt, cache)
    resume = [adapter.forward_all_logits(model, tokens[:half], cache)[-1].float().cpu()]
    for tok in tokens[half:-1]:
        resume.append(adapter.forward_last_logits(model, [tok], cache).float().cpu())
    resume = torch.stack(resume)  # rows half-1 .. n-2 of the reference

    top2 = torch.topk(reference, 2, dim=-1).values
    return {
        "verify": (verify - reference).abs().amax(dim=-1).tolist(),
        "resume": (resume - reference[half - 1:-1]).abs().amax(dim=-1).tolist(),
        "margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "scale": reference.abs().amax(dim=-1).tolist(),
    }


def get_quantiles(xs: list[float]) -> dict[str, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    return {"n": len(xs), "max": float(t.max()), "p50": float(t.quantile(0.5)), "p99": float(t.quantile(0.99)),
            "p999": float(t.quantile(0.999))}


def get_resolution(lm, scale: float) -> float:
    """One rounding step of the model's dtype at the largest |logit| seen: the smallest
    discrepancy the logits can show (a measured maximum of 0 means "below this")."""
    return float(torch.finfo(lm.model.dtype).eps) * scale


def measure_threads(lm, prompts: Sequence[list[int]], n_tokens: int,
                    step: Callable[[], None] | None = None) -> tuple[dict, float]:
    """One thread count's row of :func:`measure_discrepancy` and the largest |logit|
    seen; ``step`` is called after each prompt (a progress bar)."""
    paths: dict[str, list[float]] = {"verify": [], "resume": [], "margin": [], "scale": []}
    for prompt in prompts:
        for key, values in measure_prompt(lm, prompt, n_tokens).items():
            paths[key].extend(values)
        if step is not None:
            step()
    row = {key: get_quantiles(values) for key, values in paths.items() if key in ("verify", "resume")}
    row["min_margin"] = min(paths["margin"])
    row["margins_below_1e-3"] = sum(m < 1e-3 for m in paths["margin"])
    row["margins"] = paths["margin"]  # taken out by measure_discrepancy
    return row, max(paths["scale"])


def measure_discrepancy(lm, n_prompts: int, n_tokens: int, threads: Sequence[int],
                        step: Callable[[], None] | None = None) -> dict:
    """The discrepancy distribution of ``lm`` over ``n_prompts`` greedy turns of
    ``n_tokens`` at each thread count: ``by_threads`` rows, ``measured_max`` (the
    largest over paths and thread counts), ``positions`` compared and ``resolution``
    (:func:`get_resolution`), and ``margins``: every reference position's top-2 margin
    (what a bound's threshold is compared with). Restores torch's thread count when done."""
    if n_prompts < 1 or n_tokens < 2 or not threads:
        raise ValueError(f"measure_discrepancy: prompts={n_prompts} (>= 1), tokens={n_tokens} (>= 2) and "
                         f"threads={list(threads)} (not empty) are needed")
    prompts = [lm.encode(p) for p in get_prompts(n_prompts)]
    before = torch.get_num_threads()
    result: dict = {"by_threads": {}, "measured_max": 0.0, "positions": 0, "scale": 0.0, "margins": []}
    try:
        for count in threads:
            torch.set_num_threads(int(count))
            row, scale = measure_threads(lm, prompts, n_tokens, step)
            result["margins"] += row.pop("margins")
            result["by_threads"][str(count)] = row
            result["measured_max"] = max(result["measured_max"], row["verify"]["max"], row["resume"]["max"])
            result["positions"] += row["verify"]["n"] + row["resume"]["n"]
            result["scale"] = max(result["scale"], scale)
    finally:
        torch.set_num_threads(before)
    result["resolution"] = get_resolution(lm, result["scale"])
    return result


__all__ = ["TOPICS", "get_prompts", "get_quantiles", "get_resolution", "measure_discrepancy", "measure_prompt",
           "measure_threads"]
