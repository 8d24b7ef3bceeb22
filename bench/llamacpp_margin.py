"""Would a margin guard make long verification forwards pay on llama.cpp?

Where a file's decode equals its prefill bitwise only for short forwards
(impl/engines/llamacpp/facts.py: Qwen2.5-Coder-1.5B Q4_K_M up to 3 tokens under
the default, repacked kernels), drafts could instead be verified in one long
forward, each decision taken on its logits accepted only when its top-1/top-2
margin clears twice a bound on |logit_forward - logit_decode| (as the
transformers engine does: impl/engines/decoding.py ``get_threshold``). This
script measures both sides of that trade on chat prompts:

* the discrepancy: after each prompt, greedy-decode ``--tokens`` tokens one
  step at a time (the reference), then, for each size L of ``--sizes``, crop
  the KV back to the prompt's end and feed the first L decoded tokens as one
  forward: max |logit difference| over the L positions, how many of their
  greedy decisions differ from the reference's, and the same for ``--after``
  decode steps on the KV that forward wrote (what a turn resumed after a
  partly accepted draft decides on);
* the acceptance: the reference's own top-1/top-2 margins, the share that
  clear ``2 x safety x measured max`` for each safety factor, and where in
  each answer the first decision that does not clear it falls (a draft is
  accepted only up to there; an unstable decision sends the turn back to
  decoding from its start, so a draft pays only when it is accepted whole).

    python -m unsee.bench.llamacpp_margin --model qwen2.5-1.5b --out out/llamacpp-margin.json
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from unsee.bench import options
from unsee.impl.agent.templates import compile_template
from unsee.impl.engines.decoding import get_scores, pick
from unsee.impl.engines.llamacpp.facts import forward
from unsee.impl.engines.llamacpp.model import llama_module
from unsee.impl.engines.registry import load_model_for

#: typical requests: short and long contexts (the long ones carry earlier notes in the system message)
QUESTIONS = (
    "Where is the party on Saturday, and what should I bring?",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarise the plot of Hamlet in three sentences.",
    "I'm planning a dinner for eight guests. Suggest a menu with a starter, a main course and a dessert.",
    "How long should I boil an egg for a soft yolk?",
    "Explain what a hash table is to a beginner.",
    "Draft a short message inviting my neighbours to a barbecue on Sunday.",
    "List three things to check before a long car trip.",
)
NOTES = ("Earlier notes: the guest list has Ana, Ben, Carla and Dev; the menu draft has soup, pasta and cake; "
         "the shopping list has flour, eggs, tomatoes, basil and cream. ") * 12
SAFETY = (1.0, 1.5, 2.0, 3.0)


def get_prompt(lm, render, i: int, question: str) -> list[int]:
    system = "You are a helpful assistant." + (" " + NOTES if i % 2 else "")
    return lm.encode(render([{"role": "system", "content": system}, {"role": "user", "content": question}], True))


def decide_all(rows: np.ndarray) -> list[tuple[int, float]]:
    return [pick(get_scores(torch.from_numpy(row), 0.0, None, 0)) for row in rows]


def measure_prompt(lm, lc, ctx, batch, prompt: list[int], tokens: int, sizes: list[int], after: int) -> dict:
    """One prompt's reference turn, and each size's forward against it."""
    mem = lc.llama_get_memory(ctx)
    lc.llama_memory_clear(mem, True)
    logits = forward(lc, ctx, batch, prompt, 0, False, lm.vocab_size)
    decoded, margins, steps = [], [], []
    for i in range(tokens + after):
        tok, margin = pick(get_scores(torch.from_numpy(logits), 0.0, None, i))
        decoded.append(tok)
        margins.append(margin)
        logits = forward(lc, ctx, batch, [tok], len(prompt) + i, False, lm.vocab_size)
        steps.append(logits)
    reference = np.stack(steps)
    ref_tokens = [t for t, _ in decide_all(reference)]
    per_size = {}
    for size in sizes:
        lc.llama_memory_seq_rm(mem, 0, len(prompt), -1)
        got = forward(lc, ctx, batch, decoded[:size], len(prompt), True, lm.vocab_size)
        rows_after = [forward(lc, ctx, batch, [decoded[j]], len(prompt) + j, False, lm.vocab_size)
                      for j in range(size, size + after)]
        got_after = np.stack(rows_after) if rows_after else np.zeros((0, lm.vocab_size), np.float32)
        per_size[size] = {
            "max_abs_diff": float(np.abs(got - reference[:size]).max()),
            "row_max_diffs": np.abs(got - reference[:size]).max(axis=1).tolist(),
            "flips": sum(t != r for (t, _), r in zip(decide_all(got), ref_tokens[:size])),
            "after_max_abs_diff": float(np.abs(got_after - reference[size:size + after]).max()) if after else 0.0,
            "after_flips": sum(t != r for (t, _), r in zip(decide_all(got_after), ref_tokens[size:size + after]))}
    return {"prompt_tokens": len(prompt), "answer": lm.decode(decoded[:tokens]), "margins": margins[:tokens],
            "sizes": per_size}


def summarise(prompts: list[dict], tokens: int) -> dict:
    """The measured maximum, and for each safety factor the share of decisions that clear the
    threshold and the first position in each answer that does not (position 0 is decided on the
    header's own logits, so it never needs to)."""
    worst = max(max(s["max_abs_diff"], s["after_max_abs_diff"]) for p in prompts for s in p["sizes"].values())
    rows = np.concatenate([s["row_max_diffs"] for p in prompts for s in p["sizes"].values()])
    margins = np.concatenate([p["margins"] for p in prompts])
    out = {"measured_max": worst, "positions": int(rows.size), "row_max_p50": float(np.median(rows)),
           "row_max_p99": float(np.percentile(rows, 99)), "decisions": int(margins.size),
           "margin_percentiles": {q: float(np.percentile(margins, q)) for q in (5, 10, 25, 50)},
           "flips": sum(s["flips"] + s["after_flips"] for p in prompts for s in p["sizes"].values()),
           "by_safety": {}}
    for safety in SAFETY:
        threshold = 2 * safety * worst
        first = []
        for p in prompts:
            unstable = [k for k, m in enumerate(p["margins"]) if k > 0 and m <= threshold]
            first.append(unstable[0] if unstable else tokens)
        out["by_safety"][safety] = {"threshold": threshold, "share_clear": float(np.mean(margins > threshold)),
                                    "first_unstable": first}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("llamacpp_margin", __doc__)
    options.add_model(parser)
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per answer (the reference)")
    parser.add_argument("--sizes", default="4,8,16,32,48,64", help="forward sizes compared")
    parser.add_argument("--after", type=int, default=8, help="decode steps compared after each forward")
    parser.add_argument("--prompts", type=int, default=len(QUESTIONS))
    options.add_out(parser, "out/llamacpp-margin.json")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if not sizes or sizes[0] < 2 or sizes[-1] > args.tokens:
        parser.error(f"--sizes {args.sizes!r}: each must be in 2..--tokens ({args.tokens})")
    lm = load_model_for("llamacpp", args.model)
    lc = llama_module()
    render = compile_template(lm.chat_template, lm.special_tokens)
    ctx = lm.new_context(2048)
    batch = lc.llama_batch_init(2048, 0, 1)
    started, prompts = time.process_time(), []
    try:
        for i, question in enumerate(QUESTIONS[:args.prompts]):
            prompts.append(measure_prompt(lm, lc, ctx, batch, get_prompt(lm, render, i, question), args.tokens,
                                          sizes, args.after))
            print(f"prompt {i}: {prompts[-1]['prompt_tokens']} tokens, max diff "
                  f"{max(s['max_abs_diff'] for s in prompts[-1]['sizes'].values()):.3f}", flush=True)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    summary = summarise(prompts, args.tokens)
    record = {"model": args.model, "file": os.path.basename(lm.source), "threads": lm.threads,
              "flash_attn": lm.flash_attn, "llama_cpp_python": lm.info.get("llama_cpp_python"),
              "max_forward": lm.max_forward, "cpu": platform.processor() or platform.machine(),
              "cpu_s": time.process_time() - started, "sizes": sizes, "summary": summary, "prompts": prompts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "prompts"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
