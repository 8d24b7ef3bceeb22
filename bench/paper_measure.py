"""Measuring the methods of bench/paper.py on one episode: every method on a
fork of one contaminated session, ``--rounds`` rounds, paired with the
compute floor (:mod:`unsee.bench.floor`) of each round, and the costs and
ratios a table reports."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

from unsee.impl.agent.episode import Episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine, Residue
from unsee.impl.methods.baselines import METHODS, apply_method

from .floor import compute_floor, get_excess
from .timing import time_engine

#: Table 1's methods: B5, B5', the paper's B7 (attribution oracle), our B7 (verified drafts).
TABLE1_METHODS = ("reset", "reset-prefix-cache", "replay-oracle", "replay")
LABELS = {"reset": "B5 full reset", "reset-prefix-cache": "B5' + prefix cache",
          "replay-oracle": "B7-oracle (paper's B7)", "replay": "B7 replay (ours)"}
#: Methods that must reach the full reset's digest (B7-oracle need not: its labels may be wrong).
EXACT_METHODS = ("reset", "reset-prefix-cache", "replay")
#: Cost fields of MethodResult; the draft and reuse counters arrive with the
#: lead's verified-draft replay and prefix cache (0 until then).
COST_FIELDS = ("invocations", "prefilled_tokens", "decoded_tokens", "recomputed_tokens")
OPTIONAL_FIELDS = ("draft_accepted_tokens", "draft_rejected_tokens", "reused_tokens")


def get_methods(wanted: Sequence[str], notes: list[str]) -> list[str]:
    """The methods of ``wanted`` that this build has; a note for each one it has not."""
    out = []
    for method in wanted:
        if method in METHODS:
            out.append(method)
        else:
            note = f"skipped {method!r}: not a method of this build (impl/methods/baselines.py METHODS)"
            if note not in notes:
                notes.append(note)
                print(f"note: {note}", file=sys.stderr)
    return out


def is_serving_engine(engine: Engine) -> bool:
    """Whether ``engine`` serves requests from one prefix cache that all its
    lineages share (vLLM: blocks under the session's salt, dropped by
    ``release_prefix_cache``). Measured alike on forks of one session, one
    method's run would serve the next's (a forget's replay hits the blocks the
    oracle's replay left under the session's salt: on vllm-tiny one block of
    128 tokens, prefilled once and served to the other), and one round would
    serve the next; so every method run there gets a session of its own, the
    cache released first. Its prefill computes nothing until a request, so the
    compute floor's raw run (bench/floor.py: prefill and crop only) would time
    nothing: no floor is measured there."""
    return isinstance(engine, Residue)


def new_session(engine: Engine, episode: Episode, keep: set[str]) -> AgentRuntime:
    """``episode`` run on a session of its own: every lineage not in ``keep``
    dropped and, on a serving engine, its prefix cache released first, so
    nothing an earlier run cached can serve this one."""
    _drop_new(engine, keep)
    if is_serving_engine(engine):
        engine.release_prefix_cache()
    return AgentRuntime.from_episode(engine, episode)


def run_rounds(engine: Engine, episode: Episode, methods: Sequence[str], rounds: int, floor: bool,
               keep: set[str]) -> tuple[AgentRuntime, dict[str, list[dict]], list[dict]]:
    """Every method ``rounds`` times, each run a fork of one session of
    ``episode`` (on a serving engine, :func:`is_serving_engine`, a session of
    its own), and the compute floor once per round: ``(the last session, the
    rows per method, the floors)``."""
    serving = is_serving_engine(engine)
    base, used = new_session(engine, episode, keep), False
    source = episode.target.source
    boundary = base.checkpoints.latest_before(base.graph.first_entry(source)).boundary
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    floors: list[dict] = []
    for _ in range(rounds):
        for method in methods:
            if serving and used:
                base = new_session(engine, episode, keep)
            used, kept = True, set(engine.budget.lineages)
            cpu_started = time.process_time()
            runtime, result = apply_method(base, method, source)
            # the model work on a loaded machine, the process's: the engine's loop thread runs the forwards;
            # it includes the fork, a copy-on-write share that costs microseconds
            cpu = time.process_time() - cpu_started
            row = {k: getattr(result, k) for k in COST_FIELDS}
            row.update({k: getattr(result, k, 0) for k in OPTIONAL_FIELDS})
            row.update(wall_s=result.wall_s, cpu_s=cpu, digest=result.digest,
                       boundary=result.report.boundary if result.report else None,
                       draft_turns=result.report.drafts.to_json().get("turns", []) if result.report else [])
            runs[method].append(row)
            if floor and method == "reset" and len(floors) < rounds:
                floors.append(compute_floor(engine, base, runtime, boundary).to_json())
            _drop_new(engine, kept)
        if floor and "reset" not in methods:
            kept = set(engine.budget.lineages)
            runtime, _ = apply_method(base, "reset", source)
            floors.append(compute_floor(engine, base, runtime, boundary).to_json())
            _drop_new(engine, kept)
    return base, runs, floors


def measure_episode(engine: Engine, episode: Episode, methods: Sequence[str], rounds: int,
                    floor: bool = True, profile: Sequence[str] = ()) -> dict:
    """Run ``episode`` once, then every method ``rounds`` times on forks of it
    (and the compute floor once per round; :func:`run_rounds`). Every cache
    made here is dropped. Each method of ``profile`` then runs once more under
    :func:`bench.timing.time_engine` (outside the timed rounds): where its
    time goes, in ``breakdown``."""
    before = set(engine.budget.lineages)
    floor = floor and not is_serving_engine(engine)
    try:
        base, runs, floors = run_rounds(engine, episode, methods, rounds, floor, before)
        source = episode.target.source
        tau = base.graph.first_entry(source)
        boundary = base.checkpoints.latest_before(tau).boundary
        # the tokens every exact forget keeps (under every_turn: the whole history before the target)
        prefix = base.checkpoints.latest_before(tau).token_offset
        out = {"T": len(episode.steps), "tau": tau, "boundary": boundary,
               "policy": episode.settings.checkpoint_policy, "prefix_tokens": prefix,
               "suffix_tokens": len(engine.tokens(base.lineage)) - prefix, "methods": {}}
        breakdowns = {m: get_breakdown(engine, base if not is_serving_engine(engine)
                                       else new_session(engine, episode, before), m, source)
                      for m in profile if m in runs}
        reset_digest = runs["reset"][0]["digest"] if "reset" in runs else None
        for method, rows in runs.items():
            out["methods"][method] = summarise(rows, reset_digest)
            if method in breakdowns:
                out["methods"][method]["breakdown"] = breakdowns[method]
        if floors:
            add_floor(out, floors, episode)
        return out
    finally:
        _drop_new(engine, before)


def add_floor(out: dict, floors: list[dict], episode: Episode) -> None:
    """The compute floor's counts and walls into ``out`` (a row of
    :func:`measure_episode`), the turns it changed, and every method's ratio
    to it."""
    out["floor"] = {k: floors[0][k] for k in ("prefilled", "decoded", "recomputed", "forwards", "blocks")}
    out["floor"]["wall_p50_s"] = statistics.median(f["wall_s"] for f in floors)
    out["floor"]["wall_s"] = [f["wall_s"] for f in floors]
    out["floor"]["cpu_p50_s"] = statistics.median(f["cpu_s"] for f in floors)
    out["floor"]["cpu_s"] = [f["cpu_s"] for f in floors]
    out["floor"]["changed_turns"] = len(floors[0]["changed_turns"])
    out["floor"]["changed"] = get_changed_turns(episode, floors[0], out["boundary"])
    for row in out["methods"].values():
        row["excess"] = get_excess(row["draft_turns"], floors[0]) if row["draft_turns"] else []
        row["x_floor_wall"] = row["wall_p50_s"] / out["floor"]["wall_p50_s"]
        row["x_floor_paired"] = get_paired_ratio(row["wall_s"], out["floor"]["wall_s"])
        row["x_floor_cpu"] = row["cpu_p50_s"] / out["floor"]["cpu_p50_s"]
        row["x_floor_recomputed"] = row["recomputed_tokens"] / max(out["floor"]["recomputed"], 1)


def get_breakdown(engine: Engine, base: AgentRuntime, method: str, source: str) -> dict:
    """One more run of ``method`` under :func:`bench.timing.time_engine`: its
    seconds, forwards and tokens per category."""
    kept = set(engine.budget.lineages)
    try:
        with time_engine(engine) as breakdown:
            apply_method(base, method, source)
        return breakdown.to_json()
    finally:
        _drop_new(engine, kept)


def get_changed_turns(episode: Episode, floor: dict, boundary: int) -> dict:
    """How many model turns after the restore boundary the forget changes
    (the floor's changed turns), of all such turns, split by the episode's
    ``independent`` label: a forget that changes none replays nothing but
    prefill, which flatters it."""
    labels = {step.id: step.independent for step in episode.steps}
    changed = [t["block_id"].split("/")[0] for t in floor["changed_turns"]]
    turns = [step.id for step in episode.steps[boundary:]]
    return {"turns": len(turns), "changed": len(changed),
            "dependent_changed": sum(not labels.get(c, False) for c in changed),
            "dependent": sum(not labels[t] for t in turns),
            "independent_changed": sum(labels.get(c, False) for c in changed),
            "ids": changed}


def get_paired_ratio(walls: Sequence[float], floor_walls: Sequence[float]) -> float:
    """The median over rounds of (method wall / floor wall) in the same round.
    The two run seconds apart, so a machine whose speed drifts between rounds
    (this one's did by 30% within one run, CPU time with it) moves both
    alike; a ratio of p50s taken over different rounds does not cancel it."""
    return statistics.median(w / f for w, f in zip(walls, floor_walls, strict=True))


def summarise(rows: list[dict], reset_digest: str | None) -> dict:
    """One method's rounds: costs of the first round (token counts do not vary
    between rounds; checked), wall p50, the draft acceptance rate, and whether
    every round reached the full reset's digest."""
    first = rows[0]
    for row in rows[1:]:
        if any(row[k] != first[k] for k in COST_FIELDS + OPTIONAL_FIELDS):
            raise AssertionError(f"token counts differ between rounds: {first} vs {row}")
    out = {k: first[k] for k in COST_FIELDS + OPTIONAL_FIELDS + ("boundary", "draft_turns")}
    walls = [r["wall_s"] for r in rows]
    out.update(wall_p50_s=statistics.median(walls), wall_s=walls)
    cpus = [r["cpu_s"] for r in rows]
    out.update(cpu_p50_s=statistics.median(cpus), cpu_s=cpus)
    drafted = first["draft_accepted_tokens"] + first["draft_rejected_tokens"]
    out["draft_acceptance"] = first["draft_accepted_tokens"] / drafted if drafted else None
    out["equal_to_reset"] = None if reset_digest is None else all(r["digest"] == reset_digest for r in rows)
    out["digest"] = first["digest"]
    return out


def _drop_new(engine: Engine, kept: set[str]) -> None:
    for lineage in engine.budget.lineages:
        if lineage not in kept:
            engine.drop(lineage)
