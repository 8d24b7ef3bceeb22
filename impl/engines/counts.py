"""The one record of the work an engine did: a turn's, a forget's and the engine's own counts."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass
class Counters:
    """Work done by an engine, for measuring a span:

        before = engine.counters.snapshot(); ...; spent = engine.counters - before

    An engine keeps one per thread, so a span counts its own thread's work
    only, even where a server interleaves other requests' forwards with it.

    forward_calls          model forwards (a prefill chunk or a decode step is one)
    prefilled_tokens       tokens fed by prefill forwards, canonicalisation and
                           draft verification included
    decoded_tokens         tokens the decoding rule produced (n tokens need n-1
                           decode forwards: the last one is never fed back one
                           by one); draft tokens accepted are not counted here
    draft_accepted_tokens  draft tokens verified and kept (impl/agent/drafts.py)
    draft_rejected_tokens  draft tokens verified and thrown away
    draft_fallbacks        turns re-decoded from the header at an unstable decision
    draft_probes           one-token probe forwards before a verification (the
                           reference's own first decode step, impl/agent/drafts.py);
                           a probe that finds the draft wrong is the start of
                           the turn's decode, one that finds it right is spent
    lookup_forwards        forwards that fed a decided token together with a guess
                           from the lineage's own tokens (impl/engines/decoding.py,
                           `get_lookup`); each replaces the one-token forward
                           that token needed anyway
    lookup_accepted_tokens guessed tokens verified and kept (not in decoded_tokens)
    lookup_rejected_tokens guessed tokens verified and thrown away (the guessed
                           tokens are counted in prefilled_tokens either way)
    rebuilt_tokens         the part of prefilled_tokens spent by `rebuild`, i.e.
                           re-creating a lineage that was evicted or not in memory
    reused_tokens          tokens the prefix cache served instead of prefilling
                           (not counted in prefilled_tokens: nothing was computed)
    """

    forward_calls: int = 0
    prefilled_tokens: int = 0
    decoded_tokens: int = 0
    draft_accepted_tokens: int = 0
    draft_rejected_tokens: int = 0
    draft_fallbacks: int = 0
    draft_probes: int = 0
    lookup_forwards: int = 0
    lookup_accepted_tokens: int = 0
    lookup_rejected_tokens: int = 0
    rebuilt_tokens: int = 0
    reused_tokens: int = 0

    def snapshot(self) -> Counters:
        return replace(self)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(Counters)})

    def since(self, earlier: Counters) -> Counters:
        return self - earlier


__all__ = ["Counters"]
