"""The runtime as a deterministic transition system (paper, Section 3.1).

A session is ``R_t = F(R_{t-1}, o_t)`` for ``t = 1..T`` from ``R_0 = R_init``.
States are any hashable values; observations are plain data. Everything here
is a pure function: no I/O, no torch, no clocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

State = Hashable

#: Observation kinds the paper names (user input, memory injection, tool
#: return) plus ``event``: a scaffold trigger such as a compaction, which
#: carries no external content.
OBSERVATION_KINDS = ("user", "memory", "tool", "event")

#: Randomness of a step function, for assumption A1.
RANDOMNESS = ("none", "seeded", "unseeded")


@attrs.frozen
class Item:
    """One unit of external content inside an observation.

    ``source_id`` names the occurrence (the forget request names it);
    ``value`` is the content. ``key`` is set for tool returns: the environment
    key the tool read, so that replay can re-execute the read (assumption A3).
    """

    source_id: str
    value: str
    key: str | None = None


@attrs.frozen
class Observation:
    """``o_t``: the external input consumed by transition ``t``."""

    kind: str
    items: tuple[Item, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.kind not in OBSERVATION_KINDS:
            raise ValueError(f"Observation.kind must be one of {OBSERVATION_KINDS}, got {self.kind!r}")

    def get_source_ids(self) -> tuple[str, ...]:
        return tuple(item.source_id for item in self.items)


@attrs.frozen
class StepFunction:
    """``F: R x O -> R``, with what assumption A1 needs to know about it.

    ``randomness`` is ``none`` (greedy), ``seeded`` (sampling from a fixed
    randomness source) or ``unseeded`` (sampling from fresh entropy: A1 fails).
    """

    name: str
    apply: Callable[[State, Observation], State] = attrs.field(eq=False, repr=False)
    randomness: str = "none"

    def __attrs_post_init__(self) -> None:
        if self.randomness not in RANDOMNESS:
            raise ValueError(f"StepFunction.randomness must be one of {RANDOMNESS}, got {self.randomness!r}")

    def __call__(self, state: State, observation: Observation) -> State:
        return self.apply(state, observation)


class InvocationCounter:
    """Wraps a step function and counts its invocations (Corollary 1)."""

    def __init__(self, step: StepFunction):
        self.step = step
        self.invocations = 0

    def __call__(self, state: State, observation: Observation) -> State:
        self.invocations += 1
        return self.step(state, observation)


def trajectory(step: Callable[[State, Observation], State], initial: State,
               observations: Sequence[Observation]) -> tuple[State, ...]:
    """Equation (1): ``(R_0, R_1, ..., R_T)`` with ``R_t = F(R_{t-1}, o_t)``."""
    states = [initial]
    for observation in observations:
        states.append(step(states[-1], observation))
    return tuple(states)


def is_item_of(observation: Observation, target: str) -> bool:
    """``z in o_t``: the target (a source id) occurs in this observation."""
    return target in observation.get_source_ids()


def first_entry(observations: Sequence[Observation], target: str) -> int:
    """The injection step ``tau`` (1-based): ``z in o_tau`` and ``z not in o_t`` for ``t < tau``.

    Raises ``ValueError`` naming the target when it never enters the stream.
    """
    for t, observation in enumerate(observations, start=1):
        if is_item_of(observation, target):
            return t
    raise ValueError(f"target {target!r} never enters the observation stream")


def remove_item(observation: Observation, target: str) -> Observation:
    """``o \\ {z}``: the observation with every item of source ``target`` removed."""
    kept = tuple(item for item in observation.items if item.source_id != target)
    return attrs.evolve(observation, items=kept)


def counterfactual_stream(observations: Sequence[Observation], target: str) -> tuple[Observation, ...]:
    """``o^-z``: ``o^-z_t = o_t`` for ``t != tau`` and ``o^-z_tau = o_tau \\ {z}`` (paper, Section 3.1)."""
    tau = first_entry(observations, target)
    return tuple(remove_item(o, target) if t == tau else o
                 for t, o in enumerate(observations, start=1))


def counterfactual_trajectory(step: Callable[[State, Observation], State], initial: State,
                              observations: Sequence[Observation], target: str) -> tuple[State, ...]:
    """``R^-z_0..R^-z_T``: the twin that never observed the target."""
    return trajectory(step, initial, counterfactual_stream(observations, target))


def sanitize_observation(observation: Observation, target: str) -> Observation:
    """Algorithm 1 line 7, ``Sanitize(o_t, z)``: remove ``z``, keep the rest verbatim."""
    return remove_item(observation, target)


#: A fresh-entropy source for ``unseeded`` step functions. A global counter
#: (not os.urandom) so that runs stay reproducible while every call differs.
_ENTROPY = itertools.count()


def draw_unseeded_entropy() -> int:
    """A value that differs on every call: what an unseeded sampler sees."""
    return next(_ENTROPY)


def describe(value: Any) -> str:
    """A short printable form of a state or observation for mismatch reports."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
