"""Subprocess side of tests/test_concurrency.py (imported by the zygote of
tests/store_child.py, not collected).

A race is a list of operations; each runs in its own forked child (a real
process with its own SQLite connections), all started together; the answer
is every child's exit status and result (JSON).

Operations (``{"op": ..., "pause": [POINT, SECONDS] | null, ...}``):

- ``step``: open the session as an agent process would, apply one user step
  and commit it; on a conflict, reload the newer state and apply the step
  again (the agent's retry policy, docs/persistence.md);
- ``forget``: ``unsee forget DB --forget SOURCE`` (which redoes the forget on a conflict);
- ``verify``: ``unsee verify DB``;
- ``hold``: take the store's write lock and keep it ``seconds`` (a writer that
  takes its time), to show a bounded wait ending in "busy".

``pause`` sleeps at a named point of impl/store/sqlite.py's ``HOOKS``: ``load:before``,
``commit:before``, ``commit:begin`` (holding the write lock), ``commit:end``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import sys
import time


def _arm(pause) -> None:
    from unsee.impl.store import sqlite as store

    if pause:
        point, seconds = pause
        store.HOOKS[point] = lambda: time.sleep(seconds)


def run_op(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    _arm(spec.get("pause"))
    db = spec["db"]
    if spec["op"] == "step":
        from unsee.impl.agent.episode import Item, Step
        from unsee.impl.engines.hf.engine import KVEngine
        from unsee.impl.engines.hf.models import load_model
        from unsee.impl.store.session import PersistentSession
        from unsee.impl.store.sqlite import StoreConflictError

        step = Step(spec["step"], "user", (Item(spec["step"], spec["text"]),))
        session = PersistentSession.open(db, KVEngine(load_model("tiny")))
        conflicts = 0
        while True:
            try:
                session.step(step)
                break
            except StoreConflictError:
                conflicts += 1  # the newer state wins; redo the step on it
                from unsee.impl.store import sqlite as store

                store.HOOKS.clear()
                session.reload()
        session.close()
        return {"code": 0, "conflicts": conflicts}
    if spec["op"] == "hold":
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(spec["seconds"])
        conn.execute("ROLLBACK")
        return {"code": 0}
    from unsee.impl.cli.main import main

    argv = (["forget", db, "--forget", spec["source"], "--json", "--wait", str(spec.get("wait", 10.0))]
            if spec["op"] == "forget" else ["verify", db, "--json"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    result = {"code": code, "stderr": err.getvalue()[-2000:]}
    if spec["op"] == "verify" and out.getvalue():
        result["outcome"] = json.loads(out.getvalue())["outcome"]
    if spec["op"] == "forget":
        result["conflicts"] = err.getvalue().count("conflict")
    return result


def race(ops: list[dict]) -> list[dict]:
    """Fork one child per operation, all at once; wait for all; their results."""
    children = []
    for i, spec in enumerate(ops):
        out_path = f"{spec['db']}.op{i}.json"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                time.sleep(spec.get("start", 0.0))
                began = time.perf_counter()
                result = run_op(spec) | {"wall_s": time.perf_counter() - began}
                code = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                result = {"code": -1, "error": repr(exc)}
            with open(out_path, "w") as f:
                json.dump(result, f)
            sys.stdout.flush()
            os._exit(code)
        children.append((pid, out_path))
    results = []
    for pid, out_path in children:
        _, status = os.waitpid(pid, 0)
        with open(out_path) as f:
            results.append(json.load(f) | {"exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None})
        os.unlink(out_path)
    return results


if __name__ == "__main__":
    raise SystemExit("imported by tests/store_child.py's zygote, which serves the races")
