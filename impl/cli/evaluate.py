"""``unsee eval`` (the paper's evaluation, docs/eval.md) and ``unsee conform``
(another implementation against the conformance contract, docs/conformance.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unsee.impl.cli.exits import Exit
from unsee.impl.cli.options import get_loader_options, get_spelling, get_vllm_options, parse_method_list
from unsee.impl.methods.baselines import METHODS


def get_eval_config(args: argparse.Namespace):
    """The EvalConfig of ``unsee eval``'s options, every one checked before the
    out folder is created or a model loads, and the optional packages they need
    (:func:`~unsee.impl.eval.run.check_eval_extras`)."""
    from unsee.impl.eval.run import EvalConfig, EvalError, check_eval_extras, get_suite_names

    check_eval_extras(get_suite_names(args.suite))
    if args.episodes <= 0:
        raise EvalError(f"{get_spelling(args, 'episodes')} must be a positive integer, got {args.episodes}")
    methods = get_eval_methods(args)
    check_vllm_workers(args)
    # llama.cpp runs the file's own weight types on the cpu: its rows say dtype 'gguf', as its stores do
    dtype = get_loader_options(args.engine, args.device, args.dtype).get("dtype", "gguf")
    return EvalConfig(model=args.model, backend=args.engine, device=args.device, dtype=dtype, methods=methods,
                      samples=args.samples, workers=args.workers, kv_budget=args.kv_budget,
                      max_new_tokens=args.probe_tokens, turn_tokens=args.turn_tokens,
                      share_identical=not args.no_share, engine_options=tuple(get_vllm_options(args).items()))


def check_vllm_workers(args: argparse.Namespace) -> None:
    """An EvalError for ``--workers`` above 1 with vLLM on GPUs: every worker
    loads a vLLM engine of its own (on the CPU, each with its own KV space),
    and on GPUs each would claim the same devices' memory."""
    from unsee.impl.eval.run import EvalError

    gpus = args.device != "cpu" or (args.tensor_parallel_size or 1) > 1
    if args.engine == "vllm" and args.workers > 1 and gpus:
        raise EvalError(f"--workers {args.workers} with --engine vllm on GPUs: each worker would load its own vLLM "
                        "on the same GPUs; use --workers 1 and scale one engine with --tensor-parallel-size "
                        "(and --distributed-executor-backend ray across nodes)")


def get_eval_methods(args: argparse.Namespace) -> tuple[str, ...]:
    """``--method``'s methods; left at its default (all), without those the
    engine cannot run, which a notice names (named explicitly, EvalConfig
    refuses them)."""
    from unsee.impl.eval.run import UNSUPPORTED_METHODS

    methods = parse_method_list(args.method)
    skipped = UNSUPPORTED_METHODS.get(args.engine, {})
    if args.method != ",".join(METHODS) or not set(skipped) & set(methods):
        return methods
    print(f"unsee eval: the {args.engine} engine cannot run {', '.join(skipped)} "
          f"({'; '.join(skipped.values())}); running the other methods", file=sys.stderr)
    return tuple(m for m in methods if m not in skipped)


def do_eval(args: argparse.Namespace) -> int:
    """``unsee eval --out DIR``: rows are flushed one by one, so an interrupt
    loses at most the row in progress (exit 130; the same command resumes)."""
    from unsee.impl.eval.run import (
        ROWS_FILE,
        EvalError,
        check_eval_extras,
        check_out_dir,
        generate_cases,
        read_rows,
        run_evaluation,
    )

    if args.report_only:
        check_eval_extras(())  # the report's statistics need scipy
        out = check_out_dir(Path(args.out))
        rows = read_rows(out / ROWS_FILE)
        if not rows:
            raise EvalError(f"{out / ROWS_FILE}: no rows to report")
        return write_report_or_say_why(rows, out)
    config = get_eval_config(args)
    out = check_out_dir(Path(args.out))
    read_rows(out / ROWS_FILE)  # a corrupt file fails here, before any model loads
    cases = generate_cases(args.suite, args.episodes, seed=args.seed)
    try:
        rows = run_evaluation(cases, config, out, progress=not args.quiet)
    except KeyboardInterrupt:
        kept = len(read_rows(out / ROWS_FILE))
        print(f"unsee eval: interrupted; {kept} finished rows are in {out / ROWS_FILE}; run the same command "
              "again to resume", file=sys.stderr)
        return Exit.INTERRUPTED
    print(f"rows     {out / ROWS_FILE} ({len(rows)} rows)")
    return write_report_or_say_why(rows, out)


