"""Forget against full reset on each zoo family (impl/engines/hf/zoo.py), on
one episode far longer than the zoo's 8-token windows: tokens prefilled and
decoded, forwards and wall time of each, and whether they agree (digest and
every generated token).

    python -m unsee.bench.zoo_forget
"""

from __future__ import annotations

import time

import torch

from unsee.bench import options
from unsee.impl.agent.episode import parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.hf import zoo
from unsee.impl.engines.registry import load_engine

EPISODE = {
    "format": "unsee.episode", "version": 1, "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 16, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [{"id": "t1", "kind": "user", "text": "Plan a three-day walk along the coast, with stops."},
              {"id": "t2", "kind": "tool", "fields": [{"source": "secret", "text": "Ana lives at 4417 Elm Street."}]},
              {"id": "t3", "kind": "user", "text": "List what to pack."},
              {"id": "t4", "kind": "user", "text": "Which stop has the best view?"},
              {"id": "t5", "kind": "user", "text": "Summarise the plan."}],
    "target": {"source": "secret", "value": "Ana lives at 4417 Elm Street."}}


def measure(name: str, drafts: bool) -> dict:
    """One run, then forget (with or without drafts) on one fork and full reset on another."""
    engine = load_engine(name)
    episode = parse_episode(EPISODE)
    original = AgentRuntime.start(engine, episode.system, episode.settings)
    original.run(episode.steps)
    other = original.fork()
    t0 = time.perf_counter()
    forget = original.forget("secret", drafts=drafts)
    forget_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reset = other.full_reset("secret")
    reset_s = time.perf_counter() - t0
    same = forget.digest == reset.digest and original.generated_tokens() == other.generated_tokens()
    return {"family": name, "tokens": len(engine.tokens(other.lineage)), "equal": same, "forget": forget, "reset": reset,
            "forget_s": forget_s, "reset_s": reset_s}


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("zoo_forget", __doc__)
    parser.add_argument("--families", default=",".join(zoo.ZOO_NAMES))
    options.add_threads(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{'family':<14} {'tokens':>6} {'equal':>5}  {'forget pre/dec/fwd':>18} {'reset pre/dec/fwd':>18} "
          f"{'forget s':>8} {'reset s':>8} {'ratio':>6}")
    ok = True
    for name in args.families.split(","):
        r = measure(name, drafts=True)
        f, z = r["forget"], r["reset"]
        ok &= r["equal"]
        print(f"{name:<14} {r['tokens']:>6} {r['equal']!s:>5}  "
              f"{f'{f.prefilled_tokens}/{f.decoded_tokens}/{f.forward_calls}':>18} "
              f"{f'{z.prefilled_tokens}/{z.decoded_tokens}/{z.forward_calls}':>18} "
              f"{r['forget_s']:>8.3f} {r['reset_s']:>8.3f} {r['forget_s'] / r['reset_s']:>6.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
