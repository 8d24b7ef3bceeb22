"""Opening a new lineage for a new context (a compaction, a new session): forked
from the live one where their first chunks agree, else prefilled."""

from __future__ import annotations

from collections.abc import Sequence

from unsee.impl.engines.protocol import PendingChunks


def open_lineage(engine, live: str, first_chunks: Sequence[Sequence[int]], tokens: Sequence[int]) -> str:
    """A new lineage holding ``tokens`` as one chunk from position 0, for a new
    context (a compaction, a new session) that opens with the system block.
    Where the live lineage's first recorded chunk (``first_chunks``: it, or
    none) is exactly ``tokens``, its KV is forked rather than prefilled again
    (on Qwen with a tools list, 365 tokens every compaction of every run): the
    same bits, where the engine promises that the same chunking repeats and
    that a crop keeps a fresh prefill's bits, and the live KV is resident.
    Elsewhere, a new lineage and a prefill. The live lineage, which checkpoints
    keep, is left computed whole (its last turn's last token may be pending),
    so that a prefix cache may serve from all of it, as from any other."""
    if isinstance(engine, PendingChunks) and live in engine.budget.lineages:
        engine.flush(live)
    if can_fork_first_chunk(engine, live, first_chunks, tokens):
        return engine.fork(live, len(tokens))
    lineage = engine.new_lineage()
    engine.prefill(lineage, list(tokens))
    return lineage


def can_fork_first_chunk(engine, live: str, first_chunks: Sequence[Sequence[int]], tokens: Sequence[int]) -> bool:
    """Whether :func:`open_lineage` forks ``live`` rather than prefilling ``tokens``."""
    det = engine.determinism
    return bool(list(first_chunks[:1]) == [list(tokens)] and tokens and det.same_chunking_repeats
                and det.crop_continue_is_fresh and not engine.budget.is_evicted(live))


__all__ = ["can_fork_first_chunk", "open_lineage"]
