"""The paper's efficiency results, reproduced: Table 1, the tau sweep, the
indep sweep, checkpoint granularity and target position (issue 8, item 4).

    python -m unsee.bench.paper --model smollm2 --device cpu --dtype float32 --rounds 3 --out out/paper
    python -m unsee.bench.paper --model smollm2 --device cuda --dtype bfloat16 --rounds 3 --out out/paper-gpu

Writes ``paper.json`` (every row), one PNG per table and ``paper.md``, a
markdown fragment with each table, the command that made it and the paper's
numbers beside ours. Every method runs on a fork of one contaminated session
per episode (:func:`unsee.impl.methods.baselines.apply_method`), so rows are paired;
wall times are medians (p50) over ``--rounds`` rounds. The compute floor
(:mod:`unsee.bench.floor`) is measured once per round from the full reset's
counterfactual and the forget's restore boundary. Methods this build does
not have (``METHODS`` in impl/methods/baselines.py) are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from unsee.bench import options
from unsee.impl.agent.episode import CHECKPOINT_POLICIES, Episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.cli.options import check_vllm_scale_out
from unsee.impl.engines import registry
from unsee.impl.engines.protocol import Engine, MarginGuard, Residue
from unsee.impl.eval.paper import (
    INDEP1_WALL_P50_S,
    INDEP_B5PRIME_DECODED,
    PAPER_B7,
    POSITION_RATIO_TO_RESET,
    TABLE1_RATIOS,
    TABLE1_RECOMPUTED,
    get_paper_figures,
)
from unsee.impl.eval.report import fmt, render_table
from unsee.impl.methods.baselines import METHODS, PAPER_NAMES, apply_method

from .episodes import HISTORY_KINDS, make_bench_episode, make_indep_episode
from .floor import compute_floor, get_excess
from .sweep import fit_r2
from .timing import render_breakdown, time_engine

#: Table 1's methods: B5, B5', the paper's B7 (attribution oracle), our B7 (verified drafts).
TABLE1_METHODS = ("reset", "reset-prefix-cache", "replay-oracle", "replay")
LABELS = {"reset": "B5 full reset", "reset-prefix-cache": "B5' + prefix cache",
          "replay-oracle": "B7-oracle (paper's B7)", "replay": "B7 replay (ours)"}
#: Methods that must reach the full reset's digest (B7-oracle need not: its labels may be wrong).
EXACT_METHODS = ("reset", "reset-prefix-cache", "replay")
INDEP_LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Table 1's session shapes (``--shape``), each its own table: ``current``, two
#: setup turns before the target (tau = 3); ``paper``, about ``--history-tokens``
#: (1,000) tokens of history before it, as the paper's sessions carry.
SHAPES = {"current": "table1", "paper": "table1_paper"}
#: Where the target enters the bench episode of T steps (tau = 1, 6, 12 at T = 12).
POSITIONS = {"early": lambda T: 1, "middle": lambda T: (T + 1) // 2, "late": lambda T: T}
#: Cost fields of MethodResult; the draft and reuse counters arrive with the
#: lead's verified-draft replay and prefix cache (0 until then).
COST_FIELDS = ("invocations", "prefilled_tokens", "decoded_tokens", "recomputed_tokens")
OPTIONAL_FIELDS = ("draft_accepted_tokens", "draft_rejected_tokens", "reused_tokens")


# --- measuring ----------------------------------------------------------------------------------

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
            cpu_started = time.thread_time()
            runtime, result = apply_method(base, method, source)
            # the model work on a loaded machine (one torch thread: it runs in this thread);
            # it includes the fork, a copy-on-write share that costs microseconds
            cpu = time.thread_time() - cpu_started
            row = {k: getattr(result, k) for k in COST_FIELDS}
            row.update({k: getattr(result, k, 0) for k in OPTIONAL_FIELDS})
            row.update(wall_s=result.wall_s, cpu_s=cpu, digest=result.digest,
                       boundary=result.report.boundary if result.report else None,
                       draft_turns=(result.report.drafts or {}).get("turns", []) if result.report else [])
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


# --- the tables ------------------------------------------------------------------------------

def make_table1_episode(engine: Engine, args, shape: str) -> Episode:
    """Table 1's episode: indep 0.5, ``--turns-after`` turns past the target;
    the ``paper`` shape puts about ``--history-tokens`` tokens (the paper's
    ~1,000: its B5 recomputes 1,235 tokens, its B5' 202) of earlier planning
    before the target, counted with the model's own tokenizer."""
    if shape == "paper":
        return make_indep_episode(0.5, args.turns_after, args.tau, args.max_new_tokens,
                                  history_tokens=args.history_tokens,
                                  count_tokens=lambda text: len(engine.lm.encode(text)),
                                  history_kind=getattr(args, "history_kind", "memory"))
    return make_indep_episode(0.5, args.turns_after, args.tau, args.max_new_tokens)


def get_token_ratios(m: dict) -> list[dict]:
    """Reference over B7 on decoded, prefilled and recomputed tokens (the
    paper's Recomp: prefilled + decoded), for B7 and B7-oracle against B5
    and B5', beside the paper's 9.3x and 1.5x (Recomp)."""
    ratios = []
    for ours, our_name in (("replay", "B7"), ("replay-oracle", "B7-oracle")):
        for ref, ref_name in (("reset", "B5"), ("reset-prefix-cache", "B5'")):
            if ours in m and ref in m:
                ratios.append({"ratio": f"{ref_name}/{our_name}", "method": ours, "reference": ref,
                               "paper": TABLE1_RATIOS[f"{ref_name}/B7"],
                               **{kind: m[ref][kind] / max(m[ours][kind], 1)
                                  for kind in ("decoded_tokens", "prefilled_tokens", "recomputed_tokens")}})
    return ratios


def get_wall_ratios(row: dict) -> list[dict]:
    """The forget's wall over each reference's, as same-round ratios (each
    round's pair runs seconds apart; :func:`get_paired_ratio`): their median
    and every round's. B7 (ours) and B7-oracle against B5, B5' and the
    compute floor."""
    m, out = row["methods"], []
    references = [(ref, name, m[ref]["wall_s"]) for ref, name in (("reset", "B5"), ("reset-prefix-cache", "B5'"))
                  if ref in m]
    if "floor" in row:
        references.append(("floor", "floor", row["floor"]["wall_s"]))
    for ours, our_name in (("replay", "B7"), ("replay-oracle", "B7-oracle")):
        if ours not in m:
            continue
        for ref, ref_name, walls in references:
            rounds = [w / f for w, f in zip(m[ours]["wall_s"], walls, strict=True)]
            out.append({"ratio": f"{our_name}/{ref_name}", "method": ours, "reference": ref,
                        "p50": statistics.median(rounds), "rounds": rounds})
    return out


def run_table1(engine: Engine, args, notes: list[str], shape: str = "current") -> dict:
    """Table 1 on one session shape (:data:`SHAPES`): every method's counts
    and walls, the compute floor, the token ratios and the same-round wall
    ratios."""
    methods = get_methods(TABLE1_METHODS, notes)
    row = measure_episode(engine, make_table1_episode(engine, args, shape), methods, args.rounds,
                          profile=("replay", "reset"))
    episode = {"shape": shape, "indep": 0.5, "turns_after": args.turns_after, "tau": row["tau"],
               "history_tokens": args.history_tokens if shape == "paper" else None,
               "history_kind": getattr(args, "history_kind", "memory") if shape == "paper" else None}
    return {"episode": episode, **row, "ratios": get_token_ratios(row["methods"]), "walls": get_wall_ratios(row)}


def run_table1_paper(engine: Engine, args, notes: list[str]) -> dict:
    return run_table1(engine, args, notes, "paper")


def run_tau_sweep(engine: Engine, args, notes: list[str]) -> dict:
    methods = get_methods(("replay", "reset"), notes)
    taus = _ints(args.taus) or list(range(1, args.length + 1))
    rows = []
    for tau in tqdm(taus, desc="tau sweep", unit="episode"):
        row = measure_episode(engine, make_bench_episode(tau, args.length, args.max_new_tokens), methods,
                              args.rounds, floor=False)
        row["transitions_ok"] = row["methods"]["replay"]["invocations"] == args.length - tau + 1
        rows.append(row)
    fits = {}
    for kind in ("recomputed_tokens", "decoded_tokens", "prefilled_tokens"):
        _, slope, r2 = fit_r2([r["tau"] for r in rows], [r["methods"]["replay"][kind] for r in rows]) \
            if len(rows) > 1 else (0.0, 0.0, float("nan"))
        fits[kind] = {"slope": slope, "r2": r2}
    return {"T": args.length, "rows": rows, "replay_fit": fits,
            "all_transitions_ok": all(r["transitions_ok"] for r in rows)}


def run_indep_sweep(engine: Engine, args, notes: list[str]) -> dict:
    methods = get_methods(TABLE1_METHODS, notes)
    levels = _floats(args.indeps) or list(INDEP_LEVELS)
    rows = []
    for indep in tqdm(levels, desc="indep sweep", unit="episode"):
        row = measure_episode(engine, make_indep_episode(indep, args.turns_after, args.tau, args.max_new_tokens),
                              methods, args.rounds)
        rows.append({"indep": indep, **row})
    fits = {}
    for method in methods:
        if len(rows) > 1:
            _, slope, r2 = fit_r2([r["indep"] for r in rows], [r["methods"][method]["decoded_tokens"] for r in rows])
        else:
            slope, r2 = 0.0, float("nan")
        values = [r["methods"][method]["decoded_tokens"] for r in rows]
        fits[method] = {"slope": slope, "r2": r2, "min": min(values), "max": max(values)}
    return {"rows": rows, "decoded_fit": fits}


def run_granularity(engine: Engine, args, notes: list[str]) -> dict:
    methods = get_methods(("replay", "reset"), notes)
    rows = []
    for policy in tqdm(CHECKPOINT_POLICIES, desc="checkpoint granularity", unit="policy"):
        episode = make_indep_episode(0.5, args.turns_after, args.tau, args.max_new_tokens, policy)
        rows.append(measure_episode(engine, episode, methods, args.rounds))
    return {"rows": rows}


def run_position(engine: Engine, args, notes: list[str]) -> dict:
    methods = get_methods(("replay", "reset"), notes)
    rows = []
    for where, position in tqdm(list(POSITIONS.items()), desc="target position", unit="episode"):
        tau = position(args.length)
        row = measure_episode(engine, make_bench_episode(tau, args.length, args.max_new_tokens), methods,
                              args.rounds, floor=False)
        replay, reset = row["methods"]["replay"], row["methods"]["reset"]
        row.update(where=where, token_ratio_to_reset=replay["recomputed_tokens"] / reset["recomputed_tokens"],
                   wall_ratio_to_reset=replay["wall_p50_s"] / reset["wall_p50_s"])
        rows.append(row)
    return {"rows": rows}


TABLES: dict[str, Callable] = {"table1": run_table1, "table1_paper": run_table1_paper, "tau": run_tau_sweep, "indep": run_indep_sweep,
                               "granularity": run_granularity, "position": run_position}


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


# --- the report ------------------------------------------------------------------------------

#: Columns of Table 1's method rows (and the compute floor's).
METHOD_HEADER = ("method", "prefilled", "decoded", "recomputed", "draft acceptance", "wall p50 s", "x floor (wall)",
                 "x floor (paired rounds)", "cpu p50 s", "x floor (cpu)", "x floor (tokens)", "digest = reset",
                 "paper (recomputed)")


def _fmt(x, digits: int = 2) -> str:
    return fmt(x, digits, missing="-")


def _label(method: str) -> str:
    return LABELS.get(method, PAPER_NAMES.get(method, method))


def _cells(*values) -> list[str]:
    """A table row: every value as the markdown cell f-string formatting would give."""
    return [str(v) for v in values]


def _method_row(method: str, m: dict, paper: str = "") -> list[str]:
    return _cells(_label(method), m["prefilled_tokens"], m["decoded_tokens"], m["recomputed_tokens"],
                  _fmt(m["draft_acceptance"]), _fmt(m["wall_p50_s"]), _fmt(m.get("x_floor_wall")),
                  _fmt(m.get("x_floor_paired")), _fmt(m.get("cpu_p50_s")), _fmt(m.get("x_floor_cpu")),
                  _fmt(m.get("x_floor_recomputed")), m["equal_to_reset"], paper)


def _floor_row(f: dict) -> list[str]:
    """The compute floor in Table 1's columns: the unit of every "x floor" ratio."""
    return _cells("compute floor", f["prefilled"], f["decoded"], f["recomputed"], "-", _fmt(f["wall_p50_s"]),
                  "1.00", "1.00", _fmt(f.get("cpu_p50_s")), "1.00", "1.00", "-", "-")


def _describe_fit(name: str, fit: dict) -> str:
    if fit["min"] == fit["max"]:
        return f"{name} flat at {fit['min']}"
    return f"{name} slope {fit['slope']:.1f}, R^2 = {fit['r2']:.3f}, range {fit['min']}-{fit['max']}"


def _render_header(result: dict, command: str) -> list[str]:
    lines = [f"<!-- generated by: {command} -->",
             (f"Model {result['model']}, {result['device']} {result['dtype']}, torch {result['torch']}, "
             f"{result['threads']} threads, {result['rounds']} rounds (wall: p50), "
             f"{result['max_new_tokens']} new tokens per turn. Command:"), "", "```sh", command, "```", ""]
    lines += [f"- note: {note}" for note in result["notes"]]
    return lines + ([""] if result["notes"] else [])


def _describe_shape(t: dict) -> str:
    e = t["episode"]
    history = (f"about {e['history_tokens']} tokens of history before it asked for (`--history-tokens`)"
               if e.get("history_tokens") else "two setup turns before it")
    return (f"Target at tau = {t['tau']} ({history}), {e['turns_after']} turns past it, indep 0.5 "
            f"(`make_indep_episode`), restore boundary {t['boundary']}. Measured on the pre-forget session: "
            f"{t.get('prefix_tokens', '-')} tokens before the boundary (what every exact forget keeps), "
            f"{t.get('suffix_tokens', '-')} after it.")


def _render_table1_lead(t: dict, result: dict) -> list[str]:
    """Wall time first (same-round ratios), then decoded tokens, then the
    paper's Recomp with its prefilled and decoded parts apart."""
    lines = [(f"Wall time, the forget over each reference in the same round (median of {result['rounds']} "
             "rounds; every round's ratio beside it):"), ""]
    lines += render_table(("ratio", "wall, same-round p50", "per round"), [
        _cells(w["ratio"], f"{w['p50']:.2f}x", ", ".join(f"{x:.2f}" for x in w["rounds"])) for w in t["walls"]])
    lines += ["", ("Tokens, each reference over the forget: decoded first (on this CPU a decoded token costs "
              "far more than a prefilled one), then prefilled, then Recomp as the paper counts it (prefilled + "
              "decoded), beside the paper's ratios (impl/eval/paper.py: Recomp of B5 1235, B5' 202, B7 133)."), ""]
    lines += render_table(("ratio", "decoded tokens", "prefilled tokens", "Recomp (prefilled + decoded)",
                           "paper (Recomp)"), [
        _cells(r["ratio"], f"{r['decoded_tokens']:.2f}x", f"{r['prefilled_tokens']:.2f}x",
               f"{r['recomputed_tokens']:.2f}x", f"{r['paper']:.1f}x") for r in t["ratios"]])
    return lines + [""]


def _describe_changed(t: dict) -> list[str]:
    c = t.get("floor", {}).get("changed")
    if not c:
        return []
    text = (f"Model turns the forget changed (the counterfactual's tokens differ from the pre-forget turn's): "
            f"{c['changed']} of the {c['turns']} after the restore boundary; {c['dependent_changed']} of the "
            f"{c['dependent']} that ask about the target, {c['independent_changed']} labelled independent.")
    return [text, ""]


def _render_table1(t: dict, result: dict) -> list[str]:
    paper_shape = t["episode"].get("shape") == "paper"
    name, png = ("the paper's session shape", "table1_paper.png") if paper_shape else ("current shape", "table1.png")
    lines = [f"### Table 1: recomputation on the paper's configuration ({name})", "",
             f"{_describe_shape(t)} ![Table 1]({png})", ""]
    lines += _render_table1_lead(t, result)
    rows = [_method_row(method, m, _fmt(TABLE1_RECOMPUTED.get(method))) for method, m in t["methods"].items()]
    lines += render_table(METHOD_HEADER, rows + ([_floor_row(t["floor"])] if "floor" in t else []))
    lines += [""] + _describe_changed(t) + render_breakdown(t)
    lines += ["", ("B7 is this build's `forget` (verified draft replay where the build has drafts: see the draft "
              "acceptance column); the paper's B7 assumes an attribution oracle (our B7-oracle)."), ""]
    excess = t["methods"].get("replay", {}).get("excess")
    if excess:
        lines += [("Where B7 (ours) differs from the floor, turn by turn (`bench.floor.get_excess`): what a "
                  "replay cannot know before it verifies a draft, and (negative decoded) the decode steps "
                  "that context guesses saved."), ""]
        lines += render_table(("reason", "turns", "prefilled beyond the canonical chunk", "decoded beyond the floor",
                               "probe steps"), [
            _cells(e["why"], f"{len(e['turns'])} ({', '.join(e['turns'])})", e["prefilled"], e["decoded"],
                   e["forwards"]) for e in excess])
        lines.append("")
    return lines


def _render_tau(t: dict, result: dict) -> list[str]:
    fit = t["replay_fit"]["recomputed_tokens"]
    lines = ["### Tau sweep: transitions T - tau + 1", "",
             (f"`make_bench_episode`, T = {t['T']}. All B7 transitions equal T - tau + 1: "
             f"{t['all_transitions_ok']}. B7 recomputed tokens against tau: slope {fit['slope']:.1f}, "
             f"R^2 = {fit['r2']:.3f}. ![tau sweep](tau.png)"), ""]
    rows = []
    for r in t["rows"]:
        a, b = r["methods"]["replay"], r["methods"]["reset"]
        rows.append(_cells(r["tau"], a["invocations"], r["T"] - r["tau"] + 1, b["invocations"], a["prefilled_tokens"],
                           a["decoded_tokens"], b["prefilled_tokens"], b["decoded_tokens"], _fmt(a["wall_p50_s"]),
                           _fmt(b["wall_p50_s"]), a["equal_to_reset"]))
    return lines + render_table(("tau", "B7 transitions", "T - tau + 1", "B5 transitions", "B7 prefilled",
                                 "B7 decoded", "B5 prefilled", "B5 decoded", "B7 wall p50 s", "B5 wall p50 s",
                                 "digest = reset"), rows) + [""]


def _indep_row(r: dict, methods: Sequence[str]) -> list[str]:
    a, b = r["methods"].get("replay"), r["methods"].get("reset")
    cells = _cells(r["indep"])
    for m in methods:
        cells += _cells(r["methods"][m]["decoded_tokens"], _fmt(r["methods"][m]["wall_p50_s"]))
    f = r.get("floor") or {}
    cells += _cells(f.get("decoded", "-"), _fmt(f.get("wall_p50_s")))
    cells += ([_fmt(a["wall_p50_s"] / b["wall_p50_s"]), _fmt(a["cpu_p50_s"] / b["cpu_p50_s"])] if a and b
              else ["-", "-"])
    return cells + [_fmt(a.get("x_floor_wall") if a else None), _fmt(a.get("x_floor_cpu") if a else None)]


def _render_indep(t: dict, result: dict) -> list[str]:
    methods = list(t["rows"][0]["methods"]) if t["rows"] else []
    fits = "; ".join(_describe_fit(LABELS.get(m, m), t["decoded_fit"][m]) for m in methods)
    lines = ["### Indep sweep: decode cost against indep", "",
             (f"Decoded tokens against indep: {fits}. Paper: B5' decodes {INDEP_B5PRIME_DECODED}; at indep 1, B7 "
             f"{INDEP1_WALL_P50_S[PAPER_B7]} s against B5 {INDEP1_WALL_P50_S['reset']} s p50. "
             "![indep sweep](indep.png)"), ""]
    header = ["indep"] + [h for m in methods for h in (f"{LABELS.get(m, m)} decoded", "wall p50 s")]
    header += ["floor decoded", "floor wall p50 s", "B7 / B5 wall", "B7 / B5 cpu", "B7 x floor (wall)",
               "B7 x floor (cpu)"]
    return lines + render_table(header, [_indep_row(r, methods) for r in t["rows"]]) + [""]


def _render_granularity(t: dict, result: dict) -> list[str]:
    lines = ["### Checkpoint granularity", "",
             "The paper's configuration (indep 0.5) under each checkpoint policy. ![granularity](granularity.png)",
             ""]
    rows = []
    for r in t["rows"]:
        a, b = r["methods"]["replay"], r["methods"]["reset"]
        rows.append(_cells(r["policy"], a["boundary"], a["invocations"], a["recomputed_tokens"],
                           b["recomputed_tokens"], _fmt(a["wall_p50_s"]), _fmt(b["wall_p50_s"]),
                           _fmt(a["wall_p50_s"] / b["wall_p50_s"]), _fmt(a.get("x_floor_wall")), a["equal_to_reset"]))
    return lines + render_table(("policy", "restore boundary", "B7 transitions", "B7 recomputed", "B5 recomputed",
                                 "B7 wall p50 s", "B5 wall p50 s", "B7 / B5 wall", "B7 x floor (wall)",
                                 "digest = reset"), rows) + [""]


def _render_position(t: dict, result: dict) -> list[str]:
    lines = ["### Target position: forget against reset", "",
             (f"`make_bench_episode`, T = {result['length']}. Paper: ratio to reset "
             f"{POSITION_RATIO_TO_RESET['early']} (early) -> {POSITION_RATIO_TO_RESET['late']} (late). "
             "![position](position.png)"), ""]
    rows = [_cells(r["where"], r["tau"], f"{r['token_ratio_to_reset']:.2f}", f"{r['wall_ratio_to_reset']:.2f}",
                   _fmt(POSITION_RATIO_TO_RESET.get(r["where"])), r["methods"]["replay"]["equal_to_reset"])
            for r in t["rows"]]
    return lines + render_table(("position", "tau", "B7 / B5 recomputed tokens", "B7 / B5 wall p50", "paper",
                                 "digest = reset"), rows) + [""]


#: Each table's markdown section, in the order of :data:`TABLES`.
SECTIONS: dict[str, Callable[[dict, dict], list[str]]] = {
    "table1": _render_table1, "table1_paper": _render_table1, "tau": _render_tau, "indep": _render_indep, "granularity": _render_granularity,
    "position": _render_position}


def render_markdown(result: dict, command: str) -> str:
    """``paper.md``: the command and machine, then one section per table run,
    the paper's figures (impl/eval/paper.py) beside ours."""
    lines = _render_header(result, command)
    for name, render in SECTIONS.items():
        if name in result["tables"]:
            lines += render(result["tables"][name], result)
    return "\n".join(lines) + "\n"


# --- the plots -------------------------------------------------------------------------------


def _save(fig, out: Path, name: str, title: str) -> str:
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _plot_table1(plt, t: dict):
    floor = [t["floor"]] if "floor" in t else []
    names = list(t["methods"]) + ["floor"] * len(floor)
    pre = [t["methods"][m]["prefilled_tokens"] for m in t["methods"]] + [f["prefilled"] for f in floor]
    dec = [t["methods"][m]["decoded_tokens"] for m in t["methods"]] + [f["decoded"] for f in floor]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(names))
    ax.bar(xs, pre, label="prefilled")
    ax.bar(xs, dec, bottom=pre, label="decoded")
    ax.set_xticks(list(xs), [LABELS.get(n, n) for n in names], rotation=15, fontsize=8)
    ax.set(ylabel="tokens", title=f"Table 1 ({t['episode'].get('shape', 'current')} shape): recomputed tokens")
    ax.legend()
    return fig


