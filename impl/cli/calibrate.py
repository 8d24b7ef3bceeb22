"""``unsee calibrate``: a draft-guard bound for any transformers configuration.

It measures the prefill-versus-decode logit discrepancy distribution on generated
text (impl/engines/hf/discrepancy.py, the measurement behind the shipped rows of
DRAFT_BOUNDS), takes ``SAFETY_FACTOR`` times its maximum (never less than one rounding
step of the dtype at the logits' scale) rounded up to a 1-2-5 step, and writes it to the
cache folder beside the model (engines/bounds.py). Engines built for that model, device,
dtype and attention then run drafts and context guesses under it, and the forget report
and the receipt name the file (docs/drafts.md, "Calibrated bounds").
"""

from __future__ import annotations

import argparse
import json
import platform

from unsee.impl.cli.options import ATTN_DEFAULT_HELP
from unsee.impl.util.progress import open_bar

# engines.bounds (and torch behind it) are imported where used: the parser imports this
# module, and `unsee --help` should not load torch.


def add_calibrate_parser(sub) -> argparse.ArgumentParser:
    """The ``calibrate`` subcommand's parser on ``sub`` (argparse subparsers)."""
    cal = sub.add_parser("calibrate", help="measure a draft-guard bound for a model, device, dtype and attention",
                         description=__doc__.splitlines()[0])
    cal.add_argument("--model", default="smollm2", help="smollm2, tiny, or a local checkpoint folder / .gguf file")
    cal.add_argument("--device", default="cpu", help="cpu or cuda")
    cal.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    cal.add_argument("--attn", default=None, help="unsee_eager, eager, sdpa, or flash_attention_2 on CUDA "
                                                  f"({ATTN_DEFAULT_HELP})")
    cal.add_argument("--prompts", type=int, default=20, help="greedy turns measured per thread count (default 20)")
    cal.add_argument("--tokens", type=int, default=60, help="tokens per turn (default 60)")
    cal.add_argument("--threads", default="1,2", help="torch thread counts measured, comma-separated (default 1,2)")
    cal.add_argument("--cache-dir", default=None, help="where the bound is written (default: $UNSEE_CACHE or "
                                                       "~/.cache/unsee, beside the model)")
    cal.add_argument("--json", action="store_true", help="machine-readable output")
    return cal


def parse_threads(text: str) -> list[int]:
    """``--threads``: positive ints, comma-separated; a ValueError naming the text otherwise."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--threads {text!r} is not a comma-separated list of positive thread counts")
    return counts


def check_calibrate_args(args: argparse.Namespace) -> list[int]:
    """Every option checked before a model loads; the thread counts."""
    if args.prompts < 1:
        raise ValueError(f"--prompts {args.prompts} must be at least 1")
    if args.tokens < 2:
        raise ValueError(f"--tokens {args.tokens} must be at least 2 (a verification needs a turn)")
    return parse_threads(args.threads)


def calibrate(args: argparse.Namespace, threads: list[int]) -> dict:
    """Measure and write the bound; the record written, with its path and the bound in force."""
    import torch

    from unsee.impl.engines.bounds import SAFETY_FACTOR, compute_bound, get_bound, get_key_of, write_calibration
    from unsee.impl.engines.hf.discrepancy import measure_discrepancy
    from unsee.impl.engines.hf.models import load_model

    lm = load_model(args.model, device=args.device, dtype=args.dtype, cache_dir=args.cache_dir, attn=args.attn)
    bar = open_bar(f"calibrate {lm.name} {lm.device} {lm.dtype} {lm.attn}", args.prompts * len(threads), "turn")
    try:
        measured = measure_discrepancy(lm, args.prompts, args.tokens, threads, lambda: bar.update(1))
    finally:
        bar.close()
    bound = compute_bound(measured["measured_max"], measured["resolution"])
    margins = measured.pop("margins")
    # how often a greedy decision would clear the threshold 2 x bound: what drafts can save
    clearing = sum(m > 2 * bound for m in margins) / len(margins)
    record = {"bound": bound, "decisions_clearing_threshold": round(clearing, 4), "measured_max": measured["measured_max"], "resolution": measured["resolution"],
              "safety_factor": SAFETY_FACTOR, "positions": measured["positions"], "prompts": args.prompts,
              "tokens": args.tokens, "threads": threads, "by_threads": measured["by_threads"],
              "method": "impl/engines/hf/discrepancy.py: verify and resume paths against one-token decode",
              "machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    key = get_key_of(lm)
    path = write_calibration(key, record, lm.info.get("cache_dir"))
    in_force, source = get_bound(key, lm.name, lm.info.get("cache_dir"))
    return {**record, "model": lm.name, "device": lm.device, "dtype": lm.dtype, "attn": lm.attn, "path": str(path),
            "in_force": in_force, "source": source}


def do_calibrate(args: argparse.Namespace) -> int:
    """``unsee calibrate``: measure, write, and say which bound is in force."""
    result = calibrate(args, check_calibrate_args(args))
    factor = result["safety_factor"]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"model    {result['model']} on {result['device']} {result['dtype']}, attention {result['attn']}")
    print(f"measured max |prefill - decode| {result['measured_max']:.3g} over {result['positions']} positions "
          f"(one rounding step at the logits' scale: {result['resolution']:.3g})")
    print(f"bound    {result['bound']:g} (>= {factor} x the larger), written to {result['path']}")
    print(f"margins  {result['decisions_clearing_threshold']:.1%} of the greedy decisions measured clear the "
          f"threshold 2 x {result['bound']:g} (a draft token is accepted only there)")
    print(f"in force {result['in_force']:g}, {result['source']}")
    return 0


__all__ = ["add_calibrate_parser", "calibrate", "check_calibrate_args", "do_calibrate", "parse_threads"]
