"""Persisted sessions (impl/store/, docs/persistence.md): resume, crash-atomic
forget under real SIGKILLs, zero residue, bad input, the CLI.

Every test runs torch on one thread (the ``lm`` fixture): the bits of CPU
kernels depend on the thread count, and the subprocesses of the resume and
crash tests (tests/store_child.py) use one thread too, so all of them compute
the same digests. It is also much faster on a loaded machine.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings

from unsee.impl.agent.episode import EpisodeError, Item, Step, load_episode, parse_episode
from unsee.impl.agent.provenance import UnknownSourceError
from unsee.impl.agent.runtime import AgentRuntime, AmbiguousTargetError, TargetNotFoundError
from unsee.impl.cli.main import main as cli_main
from unsee.impl.engines.registry import make_engine
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.sqlite import (
    SCHEMA_VERSION,
    SessionStore,
    StoreError,
    find_residue,
    record_hash,
    session_files,
)
from unsee.impl.util.exclusive import SessionBusyError
from unsee.properties.engines import get_model

CHILD = Path(__file__).with_name("store_child.py")
SECRET = "738215 Quillmere Road"
TARGET = "notes.address"

EPISODE = {
    "format": "unsee.episode", "version": 1,
    "system": "You are a careful assistant.",
    "settings": {"max_new_tokens": 4, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [
        {"id": "u1", "kind": "user", "text": "Hello, I am Dana."},
        {"id": "f2", "kind": "tool", "tool": "fetch_notes",
         "fields": [{"source": TARGET, "text": f"Dana lives at {SECRET}."},
                    {"source": "notes.pet", "text": "Dana has a cat."}]},
        {"id": "m3", "kind": "memory", "records": [{"source": "m.pref", "text": "Dana likes jazz."}]},
        {"id": "r4", "kind": "remember"},
        {"id": "c5", "kind": "compact"},
        {"id": "u6", "kind": "user", "text": "What should I cook?"},
        {"id": "s7", "kind": "session"},
        {"id": "p8", "kind": "plan", "tool": "send_message", "text": "Send Sam the plan."},
        {"id": "u9", "kind": "user", "text": "Thanks."},
    ],
    # the value is for the audits of this test, never handed to the store
    "target": {"source": TARGET, "value": SECRET},
}


def episode_with(**settings_) -> dict:
    raw = json.loads(json.dumps(EPISODE))
    raw["settings"].update(settings_)
    return raw


def run(lm, raw: dict, steps: int | None = None) -> AgentRuntime:
    episode = parse_episode(raw)
    runtime = AgentRuntime.start(make_engine(lm), episode.system, episode.settings)
    runtime.run(episode.steps[:steps])
    return runtime


def file_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in session_files(path))


def loaded(lm, path: Path) -> tuple[str, str]:
    """(record hash, digest after a load on a fresh engine) of a store."""
    with SessionStore.open(path) as store:
        return store.record_hash(), store.load(make_engine(lm)).digest()


def budget(fraction: float, floor: int) -> int:
    """A count scaled from the Hypothesis profile (ci 60 examples, nightly 2000)."""
    return max(floor, int(settings().max_examples * fraction))


# --- the store round-trips the session ---------------------------------------------


def test_schema_and_round_trip(lm, tmp_path):
    runtime = run(lm, EPISODE)
    path = tmp_path / "s.db"
    with SessionStore.create(path, runtime) as store:
        meta = store.get_meta()
        assert (meta["format"], meta["schema_version"], meta["model"], meta["runtime"]) == (
            "unsee.session", str(SCHEMA_VERSION), "tiny", "AgentRuntime")
        assert store.integrity_check() == "ok"
        assert store.record_hash() == record_hash(runtime.get_session_record())
        assert store.stored_digest() == runtime.digest()
        again = store.load(make_engine(lm))
        again.check_invariants()
        assert again.digest() == runtime.digest()
        assert record_hash(again.get_session_record()) == store.record_hash()
        summary = store.get_summary()
        assert summary["T"] == len(EPISODE["steps"]) and summary["forgotten"] == []
        assert [c["boundary"] for c in summary["checkpoints"]] == list(range(len(EPISODE["steps"])))
    assert os.stat(path).st_mode & 0o777 == 0o600  # the session's data is private
    assert session_files(path) == [path]  # no journal left, never a WAL


def test_odd_strings_round_trip(lm, tmp_path):
    """Lone surrogates (valid JSON escapes), NUL, emoji and RTL text survive the store."""
    odd = "a\x00b \ud800 \U0001f600 \u05e9\u05dc\u05d5\u05dd"
    raw = {"format": "unsee.episode", "version": 1, "system": f"sys {odd}", "settings": {"max_new_tokens": 2},
           "steps": [{"id": f"u{odd}", "kind": "user", "text": odd},
                     {"id": "m", "kind": "memory", "records": [{"source": odd, "text": odd}]}]}
    runtime = run(lm, raw)
    path = tmp_path / "odd.db"
    with PersistentSession.create(path, runtime) as session:
        session.forget(odd)
        assert session.store.record_hash() == record_hash(session.runtime.get_session_record())
        assert session.store.load(make_engine(lm)).digest() == session.digest()
        assert session.store.get_summary()["forgotten"] == [odd]


# --- resume ----------------------------------------------------------------------------


def uninterrupted(lm, raw: dict) -> tuple[str, str]:
    runtime = run(lm, raw)
    runtime.forget(TARGET)
    return runtime.digest(), record_hash(runtime.get_session_record())


@pytest.mark.parametrize("k", [0, 2, 5, 9])
def test_resume_in_process(lm, tmp_path, k):
    """Run k steps, save, reopen on a fresh engine, continue and forget: the
    same digest and the same record as the uninterrupted run."""
    expected = uninterrupted(lm, EPISODE)
    path = tmp_path / "s.db"
    PersistentSession.create(path, run(lm, EPISODE, k)).close()
    with PersistentSession.open(path, make_engine(lm)) as session:
        session.run(parse_episode(EPISODE).steps[k:])
        # and once more in the middle of the rest, across another reopen
        assert loaded(lm, path)[1] == session.digest()
    with PersistentSession.open(path, make_engine(lm)) as session:
        report = session.forget(TARGET)
        assert report.invocations == report.expected_invocations == len(EPISODE["steps"]) - 1
        assert (session.digest(), session.store.record_hash()) == expected
    assert loaded(lm, path) == (expected[1], expected[0])


def test_resume_in_a_subprocess(lm, tmp_path):
    """The same across processes, with sampling (A1 with a fixed seed per transition)."""
    raw = episode_with(temperature=0.7, seed=11)
    expected = uninterrupted(lm, raw)
    episode_path = tmp_path / "episode.json"
    episode_path.write_text(json.dumps(raw))
    k = 4
    path = tmp_path / "s.db"
    PersistentSession.create(path, run(lm, raw, k)).close()
    started = time.perf_counter()
    out = subprocess.run([sys.executable, str(CHILD), "resume", str(path), str(episode_path), str(k), TARGET],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"resume in a subprocess: {time.perf_counter() - started:.1f} s")
    assert (child["digest"], child["record_hash"]) == expected
    assert loaded(lm, path) == (expected[1], expected[0])


# --- crash-atomic forget ----------------------------------------------------------------


class Zygote:
    """tests/store_child.py in zygote mode (the session's, tests/conftest.py):
    forks one real process per trial."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def trial(self, db: Path, mode: str, arg, stats: Path | None = None) -> dict:
        spec = {"db": str(db), "source": TARGET, "mode": mode, "arg": arg, "stats": str(stats) if stats else None}
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        pass  # the session fixture ends it


def draw_trials(rng: random.Random, n: int, stats: dict) -> list[tuple[str, object]]:
    """Crash points: every mode gets a share; statement kills cover the commit's
    statements, VM kills land inside statements, commit kills inside SQLite's
    journal and file I/O, time kills anywhere in the whole forget."""
    statements, vm_calls, commits = stats["statements"], stats["vm_calls"], stats["commits"]
    span = stats["wall_s"]
    # the statements around each transaction boundary first (BEGIN, COMMIT, VACUUM and the next one)
    edges = sorted({k for m in stats["marks"] if m["sql"] in ("BEGIN", "COMMIT", "VACUUM")
                    for k in (m["n"], m["n"] + 1) if k <= statements})
    # then every other statement boundary, in order (nightly reaches them all)
    edges += [k for k in range(1, statements + 1) if k not in edges]
    trials = []
    for i in range(n):
        mode = ("stmt", "commit", "time", "vm")[i % 4]
        if mode == "stmt":
            trials.append((mode, edges.pop(0) if edges else rng.randint(1, statements)))
        elif mode == "vm":
            trials.append((mode, rng.randint(1, max(1, vm_calls))))
        elif mode == "commit":
            trials.append((mode, [rng.randint(1, commits), rng.uniform(0, 0.004)]))
        else:
            trials.append((mode, rng.uniform(0, 1.1 * span)))
    return trials


def test_forget_is_atomic_under_sigkill(lm, tmp_path, store_zygote):
    """SIGKILL a forget at many points; every reopened store is wholly the old
    session or wholly the new one, and a new one holds no residue."""
    started = time.perf_counter()
    runtime = run(lm, EPISODE)
    old = tmp_path / "old.db"
    SessionStore.create(old, runtime).close()
    twin = runtime.fork()
    twin.forget(TARGET)
    old_record, old_digest = loaded(lm, old)
    assert old_digest == runtime.digest()

    zygote = Zygote(store_zygote)
    try:
        new = tmp_path / "new.db"
        shutil.copy(old, new)
        stats_path = tmp_path / "stats.json"
        reference = zygote.trial(new, "none", None, stats_path)
        assert reference == {**reference, "killed": False, "exit": 0}
        stats = json.loads(stats_path.read_text()) | {"wall_s": reference["wall_s"]}
        new_record, new_digest = loaded(lm, new)
        assert new_digest == twin.digest() == stats["digest"]  # the child's forget is this process's
        assert new_record == record_hash(twin.get_session_record())
        assert new_record != old_record

        rng = random.Random(0 if settings().derandomize else None)
        n = min(budget(1.25, 24), 1100)  # ci: 75 crash points; nightly: 1100 (+ 2 fresh processes)
        outcomes = {"old": 0, "new": 0, "killed": 0, "modes": {}}

        def check(db: Path, label: str) -> str:
            before_open = [p for p in session_files(db)]
            residue_before = find_residue(before_open, SECRET, lm.encode)
            store = SessionStore.open(db)  # rolls a hot journal back, finishes a compaction
            try:
                assert store.integrity_check() == "ok", label
                record = store.record_hash()
                assert record in (old_record, new_record), f"{label}: a store that is neither old nor new"
                digest = store.load(make_engine(lm)).digest()  # load also checks the stored digest
                summary = store.get_summary()
            finally:
                store.close()
            assert session_files(db) == [db], f"{label}: {session_files(db)}"
            if record == new_record:
                assert digest == new_digest and summary["forgotten"] == [TARGET], label
                assert residue_before == [], f"{label}: {residue_before}"
                assert find_residue([db], SECRET, lm.encode) == [], label
                outcomes["new"] += 1
                return "new"
            assert digest == old_digest and summary["forgotten"] == [], label
            outcomes["old"] += 1
            return "old"

        for i, (mode, arg) in enumerate(draw_trials(rng, n, stats)):
            db = tmp_path / f"trial{i}.db"
            shutil.copy(old, db)
            result = zygote.trial(db, mode, arg)
            assert result["killed"] or result["exit"] == 0, f"trial {i} ({mode} {arg}) failed: {result}"
            outcomes["killed"] += result["killed"]
            landed = check(db, f"trial {i} ({mode} {arg})")
            split = outcomes["modes"].setdefault(mode, {"old": 0, "new": 0})
            split[landed] += 1
            db.unlink()
    finally:
        zygote.close()

    # Two trials in fresh processes (no fork): a statement kill and a kill
    # from outside at a random moment of the forget.
    for mode in ("stmt", "time"):
        db = tmp_path / f"fresh-{mode}.db"
        shutil.copy(old, db)
        arg = rng.randint(1, stats["statements"]) if mode == "stmt" else "null"
        child = subprocess.Popen([sys.executable, str(CHILD), "trial", str(db), TARGET,
                                  "stmt" if mode == "stmt" else "none", json.dumps(arg), "--announce"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "open"
        if mode == "time":
            time.sleep(rng.uniform(0, stats["forget_s"]))
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=120)
        outcomes["killed"] += child.returncode == -signal.SIGKILL
        outcomes["modes"][f"fresh-{mode}"] = check(db, f"fresh process ({mode} {arg})")
        n += 1
    print(f"crash points tried: {n} ({outcomes['killed']} killed; landed old {outcomes['old']}, "
          f"new {outcomes['new']}); modes {outcomes['modes']}; {time.perf_counter() - started:.1f} s")
    assert outcomes["old"] + outcomes["new"] == n
    assert outcomes["old"] > 0 and outcomes["new"] > 0


# --- zero residue ---------------------------------------------------------------------------


def test_zero_residue_after_forget(lm, tmp_path):
    runtime = run(lm, EPISODE)
    path = tmp_path / "s.db"
    with PersistentSession.create(path, runtime) as session:
        assert find_residue([path], SECRET, lm.encode)  # the scan sees the value while it is there
        session.forget(TARGET)
        record = session.store.read_record()
    assert find_residue(session_files(path), SECRET, lm.encode) == []
    # the observation at tau holds its sanitized form, the rest verbatim
    f2 = next(s for s in record["steps"] if s["id"] == "f2")
    assert f2["items"] == [{"source": "notes.pet", "text": "Dana has a cat."}]
    block = next(b for b in record["blocks"] if b["id"] == "f2")
    assert "Dana has a cat." in block["text"] and "Quillmere" not in block["text"]
    # the token ids of the value form no contiguous run in any stored block
    needle = lm.encode(SECRET)
    for b in record["blocks"]:
        tokens = b["tokens"]
        assert not any(tokens[i:i + len(needle)] == needle for i in range(len(tokens) - len(needle) + 1)), b["id"]


def test_residue_scan_detects_an_unprotected_store(lm, tmp_path, monkeypatch):
    """Negative control: without secure_delete and VACUUM, SQLite keeps the
    forgotten rows in free pages, and the scan finds them."""
    import sqlite3

    import unsee.impl.store.sqlite as store_module

    raw = json.loads(json.dumps(EPISODE))
    raw["steps"][1]["fields"][0]["text"] += " Padding." * 400  # big enough to free whole pages
    runtime = run(lm, raw, 3)

    def plain_connect(path, *args, **kwargs):
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA secure_delete = OFF")  # some builds default to ON
        return conn

    monkeypatch.setattr(store_module, "_connect", plain_connect)
    monkeypatch.setattr(store_module.SessionStore, "_scrub", lambda self: None)
    path = tmp_path / "plain.db"
    with PersistentSession.create(path, runtime) as session:
        session.forget(TARGET)
    assert find_residue([path], SECRET, lm.encode) != []


# --- bad input -----------------------------------------------------------------------------


@pytest.fixture()
def stored(lm, tmp_path):
    path = tmp_path / "s.db"
    session = PersistentSession.create(path, run(lm, EPISODE, 6))
    yield session
    session.close()


def assert_unchanged(session: PersistentSession, digest: str, record: str, raw: bytes) -> None:
    assert session.digest() == digest
    assert session.store.record_hash() == record
    assert file_bytes(session.store.path) == raw


def test_bad_requests_change_nothing(stored):
    session = stored
    state = (session.digest(), session.store.record_hash(), file_bytes(session.store.path))
    with pytest.raises(UnknownSourceError, match="no-such-source"):
        session.forget("no-such-source")
    assert_unchanged(session, *state)
    with pytest.raises(UnknownSourceError, match="nope"):
        session.forget_many(["notes.pet", "nope"])  # one bad id: nothing forgotten
    assert_unchanged(session, *state)
    with pytest.raises(TargetNotFoundError, match="never read"):
        session.forget_value("an address nobody gave")
    assert_unchanged(session, *state)
    with pytest.raises(AmbiguousTargetError, match=r"several sources \['u1', 'notes.address', 'notes.pet'"):
        session.forget_value("Dana")
    assert_unchanged(session, *state)
    with pytest.raises(ValueError, match="letters or digits"):
        session.forget_value("!!")
    assert_unchanged(session, *state)
    with pytest.raises(ValueError, match="at least one source"):
        session.forget_many([])
    assert_unchanged(session, *state)
    with pytest.raises(ValueError, match="already observed"):
        session.step(Step("u1", "user", (Item("u1", "again"),)))
    assert_unchanged(session, *state)


def test_second_forget_is_a_noop(stored):
    session = stored
    first = session.forget(TARGET)
    assert not first.already_forgotten
    state = (session.digest(), session.store.record_hash(), file_bytes(session.store.path))
    again = session.forget(TARGET)
    assert again.already_forgotten and again.invocations == 0 and again.digest == first.digest
    assert_unchanged(session, *state)
    assert [f["sources"] for f in session.store.get_summary()["forgets"]] == [[TARGET]]


def test_forget_by_value(stored):
    report = stored.forget_value("738215 quillmere road")  # normalised match, one source
    assert report.source_id == TARGET
    assert stored.store.get_summary()["forgotten"] == [TARGET]


class GatedRuntime(AgentRuntime):
    """A runtime whose user steps wait on a gate (to hold a step running)."""

    entered: threading.Event
    gate: threading.Event

    def _observe(self, step):
        if getattr(self, "gate", None) is not None and step.id == "slow":
            self.entered.set()
            assert self.gate.wait(60)
        return super()._observe(step)


def test_forget_during_a_running_step(lm, tmp_path):
    episode = parse_episode(EPISODE)
    runtime = GatedRuntime.start(make_engine(lm), episode.system, episode.settings)
    runtime.run(episode.steps[:3])
    path = tmp_path / "s.db"
    session = PersistentSession.create(path, runtime)
    runtime.entered, runtime.gate = threading.Event(), threading.Event()
    stored_record, stored_bytes = session.store.record_hash(), file_bytes(path)
    stepper = threading.Thread(target=session.step, args=(Step("slow", "user", (Item("slow", "Hi again."),)),))
    stepper.start()
    assert runtime.entered.wait(60)
    with pytest.raises(SessionBusyError, match="step slow"):
        session.forget(TARGET, wait=False)
    with pytest.raises(SessionBusyError):
        session.runtime.forget(TARGET, wait=False)  # the runtime itself refuses too
    assert session.store.record_hash() == stored_record and file_bytes(path) == stored_bytes
    reports = []
    waiter = threading.Thread(target=lambda: reports.append(session.forget(TARGET, wait=True)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive() and not reports  # waiting for the step
    runtime.gate.set()
    stepper.join(60)
    waiter.join(60)
    assert reports and reports[0].length == 4  # it ran after the step committed
    record = session.store.read_record()
    assert [s["id"] for s in record["steps"]] == ["u1", "f2", "m3", "slow"]
    assert record["forgotten"] == [TARGET]
    session.close()


def test_malformed_episode_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**EPISODE, "version": 5}))
    with pytest.raises(EpisodeError, match="unsupported version 5"):
        load_episode(bad)
    bad.write_text("{not json")
    with pytest.raises(EpisodeError, match="not valid JSON"):
        load_episode(bad)
    bad.write_text(json.dumps({**EPISODE, "steps": [{"id": "x", "kind": "dance"}]}))
    with pytest.raises(EpisodeError, match="unknown kind 'dance'"):
        load_episode(bad)


def test_store_errors(lm, tmp_path, stored, engine_factory):
    with pytest.raises(StoreError, match="no such session store"):
        SessionStore.open(tmp_path / "missing.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a session store"):
        SessionStore.open(junk)
    with pytest.raises(StoreError, match="already exists"):
        SessionStore.create(stored.store.path, stored.runtime)
    # another schema version
    other = tmp_path / "other.db"
    shutil.copy(stored.store.path, other)
    with SessionStore.open(other) as store:
        store._conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="unsupported schema version '99'"):
        SessionStore.open(other)
    # another model (dtype) and another runtime class
    with pytest.raises(StoreError, match="created with model 'tiny'"):
        stored.store.load(engine_factory("tiny", dtype="bfloat16"))
    with pytest.raises(StoreError, match="is a AgentRuntime, not a GatedRuntime"):
        stored.store.load(make_engine(lm), GatedRuntime)
    # a stored state that no longer rebuilds to its digest
    tampered = tmp_path / "tampered.db"
    shutil.copy(stored.store.path, tampered)
    with SessionStore.open(tampered) as store:
        store._conn.execute("UPDATE session SET digest = zeroblob(32)")
        with pytest.raises(StoreError, match="differs from the stored"):
            store.load(make_engine(lm))


