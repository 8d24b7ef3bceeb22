"""The stored-session subcommands of docs/persistence.md: ``unsee forget``,
``unsee show`` and ``unsee verify``. Each rebuilds the engine and model the
store records (impl/store/backend.py: the backend, the model and the options
its bits depend on), through the registry; an ``--engine``/``--model``/
``--dtype`` given must match the store's (checked before any model loads)."""

from __future__ import annotations

import argparse
import json
import sys

from unsee.impl.cli.exits import Exit
from unsee.impl.cli.run import describe_drafts, describe_restore
from unsee.impl.util.progress import progress_bar

#: How often `unsee forget` redoes a forget that lost a commit race.
RETRIES = 3


def open_stored(args: argparse.Namespace):
    """The store, after checking ``--engine``/``--model``/``--dtype`` against it (before any model loads)."""
    from unsee.impl.store.sqlite import SessionStore

    store = SessionStore.open(args.store, busy_timeout=getattr(args, "wait", 10.0))
    try:
        check_stored_options(args, store.get_meta())
    except BaseException:
        store.close()
        raise
    return store


def check_stored_options(args: argparse.Namespace, meta: dict[str, str]) -> None:
    """An ``--engine``, ``--model`` or ``--dtype`` given must be the store's
    (``--model`` may name the model as loaded or as the store loads it, e.g.
    ``tiny`` for llama.cpp's ``tiny-gguf``); a StoreError names the option."""
    from unsee.impl.store.backend import read_stored_engine
    from unsee.impl.store.schema import StoreError

    stored = read_stored_engine(meta, args.store)
    allowed = {"engine": (stored.backend,), "model": (meta["model"], stored.model), "dtype": (meta["dtype"],)}
    for option, values in allowed.items():
        given = getattr(args, option, None)
        if given is not None and given not in values:
            raise StoreError(f"{args.store}: the session was created with {option} {values[-1]!r}, not {given!r}; "
                             f"run with --{option} {values[-1]} (or leave --{option} out)")


def use_stored_threads(meta: dict[str, str]) -> None:
    """Compute with the torch thread count the store recorded: a transformers session's bits on
    the CPU depend on it (docs/engines.md), so a process that continues a session (this one
    exists for nothing else) takes the count it was written with, as ``unsee verify`` does.
    Without it a session written by a one-thread process is refused on a machine where two
    threads round differently (seen on an AMD EPYC: tests/test_removal.py)."""
    import torch

    from unsee.impl.store.backend import read_stored_engine

    threads = meta.get("threads", "")
    if read_stored_engine(meta).backend == "transformers" and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def get_forget_source(args: argparse.Namespace) -> str:
    """The source ``unsee forget`` forgets: ``--forget SOURCE_ID``, or the old
    positional ``SOURCE_ID`` (a notice names the new spelling)."""
    if args.source is not None:
        print("unsee: `unsee forget PATH SOURCE_ID` is deprecated; use `unsee forget PATH --forget SOURCE_ID`",
              file=sys.stderr)
        if args.forget is not None and args.forget != args.source:
            raise ValueError(f"two sources to forget: --forget {args.forget!r} and {args.source!r}; give one")
    source = args.forget if args.forget is not None else args.source
    if source is None:
        raise ValueError("unsee forget: no source to forget; give --forget SOURCE_ID")
    return source


def do_forget(args: argparse.Namespace) -> int:
    """``unsee forget PATH --forget SOURCE_ID``: reopen, forget, commit atomically, report."""
    source = get_forget_source(args)
    store = open_stored(args)
    try:
        report = forget_with_retries(store, source, args.device, not args.json)
        receipt = store.last_receipt
    finally:
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
        return Exit.OK
    print_forget_report(report, source, args.store)
    if receipt is not None and args.receipt:
        print(f"receipt  {args.receipt}")
    return Exit.OK


