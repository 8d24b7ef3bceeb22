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


def _check_policy(instance, attribute, policy: str) -> None:
    if policy not in CHECKPOINT_POLICIES:
        raise ValueError(f"unknown checkpoint policy {policy!r}; expected one of {CHECKPOINT_POLICIES}")


def _by_boundary(checkpoints) -> tuple[Checkpoint, ...]:
    return tuple(sorted(checkpoints, key=lambda c: c.boundary))  # linear on sorted input (the usual case)


def _check_distinct(instance, attribute, checkpoints: tuple[Checkpoint, ...]) -> None:
    boundaries = [c.boundary for c in checkpoints]
    if len(set(boundaries)) != len(boundaries):
        raise ValueError(f"checkpoints at boundaries {boundaries}: at most one per boundary")


@attrs.frozen
class CheckpointStore:
    """Checkpoints by boundary, as a value; Algorithm 1 line 4 picks the
    latest before ``tau``. :meth:`with_checkpoint`, :meth:`truncated` and
    :meth:`relabeled` return a new store (the checkpoints, frozen, are shared)."""

    policy: str = attrs.field(default="every_turn", validator=_check_policy)
    #: sorted by boundary (the converter sorts), one per boundary
    _checkpoints: tuple[Checkpoint, ...] = attrs.field(default=(), converter=_by_boundary,
                                                       validator=_check_distinct)

    def __len__(self) -> int:
        return len(self._checkpoints)

    def all(self) -> list[Checkpoint]:
        return list(self._checkpoints)

    def with_checkpoint(self, checkpoint: Checkpoint) -> CheckpointStore:
        """This store with ``checkpoint``, replacing one at the same boundary."""
        if not self._checkpoints or self._checkpoints[-1].boundary < checkpoint.boundary:  # the usual case
            return CheckpointStore(self.policy, (*self._checkpoints, checkpoint))
        return CheckpointStore(self.policy, (*(c for c in self._checkpoints if c.boundary != checkpoint.boundary),
                                             checkpoint))

    def latest_before(self, tau: int) -> Checkpoint:
        """``c* = argmax{c : boundary(c) < tau}``."""
        eligible = [c for c in self._checkpoints if c.boundary < tau]
        if not eligible:
            raise LookupError(f"no checkpoint before step {tau}; the session-start checkpoint is missing")
        return eligible[-1]

    def truncated(self, boundary: int) -> CheckpointStore:
        """This store without the checkpoints of the invalidated suffix (after ``boundary``)."""
        return attrs.evolve(self, checkpoints=(c for c in self._checkpoints if c.boundary <= boundary))

    def relabeled(self, old: str, new: str) -> CheckpointStore:
        """This store with the checkpoints that crop lineage ``old`` cropping
        ``new`` instead (a branch of it with the same prefix)."""
        if old not in self.lineages():
            return self
        return attrs.evolve(self, checkpoints=(attrs.evolve(c, lineage=new) if c.lineage == old else c
                                               for c in self._checkpoints))

    def lineages(self) -> set[str]:
        return {c.lineage for c in self._checkpoints}
