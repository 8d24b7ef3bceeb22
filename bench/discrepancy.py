"""Measure the prefill-versus-decode logit discrepancy that bounds draft verification.

The measurement is impl/engines/hf/discrepancy.py's (``unsee calibrate`` runs the
same one): for each prompt a greedy turn decoded one token at a time is the
reference, and two paths compute the same positions' logits as draft replay
does: ``verify`` (one multi-token forward over the turn) and ``resume`` (a
prefill of the first half, then one-token decode steps on the KV it built).

It reports the distribution of max |logit_path - logit_decode| per position,
per thread count, the smallest top-2 margin seen, and checks the bound that
the shipped table of the configuration's attention holds for it (measured max x 10 <= bound).

    python -m unsee.bench.discrepancy --model smollm2 --out out/discrepancy
    python -m unsee.bench.discrepancy --model tiny --attn sdpa --prompts 20   (SDPA_DRAFT_BOUNDS)
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.bench import options
from unsee.impl.engines.bounds import SAFETY_FACTOR
from unsee.impl.engines.catalog import get_shipped_bound
from unsee.impl.engines.decoding import get_draft_bound
from unsee.impl.engines.files import get_cpu_isa
from unsee.impl.engines.hf import adapter
from unsee.impl.engines.hf.discrepancy import measure_discrepancy
from unsee.impl.engines.registry import load_model_for


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("discrepancy", __doc__)
    options.add_model(parser)
    options.add_device(parser)
    options.add_dtype(parser)
    parser.add_argument("--attn", default=None, help="the attention implementation (default: the device's)")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--threads", default="1,2")
    options.add_out(parser, "out/discrepancy")
    args = parser.parse_args(argv)
    lm = load_model_for("transformers", args.model, device=args.device, dtype=args.dtype, attn=args.attn)
    threads = [int(t) for t in args.threads.split(",")]
    with tqdm(total=args.prompts * len(threads), desc="prompts", unit="prompt") as bar:
        measured = measure_discrepancy(lm, args.prompts, args.tokens, threads, bar.update)
    measured.pop("margins")
    result = {"model": lm.name, "device": lm.device, "dtype": lm.dtype, "attn": lm.attn, "torch": torch.__version__,
              "transformers": adapter.TRANSFORMERS_VERSION, "machine": platform.machine(), **measured}
    worst = measured["measured_max"]
    bound = get_draft_bound(lm.name, lm.device, lm.dtype, lm.attn)  # the row of this attention
    shipped = get_shipped_bound(lm.name, lm.device, lm.dtype, lm.attn, isa=get_cpu_isa())
    if bound is None and shipped is not None:  # a catalogue model's, where measured on this CPU's sets
        bound = shipped[0]
    result.update(bound=bound, safety_factor=(bound / worst if bound and worst else None),
                  bound_ok=bound is not None and worst * SAFETY_FACTOR <= bound)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"discrepancy-{lm.name}-{lm.device}-{lm.dtype}-{lm.attn}.json").write_text(json.dumps(result, indent=2))
    print(f"{'threads':>7} {'path':>7} {'n':>6} {'p50':>10} {'p99':>10} {'max':>10} {'min margin':>11}")
    for count, row in result["by_threads"].items():
        for path in ("verify", "resume"):
            q = row[path]
            print(f"{count:>7} {path:>7} {q['n']:>6} {q['p50']:>10.3g} {q['p99']:>10.3g} {q['max']:>10.3g} "
                  f"{row['min_margin']:>11.3g}")
    print(f"measured max {worst:.3g}; the shipped bound of attn={lm.attn} (its row, or the catalogue's) is {bound}; "
          + ("bound >= 10 x measured max: OK" if result["bound_ok"] else "NOT within the bound's safety factor"))
    return 0 if result["bound_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
