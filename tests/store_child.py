"""Subprocess side of tests/test_store.py (run as a script, not collected).

Modes (argv[1]):

``resume DB EPISODE K [SOURCE]``
    Reopen the stored session ``DB`` in this fresh process, run the episode's
    steps from ``K`` on (0-based), forget ``SOURCE`` if given, and print one
    JSON line: the digest and the stored record's hash.

``trial DB SOURCE MODE ARG [--announce]``
    One crash trial in this fresh process: reopen ``DB`` and forget
    ``SOURCE`` with a kill armed by ``MODE``/``ARG`` (``ARG`` in JSON; see
    :func:`run_trial`); with ``--announce``, print ``open`` once the session
    is open, so that the parent can SIGKILL the forget at a random moment.

``zygote``
    Import torch and build the tiny model once, then serve crash trials read
    as JSON lines from stdin (a line holding a JSON *list* is a race of
    tests/test_concurrency.py instead, served by concurrency_child.py): each trial runs in a forked child (a real
    process, SIGKILLed for real) so that a trial costs the forget, not the
    ~3 s of importing torch. Answers one JSON line per trial on stdout.

Kill modes: ``none`` (no kill; writes statistics), ``time`` (the zygote
SIGKILLs the child ``ARG`` seconds after forking it), ``stmt`` (the child
SIGKILLs itself when the ``ARG``-th SQL statement of the forget's commit
starts, counted by ``sqlite3``'s trace callback), ``vm`` (at the ``ARG``-th
progress-handler call, every :data:`VM_STEP` virtual-machine instructions,
i.e. inside a statement), ``commit`` (``ARG`` = ``[n, delay]``: a timer
thread SIGKILLs the child ``delay`` seconds after the ``n``-th COMMIT or
VACUUM statement starts, i.e. during SQLite's journal and file I/O, which
runs with the GIL released).

A trial's ``weaken`` (tests/test_residue_window.py) turns one of the store's
residue defences off in the child only, to show what it is for:
``secure_delete`` (deleted content is not zeroed), ``vacuum`` (no compaction
after a forget), ``journal:<MODE>`` (another journal mode, e.g. ``PERSIST``
or ``WAL``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

VM_STEP = 25


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def weaken(what: str | None) -> None:
    """Turn one residue defence off in this (child) process."""
    import sqlite3

    from unsee.impl.store import sqlite as store

    if not what:
        return
    if what == "vacuum":
        original = store.SessionStore._scrub

        def no_vacuum(self):
            conn = self._conn
            try:
                self._conn = _SkipVacuum(conn)
                original(self)
            finally:
                self._conn = conn
        store.SessionStore._scrub = no_vacuum
        return
    pragmas = list(store.PRAGMAS)
    if what == "secure_delete":
        pragmas = [p.replace("secure_delete = ON", "secure_delete = OFF") for p in pragmas]
    elif what.startswith("journal:"):
        pragmas = [f"PRAGMA journal_mode = {what.split(':', 1)[1]}" if "journal_mode" in p else p for p in pragmas]
    else:
        raise SystemExit(f"unknown defence {what!r}")

    def weak_connect(path, readonly=False, busy_timeout=10.0):
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
        for pragma in pragmas:
            conn.execute(pragma)
        return conn
    store._connect = weak_connect


class _SkipVacuum:
    """A connection whose VACUUM does nothing (everything else passes through)."""

    def __init__(self, conn):
        self._conn = conn

    def execute(self, sql, *args):
        if sql.strip().upper() == "VACUUM":
            return None
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def run_trial(lm, db: str, source: str, mode: str, arg, stats_path: str | None = None,
              announce: bool = False, weakened: str | None = None) -> None:
    """Open ``db``, forget ``source`` under the armed kill; write statistics
    to ``stats_path`` when the forget completes (mode ``none``)."""
    from unsee.impl.engines.hf.engine import KVEngine
    from unsee.impl.store.session import PersistentSession

    weaken(weakened)

    session = PersistentSession.open(db, KVEngine(lm))
    if announce:  # the parent may now kill us at a moment of its choosing
        print("open", flush=True)
    conn = session.store._conn
    counts = {"stmt": 0, "vm": 0, "commits": 0}
    marks: list[dict] = []
    started = time.perf_counter()

    def trace(sql: str) -> None:
        counts["stmt"] += 1
        head = sql.strip().split(None, 1)[0].upper() if sql.strip() else ""
        marks.append({"n": counts["stmt"], "sql": head, "at": time.perf_counter() - started})
        if mode == "stmt" and counts["stmt"] == arg:
            _kill_self()
        if head in ("COMMIT", "VACUUM"):
            counts["commits"] += 1
            if mode == "commit" and counts["commits"] == arg[0]:
                threading.Timer(arg[1], _kill_self).start()

    def progress() -> int:
        counts["vm"] += 1
        if mode == "vm" and counts["vm"] == arg:
            _kill_self()
        return 0

    conn.set_trace_callback(trace)
    conn.set_progress_handler(progress, VM_STEP)
    report = session.forget(source)
    finished = time.perf_counter() - started
    conn.set_trace_callback(None)
    conn.set_progress_handler(None, 0)
    session.close()
    if stats_path:
        with open(stats_path, "w") as f:
            json.dump({"statements": counts["stmt"], "vm_calls": counts["vm"], "commits": counts["commits"],
                       "forget_s": finished, "marks": marks, "digest": report.digest}, f)


#: Torch's intra-op threads for every process of the store tests: the bits of
#: CPU kernels depend on the thread count (so a session resumes exactly only
#: with the same count, which SessionStore.load checks through the digest),
#: one thread is fork-safe, and it is fast on a loaded machine.
THREADS = 1


def _setup() -> None:
    import torch

    torch.set_num_threads(THREADS)


def _tiny():
    from unsee.impl.engines.hf.models import load_model

    return load_model("tiny")


def zygote() -> None:
    # Import everything, but run no torch op here, and only ever one thread:
    # a child forked after the parent started an OpenMP thread pool could
    # hang. Each child builds the tiny model itself (milliseconds).
    _setup()
    import concurrency_child  # (beside this script)

    import unsee.impl.cli.main
    import unsee.impl.engines.hf.models
    import unsee.impl.store.sqlite
    import unsee.impl.store.verify  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        spec = json.loads(line)
        if isinstance(spec, list):
            print(json.dumps(concurrency_child.race(spec)), flush=True)
            continue
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the trial: a real process of its own
            code = 0
            try:
                run_trial(_tiny(), spec["db"], spec["source"], spec["mode"], spec["arg"], spec.get("stats"),
                          weakened=spec.get("weaken"))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
                sys.stderr.write(f"trial failed: {exc!r}\n")
                code = 3
            sys.stdout.flush()
            os._exit(code)
        if spec["mode"] == "time":
            deadline = started + spec["arg"]
            while time.perf_counter() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(min(0.002, max(0.0, deadline - time.perf_counter())))
            else:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
        else:
            done, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        print(json.dumps({"killed": killed, "exit": code, "wall_s": time.perf_counter() - started}), flush=True)


def resume(db: str, episode_path: str, k: int, source: str | None) -> None:
    from unsee.impl.agent.episode import load_episode
    from unsee.impl.engines.hf.engine import KVEngine
    from unsee.impl.engines.hf.models import load_model
    from unsee.impl.store.session import PersistentSession

    _setup()
    episode = load_episode(episode_path)
    with PersistentSession.open(db, KVEngine(load_model("tiny"))) as session:
        session.run(episode.steps[k:])
        if source:
            session.forget(source)
        print(json.dumps({"digest": session.digest(), "record_hash": session.store.record_hash(),
                          "t": session.t}))


def main(argv: list[str]) -> None:
    mode = argv[1]
    if mode == "zygote":
        zygote()
    elif mode == "resume":
        resume(argv[2], argv[3], int(argv[4]), argv[5] if len(argv) > 5 else None)
    elif mode == "trial":
        _setup()
        run_trial(_tiny(), argv[2], argv[3], argv[4], json.loads(argv[5]), announce="--announce" in argv[6:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
