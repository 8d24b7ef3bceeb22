"""Which model turns a forget changes on Table 1's paper-shape episode: one
run of the contaminated session and one full reset, each turn's answer before
and after, SAME or DIFF.

    python -m unsee.bench.changed_turns --engine llamacpp --history-kind memory --tau 3

A quick look (two runs, no rounds) at whether an episode is honest for Table 1:
a forget whose later turns do not change replays nothing but prefill.
"""

from __future__ import annotations

import sys

from unsee.bench import options
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import load_engine
from unsee.impl.methods.baselines import apply_method
from unsee.impl.util.ids import ANSWER, compute_block_id

from .episodes import HISTORY_KINDS, make_indep_episode


def get_turns(engine, tau: int, history_tokens: int, history_kind: str, max_new_tokens: int) -> list[dict]:
    """Each step's answer before the forget and after (the full reset's)."""
    episode = make_indep_episode(0.5, 12, tau, max_new_tokens, history_tokens=history_tokens,
                                 count_tokens=lambda text: len(engine.lm.encode(text)), history_kind=history_kind)
    base = AgentRuntime.from_episode(engine, episode)
    reset, _ = apply_method(base, "reset", episode.target.source)
    before = {b.id: b.text for b in base.graph.blocks()}
    after = {b.id: b.text for b in reset.graph.blocks()}
    tau = next(t for t, s in enumerate(episode.steps, start=1) if episode.target.source in {i.source for i in s.items})
    return [{"step": s.id, "kind": s.kind, "independent": s.independent, "from_target": t >= tau,
             "before": before[compute_block_id(s.id, ANSWER)], "after": after.get(compute_block_id(s.id, ANSWER))}
            for t, s in enumerate(episode.steps, start=1) if compute_block_id(s.id, ANSWER) in before]


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("changed_turns", __doc__)
    options.add_engine(parser)
    parser.add_argument("--tau", type=int, default=3)
    parser.add_argument("--history-tokens", type=int, default=1000)
    parser.add_argument("--history-kind", default="memory", choices=HISTORY_KINDS)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    turns = get_turns(load_engine(args.engine), args.tau, args.history_tokens, args.history_kind,
                      args.max_new_tokens)
    for t in turns:
        same = "SAME" if t["before"] == t["after"] else "DIFF"
        print(f"{t['step']:>4} {'I' if t['independent'] else ' '} {same} {t['before'][:70]!r} -> "
              f"{(t['after'] or '')[:50]!r}")
    late = [t for t in turns if t["from_target"]]
    print(f"{sum(t['before'] != t['after'] for t in late)} of the {len(late)} turns from the target on changed "
          f"({sum(t['before'] != t['after'] for t in turns)} of all {len(turns)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
