"""Where a forgotten value still stands in kept bytes: the one matcher behind
``unsee verify --value`` (:func:`unsee.impl.store.records.find_residue`) and
conformance's residue check (:mod:`unsee.impl.conform.checks`).

What is looked for, per value (:func:`get_needles`): the value itself, case
and Unicode compatibility forms aside (NFKC, casefolded, as the leak audits
normalise), and its normalised variants
(:func:`~unsee.impl.util.text.get_variants`: the whole value, and its runs of
3+ digits and words of 6+ letters), each allowing any run of punctuation and
space where the normalised form has one space.

**A needle is found only where it stands as its own token.** A match counts
when the characters on either side of it are not letters or digits, and not
an identifier joiner (``- _ . / +``) with a letter or digit beyond it. So the
digits ``4417`` inside a random hex id (``fb5ef1eb84ae4417bba1...``), a UUID
segment (``...-4417-...``), ``conv_4417``, ``0.4417`` or a base64 run are no
hit, while ``4417 Elm``, ``(4417)`` and ``"4417"`` are.

**A needle made of digits alone does not match a structured number**: a digit
run that stands where a JSON or CSV number stands (after ``:``, ``[`` or ``,``
and before ``,``, ``]``, ``}`` or the end, spaces aside), such as a byte count
``"size": 4417`` or a token id in ``[12, 4417, 5]``. The check reads bytes, not
the implementation's schema, so it cannot tell a count that happens to equal
the target's house number from the house number; the target entered as text,
so what an implementation derives from it and keeps is text (an answer, a
note, a summary, a string field), which the whole value and its word parts
are still matched in everywhere. A value written as a bare number field is
the one form this lets through (docs/conformance.md, "The residue check").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unsee.impl.util.text import get_variants

#: Characters that join letters and digits into one identifier.
ID_JOINERS = frozenset("-_./+")
#: What stands before and after a number field (spaces skipped).
NUMBER_BEFORE, NUMBER_AFTER = frozenset(":[,"), frozenset(",]}")
#: Characters of context shown on either side of a hit.
CONTEXT = 24


@dataclass(frozen=True)
class Needle:
    """One thing a residue scan looks for: ``description`` names it in a
    finding; ``pattern`` runs over the folded text (NFKC, casefolded)."""

    description: str
    pattern: re.Pattern
    digits_only: bool


@dataclass(frozen=True)
class Hit:
    """A needle standing in a kept file: where (a byte offset into the file)
    and the bytes around it."""

    needle: str
    name: str
    offset: int
    context: bytes

    def describe(self) -> str:
        return f"{self.needle} in {self.name} at byte {self.offset}: {self.context!r}"


def fold(text: str) -> str:
    """The text a needle is matched in: NFKC, casefolded (as ``normalize``
    reads text, punctuation kept so that token boundaries can be seen)."""
    return unicodedata.normalize("NFKC", text).casefold()


def compute_pattern(text: str) -> re.Pattern:
    """``text`` (folded) as a pattern where each run of punctuation and space
    matches any such run, as normalisation equates them."""
    words = [w for w in re.split(r"[^\w]+", fold(text)) if w]
    return re.compile(r"[^\w]+".join(re.escape(w) for w in words))


def get_needles(values: Sequence[str]) -> list[Needle]:
    """What a scan for ``values`` looks for (module docstring), in report order."""
    needles = []
    for value in values:
        if not re.search(r"\w", value):
            continue
        needles.append(Needle(f"the value {value!r}", re.compile(re.escape(fold(value))), value.isdigit()))
        needles += [Needle(f"normalised variant {v!r}", compute_pattern(v), v.isdigit()) for v in get_variants(value)]
    return needles


def is_joined(text: str, at: int, step: int) -> bool:
    """Whether the character at ``at`` ties a match to a neighbouring token:
    a letter or digit, or a joiner with a letter or digit beyond it."""
    if not 0 <= at < len(text):
        return False
    if text[at].isalnum():
        return True
    beyond = at + step
    return text[at] in ID_JOINERS and 0 <= beyond < len(text) and text[beyond].isalnum()


def is_number_field(text: str, start: int, end: int) -> bool:
    """Whether the digits at ``start:end`` stand where a JSON or CSV number does."""
    before = text[:start].rstrip(" \t\r\n-")
    after = text[end:].lstrip(" \t\r\n")
    return (not before or before[-1] in NUMBER_BEFORE) and (not after or after[0] in NUMBER_AFTER)


def find_spans(folded: str, needle: Needle) -> list[tuple[int, int]]:
    """Where ``needle`` stands as its own token in ``folded`` (character spans)."""
    spans = []
    for match in needle.pattern.finditer(folded):
        start, end = match.span()
        if is_joined(folded, start - 1, -1) or is_joined(folded, end, 1):
            continue
        if needle.digits_only and is_number_field(folded, start, end):
            continue
        spans.append((start, end))
    return spans


def get_byte_offset(text: str, folded: str, at: int) -> int:
    """The byte offset in the file of the folded text's character ``at``
    (exact where folding kept every character's length, else the nearest
    character by proportion)."""
    if len(folded) != len(text):
        at = round(at * len(text) / max(len(folded), 1))
    return len(text[:at].encode("utf-8", "surrogateescape"))


def find_hits(name: str, raw: bytes, needles: Iterable[Needle]) -> list[Hit]:
    """Every needle standing in ``raw`` (one file's bytes), the first place each stands."""
    text = raw.decode("utf-8", "surrogateescape")
    folded = fold(text)
    hits = []
    for needle in needles:
        spans = find_spans(folded, needle)
        if spans:
            start, end = spans[0]
            offset = get_byte_offset(text, folded, start)
            length = len(folded[start:end].encode("utf-8", "surrogateescape"))
            context = raw[max(0, offset - CONTEXT):offset + length + CONTEXT]
            hits.append(Hit(needle.description, name, offset, context))
    return hits


__all__ = ["CONTEXT", "ID_JOINERS", "Hit", "Needle", "compute_pattern", "find_hits", "find_spans", "fold",
           "get_byte_offset", "get_needles", "is_joined", "is_number_field"]
