"""Stop texts (OpenAI's ``stop``): a turn ends once its text contains one of them, and
the text returned stops before it.

:class:`StopTexts` is a :class:`~unsee.impl.engines.decoding.Constraint` that allows every
token and says a turn is done once the decode of its last tokens contains a stop text.
It reads a window of the turn's tokens, not the whole turn: a stop of ``b`` bytes
(UTF-8) that ends in the last token starts within the last ``b`` tokens, since every
token that is not an end of turn holds at least one byte; one token more is read so
that the window's first token, whose decode a tokenizer may change (a SentencePiece
tokenizer drops its leading space), is never part of the stop. A step costs the decode
of ``b + 1`` tokens, whatever the turn's length, and the answer is a function of the
turn's tokens alone (what a replay needs, :class:`~unsee.impl.engines.decoding.Constraint`).

The tokens a turn commits (what its KV holds) include the token that completed the stop
(it may hold more text after it); only the text returned is cut (:func:`cut_at_stop`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

#: at most this many stop texts, as OpenAI's API allows
MAX_STOPS = 4


class StopTexts:
    """Ends a turn once its text contains one of ``stops`` (module docstring)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Iterable[str], eos_ids: Iterable[int] = ()):
        self.decode = decode
        self.stops = tuple(s for s in stops if s)
        self.eos = frozenset(eos_ids)
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 1

    def get_allowed(self, out: Sequence[int]) -> torch.Tensor | None:
        return None

    def is_done(self, out: Sequence[int]) -> bool:
        if not self.stops or not out:
            return False
        tail = [t for t in out[-self.window:] if t not in self.eos]
        text = self.decode(tail)
        return any(s in text for s in self.stops)


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop text in ``text`` starts, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to its first stop text (OpenAI's rule: the stop is not returned)."""
    at = find_stop(text, stops)
    return text if at is None else text[:at]


def get_sendable(text: str, stops: Sequence[str]) -> str:
    """What a stream may send of a turn's ``text`` so far: the text before its first stop,
    less any ending that could be the start of a stop (it is sent once the next tokens show
    it is not)."""
    at = find_stop(text, stops)
    if at is not None:
        return text[:at]
    held = max((n for s in stops if s for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
    return text[:len(text) - held]


__all__ = ["MAX_STOPS", "StopTexts", "cut_at_stop", "find_stop", "get_sendable"]