def write_report_or_say_why(rows: list[dict], out: Path) -> int:
    """``report.md`` from the rows (impl/eval/report.py). The rows are done
    and on disk by now, so a report that cannot be rendered must not end the
    run in a traceback: ``report.md`` then says what failed and how to render
    it again from the same rows, and the command exits 1."""
    from unsee.impl.eval.report import write_report
    from unsee.impl.eval.run import ROWS_FILE

    try:
        path = write_report(rows, out)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the finished rows must not end in a traceback
        why = f"{type(exc).__name__}: {exc}"
        path = out / "report.md"
        path.write_text(f"# unsee eval\n\nThe report could not be rendered from the {len(rows)} rows in "
                        f"`{ROWS_FILE}` ({why}). The rows are complete; fix the cause and render it again "
                        f"with `unsee eval --out {out} --report-only`.\n", encoding="utf-8")
        print(f"unsee eval: the report could not be rendered ({why}); the {len(rows)} rows are kept in "
              f"{out / ROWS_FILE}; fix the cause and run: unsee eval --out {out} --report-only", file=sys.stderr)
        print(f"report   {path} (says why it is missing)")
        return Exit.FAILED
    print(f"report   {path}")
    return Exit.OK


def do_conform(args: argparse.Namespace) -> int:
    """``unsee conform [--episodes N | --episode FILE | --replay CASE | --vectors DIR | --suite-version X]
    [--baseline FILE [--strict]] -- CMD``: 0 conforms (or fails only as the baseline expects), 1 rejected,
    2 bad input (raised, named). Every run writes result.json and badge.svg."""
    from unsee.impl.conform.ci import get_replay_file, judge_run, run_conform
    from unsee.impl.conform.harness import make_implementation
    from unsee.impl.conform.report import parse_formats
    from unsee.impl.conform.result import read_baseline

    if args.write_vectors:
        from unsee.impl.conform.vectors import write_vectors

        written = write_vectors(Path(args.write_vectors), args.episodes, args.max_steps, args.seed)
        print(f"wrote {len(written)} vector case(s) to {args.write_vectors}")
        return Exit.OK
    reports = parse_formats(args.report) if args.report else ()
    vectors, manifest, version = get_conform_suite(args)
    baseline = read_baseline(Path(args.baseline), version) if args.baseline else None
    implementation = make_implementation(args.cmd, args.entry, args.timeout)
    out = Path(args.out)
    report_dir = Path(args.report_dir) if args.report_dir else (out if reports else None)
    if vectors is not None:
        from unsee.impl.conform.vectors import check_vectors

        run, mode = check_vectors(implementation, vectors, out, reports, report_dir), "vectors"
    else:
        episode = get_replay_file(args.replay) if args.replay else args.episode
        run = run_conform(implementation, out, examples=args.episodes, max_steps=args.max_steps, seed=args.seed,
                          max_failures=args.max_failures, episode=episode, reference=not args.no_reference,
                          reports=reports, report_dir=report_dir)
        mode = "search" if episode is None else "episode"
    verdict = judge_run(run, version, mode, report_dir or out, baseline, args.strict, vectors, manifest)
    print(run.describe())
    print(verdict.text)
    return Exit.OK if verdict.passed else Exit.FAILED


def get_conform_suite(args: argparse.Namespace) -> tuple[Path | None, dict | None, str]:
    """The vectors to check (``--vectors DIR``, or release ``--suite-version``'s),
    their manifest, and the suite version the run is judged by (a release
    folder's own; the latest for a search or a folder that names none)."""
    from unsee.impl.conform.answers import ConformanceInputError
    from unsee.impl.conform.suite import LATEST, get_suite_dir
    from unsee.impl.conform.vectors import read_manifest

    if not args.vectors and not args.suite_version:
        return None, None, LATEST
    vectors = Path(args.vectors) if args.vectors else get_suite_dir(args.suite_version)
    manifest = read_manifest(vectors)
    named = (manifest.get("suite") or {}).get("version")
    if args.suite_version and args.vectors and named != args.suite_version:
        raise ConformanceInputError(f"--vectors {vectors} is suite {named}, not --suite-version {args.suite_version}")
    return vectors, manifest, named or LATEST


__all__ = ["do_conform", "do_eval", "get_conform_suite", "get_eval_config", "get_eval_methods", "write_report_or_say_why"]
