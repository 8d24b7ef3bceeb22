"""``unsee run``: run an episode, forget a source with a method, print the
report, and optionally keep the session in a store (docs/persistence.md).

Every input is checked before the model loads; a bad one is a ValueError
(exit 2) naming it.
"""

from __future__ import annotations

import argparse
import json

from unsee.impl.agent.episode import Episode, EpisodeError, load_episode
from unsee.impl.agent.provenance import UnknownSourceError
from unsee.impl.cli.exits import Exit
from unsee.impl.cli.options import get_loader_options, get_vllm_options
from unsee.impl.engines.protocol import Engine
from unsee.impl.engines.registry import load_engine
from unsee.impl.methods.baselines import PAPER_NAMES, apply_method
from unsee.impl.util.progress import progress_bar

#: Methods whose result is a session the store can hold and reopen exactly.
STORABLE_METHODS = ("none", "replay", "replay-decode", "reset")


def do_run(args: argparse.Namespace) -> int:
    """``unsee run EPISODE [--forget SOURCE_ID] [--method M] [--store PATH]``."""
    from unsee.impl.agent.runtime import AgentRuntime

    episode = load_episode(args.episode)
    source = get_run_source(args, episode)
    value = episode.target.value if episode.target and episode.target.source == source else None
    engine = build_engine(args)
    runtime = AgentRuntime.from_episode(engine, episode, progress_bar("run", not args.json))
    output: dict = {"episode": args.episode, "model": engine.lm.name, "T": runtime.t,
                    "digest_before": runtime.digest()}
    store = None
    if args.store:  # the session as run; the episode's target value is not stored
        from unsee.impl.store.sqlite import SessionStore

        store = SessionStore.create(args.store, runtime)
        output["store"] = args.store
    if source is not None:
        runtime, result = apply_method(runtime, args.method, source, value)
        output["result"] = result.to_json()
        if store is not None and args.method != "none":
            store.save(runtime, report=result.report)  # one transaction
    output["digest"] = runtime.digest()
    output["probes"] = {q: runtime.probe(q) for q in args.probe}
    engine.budget.enforce()  # the runtimes apply_method replaced are gone: release their lineages
    output["kv_memory"] = engine.budget.memory().to_json()
    if args.json:
        print(json.dumps(output, indent=2, default=str))
    else:
        print_run_report(args, output, source, runtime.t)
    if store is not None:
        store.close()
        if not args.json:
            print(f"stored   {args.store}")
    return Exit.OK


def get_run_source(args: argparse.Namespace, episode: Episode) -> str | None:
    """The source ``unsee run`` forgets (``--forget``, else the episode's
    target), after checking it and ``--store`` against the episode."""
    source = args.forget or (episode.target.source if episode.target else None)
    if args.method != "none" and source is None:
        raise EpisodeError(f"{args.episode}: no --forget given and the episode names no target")
    if source is not None and source not in episode.get_sources():
        raise UnknownSourceError(f"unknown source id {source!r}: the episode has {list(episode.get_sources())}")
    if args.store:
        from pathlib import Path

        from unsee.impl.store.schema import StoreError

        if args.method not in STORABLE_METHODS:
            raise ValueError(f"--store keeps sessions of the methods {STORABLE_METHODS}; "
                             f"{args.method!r} is a baseline whose state is not a session")
        if Path(args.store).exists():
            raise StoreError(f"{args.store}: already exists; `unsee forget` and `unsee show` open it")
    return source


def build_engine(args: argparse.Namespace, **extra) -> Engine:
    """The engine of ``--engine``/``--model``/``--device``/``--dtype``/``--attn``/``--kv-budget``,
    through the registry (a missing llama.cpp extra is bad input: nothing ran); ``extra``: more
    loader options (``unsee serve``'s context)."""
    options = (get_loader_options(args.engine, args.device, args.dtype, getattr(args, "attn", None))
               | get_vllm_options(args) | extra)
    return load_engine(args.model, args.engine, kv_budget=args.kv_budget, **options)


