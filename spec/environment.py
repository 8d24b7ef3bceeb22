"""The tool environment, snapshots and committed side effects (assumption A3).

The environment is a mapping from keys to values. Tool returns read it: an
:class:`~unsee.spec.transition.Item` with a ``key`` recorded the value the key
held when the tool ran. A *committed effect* is a write the real run sent to
the outside world at some step (an email, a payment): a snapshot restore
cannot undo it. Replay re-executes tool reads against the restored snapshot
plus every committed effect it cannot undo, so a committed effect after the
restore boundary can change what a replayed tool returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .transition import Item, Observation


@attrs.frozen
class CommittedEffect:
    """A write that the real run committed to the outside world at ``step``."""

    step: int
    key: str
    value: str


@attrs.frozen
class Run:
    """What the operator recorded: the observation stream, the environment
    before step 1, and the effects the run committed."""

    observations: tuple[Observation, ...]
    environment: tuple[tuple[str, str], ...] = ()
    effects: tuple[CommittedEffect, ...] = ()

    @property
    def length(self) -> int:
        """``T``, the number of transitions."""
        return len(self.observations)


def apply_effects(environment: dict[str, str], effects: Sequence[CommittedEffect]) -> dict[str, str]:
    """The environment after the given writes, in step order."""
    result = dict(environment)
    for effect in sorted(effects, key=lambda e: e.step):
        result[effect.key] = effect.value
    return result


def get_environment_at(run: Run, t: int) -> dict[str, str]:
    """What a tool read at step ``t`` saw in the real run: effects of steps ``< t``."""
    return apply_effects(dict(run.environment), [e for e in run.effects if e.step < t])


def get_snapshot(run: Run, boundary: int) -> dict[str, str]:
    """The environment snapshot a checkpoint at ``boundary`` records (after step ``boundary``)."""
    return get_environment_at(run, boundary + 1)


def get_replay_environment(run: Run, boundary: int) -> dict[str, str]:
    """What replay reads after restoring the snapshot at ``boundary``: the
    snapshot plus every effect committed after it, which no restore undoes."""
    later = [e for e in run.effects if e.step > boundary]
    return apply_effects(get_snapshot(run, boundary), later)


def replay_tools(observation: Observation, environment: dict[str, str]) -> Observation:
    """Algorithm 1 line 8, ``ReplayTools``: re-execute each tool read against
    the replay environment. Items without a key are served as recorded."""
    items = tuple(
        Item(item.source_id, environment.get(item.key, ""), item.key) if item.key is not None else item
        for item in observation.items
    )
    return attrs.evolve(observation, items=items)


def record_observations(observations: Sequence[Observation], environment: tuple[tuple[str, str], ...],
                        effects: Sequence[CommittedEffect]) -> Run:
    """Build a consistent :class:`Run`: every tool item's value is what its key
    held in the real run at that step (generators use this)."""
    draft = Run(tuple(observations), tuple(environment), tuple(effects))
    recorded = tuple(replay_tools(o, get_environment_at(draft, t))
                     for t, o in enumerate(draft.observations, start=1))
    return attrs.evolve(draft, observations=recorded)
