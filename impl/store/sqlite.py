"""Persisted sessions: a SQLite session store with crash-atomic forget and
zero residue of a forgotten target (docs/persistence.md).

One database file per session holds everything the operator of Algorithm 1
reads: the observation log, the provenance graph (every block with its text,
token ids and prefill chunks), the checkpoint metadata, the resident context,
memory store and pending plans, the forgotten source ids, and what a runtime
subclass adds through ``_extra_record`` (a tool runtime's environment,
snapshots and effect log). KV tensors are not stored: a reopened session
rebuilds every cache bitwise from the blocks' recorded chunks
(:meth:`AgentRuntime.from_session_record`), and :meth:`SessionStore.load`
checks the rebuilt state's digest against the stored one.

Guarantees:

- **atomic**: :meth:`SessionStore.save` replaces the session's rows in one
  ``BEGIN IMMEDIATE ... COMMIT`` transaction (rollback journal, ``synchronous
  = FULL``), so a process killed at any point leaves wholly the old session or
  wholly the new one; :class:`PersistentSession` commits after every step and
  every forget.
- **zero residue**: ``secure_delete = ON`` zeroes deleted rows and freed
  pages, ``journal_mode = DELETE`` keeps no write-ahead log of old pages, and
  a save that forgets a source is followed by ``VACUUM`` (rewriting the file
  without free pages; resumed by :meth:`SessionStore.open` if the process died
  before it finished). The target value itself is never written: the store
  keeps source ids, never an episode's ``target.value``.
- **receipts**: every committed forget stores an erasure receipt
  (``impl/store/receipt.py``) in its forget-log row, in the same transaction;
  ``unsee verify`` (``impl/store/verify.py``) checks it from a read-only open.
- **several processes**: a save commits only over the generation its store
  loaded (compare-and-swap inside ``BEGIN IMMEDIATE``), else
  :class:`StoreConflictError`; a store another process is writing is waited
  for up to ``busy_timeout`` seconds, then :class:`StoreBusyError`.
- **hostile files**: a file is used only if its whole schema (``sqlite_master``:
  tables, indexes, triggers, views) equals this build's, read with
  ``trusted_schema = OFF`` and a cap on any field's size.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import sqlite3
import sys
import threading
import urllib.parse
import uuid
import warnings
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from unsee.impl.agent.episode import Step
from unsee.impl.agent.runtime import AgentRuntime, ForgetReport, Progress
from unsee.impl.engines.protocol import Engine
from unsee.impl.store.receipt import build_receipt
from unsee.impl.util.exclusive import Exclusive

FORMAT = "unsee.session"
#: 2: forget_log.receipt and meta.session_id (erasure receipts, issue 11).
SCHEMA_VERSION = 2

#: How long an operation waits for another process's write before
#: :class:`StoreBusyError` (seconds; SQLite's busy handler).
DEFAULT_BUSY_TIMEOUT = 10.0
#: The largest string or BLOB this store reads or writes (SQLite's
#: SQLITE_LIMIT_LENGTH): a hostile file's oversized field is refused before
#: it is read into memory. Sessions are far smaller (text and token ids).
MAX_FIELD_BYTES = 16 * 2**20

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
CREATE TABLE extra (                      -- a runtime subclass's record (e.g. the environment)
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

#: Runtime classes a store can name without the caller passing one.
_KNOWN_RUNTIMES = {"AgentRuntime": ("unsee.impl.agent.runtime", "AgentRuntime"),
                   "ToolAgentRuntime": ("unsee.impl.agent.tools", "ToolAgentRuntime")}


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


# --- records -------------------------------------------------------------------


def canonical_record(record: dict) -> dict:
    """The session record with process-local cache handles replaced by labels.

    A checkpoint names the cache lineage it crops by a handle (``L3``) that
    means nothing outside the process; what the state says is only *which
    checkpoints share a lineage*. Handles become ``lineage:<n>`` numbered by
    first appearance, so equal sessions have equal canonical records."""
    labels: dict[str, str] = {}
    out = dict(record)
    checkpoints = []
    for c in record["checkpoints"]:
        c = dict(c)
        c["lineage"] = labels.setdefault(c["lineage"], f"lineage:{len(labels)}")
        checkpoints.append(c)
    out["checkpoints"] = checkpoints
    return out


def record_hash(record: dict) -> str:
    """sha256 of the canonical record (JSON, sorted keys): equal sessions, equal hashes."""
    text = json.dumps(canonical_record(record), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _dumps(value: Any) -> str | bytes:
    # ensure_ascii=False: text is stored as UTF-8, the way a byte scan looks for it
    return _bind(json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True))


def _loads(value: str | bytes) -> Any:
    try:
        return json.loads(_text(value))
    except RecursionError:  # a hostile file's nesting bomb
        raise StoreError("damaged session store: a JSON field nests too deeply") from None
    except (ValueError, TypeError) as exc:
        raise StoreError(f"damaged session store: a JSON field does not parse ({exc})") from None


def _bind(text: str | None) -> str | bytes | None:
    """A string as SQLite takes it: UTF-8 text, or, for a string holding lone
    surrogates (valid in JSON and in Python, not in UTF-8), the same bytes
    with the surrogates passed through, stored as a BLOB in the column."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _text(value: str | bytes | None) -> str | None:
    """The inverse of :func:`_bind`."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:  # a hostile or damaged file
        raise StoreError(f"damaged session store: a text field is not UTF-8 ({exc.reason})") from None


def pack_tokens(tokens: Sequence[int]) -> bytes:
    buf = array("I", tokens) if array("I").itemsize == 4 else array("L", tokens)
    if sys.byteorder != "little":
        buf.byteswap()
    return buf.tobytes()


def unpack_tokens(blob: bytes) -> list[int]:
    buf = array("I") if array("I").itemsize == 4 else array("L")
    buf.frombytes(blob)
    if sys.byteorder != "little":
        buf.byteswap()
    return buf.tolist()


def session_files(path: str | Path) -> list[Path]:
    """Every file the session owns on disk that exists now: the database and
    SQLite's side files (rollback journal; a WAL and its index are never
    created by this store, but are listed if something else made them)."""
    path = Path(path)
    return [p for p in (path, *(Path(f"{path}{s}") for s in ("-journal", "-wal", "-shm"))) if p.exists()]


# --- the store -----------------------------------------------------------------


class SessionStore:
    """One session in one SQLite file. Not a runtime: :meth:`load` builds one,
    :meth:`save` writes one; :class:`PersistentSession` ties them together."""

    def __init__(self, path: Path, connection: sqlite3.Connection, readonly: bool = False):
        self.path = path
        self._conn = connection
        self._lock = threading.RLock()  # one statement sequence at a time
        self.readonly = readonly
        #: The generation of the session this store last loaded or committed:
        #: a save commits only over that generation (compare-and-swap).
        self.generation: int | None = None
        #: The receipt text of this store's last committed forget.
        self.last_receipt: str | None = None

    # --- opening --------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, runtime: AgentRuntime) -> SessionStore:
        """A new store at ``path`` (which must not exist) holding ``runtime``."""
        path = Path(path)
        if path.exists() or session_files(path):
            raise StoreError(f"{path}: already exists; open it with SessionStore.open, or remove it first")
        try:  # owner-only: the session holds private data
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise StoreError(f"{path}: cannot create the session store ({exc.strerror})") from None
        store = None
        try:
            store = cls(path, _connect(path))
            with store._transaction():  # (not executescript, which would commit on its own)
                for statement in _statements(SCHEMA):
                    store._conn.execute(statement)
                lm = runtime.engine.lm
                meta = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION),
                        "runtime": type(runtime).__name__, "model": str(lm.name), "dtype": lm.dtype,
                        "device": lm.device, "threads": str(_threads()), "scrub_pending": "0",
                        "session_id": uuid.uuid4().hex}
                store._conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                        [(k, _bind(v)) for k, v in sorted(meta.items())])
            store.generation = 0
            store.save(runtime)
            return store
        except BaseException:
            if store is not None:
                with contextlib.suppress(Exception):
                    store._conn.close()
            for p in session_files(path):
                p.unlink()
            raise

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False,
             busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> SessionStore:
        """Open an existing store. Its whole schema must be this build's
        (:func:`check_schema`) before anything else is read or written. A
        transaction interrupted by a crash is rolled back here (SQLite's hot
        journal), a journal a crash left before it became valid is removed,
        and a compaction a crash interrupted after a forget's commit is
        finished.

        ``readonly``: open without write access (``unsee verify``): nothing is
        rolled back, removed or compacted, so the file stays byte-for-byte as
        it is; a store with an interrupted transaction cannot be read this way.
        ``busy_timeout``: seconds to wait for another process's write."""
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"{path}: no such session store")
        _check_header(path)
        try:
            conn = _connect(path, readonly, busy_timeout)
        except sqlite3.DatabaseError as exc:
            raise _store_error(path, exc, "not a session store") from None
        store = cls(path, conn, readonly)
        try:
            check_schema(conn, path)
            if not readonly and Path(f"{path}-journal").exists():
                store._clear_stale_journal()
            if not readonly and store.get_meta().get("scrub_pending") == "1":
                store._scrub()
        except sqlite3.Error as exc:  # e.g. locked by a writer in another process, or damaged
            conn.close()
            raise _store_error(path, exc, "cannot open the session store") from None
        except BaseException:
            conn.close()
            raise
        return store

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- reading --------------------------------------------------------------

    def get_meta(self) -> dict[str, str]:
        with self._lock, self._errors():
            return {_text(k): _text(v) for k, v in self._conn.execute("SELECT key, value FROM meta").fetchall()}

    @property
    def model(self) -> str:
        return self.get_meta()["model"]

    def get_summary(self) -> dict:
        """What ``unsee show`` prints: no model needed."""
        with self._lock, self._errors(), self._read():
            meta = self.get_meta()
            t, transitions, digest, generation = self._conn.execute(
                "SELECT t, transitions, digest, generation FROM session").fetchone()
            checkpoints = [{"boundary": b, "token_offset": o, "env_snapshot": e} for b, o, e in self._conn.execute(
                "SELECT boundary, token_offset, env_snapshot FROM checkpoints ORDER BY boundary")]
            forgotten = [_text(r[0]) for r in self._conn.execute("SELECT source FROM forgotten ORDER BY pos")]
            log = [{"generation": g, "method": m, "sources": _loads(s), "tau": tau, "boundary": b,
                    "length": n, "invocations": i, "digest_after": d.hex()}
                   for g, m, s, tau, b, n, i, d in self._conn.execute(
                       "SELECT generation, method, sources, tau, boundary, length, invocations, digest_after "
                       "FROM forget_log ORDER BY seq")]
            sources = [_text(r[0]) for r in self._conn.execute("SELECT source FROM items ORDER BY step_seq, pos")]
        return {"path": str(self.path), "schema_version": int(meta["schema_version"]), "runtime": meta["runtime"],
                "session_id": meta.get("session_id"),
                "model": meta["model"], "dtype": meta["dtype"], "T": t, "transitions": transitions,
                "digest": digest.hex(), "generation": generation, "forgotten": forgotten,
                "sources": sources, "checkpoints": checkpoints, "forgets": log}

    def read_record(self) -> dict:
        """The stored session record, in the form of
        :meth:`AgentRuntime.get_session_record` (checkpoint lineages as labels).
        Sets :attr:`generation` to the generation read (one read transaction)."""
        try:
            return self._read_record()
        except StoreError as exc:
            if str(self.path) in str(exc):
                raise
            raise StoreError(f"{self.path}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise StoreError(f"{self.path}: damaged session store ({type(exc).__name__}: {exc})") from None

    def _read_record(self) -> dict:
        with self._lock, self._errors(), self._read():
            c = self._conn
            row = c.execute("SELECT system, settings, t, transitions, generation, digest FROM session").fetchone()
            if row is None:
                raise StoreError(f"{self.path}: damaged session store (no session row)")
            system, settings, t, transitions, generation, digest = row
            items: dict[int, list[dict]] = {}
            for seq, source, text in c.execute("SELECT step_seq, source, text FROM items ORDER BY step_seq, pos"):
                items.setdefault(seq, []).append({"source": _text(source), "text": _text(text)})
            steps = [{"id": _text(i), "kind": _text(k), "tool": _text(tool), "items": items.get(seq, [])}
                     for seq, i, k, tool in c.execute("SELECT seq, id, kind, tool FROM steps ORDER BY seq")]
            blocks = [{"id": _text(i), "type": _text(ty), "text": _text(tx), "tokens": unpack_tokens(tok),
                       "parents": _loads(p), "source_ids": _loads(s), "token_span": [a, b], "turn": turn,
                       "committed": bool(com), "chunks": _loads(ch)}
                      for i, ty, tx, tok, p, s, a, b, turn, com, ch in c.execute(
                          "SELECT id, type, text, tokens, parents, source_ids, span_start, span_end, turn, "
                          "committed, chunks FROM blocks ORDER BY seq")]
            checkpoints = [{"boundary": b, "lineage": _text(lin), "token_offset": o, "context": _loads(ctx),
                            "memory": _loads(mem), "plans": _loads(pl), "env_snapshot": _text(env)}
                           for b, lin, o, ctx, mem, pl, env in c.execute(
                               "SELECT boundary, lineage, token_offset, context, memory, plans, env_snapshot "
                               "FROM checkpoints ORDER BY boundary")]
            resident: dict[str, list[str]] = {"context": [], "memory": [], "plans": []}
            for role, block_id in c.execute("SELECT role, block_id FROM resident ORDER BY role, pos"):
                resident[role].append(_text(block_id))
            forgotten = [_text(r[0]) for r in c.execute("SELECT source FROM forgotten ORDER BY pos")]
            extra = {_text(k): _loads(v) for k, v in c.execute("SELECT key, value FROM extra ORDER BY key")}
            # read in the same snapshot as the record: another process may commit between two reads
            self.generation, self._record_digest = generation, bytes(digest).hex()
        return {"system": _text(system), "settings": _loads(settings), "t": t, "transitions": transitions,
                "steps": steps, "blocks": blocks, "checkpoints": checkpoints, **resident,
                "forgotten": forgotten, "extra": extra}

    def record_hash(self) -> str:
        return record_hash(self.read_record())

    def stored_digest(self) -> str:
        with self._lock, self._errors():
            return self._conn.execute("SELECT digest FROM session").fetchone()[0].hex()

    def read_snapshot(self) -> dict:
        """Everything ``unsee verify`` reads, in one short read transaction
        (a writer waits at most this long): meta, the session record, the
        stored digest and generation, the forget log with its receipts, and
        SQLite's ``quick_check``."""
        with self._lock, self._errors(), self._read():
            meta = self.get_meta()
            record = self.read_record()
            digest, generation = self._conn.execute("SELECT digest, generation FROM session").fetchone()
            log = [{"seq": q, "generation": g, "method": _text(m), "sources": _loads(s), "tau": tau, "boundary": b,
                    "length": n, "invocations": i, "digest_after": bytes(d).hex(), "receipt": _text(r)}
                   for q, g, m, s, tau, b, n, i, d, r in self._conn.execute(
                       "SELECT seq, generation, method, sources, tau, boundary, length, invocations, "
                       "digest_after, receipt FROM forget_log ORDER BY seq")]
            check = "; ".join(r[0] for r in self._conn.execute("PRAGMA quick_check"))
        return {"meta": meta, "record": record, "digest": bytes(digest).hex(), "generation": generation,
                "forget_log": log, "quick_check": check}

    def get_receipts(self) -> list[str]:
        """Every stored receipt, oldest first (one per committed forget)."""
        with self._lock, self._errors():
            return [_text(r[0]) for r in self._conn.execute("SELECT receipt FROM forget_log ORDER BY seq")]

    def load(self, engine: Engine, runtime_class: type[AgentRuntime] | None = None,
             verify: bool = True) -> AgentRuntime:
        """Reopen the session on ``engine``: metadata as stored, the live cache
        rebuilt by prefill of the recorded chunks. With ``verify`` the rebuilt
        state's digest must equal the digest stored at the last commit."""
        _hook("load:before")
        meta = self.get_meta()
        self.check_model(engine)
        cls = runtime_class or _runtime_class(meta["runtime"], self.path)
        if cls.__name__ != meta["runtime"]:
            raise StoreError(f"{self.path}: the session is a {meta['runtime']}, not a {cls.__name__}")
        try:
            runtime = cls.from_session_record(engine, self.read_record())
        except StoreError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
            raise StoreError(f"{self.path}: damaged session store (the record does not rebuild a session: "
                             f"{type(exc).__name__}: {exc})") from None
        if verify:
            stored = self._record_digest  # the digest committed with the record just read
            rebuilt = runtime.digest()
            if rebuilt != stored:
                raise StoreError(f"{self.path}: the rebuilt state's digest {rebuilt[:16]}... differs from the "
                                 f"stored {stored[:16]}...: the session was written by another model, device, "
                                 f"dtype, build or CPU thread count (stored with {meta.get('threads')} torch "
                                 f"threads, this process has {_threads()}), so it cannot continue exactly")
        return runtime

    def check_model(self, engine: Engine) -> None:
        meta = self.get_meta()
        lm = engine.lm
        if lm.name != meta["model"] or lm.dtype != meta["dtype"]:
            raise StoreError(f"{self.path}: the session was created with model {meta['model']!r} "
                             f"({meta['dtype']}); it cannot continue on {lm.name!r} ({lm.dtype})")

    # --- writing ----------------------------------------------------------------

    def save(self, runtime: AgentRuntime, report: ForgetReport | None = None, scrub: bool | None = None) -> None:
        """Replace the stored session by ``runtime``'s, in one transaction.

        ``report``: a forget's report, appended to the forget log in the same
        transaction with the source ids this save adds to the forgotten ones.
        ``scrub`` (default: when the forgotten sources changed) compacts the
        file after the commit, so no freed page outlives it."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; nothing can be saved through this store")
        self.check_model(runtime.engine)
        meta = self.get_meta()
        if type(runtime).__name__ != meta["runtime"]:
            raise StoreError(f"{self.path}: the session is a {meta['runtime']}, not a {type(runtime).__name__}")
        if self.generation is None:
            raise StoreError(f"{self.path}: save over a session this store never loaded; load it first")
        _hook("commit:before")
        with runtime._exclusive(True, "save"):  # a consistent snapshot of the state
            record = runtime.get_session_record()
            digest = bytes.fromhex(runtime.digest())
        with self._lock:
            with self._transaction():
                c = self._conn
                row = c.execute("SELECT generation FROM session").fetchone()
                stored = row[0] if row else 0
                if stored != self.generation:  # compare-and-swap: never save over an unseen generation
                    raise StoreConflictError(
                        f"{self.path}: conflict: another process committed generation {stored} after this one "
                        f"loaded generation {self.generation}; nothing was written (reload the newer session "
                        "and redo the operation)")
                _hook("commit:begin")
                generation = stored + 1
                stored_forgotten = [_text(r[0]) for r in c.execute("SELECT source FROM forgotten ORDER BY pos")]
                if scrub is None:
                    scrub = stored_forgotten != list(record["forgotten"])
                for table in SESSION_TABLES:
                    c.execute(f"DELETE FROM {table}")
                self._insert(record, digest, generation)
                receipt = None
                if report is not None and not report.already_forgotten:
                    forgotten_now = [x for x in record["forgotten"] if x not in stored_forgotten]
                    receipt = build_receipt(
                        session_id=meta.get("session_id", ""), generation=generation, record=record,
                        digest=digest.hex(), engine=runtime.engine, report=report, forgotten_now=forgotten_now,
                        committed_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
                    c.execute("INSERT INTO forget_log (generation, method, sources, tau, boundary, length, "
                              "invocations, digest_after, receipt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (generation, report.method, _dumps(forgotten_now), report.tau,
                               report.boundary, report.length, report.invocations, bytes.fromhex(report.digest),
                               _bind(receipt)))
                if scrub:
                    c.execute("UPDATE meta SET value = '1' WHERE key = 'scrub_pending'")
                _hook("commit:end")
            self.generation = generation
            if receipt is not None:
                self.last_receipt = receipt
            if scrub:  # the save is committed: a failed compaction is retried by the next open
                try:
                    self._scrub()
                except sqlite3.Error as exc:
                    warnings.warn(f"{self.path}: compaction after the commit failed ({exc}); the next open "
                                  "retries it (deleted content is already zeroed)", RuntimeWarning, stacklevel=2)

    def _insert(self, record: dict, digest: bytes, generation: int) -> None:
        c = self._conn
        c.execute("INSERT INTO session (id, system, settings, t, transitions, digest, generation) "
                  "VALUES (1, ?, ?, ?, ?, ?, ?)",
                  (_bind(record["system"]), _dumps(record["settings"]), record["t"], record["transitions"], digest,
                   generation))
        c.executemany("INSERT INTO steps (seq, id, kind, tool) VALUES (?, ?, ?, ?)",
                      [(n, _bind(s["id"]), _bind(s["kind"]), _bind(s["tool"]))
                       for n, s in enumerate(record["steps"], start=1)])
        c.executemany("INSERT INTO items (step_seq, pos, source, text) VALUES (?, ?, ?, ?)",
                      [(n, j, _bind(i["source"]), _bind(i["text"])) for n, s in enumerate(record["steps"], start=1)
                       for j, i in enumerate(s["items"])])
        c.executemany("INSERT INTO blocks (seq, id, type, text, tokens, parents, source_ids, span_start, span_end, "
                      "turn, committed, chunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      [(n, _bind(b["id"]), _bind(b["type"]), _bind(b["text"]), pack_tokens(b["tokens"]),
                        _dumps(b["parents"]),
                        _dumps(b["source_ids"]), b["token_span"][0], b["token_span"][1], b["turn"],
                        int(b["committed"]), _dumps(b["chunks"])) for n, b in enumerate(record["blocks"])])
        checkpoints = canonical_record(record)["checkpoints"]
        c.executemany("INSERT INTO checkpoints (boundary, lineage, token_offset, context, memory, plans, "
                      "env_snapshot) VALUES (?, ?, ?, ?, ?, ?, ?)",
                      [(k["boundary"], _bind(k["lineage"]), k["token_offset"], _dumps(list(k["context"])),
                        _dumps(list(k["memory"])), _dumps(list(k["plans"])), _bind(k.get("env_snapshot")))
                       for k in checkpoints])
        c.executemany("INSERT INTO resident (role, pos, block_id) VALUES (?, ?, ?)",
                      [(role, j, _bind(b)) for role in ("context", "memory", "plans")
                       for j, b in enumerate(record[role])])
        c.executemany("INSERT INTO forgotten (pos, source) VALUES (?, ?)",
                      [(j, _bind(source)) for j, source in enumerate(record["forgotten"])])
        c.executemany("INSERT INTO extra (key, value) VALUES (?, ?)",
                      [(_bind(k), _dumps(v)) for k, v in sorted(record.get("extra", {}).items())])

    def _clear_stale_journal(self) -> None:
        """Remove a rollback journal that SQLite did not roll back.

        A process killed before its journal was synced leaves a journal whose
        header is still zero: not *hot*, so SQLite ignores it (the database
        file was not yet written) and leaves the file, with copies of old
        pages, beside the database. Under our write lock (no other writer can
        own it) it is zeroed and unlinked; the next commit would have replaced
        it anyway."""
        journal = Path(f"{self.path}-journal")
        with self._transaction():  # BEGIN IMMEDIATE: any hot journal is rolled back first
            if journal.exists():
                size = journal.stat().st_size
                with open(journal, "r+b") as f:
                    f.write(bytes(size))
                    f.flush()
                    os.fsync(f.fileno())
                journal.unlink()

    def _scrub(self) -> None:
        """Rewrite the file without free pages, then clear the pending flag.

        Deleted content is already zeroed (``secure_delete``); VACUUM also
        drops the zeroed free pages and shrinks the file. Idempotent, so
        :meth:`open` re-runs it after a crash between a forget's commit and
        the end of its compaction."""
        with self._lock:
            self._conn.execute("VACUUM")
            with self._transaction():
                self._conn.execute("UPDATE meta SET value = '0' WHERE key = 'scrub_pending'")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock, self._errors():
            self._conn.execute("BEGIN IMMEDIATE")  # the write lock, waiting up to the busy timeout
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[None]:
        """One read transaction (a consistent snapshot); nested reads join it."""
        if self._conn.in_transaction:
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors as this module's: a lock held past the busy
        timeout is :class:`StoreBusyError`; anything else names the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise _store_error(self.path, exc, "cannot use the session store") from None

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``'ok'`` for a sound file."""
        with self._lock:
            return "; ".join(r[0] for r in self._conn.execute("PRAGMA integrity_check"))

    def set_trace_callback(self, callback) -> None:
        """Install ``sqlite3`` statement tracing on this store's connection (tests)."""
        self._conn.set_trace_callback(callback)


# --- residue audit -------------------------------------------------------------------


def find_residue(files: Iterable[str | Path], value: str, encode=None) -> list[str]:
    """Where a target value survives in the raw bytes of ``files``.

    Looks, in every byte of every file (live rows, free pages, journal), for:
    the value's UTF-8 bytes; the value case-insensitively (the bytes decoded
    as UTF-8 and casefolded); each normalised variant of
    :func:`~unsee.impl.util.text.get_variants` in the normalised decoded text; and,
    with ``encode`` (a tokenizer's ``encode``), the value's token ids as the
    store packs them (uint32 little-endian), with and without a leading
    space. Returns one line per finding; empty means no residue."""
    from unsee.impl.util.text import get_variants, normalize

    needles = {"utf-8": value.encode("utf-8", "surrogatepass")}
    if encode is not None:
        for prefix in ("", " "):
            ids = encode(prefix + value)
            if ids:
                needles[f"token ids of {prefix + value!r}"] = pack_tokens(ids)
    folded = value.casefold()
    variants = get_variants(value)
    found = []
    for path in files:
        raw = Path(path).read_bytes()
        for kind, needle in needles.items():
            at = raw.find(needle)
            if needle and at >= 0:
                found.append(f"{path}: {kind} at byte {at}")
        text = raw.decode("utf-8", "replace")
        if folded and folded in text.casefold():
            found.append(f"{path}: the value, case-insensitively")
        normalized = normalize(text)
        for variant in variants:
            if variant in normalized:
                found.append(f"{path}: normalised variant {variant!r}")
    return found


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _connect(path: Path, readonly: bool = False, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions, every BEGIN/COMMIT is ours;
    # timeout: SQLite's busy handler waits this long for another process's lock
    if readonly:  # mode=ro: SQLite refuses every write, ours included
        uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    try:
        # before anything reads a row: a hostile field cannot be larger than this
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_FIELD_BYTES)
        # A file in WAL mode says so in its header; setting the mode would
        # rewrite that header, so a file not in a rollback mode is refused as is.
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() == "wal":
            raise StoreError(f"{path}: journal mode 'wal', not 'delete' (a WAL would keep old pages); "
                             "not a store this build writes")
        for pragma in PRAGMAS:
            if readonly and "journal_mode" in pragma:
                continue  # nothing to set: a read-only connection never journals
            conn.execute(pragma)
        if conn.execute("PRAGMA trusted_schema").fetchone()[0] != 0:
            raise StoreError("this SQLite build cannot turn trusted_schema off")
        if conn.execute("PRAGMA secure_delete").fetchone()[0] != 1:
            raise StoreError("this SQLite build cannot zero deleted content (secure_delete)")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "delete":
            raise StoreError(f"{path}: journal mode {mode!r}, not 'delete' (a WAL would keep old pages)")
    except BaseException:
        conn.close()
        raise
    return conn


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_header(path: Path) -> None:
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


def _store_error(path: Path, exc: sqlite3.Error, what: str) -> StoreError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return StoreBusyError(f"{path}: busy: another process is writing the session and held it past the busy "
                              f"timeout ({text}); nothing was written, retry later")
    if "too big" in text:
        return StoreError(f"{path}: a field is larger than {MAX_FIELD_BYTES} bytes ({text}); not a store "
                          "this build reads")
    if "readonly" in text.replace("-", "").replace(" ", "").lower() and "rollback" in text.lower():
        return StoreError(f"{path}: an interrupted transaction must be rolled back first (a hot journal); "
                          f"open the store for writing once (e.g. `unsee show`) ({text})")
    return StoreError(f"{path}: {what} ({text})")


@functools.cache
def expected_schema() -> tuple[tuple[str, str, str, str | None], ...]:
    """``sqlite_master`` of a store of this build: (type, name, tbl_name, sql)
    of every table, index, trigger and view, sorted."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in _statements(SCHEMA):
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


#: Test hooks: named points inside an operation (``load:before``;
#: ``commit:before``, before the write lock; ``commit:begin``, holding it,
#: after the generation check; ``commit:end``, before COMMIT) call ``HOOKS[name]()`` when set, so that
#: the concurrency tests can pause a real process there.
HOOKS: dict[str, Any] = {}


def _hook(name: str) -> None:
    hook = HOOKS.get(name)
    if hook is not None:
        hook()


def _statements(script: str) -> Iterable[str]:
    text = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


def _runtime_class(name: str, path: Path) -> type[AgentRuntime]:
    if name not in _KNOWN_RUNTIMES:
        raise StoreError(f"{path}: the session is a {name}; pass runtime_class= to load it")
    module, attr = _KNOWN_RUNTIMES[name]
    import importlib

    return getattr(importlib.import_module(module), attr)


# --- a runtime that commits ---------------------------------------------------------


class PersistentSession:
    """A runtime whose every step and forget is committed to its store.

    ``step`` commits after the transition; ``forget``/``forget_many``/
    ``forget_value``/``full_reset`` build the new state beside the old one in
    memory (the runtime's replay) and commit it in one transaction, so the
    store holds wholly the old session or wholly the new. One operation at a
    time: a second one arriving while one runs waits (``wait=True``) or raises
    :class:`SessionBusyError`. A failed operation changes neither the store
    nor (after a reload if the failure was half-way) the runtime.
    """

    def __init__(self, store: SessionStore, runtime: AgentRuntime):
        self.store = store
        self.runtime: AgentRuntime | None = runtime
        self._engine, self._class = runtime.engine, type(runtime)
        self._exclusive = Exclusive()

    @classmethod
    def create(cls, path: str | Path, runtime: AgentRuntime) -> PersistentSession:
        return cls(SessionStore.create(path, runtime), runtime)

    @classmethod
    def open(cls, path: str | Path, engine: Engine, runtime_class: type[AgentRuntime] | None = None,
             verify: bool = True, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> PersistentSession:
        store = SessionStore.open(path, busy_timeout=busy_timeout)
        try:
            return cls(store, store.load(engine, runtime_class, verify))
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> PersistentSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def digest(self) -> str:
        return self._live().digest()

    @property
    def t(self) -> int:
        return self._live().t

    @property
    def receipt(self) -> str | None:
        """The erasure receipt of this session's last committed forget (JSON text)."""
        return self.store.last_receipt

    def reload(self) -> AgentRuntime:
        """Load the store's newest committed state (after a conflict, say)."""
        with self._exclusive(True, "reload"):
            self._drop()
            self.runtime = self.store.load(self._engine, self._class)
            return self.runtime

    def _live(self) -> AgentRuntime:
        if self.runtime is None:
            raise StoreConflictError(f"{self.store.path}: this session's state was dropped after a conflict "
                                     "with another process; call reload() (or reopen) and redo the operation")
        return self.runtime

    def _drop(self) -> None:
        """Forget the in-memory state (it may hold a value another process's
        forget removed): its caches are dropped from the engine."""
        runtime, self.runtime = self.runtime, None
        if runtime is None:
            return
        names = {runtime.lineage} | runtime.checkpoints.lineages()
        for lineage in names:
            if lineage in runtime.engine.lineages:
                runtime.engine.drop(lineage)

    def _save(self, report: ForgetReport | None = None, scrub: bool | None = None) -> None:
        """Commit the runtime. On a conflict the in-memory state is dropped
        (the newer state on disk wins); on any other failure it goes back to
        the last committed state, so memory and disk agree."""
        try:
            self.store.save(self.runtime, report=report, scrub=scrub)
        except StoreConflictError:
            self._drop()
            raise
        except BaseException:
            self._drop()
            with contextlib.suppress(Exception):
                self.runtime = self.store.load(self._engine, self._class)
            raise

    # --- operations -------------------------------------------------------------

    def step(self, step: Step, wait: bool = True) -> None:
        with self._exclusive(wait, f"step {step.id}"):
            self._guarded(lambda: self._live().step(step))
            self._save()

    def run(self, steps: Iterable[Step], wait: bool = True) -> None:
        """Each step committed as it completes."""
        for step in steps:
            self.step(step, wait)

    def forget(self, source_id: str, progress: Progress | None = None, wait: bool = True) -> ForgetReport:
        return self.forget_many([source_id], progress, wait)

    def forget_many(self, source_ids: Sequence[str], progress: Progress | None = None,
                    wait: bool = True) -> ForgetReport:
        with self._exclusive(wait, "forget"):
            return self._commit_forget(self._guarded(lambda: self._live().forget_many(source_ids, progress)))

    def forget_value(self, value: str, progress: Progress | None = None, wait: bool = True) -> ForgetReport:
        with self._exclusive(wait, "forget"):
            return self._commit_forget(self._guarded(lambda: self._live().forget_value(value, progress)))

    def full_reset(self, source_ids: str | Sequence[str], progress: Progress | None = None,
                   wait: bool = True) -> ForgetReport:
        with self._exclusive(wait, "reset"):
            return self._commit_forget(self._guarded(lambda: self._live().full_reset(source_ids, progress)))

    def _commit_forget(self, report: ForgetReport) -> ForgetReport:
        if not report.already_forgotten:  # a repeated forget changes nothing, writes nothing
            self._save(report=report, scrub=True)
        return report

    def _guarded(self, operation):
        """Run ``operation`` on the runtime; if it fails after changing the
        state, go back to the last committed state (the store's)."""
        runtime = self._live()
        before = (runtime.t, len(runtime.graph), runtime.lineage, len(runtime.forgotten))
        try:
            return operation()
        except BaseException:
            now = (self.runtime.t, len(self.runtime.graph), self.runtime.lineage, len(self.runtime.forgotten))
            if now != before:
                self.runtime = self.store.load(self.runtime.engine, type(self.runtime))
            raise


__all__ = ["DEFAULT_BUSY_TIMEOUT", "FORMAT", "MAX_FIELD_BYTES", "PersistentSession", "SCHEMA", "SCHEMA_VERSION",
           "SessionStore", "StoreBusyError", "StoreConflictError", "StoreError", "canonical_record", "check_schema",
           "expected_schema", "find_residue", "pack_tokens", "record_hash", "session_files", "unpack_tokens"]
