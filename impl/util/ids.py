"""Ids with types: the runtime's block ids, the engines' lineage handles and the
store's handles for a lineage that is not in memory. Every id is built and read
here, so that no other module spells a suffix or slices a handle by hand.

A block id is ``<step id>/<part>``: the step that wrote the block and which of
its blocks it is. A lineage handle is ``L<n>``, numbered in the order an engine
made them (an LRU that keeps the newest reads the number). A stored handle is
``stored:<handle>``: a checkpoint read back from disk names the lineage it was
taken on, whose cache is gone; it matches no live lineage, so the restore
rebuilds it. ``NO_LINEAGE`` is the state before R_0, which has no cache.
"""
from __future__ import annotations

# The parts of a step, one block each (a step writes some of them).
ANSWER = "answer"      # the model's answer, or a compaction's summary
PLAN = "plan"          # the model's tool call
CALL = "call"          # the call as the tool layer parsed it
RESULT = "result"      # the tool's output, an observation
NOTE = "note"          # a memory write the model made
CONTEXT = "context"    # the new context a compaction starts
MEMORY = "memory"      # memory re-injected at a session start
SYSTEM = "system"      # a new system text (instructions)
PARTS = (ANSWER, PLAN, CALL, RESULT, NOTE, CONTEXT, MEMORY, SYSTEM)

NO_LINEAGE = ""        # before R_0: no cache, no lineage
LINEAGE_PREFIX = "L"
STORED_PREFIX = "stored:"


def compute_block_id(step_id: str, part: str) -> str:
    """The id of ``step_id``'s block ``part`` (one of ``PARTS``)."""
    if part not in PARTS:
        raise ValueError(f"block part {part!r}: not one of {', '.join(PARTS)}")
    return f"{step_id}/{part}"


def get_step_id(block_id: str) -> str:
    """The step that wrote ``block_id`` (the whole id where it names no part)."""
    step_id, sep, _ = block_id.rpartition("/")
    return step_id if sep else block_id


def get_block_part(block_id: str) -> str:
    """Which of its step's blocks ``block_id`` is ("" where it names no part)."""
    _, sep, part = block_id.rpartition("/")
    return part if sep else ""


def is_block_part(block_id: str, part: str) -> bool:
    return get_block_part(block_id) == part


def compute_lineage_handle(number: int) -> str:
    """The handle of an engine's ``number``-th lineage."""
    return f"{LINEAGE_PREFIX}{number}"


def compute_stored_handle(handle: str) -> str:
    """The handle a checkpoint read back from disk names its lineage by."""
    return f"{STORED_PREFIX}{handle}"


def is_stored_handle(handle: str) -> bool:
    return handle.startswith(STORED_PREFIX)


def get_stored_lineage(handle: str) -> str:
    """The lineage a stored handle was taken on."""
    if not is_stored_handle(handle):
        raise ValueError(f"{handle!r} is not a stored handle ({STORED_PREFIX}<handle>)")
    return handle[len(STORED_PREFIX):]


def compute_record_id(step_id: str, source_id: str) -> str:
    """The id of the memory record ``step_id`` stored for the item of ``source_id``
    (a memory step writes one record per item, named by the item's source)."""
    return f"{step_id}/{source_id}"
