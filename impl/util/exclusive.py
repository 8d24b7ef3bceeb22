"""One operation at a time on a session, by owner.

A step, a forget or a save that arrives from another thread while one runs
either waits for it (``wait=True``) or is refused with
:class:`SessionBusyError` naming what is running; either way it never
interleaves with it. The thread that holds the lock may take it again (an
operation that runs others of the same session, a save's snapshot that
steps): the lock is re-entrant, and what it says is running stays the
outermost operation.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class SessionBusyError(RuntimeError):
    """A forget or step arrived while another one was running."""


class Exclusive:
    """A re-entrant lock that remembers what holds it, for the refusal message."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # how many times the owner holds it (changed only by the owner)
        self.running: str | None = None

    @contextlib.contextmanager
    def __call__(self, wait: bool, what: str) -> Iterator[None]:
        if not self._lock.acquire(blocking=wait):
            raise SessionBusyError(f"{what} refused: {self.running!r} is still running on this session "
                                   "(retry, or call with wait=True to run after it)")
        self._depth += 1
        if self._depth == 1:
            self.running = what
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.running = None
            self._lock.release()
