"""One operation at a time on a session.

A step, a forget or a save that arrives while another one runs either waits
for it (``wait=True``) or is refused with :class:`SessionBusyError` naming
what is running; either way it never interleaves with it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class SessionBusyError(RuntimeError):
    """A forget or step arrived while another one was running."""


class Exclusive:
    """A lock that remembers what holds it, for the refusal message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: str | None = None

    @contextlib.contextmanager
    def __call__(self, wait: bool, what: str) -> Iterator[None]:
        if not self._lock.acquire(blocking=wait):
            raise SessionBusyError(f"{what} refused: {self.running!r} is still running on this session "
                                   "(retry, or call with wait=True to run after it)")
        self.running = what
        try:
            yield
        finally:
            self.running = None
            self._lock.release()