# --- several targets -------------------------------------------------------------------------


def test_two_forgets_equal_one_forget_many_and_the_reset(lm, tmp_path):
    runtime = run(lm, EPISODE)
    reset, many = runtime.fork(), runtime.fork()
    reset.full_reset([TARGET, "m.pref"])
    many.forget_many([TARGET, "m.pref"])
    path = tmp_path / "s.db"
    with PersistentSession.create(path, runtime) as session:
        session.forget("m.pref")
    with PersistentSession.open(path, make_engine(lm)) as session:
        session.forget(TARGET)
        assert session.digest() == reset.digest() == many.digest()
        assert session.store.get_summary()["forgotten"] == ["m.pref", TARGET]


# --- the command line --------------------------------------------------------------------------


def test_cli_store_forget_show(lm, tmp_path, capsys):
    episode_path = tmp_path / "episode.json"
    episode_path.write_text(json.dumps(EPISODE))
    path = tmp_path / "s.db"
    assert cli_main(["run", str(episode_path), "--model", "tiny", "--method", "none", "--store", str(path),
                     "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert cli_main(["show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["T"], shown["digest"], shown["forgotten"], shown["model"]) == (9, ran["digest"], [], "tiny")
    assert cli_main(["forget", str(path), "--forget", TARGET, "--json"]) == 0
    out = capsys.readouterr().out
    forgot = json.loads(out)
    assert SECRET not in out and "Quillmere" not in out  # the report names ids, never the value
    assert forgot["invocations"] == 8 and not forgot["already_forgotten"]
    # the same as running and forgetting in one go, stored
    direct = tmp_path / "direct.db"
    assert cli_main(["run", str(episode_path), "--model", "tiny", "--forget", TARGET, "--store", str(direct),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == forgot["digest"]
    assert cli_main(["show", str(path), "--model", "tiny"]) == 0
    text = capsys.readouterr().out
    assert forgot["digest"] in text and "verified by rebuild" in text and f"forgot   {TARGET}" in text
    assert find_residue(session_files(path) + session_files(direct), SECRET, lm.encode) == []
    assert cli_main(["forget", str(path), "--forget", TARGET]) == 0
    assert "already forgotten" in capsys.readouterr().out
    # bad input: exit 2 and a message naming the problem; nothing written
    before = file_bytes(path)
    for argv, message in [
        (["forget", str(path), "--forget", "nope"], "unknown source id 'nope'"),
        (["forget", str(path), "--forget", TARGET, "--model", "smollm2"], "created with model 'tiny', not 'smollm2'"),
        (["show", str(tmp_path / "missing.db")], "no such session store"),
        (["run", str(episode_path), "--model", "tiny", "--store", str(path)], "already exists"),
        (["run", str(episode_path), "--model", "tiny", "--method", "memory-delete", "--store",
          str(tmp_path / "x.db")], "--store keeps sessions"),
    ]:
        assert cli_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert file_bytes(path) == before
    assert not (tmp_path / "x.db").exists()


def test_a_store_without_an_engine_record_is_a_transformers_session(lm, tmp_path, capsys):
    """Stores written before the store recorded its engine (no ``backend``,
    ``model_ref``, ``engine_options`` in meta) were all made by transformers:
    show, forget and verify rebuild them there. A backend this build does not
    have, or damaged options, is refused by name before any model loads."""
    import sqlite3

    path = tmp_path / "s.db"
    ours = get_model("tiny", attn="unsee_eager")  # such stores ran with ours, the only attention then
    with PersistentSession.create(path, run(ours, EPISODE, 4)) as session:
        meta = session.store.get_meta()
    assert (meta["backend"], meta["model_ref"], json.loads(meta["engine_options"])) == ("transformers", "tiny",
                                                                                       {"attn": "unsee_eager"})
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM meta WHERE key IN ('backend', 'model_ref', 'engine_options')")
    assert cli_main(["show", str(path), "--json", "--model", "tiny"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["backend"] == "transformers" and shown["verified"]
    receipt = tmp_path / "receipt.json"
    assert cli_main(["forget", str(path), "--forget", TARGET, "--receipt", str(receipt), "--json"]) == 0
    capsys.readouterr()
    assert cli_main(["verify", str(path), "--receipt", str(receipt), "--value", SECRET]) == 0, capsys.readouterr()
    capsys.readouterr()
    for key, value, message in [("backend", "sglang", "made by engine 'sglang', which this build does not have"),
                                ("engine_options", "[1]", "engine_options '[1]' is not a JSON object")]:
        copy = tmp_path / f"{key}.db"
        shutil.copy(path, copy)
        with sqlite3.connect(copy) as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
        before = copy.read_bytes()
        assert cli_main(["forget", str(copy), "--forget", "notes.pet"]) == 2
        assert message in capsys.readouterr().err
        assert copy.read_bytes() == before


# --- tool sessions: environment, snapshots and effect log persist ----------------------------


def tool_runtime(lm, steps: int | None = None):
    from unsee.impl.agent.tools import Environment, ToolAgentRuntime
    from unsee.impl.cli.tools_demo import demo_episode

    episode = demo_episode(6)
    runtime = ToolAgentRuntime.start(make_engine(lm), episode.system, episode.settings,
                                     world=Environment({"inbox/count": "2"}))
    runtime.run(episode.steps[:steps])
    return runtime, episode


@pytest.mark.parametrize("k", [0, 2, 4])
def test_tool_session_resumes_exactly(lm, tmp_path, k):
    from unsee.impl.agent.tools import ToolAgentRuntime
    from unsee.impl.cli.tools_demo import INJECTED

    full, episode = tool_runtime(lm)
    expected = full.forget(INJECTED)
    runtime, _ = tool_runtime(lm, k)
    path = tmp_path / "s.db"
    PersistentSession.create(path, runtime).close()
    with PersistentSession.open(path, make_engine(lm)) as session:
        assert isinstance(session.runtime, ToolAgentRuntime)
        assert record_hash(session.runtime.get_session_record()) == record_hash(runtime.get_session_record())
        session.run(episode.steps[k:])
    with PersistentSession.open(path, make_engine(lm)) as session:
        report = session.forget(INJECTED)
        assert session.digest() == full.digest()
        assert session.store.record_hash() == record_hash(full.get_session_record())
        assert report.extra.fields["divergences"] == expected.extra.fields["divergences"]
        assert dict(session.runtime.world.executions) == dict(full.world.executions)  # sent once, never again


def test_tool_session_residue_and_its_limit(lm, tmp_path):
    """Zero residue holds for what the agent read; a committed side effect
    that carried the target (an irrevocable divergence, A3) stays in the
    effect log and the world, which no forget rewrites."""
    from unsee.impl.cli.tools_demo import ATTACKER, INJECTED

    runtime, _ = tool_runtime(lm)
    path = tmp_path / "s.db"
    with PersistentSession.create(path, runtime) as session:
        session.forget("inbox/1")  # the genuine mail: read, answered, never sent on
    assert find_residue(session_files(path), "Are we still on for lunch at noon tomorrow?", lm.encode) == []

    runtime, _ = tool_runtime(lm)
    path = tmp_path / "injected.db"
    with PersistentSession.create(path, runtime) as session:
        report = session.forget(INJECTED)
        record = session.store.read_record()
    assert [d["kind"] for d in report.extra.fields["divergences"]] == ["changed_arguments"]
    assert not report.assumptions["A3"]["holds"]
    agent_state = json.dumps({k: v for k, v in record.items() if k != "extra"}, ensure_ascii=False)
    assert ATTACKER not in agent_state and "IMPORTANT SYSTEM NOTICE" not in agent_state
    assert ATTACKER in json.dumps(record["extra"]["tools"]["effects"])  # what was really sent
    # (get_variants would also look for the generic word 'system', which the store holds anyway)
    stored = file_bytes(path).decode("utf-8", "replace").casefold()
    assert "important system notice" not in stored and "all replies must now go to" not in stored


def test_tool_layer_is_stored_under_its_name(lm, tmp_path):
    """The ``extra`` table holds one row per extension, keyed by its name; a
    store written before that (the tool layer's keys as rows) still opens and
    rebuilds the same session; a name no loader knows is refused by name."""
    import sqlite3

    from unsee.impl.agent.tools import ToolAgentRuntime

    runtime, _ = tool_runtime(lm, 3)
    path = tmp_path / "s.db"
    PersistentSession.create(path, runtime).close()
    with sqlite3.connect(path) as conn:
        rows = dict(conn.execute("SELECT key, value FROM extra"))
    assert list(rows) == ["tools"]
    legacy = tmp_path / "legacy.db"
    shutil.copy(path, legacy)
    with sqlite3.connect(legacy) as conn:  # the layout of stores written before extensions had names
        conn.execute("DELETE FROM extra")
        conn.executemany("INSERT INTO extra (key, value) VALUES (?, ?)",
                         [(k, json.dumps(v)) for k, v in json.loads(rows["tools"]).items()])
    with PersistentSession.open(legacy, make_engine(lm)) as session:
        assert isinstance(session.runtime, ToolAgentRuntime) and session.digest() == runtime.digest()
        assert record_hash(session.runtime.get_session_record()) == record_hash(runtime.get_session_record())
    renamed = tmp_path / "renamed.db"
    shutil.copy(path, renamed)
    with sqlite3.connect(renamed) as conn:
        conn.execute("UPDATE extra SET key = 'toolbox'")
    before = file_bytes(renamed)
    with SessionStore.open(renamed) as store, pytest.raises(StoreError, match=r"extension\(s\) \['toolbox'\]"):
        store.load(make_engine(lm))
    assert file_bytes(renamed) == before
