"""The session store's schema: its tables, the pragmas every connection
sets, and the check that a file's whole schema is this build's (a hostile
file's triggers, views or extra tables are refused before anything is read
or written). See docs/persistence.md.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable
from pathlib import Path

FORMAT = "unsee.session"
#: 2: forget_log.receipt and meta.session_id (erasure receipts, issue 11).
SCHEMA_VERSION = 2

#: The tables holding the session (all replaced by every save) and the schema.
SCHEMA = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE session (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    system      TEXT NOT NULL,
    settings    TEXT NOT NULL,            -- JSON object (episode settings)
    t           INTEGER NOT NULL,         -- transitions observed, T
    transitions INTEGER NOT NULL,         -- invocations of F so far
    digest      BLOB NOT NULL,            -- sha256 of R_T (KV bytes + state), 32 raw bytes
    generation  INTEGER NOT NULL          -- number of committed saves
);
CREATE TABLE steps (                      -- the observation log o_1..o_T
    seq  INTEGER PRIMARY KEY,             -- 1-based step number t
    id   TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    tool TEXT
);
CREATE TABLE items (                      -- external content, by source id
    step_seq INTEGER NOT NULL REFERENCES steps (seq),
    pos      INTEGER NOT NULL,
    source   TEXT NOT NULL,
    text     TEXT NOT NULL,
    PRIMARY KEY (step_seq, pos)
);
CREATE TABLE blocks (                     -- the provenance graph, creation order
    seq        INTEGER PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    type       TEXT NOT NULL,
    text       TEXT NOT NULL,
    tokens     BLOB NOT NULL,             -- token ids, uint32 little-endian
    parents    TEXT NOT NULL,             -- JSON list of block ids
    source_ids TEXT NOT NULL,             -- JSON list of source ids (sorted)
    span_start INTEGER NOT NULL,
    span_end   INTEGER NOT NULL,
    turn       INTEGER NOT NULL,
    committed  INTEGER NOT NULL,
    chunks     TEXT NOT NULL              -- JSON list of prefill chunk lengths
);
CREATE TABLE checkpoints (                -- metadata only: no tensors
    boundary     INTEGER PRIMARY KEY,
    lineage      TEXT NOT NULL,           -- canonical label 'lineage:<n>'
    token_offset INTEGER NOT NULL,
    context      TEXT NOT NULL,           -- JSON list of block ids (prompt manifest)
    memory       TEXT NOT NULL,
    plans        TEXT NOT NULL,
    env_snapshot TEXT
);
CREATE TABLE resident (                   -- R_T's context, memory store, pending plans
    role     TEXT NOT NULL CHECK (role IN ('context', 'memory', 'plans')),
    pos      INTEGER NOT NULL,
    block_id TEXT NOT NULL REFERENCES blocks (id),
    PRIMARY KEY (role, pos)
);
CREATE TABLE forgotten (                  -- source ids forgotten so far (ids, never values)
    pos    INTEGER PRIMARY KEY,
    source TEXT NOT NULL UNIQUE
);
CREATE TABLE extra (                      -- each runtime extension's record, by name (e.g. 'tools')
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                   -- JSON
);
CREATE TABLE forget_log (                 -- one row per committed forget: ids and costs only
    seq          INTEGER PRIMARY KEY,
    generation   INTEGER NOT NULL,
    method       TEXT NOT NULL,
    sources      TEXT NOT NULL,           -- JSON list of source ids
    tau          INTEGER NOT NULL,
    boundary     INTEGER NOT NULL,
    length       INTEGER NOT NULL,
    invocations  INTEGER NOT NULL,
    digest_after BLOB NOT NULL,
    receipt      TEXT NOT NULL            -- the erasure receipt, canonical JSON (impl/store/receipt.py)
);
"""

#: Tables a save replaces (``forget_log`` is appended to, ``meta`` updated).
SESSION_TABLES = ("items", "steps", "resident", "blocks", "checkpoints", "forgotten", "extra", "session")
TABLES = ("meta",) + SESSION_TABLES + ("forget_log",)

