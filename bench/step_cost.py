"""What stepping a long session costs, and how much of it is the runtime's own
bookkeeping (issue 28: the state as a persistent value must not slow a step).

Runs bench/memory.py's session (a compaction every ``every`` steps, a
checkpoint every turn) ``repeats`` times on fresh engines over one model and
reports, per run, the wall and CPU time of ``run`` (one thread: the CPU
time is what a loaded machine disturbs least) and the part of the wall time
outside every engine verb and forward (:func:`~unsee.bench.timing.time_engine`'s
``runtime``: the state, the graph, the checkpoints, rendering). The lead's
command (one thread, tiny model)::

    OMP_NUM_THREADS=1 .venv/bin/python -m unsee.bench.step_cost --model tiny --steps 200 --repeats 5
"""

from __future__ import annotations

import json
import time

import torch

from unsee.bench import options
from unsee.bench.memory import make_compaction_episode
from unsee.bench.timing import time_engine
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import load_model_for, make_engine


def time_session(lm, steps: int, every: int) -> dict:
    """One run of the session on a fresh engine: wall and runtime-side seconds."""
    episode = make_compaction_episode(steps, every)
    engine = make_engine(lm)
    runtime = AgentRuntime.start(engine, episode.system, episode.settings)
    with time_engine(engine) as breakdown:
        started, cpu = time.perf_counter(), time.process_time()
        runtime.run(episode.steps)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"run_s": wall, "cpu_s": cpu, "runtime_s": breakdown.seconds["runtime"], "blocks": len(runtime.graph),
            "checkpoints": len(runtime.checkpoints), "digest": runtime.digest()}


def main(argv: list[str] | None = None) -> None:
    parser = options.get_parser("step_cost", __doc__)
    options.add_model(parser)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_model_for("transformers", args.model)
    runs = [time_session(lm, args.steps, args.every) for _ in range(args.repeats)]
    print(json.dumps({key: min(r[key] for r in runs) for key in ("run_s", "cpu_s", "runtime_s")} | {"runs": runs},
                     indent=1))


if __name__ == "__main__":
    main()
