"""Persisted sessions: a SQLite session store with crash-atomic forget and
zero residue of a forgotten target (docs/persistence.md).

One database file per session holds everything the operator of Algorithm 1
reads: the observation log, the provenance graph (every block with its text,
token ids and prefill chunks), the checkpoint metadata, the resident context,
memory store and pending plans, the forgotten source ids, and each runtime
extension's record under its name in the ``extra`` table (the tool layer's
environment, snapshots and effect log under ``tools``). KV tensors are not stored: a reopened session
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
import os
import sqlite3
import threading
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

from unsee.impl.agent.loading import UnknownExtensionError, load_runtime
from unsee.impl.agent.report import ForgetReport
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine
from unsee.impl.store.backend import check_engine_choice, get_backend_of, get_engine_meta
from unsee.impl.store.receipt import build_receipt
from unsee.impl.store.records import (
    bind_text,
    canonical_record,
    dump_json,
    find_residue,
    load_json,
    pack_tokens,
    read_text,
    record_hash,
    session_files,
    unpack_tokens,
    upgrade_extra,
)
from unsee.impl.store.schema import (
    FORMAT,
    PRAGMAS,
    SCHEMA,
    SCHEMA_VERSION,
    SESSION_TABLES,
    StoreBusyError,
    StoreConflictError,
    StoreError,
    check_header,
    check_schema,
    expected_schema,
    get_statements,
)

#: How long an operation waits for another process's write before
#: :class:`StoreBusyError` (seconds; SQLite's busy handler).
DEFAULT_BUSY_TIMEOUT = 10.0
#: The largest string or BLOB this store reads or writes (SQLite's
#: SQLITE_LIMIT_LENGTH): a hostile file's oversized field is refused before
#: it is read into memory. Sessions are far smaller (text and token ids).
MAX_FIELD_BYTES = 16 * 2**20


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
                for statement in get_statements(SCHEMA):
                    store._conn.execute(statement)
                lm = runtime.engine.lm
                meta = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION),
                        "runtime": type(runtime).__name__, "model": str(lm.name), "dtype": lm.dtype,
                        "device": lm.device, "threads": str(_threads()), "scrub_pending": "0",
                        "session_id": uuid.uuid4().hex, **get_engine_meta(runtime.engine)}
                store._conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                        [(k, bind_text(v)) for k, v in sorted(meta.items())])
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
        check_header(path)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- reading --------------------------------------------------------------

    def get_meta(self) -> dict[str, str]:
        with self._lock, self._errors():
            return {read_text(k): read_text(v) for k, v in self._conn.execute("SELECT key, value FROM meta").fetchall()}

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
            forgotten = [read_text(r[0]) for r in self._conn.execute("SELECT source FROM forgotten ORDER BY pos")]
            log = [{"generation": g, "method": m, "sources": load_json(s), "tau": tau, "boundary": b,
                    "length": n, "invocations": i, "digest_after": d.hex()}
                   for g, m, s, tau, b, n, i, d in self._conn.execute(
                       "SELECT generation, method, sources, tau, boundary, length, invocations, digest_after "
                       "FROM forget_log ORDER BY seq")]
            sources = [read_text(r[0]) for r in self._conn.execute("SELECT source FROM items ORDER BY step_seq, pos")]
        return {"path": str(self.path), "schema_version": int(meta["schema_version"]), "runtime": meta["runtime"],
                "session_id": meta.get("session_id"), "backend": check_engine_choice(meta, None, self.path).backend,
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
                items.setdefault(seq, []).append({"source": read_text(source), "text": read_text(text)})
            steps = [{"id": read_text(i), "kind": read_text(k), "tool": read_text(tool), "items": items.get(seq, [])}
                     for seq, i, k, tool in c.execute("SELECT seq, id, kind, tool FROM steps ORDER BY seq")]
            blocks = [{"id": read_text(i), "type": read_text(ty), "text": read_text(tx), "tokens": unpack_tokens(tok),
                       "parents": load_json(p), "source_ids": load_json(s), "token_span": [a, b], "turn": turn,
                       "committed": bool(com), "chunks": load_json(ch)}
                      for i, ty, tx, tok, p, s, a, b, turn, com, ch in c.execute(
                          "SELECT id, type, text, tokens, parents, source_ids, span_start, span_end, turn, "
                          "committed, chunks FROM blocks ORDER BY seq")]
            checkpoints = [{"boundary": b, "lineage": read_text(lin), "token_offset": o, "context": load_json(ctx),
                            "memory": load_json(mem), "plans": load_json(pl), "env_snapshot": read_text(env)}
                           for b, lin, o, ctx, mem, pl, env in c.execute(
                               "SELECT boundary, lineage, token_offset, context, memory, plans, env_snapshot "
                               "FROM checkpoints ORDER BY boundary")]
            resident: dict[str, list[str]] = {"context": [], "memory": [], "plans": []}
            for role, block_id in c.execute("SELECT role, block_id FROM resident ORDER BY role, pos"):
                resident[role].append(read_text(block_id))
            forgotten = [read_text(r[0]) for r in c.execute("SELECT source FROM forgotten ORDER BY pos")]
            extra = upgrade_extra({read_text(k): load_json(v)
                                   for k, v in c.execute("SELECT key, value FROM extra ORDER BY key")})
            # read in the same snapshot as the record: another process may commit between two reads
            self.generation, self._record_digest = generation, bytes(digest).hex()
        return {"system": read_text(system), "settings": load_json(settings), "t": t, "transitions": transitions,
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
            log = [{"seq": q, "generation": g, "method": read_text(m), "sources": load_json(s), "tau": tau,
                    "boundary": b, "length": n, "invocations": i, "digest_after": bytes(d).hex(), "receipt": read_text(r)}
                   for q, g, m, s, tau, b, n, i, d, r in self._conn.execute(
                       "SELECT seq, generation, method, sources, tau, boundary, length, invocations, "
                       "digest_after, receipt FROM forget_log ORDER BY seq")]
            check = "; ".join(r[0] for r in self._conn.execute("PRAGMA quick_check"))
        return {"meta": meta, "record": record, "digest": bytes(digest).hex(), "generation": generation,
                "forget_log": log, "quick_check": check}

    def get_receipts(self) -> list[str]:
        """Every stored receipt, oldest first (one per committed forget)."""
        with self._lock, self._errors():
            return [read_text(r[0]) for r in self._conn.execute("SELECT receipt FROM forget_log ORDER BY seq")]

    def load(self, engine: Engine, runtime_class: type[AgentRuntime] | None = None,
             verify: bool = True) -> AgentRuntime:
        """Reopen the session on ``engine``: metadata as stored, the live cache
        rebuilt by prefill of the recorded chunks, each extension rebuilt from
        its record by name (:func:`~unsee.impl.agent.loading.load_runtime`;
        ``runtime_class``: the class to build, which must be the one that
        wrote the session). With ``verify`` the rebuilt
        state's digest must equal the digest stored at the last commit."""
        _hook("load:before")
        meta = self.get_meta()
        self.check_model(engine)
        if runtime_class is not None and runtime_class.__name__ != meta["runtime"]:
            raise StoreError(f"{self.path}: the session is a {meta['runtime']}, not a {runtime_class.__name__}")
        try:
            runtime = load_runtime(engine, self.read_record(), runtime_class)
        except StoreError:
            raise
        except UnknownExtensionError as exc:
            raise StoreError(f"{self.path}: {exc}") from None
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
                                 f"threads, this process has {_threads()}; engine options "
                                 f"{meta.get('engine_options', '{}')}), so it cannot continue exactly")
        return runtime

    def check_model(self, engine: Engine) -> None:
        meta = self.get_meta()
        lm = engine.lm
        check_engine_choice(meta, get_backend_of(engine), self.path)  # the engine that made the session
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
        with runtime.hold("save"):  # a consistent snapshot of the state
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
                stored_forgotten = [read_text(r[0]) for r in c.execute("SELECT source FROM forgotten ORDER BY pos")]
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
                        committed_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
                    self._log_forget(generation, report, forgotten_now, receipt)
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

    def _log_forget(self, generation: int, report: ForgetReport, forgotten_now: list[str], receipt: str) -> None:
        """The forget-log row of a committed forget, with its receipt (inside the save's transaction)."""
        self._conn.execute("INSERT INTO forget_log (generation, method, sources, tau, boundary, length, "
                           "invocations, digest_after, receipt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (generation, report.method, dump_json(forgotten_now), report.tau,
                            report.boundary, report.length, report.invocations, bytes.fromhex(report.digest),
                            bind_text(receipt)))

    def _insert(self, record: dict, digest: bytes, generation: int) -> None:
        c = self._conn
        c.execute("INSERT INTO session (id, system, settings, t, transitions, digest, generation) "
                  "VALUES (1, ?, ?, ?, ?, ?, ?)",
                  (bind_text(record["system"]), dump_json(record["settings"]), record["t"], record["transitions"],
                   digest, generation))
        c.executemany("INSERT INTO steps (seq, id, kind, tool) VALUES (?, ?, ?, ?)",
                      [(n, bind_text(s["id"]), bind_text(s["kind"]), bind_text(s["tool"]))
                       for n, s in enumerate(record["steps"], start=1)])
        c.executemany("INSERT INTO items (step_seq, pos, source, text) VALUES (?, ?, ?, ?)",
                      [(n, j, bind_text(i["source"]), bind_text(i["text"]))
                       for n, s in enumerate(record["steps"], start=1) for j, i in enumerate(s["items"])])
        c.executemany("INSERT INTO blocks (seq, id, type, text, tokens, parents, source_ids, span_start, span_end, "
                      "turn, committed, chunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      [(n, bind_text(b["id"]), bind_text(b["type"]), bind_text(b["text"]), pack_tokens(b["tokens"]),
                        dump_json(b["parents"]),
                        dump_json(b["source_ids"]), b["token_span"][0], b["token_span"][1], b["turn"],
                        int(b["committed"]), dump_json(b["chunks"])) for n, b in enumerate(record["blocks"])])
        checkpoints = canonical_record(record)["checkpoints"]
        c.executemany("INSERT INTO checkpoints (boundary, lineage, token_offset, context, memory, plans, "
                      "env_snapshot) VALUES (?, ?, ?, ?, ?, ?, ?)",
                      [(k["boundary"], bind_text(k["lineage"]), k["token_offset"], dump_json(list(k["context"])),
                        dump_json(list(k["memory"])), dump_json(list(k["plans"])), bind_text(k.get("env_snapshot")))
                       for k in checkpoints])
        c.executemany("INSERT INTO resident (role, pos, block_id) VALUES (?, ?, ?)",
                      [(role, j, bind_text(b)) for role in ("context", "memory", "plans")
                       for j, b in enumerate(record[role])])
        c.executemany("INSERT INTO forgotten (pos, source) VALUES (?, ?)",
                      [(j, bind_text(source)) for j, source in enumerate(record["forgotten"])])
        c.executemany("INSERT INTO extra (key, value) VALUES (?, ?)",
                      [(bind_text(k), dump_json(v)) for k, v in sorted(record.get("extra", {}).items())])

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


#: Test hooks: named points inside an operation (``load:before``;
#: ``commit:before``, before the write lock; ``commit:begin``, holding it,
#: after the generation check; ``commit:end``, before COMMIT) call ``HOOKS[name]()`` when set, so that
#: the concurrency tests can pause a real process there.
HOOKS: dict[str, Any] = {}


def _hook(name: str) -> None:
    hook = HOOKS.get(name)
    if hook is not None:
        hook()


__all__ = ["DEFAULT_BUSY_TIMEOUT", "FORMAT", "HOOKS", "MAX_FIELD_BYTES", "SCHEMA", "SCHEMA_VERSION", "SessionStore",
           "StoreBusyError", "StoreConflictError", "StoreError", "canonical_record", "check_schema",
           "expected_schema", "find_residue", "pack_tokens", "record_hash", "session_files", "unpack_tokens"]