def print_run_report(args: argparse.Namespace, output: dict, source: str | None, t: int) -> None:
    """``unsee run``'s text report of ``output`` (what ``--json`` prints); ``t``:
    the final runtime's length (a baseline may have appended a block)."""
    print(f"episode {args.episode}: T = {t} transitions on {output['model']}")
    if "result" in output:
        r = output["result"]
        print(f"method   {PAPER_NAMES[args.method]} on source {source!r}")
        if r["report"]:
            print_forget_lines(r["report"])
        print(f"cost     {r['invocations']} transitions, {r['prefilled_tokens']} prefilled + "
              f"{r['decoded_tokens']} decoded tokens, {r['wall_s']:.2f} s")
        if r["report"] and r["report"]["rebuilt_tokens"]:
            print(f"rebuilt  {r['report']['rebuilt_tokens']} of the prefilled tokens rebuilt evicted cache lineages")
    print(f"digest   {output['digest']}")
    if args.kv_budget is not None:
        m = output["kv_memory"]
        print(f"kv       {m['held_bytes']} bytes held ({m['live_bytes']} live, {m['unpinned_bytes']} unpinned "
              f"<= budget {args.kv_budget}); {m['evicted_lineages']} lineages evicted")
    for q, a in output["probes"].items():
        print(f"probe    {q!r} -> {a!r}")


def print_forget_lines(rep: dict) -> None:
    """The forget report's lines of ``unsee run``: tau, closure, A1-A3, drafts."""
    print(f"tau      {rep['tau']}   restored checkpoint at boundary {rep['boundary']} "
          f"({rep['checkpoint_bytes']} bytes of metadata)")
    print(f"closure  {len(rep['closure'])} blocks: {', '.join(rep['closure'][:8])}"
          f"{' ...' if len(rep['closure']) > 8 else ''}")
    print("A1-A3    " + "; ".join(f"{k}: {'holds' if v['holds'] else 'FAILS'}"
                                  for k, v in rep["assumptions"].items()))
    print(f"drafts   {describe_drafts(rep['drafts'])}")
    restore = describe_restore(rep.get("extra", {}).get("restore"))
    if restore:
        print(f"restore  {restore}")


def describe_restore(restore: dict | None) -> str:
    """One line on what a restore kept from the engine's cache, where its
    engine resumes a prefill only at multiples of more than one token (vLLM's
    blocks); empty elsewhere (a crop keeps every token of the checkpoint)."""
    if not restore or restore["granularity"] <= 1:
        return ""
    line = (f"{restore['cached_tokens']} of the checkpoint's {restore['checkpoint_tokens']} tokens kept "
            f"(whole blocks of {restore['granularity']}), {restore['recomputed_tokens']} recomputed")
    served = restore.get("served")
    if served and "cached_tokens" in served:
        line += (f"; the first request was served {served['cached_tokens']} of its {served['prompt_tokens']} "
                 "prompt tokens from the cache")
    return line


def describe_drafts(drafts: dict) -> str:
    """One line on how a forget replayed its model turns (impl/agent/drafts.py)."""
    totals = drafts.get("totals")
    if drafts.get("mode") == "off" or not totals:
        return f"off ({drafts.get('why', 'no drafts')})"
    return (f"{drafts['mode']}: {totals['accepted']} of {totals['draft']} draft tokens accepted, "
            f"{totals['fully_accepted_turns']} of {totals['turns']} turns without a decode step, "
            f"{totals['fallbacks']} fallback(s), {totals['probes']} probe(s), "
            f"{totals.get('quoting', 0)} draft(s) quoting a forgotten item, "
            f"{totals.get('lookup_accepted', 0)} of {totals.get('looked_up', 0)} guessed token(s) from the context "
            "accepted" + (f"; bound {drafts['bound']:g}, {drafts['bound_source']}" if drafts.get("bound_source") else ""))


__all__ = ["STORABLE_METHODS", "build_engine", "describe_drafts", "do_run", "get_run_source", "print_run_report"]
