"""The lineage skeleton of an engine that computes its own KV (transformers,
llama.cpp): prefill, the prefix cache's serving, and the recomputation of a
served chunk a decode needs, written once over four backend steps.

A backend supplies:

``_forward(handle, lin, ids)``            one forward over ``ids`` at the lineage's end,
                                          appending them to ``lin.tokens``; the logits after the last
``_truncate_to(handle, lin, n)``          keep the first ``n`` tokens and their KV
``_take_rows(handle, lin, src_handle, src, n)``  give ``lin`` the KV of ``src``'s first ``n``
                                          positions (shared, never copied where it can be)
``_check_room(lin, ids)``                 refuse a prefill the backend cannot hold (default: none)
"""

from __future__ import annotations

from collections.abc import Iterable

from unsee.impl.engines.lineage import LineageBook, take_served_chunk


class ComputedKVBook(LineageBook):
    """:class:`LineageBook` plus the verbs' skeleton for an engine whose
    lineages are :class:`~unsee.impl.engines.lineage.ChunkedLineage` objects."""

    def _prefill(self, token_ids: Iterable[int]) -> None:
        """Exactly one forward over ``token_ids`` on the lineage worked on, or,
        inside :meth:`prefix_cache`, the same chunk served from a cached lineage."""
        handle = self._need_current()
        lin = self._get(handle)
        ids = self._check_ids(token_ids)
        self._check_room(lin, ids)
        if self._serve(handle, lin, ids):
            self.counters.reused_tokens += len(ids)
        else:
            start = len(lin.tokens)
            lin.last_logits = self._forward(handle, lin, ids)
            lin.record_chunk(start)
            lin.served_last = False
            self.counters.forward_calls += 1
            self.counters.prefilled_tokens += len(ids)
        lin.changed()
        self.budget.enforce()

    def _check_room(self, lin, ids: list[int]) -> None:
        """Nothing to refuse (a backend with a bounded context says so here)."""

    def _serve(self, handle: str, lin, ids: list[int]) -> bool:
        """Serve chunk ``ids`` on ``lin`` from another cached lineage; False if none has it."""
        found = self._find_served_chunk(lin, ids)
        if found is None:
            return False
        src_handle, src, logits = found
        self._take_rows(handle, lin, src_handle, src, len(lin.tokens) + len(ids))
        take_served_chunk(lin, src, ids, logits)
        self._touch(src_handle)
        return True

    def _get_decodable(self, handle: str):
        """The lineage ``handle``, with the logits a decode continues from."""
        lin = self._get(handle)
        if lin.last_logits is None and lin.served_last:
            self._recompute_served_chunk(handle, lin)  # a served chunk whose logits were not kept
        if lin.last_logits is None:
            raise RuntimeError(f"generate on lineage {handle!r}: no logits to continue from; "
                               "prefill first (a new lineage or a crop has none)")
        return lin

    def _recompute_served_chunk(self, handle: str, lin) -> None:
        """Compute the last (served) chunk for real, for the logits a decode needs."""
        end = lin.chunk_ends.pop()
        start = lin.chunk_ends[-1] if lin.chunk_ends else 0
        ids = lin.tokens[start:end]
        self._truncate_to(handle, lin, start)
        lin.decode_logits = {p: t for p, t in lin.decode_logits.items() if p <= start}
        lin.served_last = False
        self.counters.reused_tokens -= len(ids)  # it was not reused after all
        lin.last_logits = self._forward(handle, lin, ids)
        lin.chunk_ends.append(end)
        lin.changed()
        self.counters.forward_calls += 1
        self.counters.prefilled_tokens += len(ids)


__all__ = ["ComputedKVBook"]