def forget_with_retries(store, source: str, device: str, progress: bool):
    """Forget ``source`` in ``store``'s session and commit; its ForgetReport.

    A conflict means another process committed while this one replayed: the
    forget is redone on the newer state (it still has to happen there); the
    loser's state, which may hold the value, was dropped by the session."""
    from unsee.impl.store.backend import load_stored_engine
    from unsee.impl.store.schema import StoreConflictError
    from unsee.impl.store.session import PersistentSession

    engine = None
    for attempt in range(1, RETRIES + 1):
        try:
            if engine is None:  # the engine the store records, rebuilt through the registry
                use_stored_threads(store.get_meta())
                engine = load_stored_engine(store.get_meta(), device, path=store.path)
            session = PersistentSession(store, store.load(engine))
            return session.forget(source, progress_bar("forget", progress))
        except StoreConflictError as exc:
            if attempt == RETRIES:
                raise
            print(f"unsee: {exc}; retrying on the newer state ({attempt}/{RETRIES - 1})", file=sys.stderr)
    raise AssertionError("unreachable: the last attempt returns or raises")


def print_forget_report(report, source: str, path: str) -> None:
    """``unsee forget``'s text report."""
    if report.already_forgotten:
        print(f"source   {source!r} was already forgotten: nothing to do, the session is unchanged")
    else:
        print(f"forgot   {source!r} in {path} (committed atomically)")
        print(f"tau      {report.tau}   restored checkpoint at boundary {report.boundary}")
        print(f"closure  {len(report.closure)} blocks")
        print(f"cost     {report.invocations} transitions (T - boundary = {report.expected_invocations}), "
              f"{report.prefilled_tokens} prefilled + {report.decoded_tokens} decoded tokens, "
              f"{report.wall_s:.2f} s")
        print(f"drafts   {describe_drafts(report.drafts.to_json())}")
        restore = report.extra.restore.to_json() if report.extra.restore is not None else None
        if describe_restore(restore):
            print(f"restore  {describe_restore(restore)}")
    print(f"T        {report.length}")
    print(f"digest   {report.digest}")


def do_verify(args: argparse.Namespace) -> int:
    """``unsee verify PATH [--receipt FILE] [--value V]``: 0 verified, 1 a check
    failed, 3 cannot verify here."""
    from unsee.impl.store.verify import CANNOT, VERIFIED, verify_store

    receipt = None
    if args.receipt:
        try:
            with open(args.receipt, "rb") as f:
                receipt = f.read()
        except OSError as exc:
            raise ValueError(f"{args.receipt}: cannot read the receipt ({exc.strerror})") from None
    if args.engine is not None:  # given, it must be the store's engine (checked before reading stdin)
        check_verify_engine(args)
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
    return Exit.OK if verdict.outcome == VERIFIED else Exit.CANNOT_VERIFY if verdict.outcome == CANNOT else Exit.FAILED


def check_verify_engine(args: argparse.Namespace) -> None:
    """``unsee verify --engine E``: E must be the engine the store records
    (read from a read-only open, as verify reads; a StoreError otherwise). A
    store that does not open is left to verify, which names why."""
    from unsee.impl.store.schema import StoreError
    from unsee.impl.store.sqlite import SessionStore

    try:
        store = SessionStore.open(args.store, readonly=True)
    except StoreError:
        return
    with store:
        check_stored_options(args, store.get_meta())


def do_show(args: argparse.Namespace) -> int:
    """``unsee show PATH [--model M]``: the stored session's summary; with
    ``--model``, rebuilt on that model and its digest checked."""
    from unsee.impl.store.backend import load_stored_engine

    store = open_stored(args)
    try:
        summary = store.get_summary()
        if args.model is not None:  # rebuild on the named model (the store's): the digest must match
            use_stored_threads(store.get_meta())
            engine = load_stored_engine(store.get_meta(), args.device, path=store.path)
            summary["verified"] = store.load(engine).digest() == summary["digest"]
    finally:
        store.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return Exit.OK
    print(f"session  {summary['path']} ({summary['runtime']}, schema {summary['schema_version']})")
    print(f"model    {summary['model']} ({summary['dtype']}) on the {summary['backend']} engine")
    print(f"T        {summary['T']} steps, {summary['transitions']} transitions run")
    print(f"digest   {summary['digest']}" + ("   (verified by rebuild)" if summary.get("verified") else ""))
    print(f"forgot   {', '.join(summary['forgotten']) or '-'}")
    print(f"sources  {', '.join(summary['sources']) or '-'}")
    print(f"ckpts    {len(summary['checkpoints'])} at boundaries "
          f"{', '.join(str(c['boundary']) for c in summary['checkpoints'])}")
    return Exit.OK


__all__ = ["RETRIES", "check_stored_options", "check_verify_engine", "do_forget", "do_show", "do_verify",
           "forget_with_retries", "get_forget_source", "open_stored"]
