"""The llama.cpp options ``unsee serve`` passes its engine's constructor: the user's
``--threads``, ``--batch-threads`` and ``--slots``, and the server's slots where none is given.

Threads: where the user names none, the loader decides (:func:`~unsee.impl.engines.llamacpp.model.load_llamacpp`'s
defaults, and the ``UNSEE_LLAMA_THREADS`` / ``UNSEE_LLAMA_BATCH_THREADS`` a user set): the server
writes no environment. docs/bench.md ("Threads") has what the counts change.

Slots: the engine's context holds :data:`DEFAULT_SLOTS` conversations at once, each in a
stream of its own, and the engine's loop decodes their next tokens in one forward
(impl/engines/scheduler.py; impl/engines/llamacpp/rows.py). A batch of next tokens in streams of
their own gives each conversation the bits of its own one-thread step (docs/bench.md), so
slots, unlike threads, are not recorded in the store. Each slot reserves ``n_ctx`` cells of
KV (Qwen2.5 1.5B: 28 KiB a token, 112 MiB a slot of 4096; `unsee serve --ctx-size` sets n_ctx).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from unsee.impl.engines.llamacpp.model import SLOTS_ENV

#: conversations the server's llama.cpp context holds at once (their decode steps batched)
DEFAULT_SLOTS = 8


def get_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1


def get_llamacpp_options(engine: str, threads: int | None, batch_threads: int | None, slots: int | None,
                         environ: Mapping[str, str]) -> dict:
    """The constructor arguments of ``engine`` from the serve flags: the counts given (each at
    least 1), and :data:`DEFAULT_SLOTS` where neither ``--slots`` nor ``$UNSEE_LLAMA_SLOTS`` names
    a count; nothing for another engine (a flag given there is refused)."""
    given = {"threads": threads, "batch_threads": batch_threads, "slots": slots}
    for name, value in given.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} {value}: expected 1 or more")
    if engine != "llamacpp":
        named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if named:
            raise ValueError(f"{', '.join(named)}: llama.cpp's options (--engine llamacpp), not {engine}'s")
        return {}
    if slots is None and not environ.get(SLOTS_ENV):
        given["slots"] = DEFAULT_SLOTS
    return {k: v for k, v in given.items() if v is not None}


__all__ = ["DEFAULT_SLOTS", "get_cores", "get_llamacpp_options"]
