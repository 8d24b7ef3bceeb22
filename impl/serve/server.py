"""Running the application: in the foreground (``unsee serve``) or, for
tests and the load bench, in a thread on a free loopback port."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import uvicorn

from unsee.impl.serve.app import build_app
from unsee.impl.serve.pool import Pool

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def read_api_keys(path: str | Path | None) -> list[str]:
    """The keys in ``path``, one a line (blank lines skipped); none without a file."""
    if path is None:
        return []
    keys = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not keys:
        raise ValueError(f"--api-key-file {path}: the file holds no key")
    if len(set(keys)) != len(keys):
        raise ValueError(f"--api-key-file {path}: a key is given twice")
    return keys


def check_exposure(host: str, api_keys: Sequence[str]) -> None:
    """A server reachable beyond this machine needs a key (every conversation is readable without one)."""
    if host not in LOOPBACK and not api_keys:
        raise ValueError(f"--host {host}: serving beyond loopback needs --api-key-file")


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM or SIGINT also stops the engine's loop: every turn in
    flight ends at its next forward (its step rolled back, as any failed turn's), so the server
    need not wait for a turn's end to close its connections and exit."""

    def __init__(self, config: uvicorn.Config, pool: Pool):
        super().__init__(config)
        self.pool = pool

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self.pool.loop.stop()


class ServerThread:
    """The app on ``host`` (port 0: a free one) in a daemon thread; ``url`` is its base URL."""

    def __init__(self, pool: Pool, model_name: str, api_keys: Sequence[str] = (), host: str = "127.0.0.1",
                 port: int = 0):
        config = uvicorn.Config(build_app(pool, model_name, api_keys), host=host, port=port, log_level="warning",
                                access_log=False)
        self.pool = pool
        self.server = StoppingServer(config, pool)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.pool.loop.stop()  # as a signal does (StoppingServer): turns in flight stop at their next forward
        self.thread.join(timeout=30)
        # the turns are over: the loop runs again, for the close's own work (on vLLM a dropped
        # lineage resets the prefix cache through the loop) and for the engine's next server
        self.pool.loop.stop(False)
        self.pool.close()


def get_log_config() -> dict:
    """uvicorn's logging, with the server's own loggers (``unsee.serve``: failures, and
    ``unsee.serve.requests``: a line per request) written as uvicorn's are, to stderr at INFO."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["unsee.serve"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def run(pool: Pool, model_name: str, host: str, port: int, api_keys: Sequence[str]) -> None:
    """Serve in the foreground until interrupted; one log line per request, ours (uvicorn's access
    log, a second line without the tokens or the conversation, is off)."""
    check_exposure(host, api_keys)
    config = uvicorn.Config(build_app(pool, model_name, api_keys), host=host, port=port, log_level="info",
                            log_config=get_log_config(), access_log=False)
    try:
        StoppingServer(config, pool).run()
    finally:
        pool.loop.stop(False)  # the turns are over; the close may need the loop (ServerThread.__exit__)
        pool.close()
