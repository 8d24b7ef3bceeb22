"""Several processes on one session store (issue 11, part 2; docs/persistence.md,
"Several processes").

Real processes (forked from tests/concurrency_child.py's zygote, each with its
own SQLite connections) race on one store, each run with a pause at a named
point inside an operation: before load, before commit, inside commit (holding
the write lock). Every run must end in the state of one serial order of the
same operations, with nothing lost: the final record equals that order's, the
forget log holds each forget once, and the store still verifies.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import settings

from unsee.impl.agent.episode import FORMAT, VERSION, Item, Step, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.registry import make_engine
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.sqlite import SessionStore, StoreConflictError
from unsee.impl.store.verify import VERIFIED, verify_store
from unsee.impl.util.exclusive import SessionBusyError

EPISODE = {
    "format": FORMAT, "version": VERSION, "system": "You are a helpful agent.", "settings": {"max_new_tokens": 3},
    "steps": [{"id": "u1", "kind": "user", "source": "z0", "text": "Ana paid for tea"},
              {"id": "f2", "kind": "tool", "tool": "fetch",
               "fields": [{"source": "z1", "text": "PIN 738215"}, {"source": "f2.b", "text": "room 12"}]},
              {"id": "u3", "kind": "user", "source": "z2", "text": "Quillmere Road 9"},
              {"id": "u4", "kind": "user", "text": "call Bob at 7"}],
}
STEP = {"op": "step", "step": "u9", "text": "jazz at 90"}
FORGET1 = {"op": "forget", "source": "z1"}
FORGET2 = {"op": "forget", "source": "z2"}
VERIFY = {"op": "verify"}

#: (label, operations, pause applied to operation i) -- every pause point on each side
RACES = [
    ("forget vs step", [FORGET1, STEP]),
    ("forget vs forget", [FORGET1, FORGET2]),
    ("forget vs verify", [FORGET1, VERIFY]),
]
POINTS = [("load:before", 0.4), ("commit:before", 0.8), ("commit:begin", 0.4)]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(lm, tmp_path_factory) -> Path:
    """A stored session that already forgot z0 (so it has a receipt to verify)."""
    path = tmp_path_factory.mktemp("base") / "base.db"
    runtime = AgentRuntime.from_episode(make_engine(lm), parse_episode(EPISODE))
    with PersistentSession.create(path, runtime) as session:
        session.forget("z0")
    return path


@pytest.fixture(scope="module")
def zygote(store_zygote):
    return store_zygote


def race(zygote, db: Path, ops: list[dict]) -> list[dict]:
    zygote.stdin.write(json.dumps([op | {"db": str(db)} for op in ops]) + "\n")
    zygote.stdin.flush()
    return json.loads(zygote.stdout.readline())


def serial(lm, base: Path, tmp: Path, ops: list[dict]) -> tuple[str, str]:
    """The record hash and forget log of ``ops`` applied one after another."""
    db = tmp / "serial.db"
    shutil.copy(base, db)
    with PersistentSession.open(db, make_engine(lm)) as session:
        for op in ops:
            if op["op"] == "step":
                session.step(Step(op["step"], "user", (Item(op["step"], op["text"]),)))
            elif op["op"] == "forget":
                session.forget(op["source"])
        result = session.store.record_hash(), json.dumps([r["sources"] for r in session.store.get_summary()["forgets"]])
    db.unlink()
    return result


def final(db: Path) -> tuple[str, str]:
    with SessionStore.open(db) as store:
        return store.record_hash(), json.dumps([r["sources"] for r in store.get_summary()["forgets"]])


def runs() -> list[tuple[str, list[dict], int, str, float]]:
    """Every race with every pause point. ``ci``: each point once, on
    alternating sides (9 runs); nightly: every point on each side, 16 times
    (288 runs)."""
    if settings().max_examples <= 100:
        return [(label, ops, k % 2, point, seconds) for label, ops in RACES
                for k, (point, seconds) in enumerate(POINTS)]
    repeat = settings().max_examples // 125
    return [(label, ops, side, point, seconds) for label, ops in RACES for side in range(len(ops))
            for point, seconds in POINTS for _ in range(repeat)]


def test_races_end_in_a_serial_order(lm, base, zygote, tmp_path):
    orders: dict[str, dict] = {}
    conflicts, landed = 0, {}
    for n, (label, ops, side, point, seconds) in enumerate(runs()):
        if label not in orders:  # both serial orders of the same operations (verify changes nothing)
            writes = [op for op in ops if op["op"] != "verify"]
            orders[label] = {serial(lm, base, tmp_path, writes): "as listed",
                             serial(lm, base, tmp_path, writes[::-1]): "reversed"}
        db = tmp_path / f"race{n}.db"
        shutil.copy(base, db)
        paused = [dict(op, pause=[point, seconds]) if i == side else dict(op, start=0.05) for i, op in enumerate(ops)]
        results = race(zygote, db, paused)
        where = f"{label}, pause {point} {seconds} s on {ops[side]['op']}"
        for op, result in zip(ops, results):
            assert result["exit"] == 0 and result["code"] == 0, f"{where}: {op['op']} {result}"
            conflicts += result.get("conflicts", 0)
            if op["op"] == "verify":
                assert result["outcome"] == VERIFIED, f"{where}: {result}"
        state = final(db)
        assert state in orders[label], f"{where}: the final store is no serial order of the operations"
        landed.setdefault(label, set()).add(orders[label][state])
        assert verify_store(db).outcome == VERIFIED, where
        db.unlink()
    print(f"races: {len(runs())} runs, {conflicts} conflicts resolved by retry; orders {landed}")
    assert conflicts > 0  # the compare-and-swap path really ran
    assert landed["forget vs step"] == {"as listed", "reversed"}  # both orders occurred


def test_a_writer_holding_the_store_makes_forget_busy(base, zygote, tmp_path):
    """A forget waits a bounded time (--wait) for another process's write
    lock, then says it is busy (exit 75) and changes nothing."""
    db = tmp_path / "busy.db"
    shutil.copy(base, db)
    before = final(db), db.read_bytes()
    hold, forget = race(zygote, db, [{"op": "hold", "seconds": 5.0},
                                     dict(FORGET1, wait=0.5, start=0.3)])
    assert hold["code"] == 0 and forget["code"] == 75, forget
    assert forget["wall_s"] < 5.0 - 0.3  # it gave up while the lock was still held
    assert "busy" in forget["stderr"] and "retry later" in forget["stderr"]
    assert (final(db), db.read_bytes()) == before


def test_conflict_drops_the_losers_state(lm, base, tmp_path):
    """In one process, two sessions on one file: the second commit loses,
    keeps nothing of its state, and the newer one is kept."""
    db = tmp_path / "s.db"
    shutil.copy(base, db)
    first = PersistentSession.open(db, make_engine(lm))
    second = PersistentSession.open(db, make_engine(lm))
    first.forget("z1")
    newer = first.store.record_hash()
    engine = second.runtime.engine
    with pytest.raises(StoreConflictError, match="conflict: another process committed generation 3"):
        second.step(Step("u9", "user", (Item("u9", "jazz"),)))
    assert second.runtime is None and engine.budget.lineages == ()  # the loser's caches are gone
    with pytest.raises(StoreConflictError, match="reload"):
        second.digest()
    assert SessionStore.open(db).record_hash() == newer
    second.reload()
    second.step(Step("u9", "user", (Item("u9", "jazz"),)))  # redone on the newer state
    assert second.runtime.forgotten == ["z0", "z1"] and second.t == 5
    first.close()
    second.close()


# --- threads on one runtime ------------------------------------------------------


class WatchedRuntime(AgentRuntime):
    """Says when a transition starts (once ``entered`` is set)."""

    entered: threading.Event | None = None

    def _observe(self, step: Step) -> str:
        if self.entered is not None:
            self.entered.set()
        return super()._observe(step)


def watched(lm) -> WatchedRuntime:
    runtime = WatchedRuntime.from_episode(make_engine(lm), parse_episode(EPISODE))
    runtime.entered = threading.Event()
    return runtime


NEXT = Step("u9", "user", (Item("u9", "jazz at 90"),))


def test_run_waits_while_another_thread_holds_the_session(lm):
    """``run`` on one thread while another holds the session (a save's
    snapshot, a forget) waits: it does not step because *some* thread holds
    the lock. (It did: ``run`` stepped unlocked whenever the lock was held.)"""
    runtime = watched(lm)
    before = runtime.state
    runner = threading.Thread(target=runtime.run, args=([NEXT],))
    with runtime.hold("save"):
        runner.start()
        assert not runtime.entered.wait(1.0), "run stepped while another thread held the session"
        assert runtime.state is before
    runner.join(60)
    assert not runner.is_alive() and runtime.t == before.t + 1 and runtime.steps[-1] == NEXT


def test_the_holder_steps_again_and_others_are_refused(lm):
    """The lock is re-entrant for its owner only: inside its own hold a thread
    steps (without waiting), while another thread's step is refused naming
    the outermost operation."""
    runtime = watched(lm)
    refused: list[str] = []

    def attempt() -> None:
        try:
            runtime.step(Step("u10", "user", (Item("u10", "late"),)), wait=False)
        except SessionBusyError as exc:
            refused.append(str(exc))

    with runtime.hold("save"):
        runtime.step(NEXT, wait=False)
        other = threading.Thread(target=attempt)
        other.start()
        other.join(60)
    assert runtime.steps[-1] == NEXT and len(refused) == 1 and "'save' is still running" in refused[0]
    runtime.step(Step("u10", "user", (Item("u10", "late"),)), wait=False)  # released on leaving the hold
    assert runtime.t == 6
