"""The paper's tables as runs (bench/paper.py ``--tables``): each builds its
episodes and measures them (:mod:`unsee.bench.paper_measure`), returning the
rows its markdown section and plot read."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from tqdm import tqdm

from unsee.impl.agent.episode import CHECKPOINT_POLICIES, Episode
from unsee.impl.engines.protocol import Engine
from unsee.impl.eval.paper import TABLE1_RATIOS

from .episodes import make_bench_episode, make_indep_episode
from .paper_measure import TABLE1_METHODS, get_methods, measure_episode
from .sweep import fit_r2

#: The indep sweep's levels (``--indeps`` when not given).
INDEP_LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Table 1's session shapes (``--shape``), each its own table: ``current``, two
#: setup turns before the target (tau = 3); ``paper``, about ``--history-tokens``
#: (1,000) tokens of history before it, as the paper's sessions carry.
SHAPES = {"current": "table1", "paper": "table1_paper"}
#: Where the target enters the bench episode of T steps (tau = 1, 6, 12 at T = 12).
POSITIONS = {"early": lambda T: 1, "middle": lambda T: (T + 1) // 2, "late": lambda T: T}


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
    round's pair runs seconds apart; :func:`~unsee.bench.paper_measure.get_paired_ratio`): their median
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
