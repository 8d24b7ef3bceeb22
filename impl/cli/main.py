"""Command line: ``unsee run EPISODE.json``, ``unsee demo``, and the stored
sessions of docs/persistence.md: ``unsee run EPISODE.json --store PATH``,
``unsee forget PATH SOURCE_ID``, ``unsee show PATH`` and
``unsee verify PATH [--receipt FILE] [--value V]``; ``unsee conform -- CMD``
checks another implementation against the conformance contract
(docs/conformance.md).

Exit codes: 0 success (``verify``: verified), 2 bad input (the message names
it), 75 the store is busy or changed under us (retry later), 1 anything else
(``verify``: a check failed; ``conform``: the implementation was rejected),
3 ``verify`` cannot verify here (the environment differs from the receipt's;
the message names the difference).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from unsee.impl.agent.episode import EpisodeError, load_episode
from unsee.impl.agent.provenance import UnknownSourceError
from unsee.impl.cli.demo import progress_bar, run_demo
from unsee.impl.eval.suites import SUITES
from unsee.impl.methods.baselines import METHODS, PAPER_NAMES, apply_method


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="unsee", description="Exact forgetting for stateful LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an episode, optionally forget a source, print the report")
    run.add_argument("episode", help="path to an episode JSON file (docs/episode-format.md)")
    run.add_argument("--forget", metavar="SOURCE_ID", help="source id to forget (default: the episode's target)")
    run.add_argument("--method", default="replay", choices=METHODS,
                     help="replay (B7, Algorithm 1), reset (B5), none (B0), or another baseline")
    _model_options(run)
    run.add_argument("--engine", default="transformers", choices=("transformers", "llamacpp"),
                     help="transformers (default), or llama.cpp over the --model GGUF: smollm2 or tiny (the "
                          "optional extra: pip install 'unsee[llamacpp]'; docs/engines.md)")
    run.add_argument("--probe", action="append", default=[], help="ask this question of the final state")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.add_argument("--store", metavar="PATH",
                     help="save the session to a new session store at PATH after running, and again "
                          "(atomically) after the forget (docs/persistence.md)")

    forget = sub.add_parser("forget", help="reopen a stored session, forget a source, commit atomically, "
                                           "print the report")
    forget.add_argument("store", metavar="PATH", help="a session store written by `unsee run --store`")
    forget.add_argument("source", metavar="SOURCE_ID", help="the source id to forget")
    _stored_model_options(forget)
    forget.add_argument("--json", action="store_true", help="machine-readable output")
    forget.add_argument("--receipt", metavar="FILE", help="also write the erasure receipt to FILE (it is always "
                                                          "stored in the session's forget log)")
    forget.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for another process writing the store before giving up (busy)")

    verify = sub.add_parser("verify", help="check a stored session's erasure receipt: rebuild the counterfactual "
                                           "from R_0 over the stored log and compare (read-only)")
    verify.add_argument("store", metavar="PATH", help="a session store")
    verify.add_argument("--receipt", metavar="FILE", help="the receipt you hold (default: the store's latest)")
    verify.add_argument("--value", metavar="V", help="a forgotten value to look for in the raw bytes of every "
                                                     "file the session owns (never stored; '-' reads it from stdin)")
    verify.add_argument("--device", default="cpu", help="cpu or cuda")
    verify.add_argument("--json", action="store_true", help="machine-readable output")

    show = sub.add_parser("show", help="print a stored session's summary (T, digest, forgotten sources, "
                                       "checkpoints)")
    show.add_argument("store", metavar="PATH", help="a session store written by `unsee run --store`")
    _stored_model_options(show, verify=True)
    show.add_argument("--json", action="store_true", help="machine-readable output")

    demo = sub.add_parser("demo", help="the leak, the forget and its cost on the default model")
    _model_options(demo)
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.add_argument("--tools", action="store_true",
                      help="instead: a forget whose counterfactual would not have sent a message that was sent")

    conform = sub.add_parser("conform", help="check an implementation against the conformance contract "
                                             "(docs/conformance.md) on generated episodes; a failure is "
                                             "shrunk and written as an episode file that reruns it")
    conform.add_argument("cmd", nargs="*", metavar="CMD",
                         help="after '--': the implementation's command; the harness appends --episode FILE "
                              "--out FILE [--forget SOURCE_ID]")
    conform.add_argument("--entry", metavar="MODULE:FUNCTION",
                         help="instead of a command: a Python function(episode_path, forget) -> result dict")
    conform.add_argument("--examples", type=int, default=10, help="generated episodes to check (default 10)")
    conform.add_argument("--max-steps", type=int, default=6, help="the longest generated episode (default 6)")
    conform.add_argument("--seed", type=int, default=None,
                         help="a random search from this seed (default: derandomized, the same episodes each run)")
    conform.add_argument("--episode", metavar="FILE", help="check this one episode file (e.g. a counterexample) "
                                                           "instead of generating episodes")
    conform.add_argument("--out", default="unsee-conform", metavar="DIR",
                         help="where a counterexample is written (default ./unsee-conform)")
    conform.add_argument("--timeout", type=float, default=300.0, help="seconds one command may take (default 300)")
    conform.add_argument("--no-reference", action="store_true",
                         help="skip the token comparison with our runtime even when the implementation "
                              "declares our engine and model")

    evaluate = sub.add_parser("eval", help="the paper's evaluation: every method on generated suites, every "
                                           "metric and audit, rows as JSONL (resumable), report.md (docs/eval.md)")
    evaluate.add_argument("--suite", default="all",
                          help=f"{'|'.join(SUITES)}|all, or a comma-separated list (default: all)")
    evaluate.add_argument("--n", type=int, default=10, help="episodes per suite (default 10)")
    evaluate.add_argument("--methods", default=",".join(METHODS),
                          help="comma-separated methods (default: all); B5 (reset) always runs, it is the "
                               "reference of CAD, agreement and every audit's floor")
    _model_options(evaluate)
    evaluate.add_argument("--out", required=True, metavar="DIR",
                          help="rows.jsonl, report.md and plots go here; an existing rows.jsonl is resumed")
    evaluate.add_argument("--seed", type=int, default=0, help="the suite generators' seed")
    evaluate.add_argument("--samples", type=int, default=5, help="Leak@5 draws per state (default 5)")
    evaluate.add_argument("--probe-tokens", type=int, default=None, metavar="N",
                          help="tokens per probe answer and Leak@5 draw (default: the episode's max_new_tokens)")
    evaluate.add_argument("--turn-tokens", type=int, default=None, metavar="N",
                          help="override every episode's max_new_tokens (model turns), for a quick run "
                               "(default: the suites' setting)")
    evaluate.add_argument("--workers", type=int, default=1,
                          help="worker processes, one torch thread each (default 1: this process)")
    evaluate.add_argument("--no-share", action="store_true",
                          help="re-ask every audit of a state even when an earlier method of the episode reached "
                               "the same digest (by default its answers are reused: same state, same tokens)")
    evaluate.add_argument("--report-only", action="store_true", help="rewrite report.md from the rows; run nothing")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")

    args = parser.parse_args(argv)
    try:
        if args.command == "conform":
            return _conform(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "demo" and args.tools:
            from unsee.impl.cli.tools_demo import run_tools_demo

            run_tools_demo(args.model)
            return 0
        if args.command == "demo":
            run_demo(args.model, args.device, args.dtype, as_json=args.json, kv_budget=args.kv_budget)
            return 0
        if args.command == "forget":
            return _forget(args)
        if args.command == "show":
            return _show(args)
        if args.command == "verify":
            return _verify(args)
        return _run(args)
    except _retry_later() as exc:
        print(f"unsee: {exc}", file=sys.stderr)
        return 75
    except (EpisodeError, UnknownSourceError, ValueError) as exc:
        print(f"unsee: error: {exc}", file=sys.stderr)
        return 2


def _conform(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unsee.impl.conform.harness import check_file, make_implementation, search

    implementation = make_implementation(args.cmd, args.entry, args.timeout)
    out = Path(args.out)
    if args.episode:
        outcome = check_file(implementation, args.episode, out, reference=not args.no_reference)
    else:
        outcome = search(implementation, out, args.examples, args.max_steps, args.seed,
                         reference=not args.no_reference)
    print(outcome.describe())
    return 0 if outcome.passed else 1


def _retry_later() -> tuple[type[Exception], ...]:
    from unsee.impl.store.sqlite import StoreBusyError, StoreConflictError
    from unsee.impl.util.exclusive import SessionBusyError

    return (StoreBusyError, StoreConflictError, SessionBusyError)


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (embedded default), tiny, or a local checkpoint folder / .gguf file")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--kv-budget", type=parse_bytes, default=None, metavar="BYTES",
                        help="bound the KV cache kept of lineages no live runtime extends (e.g. 0, 65536, "
                             "64K, 512M, 2G); older ones are evicted and rebuilt by prefill when a forget "
                             "needs them. Default: no bound")


_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_bytes(text: str) -> int:
    """A byte count: a number with an optional K/M/G suffix (binary units), e.g. ``512M``."""
    match = _BYTES.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 0, 65536, 64K, 512M, 2G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _stored_model_options(parser: argparse.ArgumentParser, verify: bool = False) -> None:
    what = "rebuild the session on this model and check its digest; " if verify else ""
    parser.add_argument("--model", default=None,
                        help=f"{what}must be the model the session was created with (default: that model)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default=None, help="must be the session's dtype (default: that dtype)")


#: Methods whose result is a session the store can hold and reopen exactly.
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
            "accepted")


STORABLE_METHODS = ("none", "replay", "replay-decode", "reset")


def _run(args: argparse.Namespace) -> int:
    from unsee.impl.agent.runtime import AgentRuntime
    from unsee.impl.engines.hf.engine import KVEngine
    from unsee.impl.engines.hf.models import load_model

    episode = load_episode(args.episode)
    source = args.forget or (episode.target.source if episode.target else None)
    if args.method != "none" and source is None:
        raise EpisodeError(f"{args.episode}: no --forget given and the episode names no target")
    if source is not None and source not in episode.get_sources():
        raise UnknownSourceError(f"unknown source id {source!r}: the episode has {list(episode.get_sources())}")
    if args.store:
        from pathlib import Path

        from unsee.impl.store.sqlite import StoreError

        if args.method not in STORABLE_METHODS:
            raise ValueError(f"--store keeps sessions of the methods {STORABLE_METHODS}; "
                             f"{args.method!r} is a baseline whose state is not a session")
        if Path(args.store).exists():
            raise StoreError(f"{args.store}: already exists; `unsee forget` and `unsee show` open it")
    value = episode.target.value if episode.target and episode.target.source == source else None
    if args.engine == "llamacpp":
        from unsee.impl.engines.llamacpp.engine import LlamaCppEngine, LlamaCppMissingError, load_llamacpp

        if args.device != "cpu":
            raise ValueError(f"--engine llamacpp runs on the cpu here; --device {args.device!r} is not supported")
        try:
            engine = LlamaCppEngine(load_llamacpp(args.model), kv_budget=args.kv_budget)
        except LlamaCppMissingError as exc:  # reported as a bad argument: nothing ran
            raise ValueError(str(exc)) from None
    else:
        engine = KVEngine(load_model(args.model, device=args.device, dtype=args.dtype), kv_budget=args.kv_budget)
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
    engine.enforce_budget()  # the runtimes apply_method replaced are gone: release their lineages
    output["kv_memory"] = engine.memory().to_json()
    if args.json:
        print(json.dumps(output, indent=2, default=str))
        return 0
    print(f"episode {args.episode}: T = {runtime.t} transitions on {engine.lm.name}")
    if "result" in output:
        r = output["result"]
        print(f"method   {PAPER_NAMES[args.method]} on source {source!r}")
        if r["report"]:
            rep = r["report"]
            print(f"tau      {rep['tau']}   restored checkpoint at boundary {rep['boundary']} "
                  f"({rep['checkpoint_bytes']} bytes of metadata)")
            print(f"closure  {len(rep['closure'])} blocks: {', '.join(rep['closure'][:8])}"
                  f"{' ...' if len(rep['closure']) > 8 else ''}")
            print("A1-A3    " + "; ".join(f"{k}: {'holds' if v['holds'] else 'FAILS'}"
                                           for k, v in rep["assumptions"].items()))
            print(f"drafts   {describe_drafts(rep['drafts'])}")
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
    if store is not None:
        store.close()
        print(f"stored   {args.store}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """``unsee eval``: every input checked before the model loads; rows are
    flushed one by one, so an interrupt loses at most the row in progress."""
    from pathlib import Path

    from unsee.impl.eval.report import write_report
    from unsee.impl.eval.run import (
        ROWS_FILE,
        EvalConfig,
        EvalError,
        check_out_dir,
        generate_cases,
        get_suite_names,
        read_rows,
        run_evaluation,
    )

    if not args.report_only:  # checked before the out folder is created
        get_suite_names(args.suite)
        if args.n <= 0:
            raise EvalError(f"--n must be a positive integer, got {args.n}")
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        config = EvalConfig(model=args.model, device=args.device, dtype=args.dtype, methods=methods,
                            samples=args.samples, workers=args.workers, kv_budget=args.kv_budget,
                            max_new_tokens=args.probe_tokens, turn_tokens=args.turn_tokens,
                            share_identical=not args.no_share)
    out = check_out_dir(Path(args.out))
    if args.report_only:
        rows = read_rows(out / ROWS_FILE)
        if not rows:
            raise EvalError(f"{out / ROWS_FILE}: no rows to report")
        print(f"report   {write_report(rows, out)}")
        return 0
    read_rows(out / ROWS_FILE)  # a corrupt file fails here, before any model loads
    cases = generate_cases(args.suite, args.n, seed=args.seed)
    try:
        rows = run_evaluation(cases, config, out, progress=not args.quiet)
    except KeyboardInterrupt:
        kept = len(read_rows(out / ROWS_FILE))
        print(f"unsee eval: interrupted; {kept} finished rows are in {out / ROWS_FILE}; run the same command "
              "again to resume", file=sys.stderr)
        return 130
    print(f"rows     {out / ROWS_FILE} ({len(rows)} rows)")
    print(f"report   {write_report(rows, out)}")
    return 0


def _open_stored(args: argparse.Namespace):
    """The store, after checking ``--model``/``--dtype`` against it (before any model loads)."""
    from unsee.impl.store.sqlite import SessionStore, StoreError

    store = SessionStore.open(args.store, busy_timeout=getattr(args, "wait", 10.0))
    meta = store.get_meta()
    for option, stored in (("model", meta["model"]), ("dtype", meta["dtype"])):
        given = getattr(args, option)
        if given is not None and given != stored:
            store.close()
            raise StoreError(f"{args.store}: the session was created with {option} {stored!r}, not {given!r}; "
                             f"run with --{option} {stored} (or leave --{option} out)")
    return store


def _forget(args: argparse.Namespace) -> int:
    from unsee.impl.engines.hf.engine import KVEngine
    from unsee.impl.engines.hf.models import load_model
    from unsee.impl.store.session import PersistentSession
    from unsee.impl.store.sqlite import StoreConflictError

    store = _open_stored(args)
    meta = store.get_meta()
    engine = None
    # A conflict means another process committed while this one replayed: the
    # forget is redone on the newer state (it still has to happen there); the
    # loser's state, which may hold the value, was dropped by the session.
    for attempt in range(1, RETRIES + 1):
        try:
            if engine is None:
                engine = KVEngine(load_model(meta["model"], device=args.device, dtype=meta["dtype"]))
            session = PersistentSession(store, store.load(engine))
            report = session.forget(args.source, progress_bar("forget", not args.json))
            break
        except StoreConflictError as exc:
            if attempt == RETRIES:
                store.close()
                raise
            print(f"unsee: {exc}; retrying on the newer state ({attempt}/{RETRIES - 1})", file=sys.stderr)
        except BaseException:
            store.close()
            raise
    receipt = store.last_receipt
    store.close()
    out = report.to_json()
    out["store"] = args.store
    if receipt is not None:
        out["receipt"] = json.loads(receipt)
        if args.receipt:
            with open(args.receipt, "x", encoding="utf-8") as f:  # never overwrite a receipt someone holds
                f.write(receipt)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    if report.already_forgotten:
        print(f"source   {args.source!r} was already forgotten: nothing to do, the session is unchanged")
    else:
        print(f"forgot   {args.source!r} in {args.store} (committed atomically)")
        print(f"tau      {report.tau}   restored checkpoint at boundary {report.boundary}")
        print(f"closure  {len(report.closure)} blocks")
        print(f"cost     {report.invocations} transitions (T - boundary = {report.expected_invocations}), "
              f"{report.prefilled_tokens} prefilled + {report.decoded_tokens} decoded tokens, "
              f"{report.wall_s:.2f} s")
        print(f"drafts   {describe_drafts(report.drafts)}")
    print(f"T        {report.length}")
    print(f"digest   {report.digest}")
    if receipt is not None and args.receipt:
        print(f"receipt  {args.receipt}")
    return 0


#: How often `unsee forget` redoes a forget that lost a commit race.
RETRIES = 3


def _verify(args: argparse.Namespace) -> int:
    from unsee.impl.store.verify import CANNOT, VERIFIED, verify_store

    receipt = None
    if args.receipt:
        try:
            with open(args.receipt, "rb") as f:
                receipt = f.read()
        except OSError as exc:
            raise ValueError(f"{args.receipt}: cannot read the receipt ({exc.strerror})") from None
    value = sys.stdin.readline().rstrip("\n") if args.value == "-" else args.value
    verdict = verify_store(args.store, receipt, value, device=args.device)
    if args.json:
        print(json.dumps(verdict.to_json(), indent=2, default=str))
    else:
        for check in verdict.checks:
            mark = {"ok": "ok", "failed": "FAILED", "cannot": "CANNOT", "skipped": "-"}[check.status]
            print(f"{mark:7}{check.name}" + (f": {check.detail}" if check.detail else ""))
        print(f"{verdict.outcome}: {args.store}" + (
            "" if verdict.outcome == VERIFIED else " (" + "; ".join(c.name for c in verdict.failed()) + ")"))
    return 0 if verdict.outcome == VERIFIED else 3 if verdict.outcome == CANNOT else 1


def _show(args: argparse.Namespace) -> int:
    store = _open_stored(args)
    try:
        summary = store.get_summary()
        if args.model is not None:  # rebuild on the named model: the digest must match
            from unsee.impl.engines.hf.engine import KVEngine
            from unsee.impl.engines.hf.models import load_model

            engine = KVEngine(load_model(args.model, device=args.device, dtype=summary["dtype"]))
            summary["verified"] = store.load(engine).digest() == summary["digest"]
    finally:
        store.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    print(f"session  {summary['path']} ({summary['runtime']}, schema {summary['schema_version']})")
    print(f"model    {summary['model']} ({summary['dtype']})")
    print(f"T        {summary['T']} steps, {summary['transitions']} transitions run")
    print(f"digest   {summary['digest']}" + ("   (verified by rebuild)" if summary.get("verified") else ""))
    print(f"forgot   {', '.join(summary['forgotten']) or '-'}")
    print(f"sources  {', '.join(summary['sources']) or '-'}")
    print(f"ckpts    {len(summary['checkpoints'])} at boundaries "
          f"{', '.join(str(c['boundary']) for c in summary['checkpoints'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