#: Pragmas every connection sets (see docs/persistence.md, "Zero residue").
PRAGMAS = ("PRAGMA trusted_schema = OFF", "PRAGMA secure_delete = ON", "PRAGMA journal_mode = DELETE",
           "PRAGMA synchronous = FULL", "PRAGMA temp_store = MEMORY", "PRAGMA foreign_keys = ON",
           "PRAGMA cell_size_check = ON")


class StoreError(ValueError):
    """A session store that cannot be used as asked: the message says why
    (missing or not a session store, an unknown schema version, a model or
    runtime class other than the session's, a state that does not rebuild)."""


class StoreConflictError(StoreError):
    """Another process committed a newer generation since this one loaded:
    this save would overwrite it, so nothing was written (compare-and-swap on
    the generation). Reload the newer state and redo the operation."""


class StoreBusyError(StoreError):
    """Another process held the store's write lock for longer than the busy
    timeout; nothing was written. Retry later."""



@functools.cache
def expected_schema() -> tuple[tuple[str, str, str, str | None], ...]:
    """``sqlite_master`` of a store of this build: (type, name, tbl_name, sql)
    of every table, index, trigger and view, sorted."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in get_statements(SCHEMA):
            conn.execute(statement)
        return tuple(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"))
    finally:
        conn.close()


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse any file whose whole schema is not this build's.

    A store from elsewhere could carry triggers (which a save's DELETE and
    INSERT would fire), views or extra tables and indexes. They are all rows
    of ``sqlite_master``; reading it runs nothing. Where a real ``meta`` table
    is there, its format and version give the more precise message."""
    found = tuple(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"))
    if found == expected_schema():
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("format") != FORMAT or meta.get("schema_version") != str(SCHEMA_VERSION):
            raise StoreError(_meta_problem(path, meta))
        return
    meta_table = [r for r in found if r[:3] == ("table", "meta", "meta")]
    if not meta_table:
        raise StoreError(f"{path}: not a session store (no meta table)")
    if meta_table[0] == next(r for r in expected_schema() if r[1] == "meta"):
        meta = {k: v for k, v in conn.execute("SELECT key, value FROM meta") if isinstance(k, str)}
        problem = _meta_problem(path, meta)
        if problem:
            raise StoreError(problem)
    expected = {r[:2]: r for r in expected_schema()}
    have = {r[:2]: r for r in found}
    diffs = ([f"unexpected {t} {n!r}" for (t, n) in have if (t, n) not in expected]
             + [f"missing {t} {n!r}" for (t, n) in expected if (t, n) not in have]
             + [f"{t} {n!r} differs" for (t, n) in have if (t, n) in expected and have[t, n] != expected[t, n]])
    raise StoreError(f"{path}: not a store of this build's schema: {'; '.join(sorted(diffs))}")


def _meta_problem(path: Path, meta: dict) -> str:
    if meta.get("format") != FORMAT:
        return f"{path}: not a session store (format {meta.get('format')!r}, expected {FORMAT!r})"
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        return (f"{path}: unsupported schema version {meta.get('schema_version')!r}; "
                f"this build reads version {SCHEMA_VERSION}")
    return ""


_SQLITE_MAGIC = b"SQLite format 3\x00"


def check_header(path: Path) -> None:
    """Refuse, from the raw header and before SQLite opens the file, what
    opening would change: a file that is not SQLite at all (SQLite would take
    an empty file for a new database) and a WAL-mode file (opening it creates
    -wal and -shm files beside it)."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the session store ({exc.strerror})") from None
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise StoreError(f"{path}: not a session store (not an SQLite 3 database file)")
    if header[18] != 1 or header[19] != 1:  # the file format versions: 1 legacy (rollback), 2 WAL
        raise StoreError(f"{path}: not a session store this build writes (write/read format "
                         f"{header[18]}/{header[19]}; 2 is WAL mode, which keeps old pages)")


def get_statements(script: str) -> Iterable[str]:
    text = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


__all__ = ["FORMAT", "PRAGMAS", "SCHEMA", "SCHEMA_VERSION", "SESSION_TABLES", "TABLES", "StoreBusyError",
           "StoreConflictError", "StoreError", "check_header", "check_schema", "expected_schema", "get_statements"]
