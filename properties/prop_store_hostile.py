"""Hostile store files (issue 11, part 5; docs/persistence.md, "Hostile stores").

A store file from someone else must not run code or read outside itself:
triggers and views planted in it, extra or altered tables and indexes, a
schema from the future, a WAL-mode file, oversized fields, JSON nesting
bombs, wrong column types, and files that are not SQLite at all. Each is
refused with a clear :class:`StoreError`, by ``open``/``load`` and by
``unsee verify`` (outcome "failed"), and the file's bytes are unchanged.

Source ids that look like SQL or paths are not hostile: they are data, and a
session holding them round-trips, forgets and verifies.
"""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from unsee.impl.agent.episode import FORMAT, VERSION, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.store import sqlite as store_mod
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.sqlite import SessionStore, StoreError, session_files
from unsee.impl.store.verify import FAILED, VERIFIED, verify_store
from unsee.properties.engines import make_engine

HOSTILE: Counter = Counter()  # kinds tried, printed at the end


pytestmark = pytest.mark.usefixtures("one_thread")


EPISODE = {
    "format": FORMAT, "version": VERSION, "system": "You are a helpful agent.", "settings": {"max_new_tokens": 3},
    "steps": [{"id": "u1", "kind": "user", "text": "Ana paid for tea"},
              {"id": "f2", "kind": "tool", "tool": "fetch",
               "fields": [{"source": "f2.a", "text": "room 12"}, {"source": "z", "text": "PIN 738215"}]},
              {"id": "u3", "kind": "user", "text": "call Bob at 7"}],
}


@functools.cache
def honest() -> Path:
    path = Path(tempfile.mkdtemp(prefix="unsee-hostile-")) / "honest.db"
    runtime = AgentRuntime.from_episode(make_engine("tiny"), parse_episode(EPISODE))
    with PersistentSession.create(path, runtime) as session:
        session.forget("z")
    return path


def scratch_copy() -> Path:
    path = Path(tempfile.mkdtemp(prefix="unsee-hostile-")) / "s.db"
    shutil.copy(honest(), path)
    return path


# --- strategies: what a hostile file can hold ---------------------------------------------------

TABLES = ("meta", "session", "steps", "items", "blocks", "checkpoints", "resident", "forgotten", "extra",
          "forget_log")
JSON_COLUMNS = (("session", "settings"), ("blocks", "parents"), ("blocks", "source_ids"), ("blocks", "chunks"),
                ("checkpoints", "context"), ("checkpoints", "memory"), ("extra", "value"),
                ("forget_log", "sources"))
TEXT_COLUMNS = (("items", "text"), ("blocks", "text"), ("session", "system"), ("meta", "value"),
                ("forget_log", "receipt"), ("blocks", "tokens"))


@st.composite
def triggers(draw) -> tuple[str, str]:
    table = draw(st.sampled_from(TABLES))
    when = draw(st.sampled_from(("BEFORE", "AFTER")))
    event = draw(st.sampled_from(("DELETE", "INSERT", "UPDATE")))
    body = draw(st.sampled_from(("INSERT INTO canary VALUES (1)", "DELETE FROM forgotten",
                                 "UPDATE meta SET value = 'x'", "SELECT load_extension('x')")))
    name = draw(st.sampled_from(("t", "sqlite_stat_x", "items_guard", "meta")))
    return "trigger", f"CREATE TRIGGER \"{name}_{table}\" {when} {event} ON {table} BEGIN {body}; END"


@st.composite
def schema_changes(draw) -> tuple[str, str]:
    kind = draw(st.sampled_from(("view", "table", "index", "alter", "temp-like")))
    table = draw(st.sampled_from(TABLES))
    indexed = draw(st.sampled_from((("items", "text"), ("blocks", "type"), ("steps", "kind"), ("meta", "value"))))
    return kind, {"view": f"CREATE VIEW v_{table} AS SELECT * FROM {table}",
                  "table": "CREATE TABLE canary2 (x)",
                  "index": f"CREATE INDEX i_{indexed[0]} ON {indexed[0]} ({indexed[1]})",
                  "alter": f"ALTER TABLE {table} ADD COLUMN extra_col TEXT",
                  "temp-like": "CREATE TABLE temp_x (x)"}[kind]


