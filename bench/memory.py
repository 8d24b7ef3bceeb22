"""Memory held against session length, with and without a KV budget (issue 8, item 6).

A long session compacts every few steps, and every compaction opens a new
cache lineage. Without a budget every old lineage stays in memory for as
long as a checkpoint names it, so memory grows with everything the agent
ever said although the live context stays small. With a budget the engine
evicts the least recently used lineages that no live runtime extends, and a
forget that needs one rebuilds it from the checkpoint's manifest.

``run_memory_bench`` runs the session twice on the same model, without a
budget and with a budget of ``factor`` x the live cache's bytes (measured
by a short pilot run), samples :meth:`engine.budget.memory() <unsee.impl.engines.protocol.KVBudget.memory>` after every step,
then forgets the secret (entered at step 2) on the budgeted session and
checks the result against the full reset. The lead's command::

    .venv/bin/python -m unsee.bench.memory --model tiny --steps 200 --every 5 \\
        --out bench/results/memory.json --plot docs/img/memory.png
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from unsee.bench import options
from unsee.impl.agent.episode import Episode, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import load_model_for, make_engine

SECRET = "4417 Elm Street"
_USER = ("What should I buy for dinner?", "Remind me of the guest list.", "Which wine goes with fish?",
         "How long does the tart bake?", "Is Saturday still fine?", "Any idea for music?")


def make_compaction_episode(steps: int = 200, every: int = 5, max_new_tokens: int = 4) -> Episode:
    """``steps`` steps: a tool result with the secret at step 2, a compaction
    every ``every`` steps, user turns otherwise; checkpoints every turn."""
    if steps < 2 or every < 2:
        raise ValueError(f"steps={steps} and every={every} must both be >= 2")
    raw = []
    for t in range(1, steps + 1):
        if t == 2:
            raw.append({"id": f"s{t}", "kind": "tool", "tool": "fetch_notes",
                        "fields": [{"source": "notes.address", "text": f"The party is at {SECRET}."},
                                   {"source": "notes.menu", "text": "Menu: cod, pear tart."}]})
        elif t % every == 0:
            raw.append({"id": f"s{t}", "kind": "compact"})
        else:
            raw.append({"id": f"s{t}", "kind": "user", "text": f"{_USER[t % len(_USER)]} ({t})"})
    return parse_episode({"format": "unsee.episode", "version": 1,
                          "system": "You are a helpful assistant. Answer in one short sentence.",
                          "settings": {"max_new_tokens": max_new_tokens, "checkpoint_policy": "every_turn"},
                          "steps": raw, "target": {"source": "notes.address", "value": SECRET}})


def run_session(engine: Engine, episode: Episode) -> tuple[AgentRuntime, list[dict]]:
    """Run the episode, sampling the engine's memory after every step."""
    samples: list[dict] = []

    def sample(done: int, total: int) -> None:
        samples.append({"T": done, **engine.budget.memory().to_json()})

    runtime = AgentRuntime.start(engine, episode.system, episode.settings)
    runtime.run(episode.steps, sample)
    return runtime, samples


def get_live_bytes(lm, episode: Episode, steps: int = 20) -> int:
    """The live cache's bytes: the most a pilot run of the first ``steps``
    steps (several compaction cycles) holds in live lineages."""
    pilot = parse_episode({**episode.to_json(), "steps": episode.to_json()["steps"][:steps]})
    _, samples = run_session(make_engine(lm), pilot)
    return max(s["live_bytes"] for s in samples)


