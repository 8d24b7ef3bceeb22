"""Measure the prefill-versus-decode logit discrepancy that bounds draft verification.

For each prompt the reference decodes a greedy turn one token at a time and
keeps every decode step's logits. Two other paths then compute logits for the
same positions, as draft replay does (impl/agent/drafts.py):

- ``verify``: one multi-token forward over the whole turn (the verification
  prefill), logits at every position;
- ``resume``: a verification prefill of the first half, then one-token decode
  steps on the KV it built (decoding after the first disagreement).

It reports the distribution of max |logit_path - logit_decode| per position,
per thread count, the smallest top-2 margin seen, and checks the bound that
``DRAFT_BOUNDS`` holds for the configuration (measured max x 10 <= bound).

    python -m unsee.bench.discrepancy --model smollm2 --out out/discrepancy
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.impl.engines.decoding import get_draft_bound
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.registry import load_model_for

TOPICS = ("the history of Paris", "how to bake bread", "planning a dinner party", "the rules of chess",
          "a trip to the mountains", "saving money each month", "learning to swim", "the planets of the solar system",
          "caring for a cat", "writing a short poem")


def get_prompts(n: int) -> list[str]:
    return [f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            f"Tell me about {TOPICS[i % len(TOPICS)]}, part {i // len(TOPICS) + 1}.<|im_end|>\n"
            f"<|im_start|>assistant\n" for i in range(n)]


def measure_prompt(lm, prompt: list[int], n_tokens: int) -> dict[str, list[float]]:
    """Per position: the max element-wise discrepancy of each path, and the reference's top-2 margin."""
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
    }


def get_quantiles(xs: list[float]) -> dict[str, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    return {"n": len(xs), "max": float(t.max()), "p50": float(t.quantile(0.5)), "p99": float(t.quantile(0.99)),
            "p999": float(t.quantile(0.999))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unsee.bench.discrepancy", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", default="out/discrepancy")
    args = parser.parse_args(argv)
    lm = load_model_for("transformers", args.model, device=args.device, dtype=args.dtype)
    prompts = [lm.encode(p) for p in get_prompts(args.prompts)]
    result = {"model": lm.name, "device": lm.device, "dtype": lm.dtype, "torch": torch.__version__,
              "transformers": adapter.TRANSFORMERS_VERSION, "machine": platform.machine(), "by_threads": {}}
    worst = 0.0
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        paths: dict[str, list[float]] = {"verify": [], "resume": [], "margin": []}
        for prompt in tqdm(prompts, desc=f"{threads} thread(s)", unit="prompt"):
            for key, values in measure_prompt(lm, prompt, args.tokens).items():
                paths[key].extend(values)
        row = {key: get_quantiles(values) for key, values in paths.items() if key != "margin"}
        row["min_margin"] = min(paths["margin"])
        row["margins_below_1e-3"] = sum(m < 1e-3 for m in paths["margin"])
        result["by_threads"][str(threads)] = row
        worst = max(worst, row["verify"]["max"], row["resume"]["max"])
    bound = get_draft_bound(lm.name, lm.device, lm.dtype)
    result.update(measured_max=worst, bound=bound, safety_factor=(bound / worst if bound and worst else None),
                  bound_ok=bound is not None and worst * 10 <= bound)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"discrepancy-{lm.name}-{lm.device}-{lm.dtype}.json").write_text(json.dumps(result, indent=2))
    print(f"{'threads':>7} {'path':>7} {'n':>6} {'p50':>10} {'p99':>10} {'max':>10} {'min margin':>11}")
    for threads, row in result["by_threads"].items():
        for path in ("verify", "resume"):
            q = row[path]
            print(f"{threads:>7} {path:>7} {q['n']:>6} {q['p50']:>10.3g} {q['p99']:>10.3g} {q['max']:>10.3g} "
                  f"{row['min_margin']:>11.3g}")
    print(f"measured max {worst:.3g}; DRAFT_BOUNDS holds {bound}; "
          + ("bound >= 10 x measured max: OK" if result["bound_ok"] else "NOT within the bound's safety factor"))
    return 0 if result["bound_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