@st.composite
def nesting_bombs(draw) -> tuple[str, tuple]:
    table, column = draw(st.sampled_from(JSON_COLUMNS))
    depth = draw(st.sampled_from((2_000, 50_000, 200_000)))
    opener, closer = draw(st.sampled_from((("[", "]"), ('{"a":', "}"))))
    return "nesting bomb", (table, column, opener * depth + "1" + closer * depth)


@st.composite
def wrong_values(draw) -> tuple[str, tuple]:
    table, column = draw(st.sampled_from(JSON_COLUMNS + TEXT_COLUMNS))
    value = draw(st.sampled_from((None, 7, 3.5, b"\xff\xfe", "not json", "{}", "[1, 2", '"x"', "null")))
    return "wrong value", (table, column, value)


def oversized() -> st.SearchStrategy:
    return st.sampled_from(TEXT_COLUMNS).map(lambda tc: ("oversized field", tc))


def future_schemas() -> st.SearchStrategy:
    return st.sampled_from(("3", "2.1", "10", "", "1")).map(lambda v: ("future schema", v))


def not_sqlite() -> st.SearchStrategy:
    header = b"SQLite format 3\x00"
    return st.one_of(
        st.binary(max_size=300),
        st.binary(min_size=100, max_size=600).map(lambda b: header + b),
        st.just(b""),
        st.text(max_size=80).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.integers(16, 4096).map(lambda n: ("truncate", n)),
    ).map(lambda content: ("not sqlite", content))


def hostile_stores() -> st.SearchStrategy:
    return st.one_of(triggers(), schema_changes(), nesting_bombs(), wrong_values(), oversized(), future_schemas(),
                     not_sqlite(), st.just(("wal", None)), st.just(("other app", None)))


LIMIT = 64 * 1024  # the field cap during these examples (the real one is shown in its own test)


def plant(path: Path, kind: str, what) -> None:
    """Write the hostile content into ``path`` with a plain connection."""
    if kind == "not sqlite":
        if isinstance(what, tuple):
            raw = path.read_bytes()
            path.write_bytes(raw[: what[1]])
        else:
            path.write_bytes(what)
        return
    if kind == "other app":
        path.unlink()
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        return
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS canary (x)") if kind == "trigger" else None
        if kind == "trigger" or kind in ("view", "table", "index", "alter", "temp-like"):
            conn.execute(what)
        elif kind in ("nesting bomb", "wrong value"):
            table, column, value = what
            if conn.execute(f"UPDATE {table} SET {column} = ?", (value,)).rowcount == 0:
                if table != "extra":
                    raise sqlite3.OperationalError(f"no {table} row to change")
                conn.execute("INSERT INTO extra (key, value) VALUES ('planted', ?)", (value,))
        elif kind == "oversized field":
            table, column = what
            if conn.execute(f"UPDATE {table} SET {column} = ?", ("x" * (LIMIT + 1),)).rowcount == 0:
                raise sqlite3.OperationalError(f"no {table} row to change")
        elif kind == "future schema":
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (what,))
        elif kind == "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        else:
            raise AssertionError(kind)
    finally:
        conn.close()


def attempt(path: Path) -> str:
    """Open and load as ``unsee`` would; the StoreError's message, or '' if accepted."""
    try:
        with SessionStore.open(path) as store:
            store.load(make_engine("tiny"))
    except StoreError as exc:
        return str(exc)
    return ""


