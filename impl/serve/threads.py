"""The server's llama.cpp threads and slots when the environment names none: prefill on
every core, decode on one, eight conversations resident at once.

llama.cpp computes a forward of one token on ``n_threads`` and a longer one on
``n_threads_batch``. docs/bench.md ("Threads") measured, under the exact kernels, that
``n_threads_batch`` does not change a bit of the KV or the logits, while ``n_threads``
does past about 200 tokens (flash attention then splits one query row's keys among the
threads). So the server prefills on every core the process may use and decodes on one
thread: a session's bits are those of one thread, and its store records both counts
(docs/persistence.md). The peer benchmark measured what it buys on 2 cores
(docs/serve.md, "Two threads for prefill").

Slots: the engine's context holds :data:`DEFAULT_SLOTS` conversations at once, each in a
stream of its own, and the server decodes their next tokens in one forward (the engine
lock's ``gather``; impl/engines/llamacpp/rows.py). A batch of next tokens in streams of
their own gives each conversation the bits of its own one-thread step (docs/bench.md), so
slots, unlike threads, are not recorded in the store. Each slot reserves ``n_ctx`` cells of
KV (Qwen2.5 1.5B: 28 KiB a token, 112 MiB a slot of 4096; `unsee serve --ctx-size` sets n_ctx).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: the loader's environment variables (impl/engines/llamacpp/model.py)
THREADS_ENV = "UNSEE_LLAMA_THREADS"
BATCH_THREADS_ENV = "UNSEE_LLAMA_BATCH_THREADS"
SLOTS_ENV = "UNSEE_LLAMA_SLOTS"
#: conversations the server's llama.cpp context holds at once (their decode steps batched)
DEFAULT_SLOTS = 8


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


def compute_slot_environment(engine: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to ``environ`` for ``engine``: :data:`DEFAULT_SLOTS` llama.cpp slots where
    ``UNSEE_LLAMA_SLOTS`` is not set; nothing for another engine."""
    if engine != "llamacpp" or environ.get(SLOTS_ENV):
        return {}
    return {SLOTS_ENV: str(DEFAULT_SLOTS)}


__all__ = ["BATCH_THREADS_ENV", "DEFAULT_SLOTS", "SLOTS_ENV", "THREADS_ENV", "compute_slot_environment",
           "compute_thread_environment", "get_cores"]
