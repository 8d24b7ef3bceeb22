"""The differential report: the same episodes on transformers fp32 and on
vLLM fp32, from the same weights. How often do the model turns' tokens
agree, and where do they first differ?

    python -m unsee.bench.vllm_differential --engine vllm-tiny --episodes 12
    python -m unsee.bench.vllm_differential --engine vllm --episodes 6

``vllm-tiny`` is compared with the same random Llama built in transformers
(:data:`unsee.impl.engines.vllm.models.TINY_MODELS`, seed 0: the weights the
vLLM folder holds); ``vllm`` with ``smollm2`` (the same dequantised folder).
The episodes are the bench's (bench/episodes.py, ``make_bench_episode``): the
target at tau = 1..N of N-step episodes (a tool result, a memory note, a
compaction), decoded greedily, then forgotten on both engines.
"""

from __future__ import annotations

import json
import sys

from unsee.bench import options
from unsee.impl.conform.adapters import get_turns
from unsee.impl.engines.registry import load_engine, make_engine
from unsee.properties.differential import run_episode

from .episodes import make_bench_episode


def load_transformers_twin(name: str):
    """The transformers engine over the weights of the vLLM engine ``name``."""
    if name == "vllm":
        return load_engine("smollm2")
    import torch

    from unsee.impl.engines.files import ByteTokenizer
    from unsee.impl.engines.hf import adapter
    from unsee.impl.engines.hf.models import LoadedModel
    from unsee.impl.engines.vllm.models import TINY_MODELS

    tok = ByteTokenizer()
    model = adapter.build_tiny_llama(vocab_size=tok.vocab_size, bos_token_id=tok.bos_token_id,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                     **TINY_MODELS[name.removeprefix("vllm-")])
    model = adapter.place(model, "cpu", torch.float32)
    return make_engine(LoadedModel(model=model, tokenizer=tok, name=name, device="cpu", dtype="float32",
                                   eos_ids=(tok.eos_token_id,), vocab_size=adapter.vocab_size_of(model),
                                   determinism_statement="cpu float32 (the differential twin)"))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter's length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(engines: dict, episode) -> dict:
    """Run, then forget the target, on both engines: per model turn, equal or where it first differs."""
    turns = {}
    for name, engine in engines.items():
        runtime = run_episode(engine, episode)
        before = get_turns(runtime)
        runtime.forget(episode.target.source)
        turns[name] = {"run": before, "forget": get_turns(runtime)}
    ta, tb = turns.values()
    rows = []
    for phase in ("run", "forget"):
        for block in ta[phase]:
            where = first_difference(ta[phase][block], tb[phase].get(block, []))
            rows.append({"phase": phase, "turn": block, "tokens": len(ta[phase][block]), "first_difference": where})
    return {"turns": len(rows), "equal": sum(r["first_difference"] is None for r in rows),
            "differences": [r for r in rows if r["first_difference"] is not None]}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("vllm_differential", __doc__)
    options.add_vllm_engine(parser, choices=("vllm-tiny", "vllm"))
    parser.add_argument("--episodes", type=int, default=12, help="N: the target at tau = 1..N of N-step episodes")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    options.add_out(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    engines = {"transformers": load_transformers_twin(args.engine), args.engine: load_engine(args.engine)}
    results = []
    for tau in range(1, args.episodes + 1):
        episode = make_bench_episode(tau, length=args.episodes, max_new_tokens=args.max_new_tokens)
        results.append({"tau": tau, **compare(engines, episode)})
    turns, equal = sum(r["turns"] for r in results), sum(r["equal"] for r in results)
    report = {"engine": args.engine, "episodes": len(results), "turns": turns, "equal_turns": equal,
              "episodes_all_equal": sum(r["equal"] == r["turns"] for r in results), "results": results}
    print(json.dumps({k: v for k, v in report.items() if k != "results"}, indent=1))
    for r in results:
        for d in r["differences"][:3]:
            print(f"tau={r['tau']} {d['phase']} {d['turn']}: first differs at token {d['first_difference']} "
                  f"of {d['tokens']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