@settings(max_examples=max(60, settings().max_examples),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(hostile=hostile_stores())
@example(hostile=("trigger", 'CREATE TRIGGER "t" AFTER DELETE ON items BEGIN INSERT INTO canary VALUES (1); END'))
@example(hostile=("view", "CREATE VIEW v AS SELECT * FROM meta"))
@example(hostile=("nesting bomb", ("extra", "value", "[" * 100_000 + "]" * 100_000)))
@example(hostile=("future schema", "3"))
@example(hostile=("wrong value", ("extra", "value", 7)))  # a planted extra key once passed verify
@example(hostile=("wrong value", ("blocks", "source_ids", 7)))  # once crashed verify with a TypeError
@example(hostile=("wrong value", ("forget_log", "receipt", b"\xff\xfe")))  # once a UnicodeDecodeError
@example(hostile=("not sqlite", b"hello"))
def test_hostile_store_is_refused_and_left_as_is(hostile, monkeypatch):
    kind, what = hostile
    note(f"{kind}: {str(what)[:200]}")  # (a bomb's text would flood the report)
    monkeypatch.setattr(store_mod, "MAX_FIELD_BYTES", LIMIT)
    path = scratch_copy()
    try:
        plant(path, kind, what)
    except sqlite3.Error as exc:  # SQLite itself refused to make this file (e.g. an index on a view)
        note(f"not plantable: {exc}")
        shutil.rmtree(path.parent)
        return
    before = {p.name: p.read_bytes() for p in session_files(path)}
    message = attempt(path)
    verdict = verify_store(path)
    if message:
        assert str(path) in message  # a clear error that names the file
    else:  # open and load read no forget-log row, and a coerced value still rebuilds: verify checks those
        planted_in = what[0] if kind in ("nesting bomb", "wrong value", "oversized field") else None
        assert planted_in == "forget_log" or kind == "wrong value", f"{kind} was accepted"
    assert verdict.outcome == FAILED and verdict.failed(), f"{kind} passed verify"
    assert {p.name: p.read_bytes() for p in session_files(path)} == before, "the file was changed"
    if kind == "trigger":
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            assert conn.execute("SELECT count(*) FROM canary").fetchone() == (0,)  # it never fired
    HOSTILE[kind] += 1
    shutil.rmtree(path.parent)


def test_schema_check_is_what_stops_a_planted_trigger(monkeypatch, tmp_path):
    """The defence is necessary: without the schema comparison, a save's
    DELETE fires the planted trigger (trusted_schema off does not stop a
    trigger that calls no function)."""
    path = tmp_path / "s.db"
    shutil.copy(honest(), path)
    plant(path, "trigger", 'CREATE TRIGGER "t" AFTER DELETE ON items BEGIN INSERT INTO canary VALUES (1); END')
    assert "unexpected trigger 't'" in attempt(path)
    monkeypatch.setattr(store_mod, "check_schema", lambda conn, path: None)
    with PersistentSession.open(path, make_engine("tiny")) as session:
        session.forget("f2.a")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM canary").fetchone()[0] > 0  # it fired


def test_the_real_field_cap_refuses_an_oversized_field(tmp_path):
    path = tmp_path / "s.db"
    shutil.copy(honest(), path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE items SET text = ? WHERE rowid = 1", ("x" * (store_mod.MAX_FIELD_BYTES + 1),))
    assert f"larger than {store_mod.MAX_FIELD_BYTES} bytes" in attempt(path)


SQL_AND_PATH_IDS = ("'; DROP TABLE items; --", "../../etc/passwd", "/dev/null", "a\"b", "x/../../y",
                    "items WHERE 1=1", "%00", "C:\\\\Windows\\\\x", "file:s.db?mode=rwc", "z")


@pytest.mark.parametrize("target", SQL_AND_PATH_IDS[:3])
def test_sql_and_path_like_source_ids_are_data(target, tmp_path):
    steps = [{"id": "u1", "kind": "user", "source": sid, "text": f"note {i} Quillmere{i}"}
             for i, sid in enumerate(SQL_AND_PATH_IDS)]
    raw = EPISODE | {"steps": steps}
    path = tmp_path / "s.db"
    for i, s in enumerate(steps):
        s["id"] = f"u{i}"
    runtime = AgentRuntime.from_episode(make_engine("tiny"), parse_episode(raw))
    listing = sorted(p.name for p in tmp_path.iterdir())
    with PersistentSession.create(path, runtime) as session:
        session.forget(target)
    with SessionStore.open(path) as store:
        assert store.get_summary()["forgotten"] == [target]
        assert store.integrity_check() == "ok"
        assert sorted(store.get_summary()["sources"]) == sorted(set(SQL_AND_PATH_IDS) - {target})
    index = SQL_AND_PATH_IDS.index(target)
    assert verify_store(path, value=f"Quillmere{index}").outcome == VERIFIED
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(listing + ["s.db"])  # no file outside it
    HOSTILE["sql/path-like ids"] += 1


def test_zz_report_hostile_stores():
    """(Runs after this module's properties: prints the counts.)"""
    print(f"hostile stores tried: {sum(HOSTILE.values())} {dict(HOSTILE)}")
    json.dumps(dict(HOSTILE))
