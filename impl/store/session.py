"""A runtime whose every step and forget is committed to its session store
(:class:`PersistentSession`; docs/persistence.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Self

from unsee.impl.agent.episode import Step
from unsee.impl.agent.forget import Progress
from unsee.impl.agent.report import ForgetReport
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.engines.protocol import Engine
from unsee.impl.store.schema import StoreConflictError
from unsee.impl.store.sqlite import DEFAULT_BUSY_TIMEOUT, SessionStore
from unsee.impl.util.exclusive import Exclusive


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

    def __enter__(self) -> Self:
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
            if lineage in runtime.engine.budget.lineages:
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



__all__ = ["PersistentSession"]