def _plot_tau(plt, rows: list[dict]):
    taus = [r["tau"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(taus, [r["methods"]["replay"]["invocations"] for r in rows], "o-", label="B7")
    left.plot(taus, [r["methods"]["reset"]["invocations"] for r in rows], "s--", label="B5")
    left.plot(taus, [r["T"] - t + 1 for r, t in zip(rows, taus)], ":", color="gray", label="T - tau + 1")
    left.set(xlabel="tau", ylabel="transitions of F")
    left.legend()
    for method, style in (("replay", "o-"), ("reset", "s--")):
        right.plot(taus, [r["methods"][method]["recomputed_tokens"] for r in rows], style, label=LABELS[method])
    right.set(xlabel="tau", ylabel="recomputed tokens")
    right.legend()
    return fig


def _plot_indep(plt, rows: list[dict]):
    xs = [r["indep"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in rows[0]["methods"]:
        left.plot(xs, [r["methods"][method]["decoded_tokens"] for r in rows], "o-", label=LABELS.get(method))
        right.plot(xs, [r["methods"][method]["wall_p50_s"] for r in rows], "o-", label=LABELS.get(method))
    if all("floor" in r for r in rows):
        left.plot(xs, [r["floor"]["decoded"] for r in rows], ":", color="gray", label="floor")
        right.plot(xs, [r["floor"]["wall_p50_s"] for r in rows], ":", color="gray", label="floor")
    left.set(xlabel="indep", ylabel="decoded tokens")
    right.set(xlabel="indep", ylabel="wall p50 (s)")
    left.legend(fontsize=8)
    return fig


def _plot_pairs(plt, rows: list[dict], key: str, xlab: str):
    """B7 and B5's recomputed tokens side by side, one pair per row (granularity, position)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r["methods"]["replay"]["recomputed_tokens"] for r in rows], width,
           label=LABELS["replay"])
    ax.bar([x + width / 2 for x in xs], [r["methods"]["reset"]["recomputed_tokens"] for r in rows], width,
           label=LABELS["reset"])
    ax.set_xticks(list(xs), [r[key] for r in rows])
    ax.set(xlabel=xlab, ylabel="recomputed tokens")
    ax.legend()
    return fig


def plot(result: dict, out: Path) -> list[str]:
    """One PNG per table; returns the file names (none, with a note, where
    matplotlib is not installed: the vLLM venv has no ``plot`` extra)."""
    try:
        import matplotlib
    except ImportError:
        result["notes"].append("no plots: matplotlib is not installed (pip install 'unsee[plot]')")
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables, written = result["tables"], []
    title = f"{result['model']}, {result['device']} {result['dtype']}"
    for name in SHAPES.values():
        if name in tables:
            written.append(_save(_plot_table1(plt, tables[name]), out, f"{name}.png", title))
    if "tau" in tables and tables["tau"]["rows"]:
        written.append(_save(_plot_tau(plt, tables["tau"]["rows"]), out, "tau.png", title))
    if "indep" in tables and tables["indep"]["rows"]:
        written.append(_save(_plot_indep(plt, tables["indep"]["rows"]), out, "indep.png", title))
    for name, key, xlab in (("granularity", "policy", "checkpoint policy"), ("position", "where", "target position")):
        if name in tables and tables[name]["rows"]:
            written.append(_save(_plot_pairs(plt, tables[name]["rows"], key, xlab), out, f"{name}.png", title))
    return written


# --- several engines in one run -------------------------------------------------------------

#: vLLM's scale-out options (``--tensor-parallel-size``, ``--distributed-executor-backend``),
#: passed to every vLLM engine of ``--engines`` as vLLM's own CLI takes them.
VLLM_OPTIONS = ("tensor_parallel_size", "distributed_executor_backend")


def get_engine_spec(name: str, model: str, device: str, dtype: str,
                    vllm_options: dict | None = None) -> tuple[str, str, dict]:
    """``(backend, model, options)`` that ``name`` (a backend or a one-word
    engine name) stands for: ``--device``/``--dtype`` go to transformers
    and vLLM (whose restore bound is looked up by them), ``vllm_options`` to vLLM; a ValueError naming both lists otherwise."""
    if name in registry.BACKENDS:
        backend, named_model = name, model
    elif name in registry.ENGINE_NAMES:
        backend, named_model = registry.parse_engine_name(name)
    else:
        raise ValueError(f"engine {name!r} is neither a backend {registry.BACKENDS} nor an engine name "
                         f"{tuple(registry.ENGINE_NAMES)}")
    options = {"transformers": {"device": device, "dtype": dtype},
               "vllm": {"device": device, "dtype": dtype, **(vllm_options or {})}}
    return backend, named_model, options.get(backend, {})


def parse_engines(text: str) -> list[str]:
    """The comma-separated names of ``--engines``, each once, in order; a
    ValueError for an empty list."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--engines {text!r}: expected one or more comma-separated engine names")
    return names


def get_engine_specs(names: list[str], args) -> dict[str, tuple[str, str, dict]]:
    """Every name's :func:`get_engine_spec`; vLLM's scale-out options given
    with no vLLM engine among ``names`` are bad input (a ValueError)."""
    vllm_options = {k: getattr(args, k) for k in VLLM_OPTIONS if getattr(args, k, None) is not None}
    check_vllm_scale_out(vllm_options)
    specs = {name: get_engine_spec(name, args.model, args.device, args.dtype, vllm_options) for name in names}
    if vllm_options and not any(backend == "vllm" for backend, _, _ in specs.values()):
        raise ValueError(f"--{next(iter(vllm_options)).replace('_', '-')} is a vLLM option; no engine of "
                         f"--engines {','.join(names)} runs on vLLM")
    return specs


def load_engines(specs: dict[str, tuple[str, str, dict]]) -> dict[str, Engine]:
    """Every engine of ``specs``, loaded now: a missing extra (the backend's
    ImportError, with its install hint) fails here, before any measurement."""
    return {name: registry.load_engine(m, backend, **options) for name, (backend, m, options) in specs.items()}


def describe_engine(name: str, result: dict) -> str:
    return f"{name} ({result['model']}, {result['device']} {result['dtype']})"


#: Table 1's methods in the side-by-side table, with the paper's names.
METHOD_NAMES = {"reset": "B5 reset", "reset-prefix-cache": "B5' prefix cache", "replay-oracle": "B7-oracle",
                "replay": "B7 forget (ours)"}


def _ratio(walls: list[dict], name: str) -> str:
    row = next((w for w in walls if w["ratio"] == name), None)
    return "-" if row is None else f"{row['p50']:.2f}x"


def _engine_rows(name: str, result: dict, table: dict) -> list[list[str]]:
    label = describe_engine(name, result)
    rows = []
    for method, m in table["methods"].items():
        ours = method in ("replay", "replay-oracle")
        prefix = "B7" if method == "replay" else "B7-oracle"
        rows.append([label, METHOD_NAMES.get(method, method), str(m["prefilled_tokens"]), str(m["decoded_tokens"]),
                     str(m.get("reused_tokens", 0)), str(m["recomputed_tokens"]), fmt(m["wall_p50_s"], 2),
                     _ratio(table["walls"], f"{prefix}/B5") if ours else "-",
                     _ratio(table["walls"], f"{prefix}/floor") if ours else "-", str(m["equal_to_reset"])])
    f = table.get("floor")
    if f:
        rows.append([label, "compute floor", str(f["prefilled"]), str(f["decoded"]), "0", str(f["recomputed"]),
                     fmt(f["wall_p50_s"], 2), "-", "1.00x", "-"])
    return rows


def _changed(name: str, table: dict) -> str:
    c = (table.get("floor") or {}).get("changed")
    if not c:
        return f"- {name}: - (no compute floor on a serving engine: `is_serving_engine`)"
    return (f"- {name}: tau = {table['tau']}, {table.get('prefix_tokens', '-')} tokens kept before the restore "
            f"boundary, {table.get('suffix_tokens', '-')} after it; the forget changed {c['changed']} of the "
            f"{c['turns']} model turns after the boundary ({c['dependent_changed']} of {c['dependent']} that ask "
            f"about the target, {c['independent_changed']} labelled independent)")


def _ratio_rows(name: str, result: dict, table: dict) -> list[list[str]]:
    """B5/B7 and B5'/B7 on decoded tokens and on Recomp, beside the paper's."""
    return [[describe_engine(name, result), r["ratio"], f"{r['decoded_tokens']:.2f}x", f"{r['prefilled_tokens']:.2f}x",
             f"{r['recomputed_tokens']:.2f}x", f"{r['paper']:.1f}x"]
            for r in table.get("ratios", []) if r["method"] == "replay"]


def _describe_sessions(results: dict[str, dict]) -> list[str]:
    """How each engine's runs were isolated, and the vLLM margin guard's counts."""
    lines = []
    for name, r in results.items():
        how = ("every method run on a session of its own, the prefix cache released before it"
               if r.get("serving") else "every method run on forks of one session per episode")
        guard = r.get("guard")
        if guard:
            how += (f"; the margin guard took {guard['decisions']} decisions, recomputed {guard['cold_recomputes']} "
                    f"cold, {guard['flips']} flipped")
        lines.append(f"- {describe_engine(name, r)}: {how}")
    return lines + [""]


def render_engines(results: dict[str, dict], table_names: dict[str, str]) -> list[str]:
    """Markdown: for each Table 1 shape (``table_names``: key in ``tables`` ->
    title), every engine's methods side by side ("cached": prompt tokens the
    engine's prefix cache served), then what changed per engine."""
    lines = ["Sessions:", ""] + _describe_sessions(results)
    for key, title in table_names.items():
        measured = {n: r for n, r in results.items() if key in r["tables"]}
        if not measured:
            continue
        lines += [f"### Table 1 on {len(measured)} engines: {title}", ""]
        rows = [row for n, r in measured.items() for row in _engine_rows(n, r, r["tables"][key])]
        lines += render_table(("engine", "method", "prefilled", "decoded", "cached", "recomputed", "wall p50 s",
                               "x reset (same-round p50)", "x floor (same-round p50)", "digest = reset"), rows)
        lines += ["", "Each reference over the forget (B7, ours), beside the paper's Recomp ratios:", ""]
        lines += render_table(("engine", "ratio", "decoded tokens", "prefilled tokens", "Recomp (prefilled + decoded)",
                               "paper (Recomp)"),
                              [row for n, r in measured.items() for row in _ratio_rows(n, r, r["tables"][key])])
        lines += ["", "Turns the forget changed:", ""]
        lines += [_changed(n, r["tables"][key]) for n, r in measured.items()] + [""]
    return lines


def run_engine(engine: Engine, args, tables: list[str], command: str, out: Path) -> dict:
    """Every table of ``tables`` on ``engine``; writes ``paper.json``,
    ``paper.md`` and the plots into ``out`` and returns the result."""
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    result = {"command": command, "model": engine.lm.name, "device": engine.lm.device, "dtype": engine.lm.dtype,
              "torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
              "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "length": args.length,
              "shapes": args.shapes, "history_tokens": args.history_tokens, "history_kind": args.history_kind,
              "paper": get_paper_figures(), "notes": notes, "serving": is_serving_engine(engine), "tables": {}}
    for name in tqdm(tables, desc="tables", unit="table"):
        result["tables"][name] = TABLES[name](engine, args, notes)
    if isinstance(engine, MarginGuard):  # vLLM's margin guard, over the whole run
        result["guard"] = dict(engine.guard_stats)
    result["all_equal_to_reset"] = all(
        m["equal_to_reset"] in (True, None) for t in result["tables"].values()
        for row in (t.get("rows") or [t]) for method, m in row.get("methods", {}).items() if method in EXACT_METHODS)
    (out / "paper.json").write_text(json.dumps(result, indent=2))
    result["plots"] = plot(result, out)
    (out / "paper.md").write_text(render_markdown(result, command))
    return result


def get_parser() -> argparse.ArgumentParser:
    parser = options.get_parser("paper", __doc__)
    options.add_model(parser)
    parser.add_argument("--engines", default="",
                        help="run every table on each of these, comma-separated, in one run: backends "
                             "(transformers, llamacpp, ...: --model on it) or one-word engine names "
                             "(impl/engines/registry.py); all are loaded before any work. Default: transformers")
    options.add_device(parser)
    options.add_dtype(parser)
    parser.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                        help="vLLM engines of --engines: vLLM's tensor parallel size (GPUs per model replica)")
    parser.add_argument("--distributed-executor-backend", default=None, choices=("ray", "mp", "uni"),
                        help="vLLM engines of --engines: vLLM's executor for several GPUs or nodes (ray: nodes)")
    options.add_rounds(parser, help="repeats of every method (wall: p50)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--turns-after", type=int, default=12, help="model turns past the target (Table 1: 12)")
    parser.add_argument("--tau", type=int, default=3, help="where the target enters in the indep episodes")
    parser.add_argument("--length", type=int, default=12, help="T of the tau sweep's and position's episodes")
    parser.add_argument("--taus", default="", help="comma-separated taus of the sweep (default: 1..T)")
    parser.add_argument("--indeps", default="", help="comma-separated indep levels (default: 0,.25,.5,.75,1)")
    parser.add_argument("--tables", default=",".join(t for t in TABLES if t != "table1_paper"),
                        help=f"which of {','.join(TABLES)} (table1: the shapes of --shape)")
    parser.add_argument("--shape", default="current",
                        help="Table 1's session shapes, comma-separated: current (tau = 3) and/or paper "
                             "(about --history-tokens tokens before the target)")
    parser.add_argument("--history-tokens", type=int, default=1000,
                        help="tokens of history before the target in the paper shape (the paper's: ~1,000)")
    parser.add_argument("--history-kind", default="memory", choices=HISTORY_KINDS,
                        help="the paper shape's history: memory records (default) or turns the model answers "
                             "(bench/episodes.py HISTORY_KINDS says why memory)")
    options.add_out(parser, "out/paper")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]):
    """The checked arguments, with ``shapes`` and the expanded ``table_list``."""
    args = parser.parse_args(argv)
    args.shapes = [x.strip() for x in args.shape.split(",") if x.strip()]
    if not args.shapes or any(x not in SHAPES for x in args.shapes):
        parser.error(f"--shape {args.shape!r}: expected some of {','.join(SHAPES)}, comma-separated")
    if args.history_tokens < 1:
        parser.error(f"--history-tokens {args.history_tokens} must be at least 1")
    tables = [t for t in args.tables.split(",") if t]
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        parser.error(f"unknown tables {unknown}; expected some of {list(TABLES)}")
    args.table_list = list(dict.fromkeys(
        x for t in tables for x in ([SHAPES[s] for s in args.shapes] if t == "table1" else [t])))
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = get_parser()
    args = parse_args(parser, argv)
    command = "python -m unsee.bench.paper " + " ".join(shlex.quote(a) for a in argv)
    try:
        engines = load_engines(get_engine_specs(parse_engines(args.engines or "transformers"), args))
    except (ValueError, ImportError) as e:  # an unknown name, or an extra not installed: before any work
        parser.error(str(e))
    out = Path(args.out)
    results = {name: run_engine(engine, args, args.table_list, command, out / name if args.engines else out)
               for name, engine in engines.items()}
    if args.engines:
        shapes = {SHAPES[s]: ("the paper's session shape" if s == "paper" else "the current shape")
                  for s in args.shapes}
        first = next(iter(results.values()))
        engines_line = "Engines: " + "; ".join(describe_engine(n, r) for n, r in results.items()) + "."
        lines = _render_header(first, command)
        lines[1] = engines_line + " " + lines[1].split(", ", 2)[-1]  # torch, threads, rounds, tokens per turn
        lines += render_engines(results, shapes)
        for name, result in results.items():
            lines += [f"## {describe_engine(name, result)}", ""] + render_markdown(result, command).splitlines()[1:]
        out.mkdir(parents=True, exist_ok=True)
        (out / "paper.json").write_text(json.dumps({"command": command, "engines": results}, indent=2))
        (out / "paper.md").write_text("\n".join(lines) + "\n")
    print((out / "paper.md").read_text())
    print(f"wrote {out}/paper.json and paper.md" + (f", one folder per engine ({', '.join(results)})"
                                                   if args.engines else ""))
    return 0 if all(r["all_equal_to_reset"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