def run_memory_bench(model: str = "tiny", steps: int = 200, every: int = 5, factor: float = 4.0,
                     max_new_tokens: int = 4, threads: int = 1, check_forget: bool = True) -> dict:
    torch.set_num_threads(threads)
    lm = load_model_for("transformers", model)  # one model, three engines over it
    episode = make_compaction_episode(steps, every, max_new_tokens)
    live = get_live_bytes(lm, episode)
    budget = int(factor * live)
    _, unbounded = run_session(make_engine(lm), episode)
    engine = make_engine(lm, kv_budget=budget)
    runtime, bounded = run_session(engine, episode)
    out = {"model": lm.name, "steps": steps, "every": every, "max_new_tokens": max_new_tokens,
           "live_bytes": live, "factor": factor, "budget": budget,
           "without_budget": unbounded, "with_budget": bounded,
           "max_unpinned_bytes_with_budget": max(s["unpinned_bytes"] for s in bounded),
           "peak_unpinned_bytes_with_budget": engine.budget.peak_unpinned_bytes}
    if check_forget:
        twin = runtime.fork()
        forget = runtime.forget(episode.target.source)
        reset = twin.full_reset(episode.target.source)
        out["forget"] = {"digest": forget.digest, "reset_digest": reset.digest,
                         "equals_reset": forget.digest == reset.digest
                         and runtime.generated_tokens() == twin.generated_tokens(),
                         "rebuilt_tokens": forget.rebuilt_tokens, "prefilled_tokens": forget.prefilled_tokens,
                         "decoded_tokens": forget.decoded_tokens, "invocations": forget.invocations,
                         "peak_unpinned_bytes": engine.budget.peak_unpinned_bytes}
    return out


def format_table(result: dict, every_n: int = 40) -> str:
    lines = [f"memory held on {result['model']}: {result['steps']} steps, a compaction every {result['every']}; "
             f"budget {result['factor']:g} x live ({result['live_bytes']} B) = {result['budget']} B",
             f"{'T':>5}{'held, no budget':>18}{'lineages':>10}{'held, budget':>15}{'unpinned':>10}"
             f"{'lineages':>10}{'evicted':>9}"]
    for a, b in zip(result["without_budget"], result["with_budget"]):
        if a["T"] % every_n == 0 or a["T"] in (1, result["steps"]):
            lines.append(f"{a['T']:>5}{a['held_bytes']:>18}{a['lineages']:>10}{b['held_bytes']:>15}"
                         f"{b['unpinned_bytes']:>10}{b['lineages']:>10}{b['evicted_lineages']:>9}")
    if "forget" in result:
        f = result["forget"]
        lines.append(f"forget under the budget equals the reset: {f['equals_reset']} "
                     f"({f['rebuilt_tokens']} tokens prefilled to rebuild evicted lineages)")
    return "\n".join(lines)


def plot(result: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("without_budget", "held, no budget"), ("with_budget", "held, with budget")):
        ax.plot([s["T"] for s in result[key]], [s["held_bytes"] / 1024 for s in result[key]], label=label)
    ax.plot([s["T"] for s in result["with_budget"]], [s["unpinned_bytes"] / 1024 for s in result["with_budget"]],
            label="unpinned (what the budget bounds)")
    ax.plot([s["T"] for s in result["with_budget"]], [s["live_bytes"] / 1024 for s in result["with_budget"]],
            label="live lineages", linestyle=":")
    ax.axhline(result["budget"] / 1024, color="grey", linestyle="--", label=f"budget ({result['factor']:g}x live)")
    ax.set_xlabel("T (steps)")
    ax.set_ylabel("KV held (KiB)")
    ax.set_title(f"{result['model']}: a compaction every {result['every']} steps")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = options.get_parser("memory", __doc__)
    options.add_model(parser)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--factor", type=float, default=4.0, help="budget = factor x the live cache's bytes")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    options.add_threads(parser)
    options.add_out(parser, help="write the JSON here")
    parser.add_argument("--plot", default=None, help="write a PNG of memory against T here")
    args = parser.parse_args(argv)
    result = run_memory_bench(args.model, args.steps, args.every, args.factor, args.max_new_tokens, args.threads)
    result["command"] = "python -m unsee.bench.memory " + " ".join(argv or [])
    print(format_table(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
