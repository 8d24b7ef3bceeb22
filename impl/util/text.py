"""Text normalisation shared by the leak audits, the string baselines and
target look-up by value (the paper's "normalized string variants")."""

from __future__ import annotations

import re
import unicodedata


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", text)).strip()


def get_variants(value: str) -> tuple[str, ...]:
    """Normalized variants of the target: the whole value, and each distinctive
    part (runs of 3+ digits, words of 6+ letters)."""
    whole = normalize(value)
    parts = set(re.findall(r"\d{3,}", whole))
    parts |= {w for w in whole.split() if len(w) >= 6 and not w.isdigit()}
    return tuple(sorted({whole, *parts} - {""}, key=len, reverse=True))
