"""Command line: ``unsee run EPISODE.json``, ``unsee demo``, the stored
sessions of docs/persistence.md (``unsee run EPISODE.json --store PATH``,
``unsee forget PATH --forget SOURCE_ID``, ``unsee show PATH``,
``unsee verify PATH [--receipt FILE] [--value V]``), ``unsee eval`` (the
paper's evaluation, docs/eval.md) and ``unsee conform -- CMD`` (another
implementation against the conformance contract, docs/conformance.md) and
``unsee calibrate`` (a draft-guard bound for a configuration, docs/drafts.md).

:func:`main` parses (impl/cli/parser.py), dispatches through
:data:`COMMANDS`, and maps errors to the exit codes of impl/cli/exits.py.
"""

from __future__ import annotations

import sys

from unsee.impl.agent.episode import EpisodeError
from unsee.impl.agent.provenance import UnknownSourceError
from unsee.impl.cli.calibrate import do_calibrate
from unsee.impl.cli.demo import do_demo
from unsee.impl.cli.evaluate import do_conform, do_eval
from unsee.impl.cli.exits import Exit
from unsee.impl.cli.parser import build_parser
from unsee.impl.cli.run import do_run
from unsee.impl.cli.serve import do_serve
from unsee.impl.cli.stored import do_forget, do_show, do_verify

#: Subcommand -> the function that runs it: ``(args) -> exit code``.
COMMANDS = {"run": do_run, "forget": do_forget, "show": do_show, "verify": do_verify, "demo": do_demo,
            "eval": do_eval, "conform": do_conform, "calibrate": do_calibrate,
            "serve": do_serve}


def get_busy_errors() -> tuple[type[Exception], ...]:
    """Errors meaning "the store is busy or changed under us": exit 75, retry later."""
    from unsee.impl.store.schema import StoreBusyError, StoreConflictError
    from unsee.impl.util.exclusive import SessionBusyError

    return (StoreBusyError, StoreConflictError, SessionBusyError)


def get_usage_errors() -> tuple[type[Exception], ...]:
    """Errors meaning bad input (exit 2); each message names the input. The engines' own
    are left out where they cannot import (``unsee conform`` runs without torch, and then no
    engine ran to raise them): bad input there must still exit 2, not end in a traceback."""
    errors: list[type[Exception]] = [EpisodeError, UnknownSourceError, ValueError]
    try:
        from unsee.impl.engines.llamacpp.engine import LlamaCppMissingError
        from unsee.impl.engines.vllm.adapter import VllmMissingError
    except ImportError:
        return tuple(errors)
    return (*errors, LlamaCppMissingError, VllmMissingError)


def main(argv: list[str] | None = None) -> int:
    """Run one ``unsee`` subcommand; its exit code (:class:`~unsee.impl.cli.exits.Exit`).
    Usage errors found by argparse exit 2 through ``SystemExit``."""
    args = build_parser().parse_args(argv)
    try:
        return int(COMMANDS[args.command](args))
    except get_busy_errors() as exc:
        print(f"unsee: {exc}", file=sys.stderr)
        return int(Exit.BUSY)
    except get_usage_errors() as exc:
        print(f"unsee: error: {exc}", file=sys.stderr)
        return int(Exit.USAGE)
    except KeyboardInterrupt:
        print("unsee: interrupted", file=sys.stderr)
        return int(Exit.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
