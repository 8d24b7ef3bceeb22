"""Metadata-only checkpoints (paper, Section 3.4 (b)): restoring one is a crop.

A checkpoint at boundary ``c`` names the cache lineage it crops and the token
offset to crop it to, plus the ids of what was resident: context blocks,
memory store records, pending plans, and the environment snapshot id. No
tensor is copied; Lemma 1 says the prefix of the live cache *is* ``R_c``.
"""

from __future__ import annotations

import json

import attrs

from unsee.impl.agent.episode import CHECKPOINT_POLICIES, OBSERVED_KINDS, Step


@attrs.frozen
class Checkpoint:
    boundary: int  # the state R_boundary, i.e. after transition `boundary`
    lineage: str  # the cache handle this checkpoint crops
    token_offset: int
    context: tuple[str, ...]  # the prompt manifest: block ids in context order
    memory: tuple[str, ...]
    plans: tuple[str, ...]
    env_snapshot: str | None = None

    def get_record(self) -> dict:
        return attrs.asdict(self)

    @property
    def nbytes(self) -> int:
        """Size of the metadata as stored (JSON, UTF-8)."""
        return len(json.dumps(self.get_record(), separators=(",", ":")).encode())


def is_checkpoint_due(policy: str, boundary: int, next_step: Step | None) -> bool:
    """Whether ``policy`` registers a checkpoint at ``boundary`` (before ``next_step``).

    - ``every_turn``: at every turn boundary;
    - ``before_injection``: at session start and before every step that
      brings external content in (so the boundary ``tau - 1`` always exists);
    - ``session_start``: only at 0 (no reusable pre-target prefix).
    """
    if policy not in CHECKPOINT_POLICIES:
        raise ValueError(f"unknown checkpoint policy {policy!r}; expected one of {CHECKPOINT_POLICIES}")
    if boundary == 0 or policy == "every_turn":
        return True
    if policy == "before_injection":
        return next_step is not None and next_step.kind in OBSERVED_KINDS
    return False


class CheckpointStore:
    """Checkpoints by boundary; Algorithm 1 line 4 picks the latest before ``tau``."""

    def __init__(self, policy: str = "every_turn"):
        if policy not in CHECKPOINT_POLICIES:
            raise ValueError(f"unknown checkpoint policy {policy!r}; expected one of {CHECKPOINT_POLICIES}")
        self.policy = policy
        self._by_boundary: dict[int, Checkpoint] = {}

    def __len__(self) -> int:
        return len(self._by_boundary)

    def all(self) -> list[Checkpoint]:
        return [self._by_boundary[b] for b in sorted(self._by_boundary)]

    def add(self, checkpoint: Checkpoint) -> None:
        self._by_boundary[checkpoint.boundary] = checkpoint

    def latest_before(self, tau: int) -> Checkpoint:
        """``c* = argmax{c : boundary(c) < tau}``."""
        eligible = [b for b in self._by_boundary if b < tau]
        if not eligible:
            raise LookupError(f"no checkpoint before step {tau}; the session-start checkpoint is missing")
        return self._by_boundary[max(eligible)]

    def drop_after(self, boundary: int) -> None:
        """Forget the checkpoints of the invalidated suffix."""
        self._by_boundary = {b: c for b, c in self._by_boundary.items() if b <= boundary}

    def copy(self) -> CheckpointStore:
        other = CheckpointStore(self.policy)
        other._by_boundary = dict(self._by_boundary)
        return other

    def lineages(self) -> set[str]:
        return {c.lineage for c in self._by_boundary.values()}
