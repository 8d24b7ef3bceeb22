"""The server's llama.cpp threads when the environment names none: prefill on every core,
decode on one.

llama.cpp computes a forward of one token on ``n_threads`` and a longer one on
``n_threads_batch``. docs/bench.md ("Threads") measured, under the exact kernels, that
``n_threads_batch`` does not change a bit of the KV or the logits, while ``n_threads``
does past about 200 tokens (flash attention then splits one query row's keys among the
threads). So the server prefills on every core the process may use and decodes on one
thread: a session's bits are those of one thread, and its store records both counts
(docs/persistence.md). The peer benchmark measured what it buys on 2 cores
(docs/serve.md, "Two threads for prefill").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: the loader's environment variables (impl/engines/llamacpp/model.py)
THREADS_ENV = "UNSEE_LLAMA_THREADS"
BATCH_THREADS_ENV = "UNSEE_LLAMA_BATCH_THREADS"


def get_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1


def compute_thread_environment(engine: str, environ: Mapping[str, str], cores: int) -> dict[str, str]:
    """What to add to ``environ`` for ``engine``: llama.cpp's prefill threads at ``cores`` where
    neither count is set (a user who sets ``UNSEE_LLAMA_THREADS`` alone gets the loader's rule:
    the same count for both); nothing for another engine."""
    if engine != "llamacpp" or environ.get(BATCH_THREADS_ENV) or environ.get(THREADS_ENV):
        return {}
    return {BATCH_THREADS_ENV: str(max(1, cores))}


__all__ = ["BATCH_THREADS_ENV", "THREADS_ENV", "compute_thread_environment", "get_cores"]
