"""How far vLLM's logits after a prefix-cache hit move from the cold run's.

For each prefix length L: a request over a random prompt's first L + 7 tokens
fills the cache under one salt; a second request (the prompt's L + 40
tokens, under the same salt) hits the cached blocks (L rounded down to the
block size) and decodes ``--steps`` tokens greedily, all logits returned. Each
of its positions is compared with the cold run of the same tokens (one
request with ``skip_reading_prefix_cache``): max |hit - cold| over the
vocabulary. The same turn under a fresh salt (no hit: decode steps alone)
is measured beside it. The bound the vLLM engine uses
(``impl/engines/vllm/engine.py``, ``RESTORE_BOUNDS``) is at least 10 times the
largest value seen.

    python -m unsee.bench.vllm_restore --engine vllm-tiny --lengths 128 256 512 1024 2048 --prompts 3 --steps 16
    python -m unsee.bench.vllm_restore --engine vllm-tiny-ties --lengths 128 512 1024 2048 --prompts 3 --steps 16
    python -m unsee.bench.vllm_restore --engine vllm --lengths 128 256 384 512 768 1024 --prompts 4 --steps 24
"""

from __future__ import annotations

import json
import random
import statistics

from unsee.bench import options
from unsee.impl.engines.registry import load_engine
from unsee.impl.util.progress import open_bar


def measure_turn(engine, prompt: list[int], warm: int | None, steps: int,
                 colds: dict | None = None) -> tuple[list[float], int]:
    """Per decoded position, max |served - cold| logits; and the tokens the cache served.
    ``colds`` keeps the cold runs' logits by tokens, so the turn with a hit and the one
    without share their cold runs (cold runs repeat bitwise: the engine's own premise)."""
    colds = {} if colds is None else colds
    salt = f"bench-{random.getrandbits(48):x}"
    if warm is not None:
        engine.request(salt, prompt[:warm], 1, 1)
    served = engine.request(salt, prompt, steps, -1)
    out, diffs = [], []
    for token, logits in zip(served.ids, served.logits):
        key = tuple(prompt + out)
        if key not in colds:
            colds[key] = engine.cold_logits(salt, prompt + out)
        cold = colds[key]
        diffs.append(float((engine.dense(logits) - cold).abs().max()))
        out.append(token)
    return diffs, served.cached_tokens


def summarize(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"n": len(ordered), "max": ordered[-1], "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "median": statistics.median(ordered), "zero": sum(v == 0 for v in ordered)}


def main(argv=None) -> dict:
    parser = options.get_parser("vllm_restore", __doc__)
    options.add_vllm_engine(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    options.add_out(parser)
    args = parser.parse_args(argv)
    engine = load_engine(args.engine)
    rng = random.Random(0)
    rows = []
    bar = open_bar("prefix lengths", len(args.lengths), "length")
    for length in args.lengths:
        hit, plain, cached = [], [], []
        for _ in range(args.prompts):
            prompt = [rng.randrange(3, engine.lm.vocab_size) for _ in range(length + 40)]
            colds: dict = {}
            diffs, served = measure_turn(engine, prompt, length + 7, args.steps, colds)
            hit += diffs
            cached.append(served)
            plain += measure_turn(engine, prompt, None, args.steps, colds)[0]
        rows.append({"prefix": length, "cached_tokens": cached, "hit": summarize(hit), "no_hit": summarize(plain)})
        write_report(args, engine, rows)  # after each length, so a long run that is stopped keeps what it measured
        bar.update(1)
    bar.close()
    report = write_report(args, engine, rows)
    print(json.dumps(report, indent=1))
    return report


def write_report(args, engine, rows: list[dict]) -> dict:
    """The report of the rows so far (written to ``--out`` if given)."""
    report = {"engine": args.engine, "block_size": engine.lm.block_size, "steps": args.steps,
              "prompts": args.prompts, "rows": rows,
              "positions": sum(r["hit"]["n"] + r["no_hit"]["n"] for r in rows),
              "max": max(max(r["hit"]["max"], r["no_hit"]["max"]) for r in rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
