"""The session record as the store writes it: canonical form and hash,
JSON and text fields as SQLite takes them, token ids as bytes, and the
residue audit over a session's files (docs/persistence.md, "Zero residue").
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from unsee.impl.agent.tools.layer import TOOLS
from unsee.impl.store.schema import StoreError
from unsee.impl.util.residue import find_hits, get_needles


def canonical_record(record: dict) -> dict:
    """The session record with process-local cache handles replaced by labels.

    A checkpoint names the cache lineage it crops by a handle (``L3``) that
    means nothing outside the process; what the state says is only *which
    checkpoints share a lineage*. Handles become ``lineage:<n>`` numbered by
    first appearance, so equal sessions have equal canonical records."""
    labels: dict[str, str] = {}
    out = dict(record)
    checkpoints = []
    for c in record["checkpoints"]:
        c = dict(c)
        c["lineage"] = labels.setdefault(c["lineage"], f"lineage:{len(labels)}")
        checkpoints.append(c)
    out["checkpoints"] = checkpoints
    return out


def record_hash(record: dict) -> str:
    """sha256 of the canonical record (JSON, sorted keys): equal sessions, equal hashes."""
    text = json.dumps(canonical_record(record), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def dump_json(value: Any) -> str | bytes:
    # ensure_ascii=False: text is stored as UTF-8, the way a byte scan looks for it
    return bind_text(json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True))


def load_json(value: str | bytes) -> Any:
    try:
        return json.loads(read_text(value))
    except RecursionError:  # a hostile file's nesting bomb
        raise StoreError("damaged session store: a JSON field nests too deeply") from None
    except (ValueError, TypeError) as exc:
        raise StoreError(f"damaged session store: a JSON field does not parse ({exc})") from None


def bind_text(text: str | None) -> str | bytes | None:
    """A string as SQLite takes it: UTF-8 text, or, for a string holding lone
    surrogates (valid in JSON and in Python, not in UTF-8), the same bytes
    with the surrogates passed through, stored as a BLOB in the column."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def read_text(value: str | bytes | None) -> str | None:
    """The inverse of :func:`bind_text`."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:  # a hostile or damaged file
        raise StoreError(f"damaged session store: a text field is not UTF-8 ({exc.reason})") from None


def pack_tokens(tokens: Sequence[int]) -> bytes:
    buf = array("I", tokens) if array("I").itemsize == 4 else array("L", tokens)
    if sys.byteorder != "little":
        buf.byteswap()
    return buf.tobytes()


def unpack_tokens(blob: bytes) -> list[int]:
    buf = array("I") if array("I").itemsize == 4 else array("L")
    buf.frombytes(blob)
    if sys.byteorder != "little":
        buf.byteswap()
    return buf.tolist()


def session_files(path: str | Path) -> list[Path]:
    """Every file the session owns on disk that exists now: the database and
    SQLite's side files (rollback journal; a WAL and its index are never
    created by this store, but are listed if something else made them)."""
    path = Path(path)
    return [p for p in (path, *(Path(f"{path}{s}") for s in ("-journal", "-wal", "-shm"))) if p.exists()]



def find_residue(files: Iterable[str | Path], value: str, encode=None) -> list[str]:
    """Where a target value survives in the raw bytes of ``files``.

    Looks, in every byte of every file (live rows, free pages, journal), for
    the value and its normalised variants standing as their own tokens
    (:mod:`unsee.impl.util.residue`: not digits inside a random id, not a
    number field), and, with ``encode`` (a tokenizer's ``encode``), for the
    value's token ids as the store packs them (uint32 little-endian), with and
    without a leading space. Returns one line per finding, naming the file,
    the byte offset and the bytes around it; empty means no residue."""
    packed = {}
    if encode is not None:
        for prefix in ("", " "):
            ids = encode(prefix + value)
            if ids:
                packed[f"token ids of {prefix + value!r}"] = pack_tokens(ids)
    needles = get_needles([value])
    found = []
    for path in files:
        raw = Path(path).read_bytes()
        found += [h.describe() for h in find_hits(str(path), raw, needles)]
        for kind, needle in packed.items():
            at = raw.find(needle)
            if at >= 0:
                found.append(f"{kind} in {path} at byte {at}")
    return found


#: The keys of a tool session's ``extra`` before each extension was stored
#: under its name (stores written before issue 19; schema version 2 both).
LEGACY_TOOL_KEYS = ("calls", "effects", "shadow", "snapshots", "tool_config", "world")


def upgrade_extra(extra: dict) -> dict:
    """A stored ``extra`` in today's form: the tool layer's keys of an older
    store move under the layer's name; anything else is kept as stored."""
    if TOOLS in extra or not set(LEGACY_TOOL_KEYS) <= set(extra):
        return extra
    rest = {k: v for k, v in extra.items() if k not in LEGACY_TOOL_KEYS}
    return rest | {TOOLS: {k: extra[k] for k in LEGACY_TOOL_KEYS}}


__all__ = ["bind_text", "canonical_record", "dump_json", "find_residue", "load_json", "pack_tokens", "read_text",
           "record_hash", "session_files", "unpack_tokens",
           "upgrade_extra"]
