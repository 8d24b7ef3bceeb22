"""The llama.cpp options ``unsee serve`` passes its engine's constructor: the user's
``--threads``, ``--batch-threads`` and ``--slots``, and the server's slots where none is given.

Threads: a lone decode step as the loader decides where the user names none
(:func:`~unsee.impl.engines.llamacpp.model.load_llamacpp`: one thread, or ``UNSEE_LLAMA_THREADS``), and
prefill and a batch of several conversations' decode steps on every core unless ``--batch-threads`` or ``UNSEE_LLAMA_BATCH_THREADS`` names a count: a
forward of several tokens has the same bits on any thread count (docs/bench.md, "Threads"). The
server writes no environment.

Slots: the engine's context holds :data:`DEFAULT_SLOTS` conversations at once, each in a
stream of its own, and the engine's loop decodes their next tokens in one forward
(impl/engines/scheduler.py; impl/engines/llamacpp/rows.py). A batch of next tokens in streams of
their own gives each conversation the bits of its own one-thread step (docs/bench.md), so
slots, unlike threads, are not recorded in the store. Each slot reserves ``n_ctx`` cells of
KV (Qwen2.5 1.5B: 28 KiB a token, 112 MiB a slot of 4096; `unsee serve --ctx-size` sets n_ctx).
"""

from __future__ import annotations

from collections.abc import Mapping

from unsee.impl.engines.llamacpp.model import SLOTS_ENV, get_cores

#: conversations the server's llama.cpp context holds at once (their decode steps batched)
DEFAULT_SLOTS = 8
BATCH_THREADS_ENV = "UNSEE_LLAMA_BATCH_THREADS"


def get_llamacpp_options(engine: str, threads: int | None, batch_threads: int | None, slots: int | None,
                         environ: Mapping[str, str]) -> dict:
    """The constructor arguments of ``engine`` from the serve flags: the counts given (each at
    least 1), and :data:`DEFAULT_SLOTS` where neither ``--slots`` nor ``$UNSEE_LLAMA_SLOTS`` names
    a count, and every core's prefill where neither ``--batch-threads`` nor
    ``$UNSEE_LLAMA_BATCH_THREADS`` names one; nothing for another engine (a flag given there is refused)."""
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
    if batch_threads is None and not environ.get(BATCH_THREADS_ENV):
        given["batch_threads"] = get_cores()
    return {k: v for k, v in given.items() if v is not None}


__all__ = ["BATCH_THREADS_ENV", "DEFAULT_SLOTS", "get_llamacpp_options"]
