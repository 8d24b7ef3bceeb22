"""Hypothesis strategies over the executable specification (:mod:`unsee.spec`).

Strategies are nouns and compose from small pieces: ``values()`` and ``keys()``
make ``items``, items make ``observations()``, observations plus an
``environments()`` draw make ``runs()``; ``targets(run)`` picks a source id the
run really contains; ``checkpoint_sets(length)`` picks restore boundaries;
``step_functions()`` and ``sanitizers()`` pick the ``F`` and the ``Sanitize``
of Algorithm 1. ``splice_cases()`` bundles one draw of each into a
:class:`SpliceCase`, the input of Theorem 1 and Corollary 1.

Everything is kept small (short streams, one- or two-letter values, three
environment keys) so that examples shrink to a few observations and collisions
between values, which the non-injective step function needs, are common.

The bottom of the module holds the comparison helpers the properties share:
they run a statement and, when it fails, print every input and both
trajectories before asserting.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

import attrs
from hypothesis import Phase, settings
from hypothesis import strategies as st

from unsee.spec import (
    OBSERVATION_KINDS,
    Artifact,
    CommittedEffect,
    Item,
    Observation,
    ProvenanceGraph,
    Run,
    StepFunction,
    add_artifact,
    counterfactual_stream,
    draw_unseeded_entropy,
    first_entry,
    record_observations,
    remove_item,
    run_session,
    sanitize_observation,
    splice,
    splice_equals_counterfactual,
    trajectory,
)
from unsee.spec.transition import State

# --- example budgets ---------------------------------------------------------


def scaled_settings(fraction: float, floor: int = 5) -> settings:
    """Settings with a fraction of the active profile's ``max_examples``.

    Expensive properties use this instead of a fixed count, so ``ci`` stays
    fast and ``nightly`` still scales the search up.
    """
    return settings(max_examples=max(floor, int(settings().max_examples * fraction)))


def search_settings(multiple: float = 1.0, floor: int = 20) -> settings:
    """Settings for a :func:`hypothesis.find` search, scaled like :func:`scaled_settings`
    but never below ``floor`` (a search that must find something needs room).
    Only generation and shrinking: the explain phase would re-run a found
    example many times for a report that ``find`` never prints."""
    return settings(max_examples=max(floor, int(settings().max_examples * multiple)), database=None,
                    phases=(Phase.generate, Phase.shrink))


# --- observations and runs ---------------------------------------------------

#: Environment keys that tool items read; three, so reads and writes collide.
KEYS = ("k0", "k1", "k2")

#: What a committed effect writes when a strategy must be sure the value is new:
#: ``values()`` never produces it (its alphabet has no ``!``).
FRESH_VALUE = "new!"

#: Kinds that carry external content (an ``event`` carries none).
CONTENT_KINDS = ("user", "memory", "tool")


def values() -> st.SearchStrategy[str]:
    """Item contents: at most two letters of ``abc`` (shrinks to ``''``)."""
    return st.text(alphabet="abc", max_size=2)


def keys() -> st.SearchStrategy[str]:
    """Environment keys a tool item may read."""
    return st.sampled_from(KEYS)


def environments() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """The environment before step 1, as the sorted pairs :class:`Run` stores."""
    return st.dictionaries(keys(), values(), max_size=len(KEYS)).map(lambda d: tuple(sorted(d.items())))


@attrs.frozen
class ObservationDraft:
    """An observation before its items are numbered: kind plus (value, key) pairs."""

    kind: str
    contents: tuple[tuple[str, str | None], ...] = ()


def item_contents(kind: str) -> st.SearchStrategy[tuple[str, str | None]]:
    """One item's ``(value, key)``: only tool items may carry a key."""
    key = st.none() | keys() if kind == "tool" else st.none()
    return st.tuples(values(), key)


def observation_drafts(kinds: Sequence[str] = OBSERVATION_KINDS) -> st.SearchStrategy[ObservationDraft]:
    """One observation: an ``event`` has no items, the other kinds one or two."""
    def with_items(kind: str) -> st.SearchStrategy[ObservationDraft]:
        if kind == "event":
            return st.just(ObservationDraft("event"))
        return st.lists(item_contents(kind), min_size=1, max_size=2).map(
            lambda contents: ObservationDraft(kind, tuple(contents)))
    return st.sampled_from(tuple(kinds)).flatmap(with_items)


def number_items(drafts: Sequence[ObservationDraft]) -> tuple[Observation, ...]:
    """Give every item a unique source id ``s0, s1, ...`` in stream order."""
    counter = 0
    stream = []
    for draft in drafts:
        items = []
        for value, key in draft.contents:
            items.append(Item(f"s{counter}", value, key))
            counter += 1
        stream.append(Observation(draft.kind, tuple(items)))
    return tuple(stream)


@st.composite
def draft_streams(draw, min_size: int = 1, max_size: int = 5) -> list[ObservationDraft]:
    """Observation drafts for a stream with at least one item (a target exists):
    one content-carrying observation placed among arbitrary others (no filter,
    so no draw is wasted; shrinks to a single one-item user turn)."""
    others = draw(st.lists(observation_drafts(), min_size=max(0, min_size - 1), max_size=max_size - 1))
    position = draw(st.integers(0, len(others)))
    return others[:position] + [draw(observation_drafts(CONTENT_KINDS))] + others[position:]


def observations(min_size: int = 1, max_size: int = 5) -> st.SearchStrategy[tuple[Observation, ...]]:
    """An observation stream ``o_1..o_T`` with unique source ids and at least one item."""
    return draft_streams(min_size, max_size).map(number_items)


def committed_effects(length: int, max_size: int = 2) -> st.SearchStrategy[tuple[CommittedEffect, ...]]:
    """Writes the real run committed at steps ``1..length`` (assumption A3)."""
    effect = st.builds(CommittedEffect, st.integers(1, max(1, length)), keys(), values())
    return st.lists(effect, max_size=max_size).map(tuple)


@st.composite
def runs(draw, min_size: int = 1, max_size: int = 5, with_effects: bool = False) -> Run:
    """A consistent :class:`Run`: tool items hold what their key held when they ran.

    Plain runs commit no effects; ``with_effects=True`` adds a few arbitrary ones.
    """
    stream = draw(observations(min_size, max_size))
    environment = draw(environments())
    effects = draw(committed_effects(len(stream))) if with_effects else ()
    return record_observations(stream, environment, effects)


@st.composite
def effectful_runs(draw, max_size: int = 5) -> Run:
    """A run whose committed effects change what a replayed tool read returns.

    A keyed tool item reads ``k`` at step ``t``; an effect at a step ``e >= t``
    writes :data:`FRESH_VALUE` to ``k``. The real read at ``t`` did not see the
    write, but a replay from any boundary before ``e`` does (no restore undoes
    a committed effect). A few arbitrary effects may come on top.
    """
    drafts = draw(st.lists(observation_drafts(), max_size=max_size - 1))
    position = draw(st.integers(0, len(drafts)))
    key = draw(keys())
    read = ObservationDraft("tool", ((draw(values()), key),))
    drafts = drafts[:position] + [read] + drafts[position:]
    stream = number_items(drafts)
    read_step = position + 1
    effect = CommittedEffect(draw(st.integers(read_step, len(stream))), key, FRESH_VALUE)
    extra = draw(committed_effects(len(stream), max_size=1))
    return record_observations(stream, draw(environments()), (effect,) + extra)


def get_source_ids(run_or_stream: Run | Sequence[Observation]) -> tuple[str, ...]:
    stream = run_or_stream.observations if isinstance(run_or_stream, Run) else run_or_stream
    return tuple(source for observation in stream for source in observation.get_source_ids())


def targets(run_or_stream: Run | Sequence[Observation]) -> st.SearchStrategy[str]:
    """A forget target: a source id that occurs in the stream."""
    return st.sampled_from(get_source_ids(run_or_stream))


def missing_targets(run_or_stream: Run | Sequence[Observation]) -> st.SearchStrategy[str]:
    """A source id that never enters the stream."""
    present = set(get_source_ids(run_or_stream))
    return st.sampled_from(["zz", "s99", "", "s0 "]).filter(lambda s: s not in present)


def checkpoint_sets(length: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Checkpoint boundaries: any subset of ``0..T`` (0 is implicit in splice)."""
    return st.sets(st.integers(0, length), max_size=3).map(lambda c: tuple(sorted(c)))


def checkpoint_sets_at(boundary: int, length: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Checkpoint sets that contain ``boundary`` (e.g. ``tau - 1``) and maybe more."""
    return checkpoint_sets(length).map(lambda c: tuple(sorted(set(c) | {boundary})))


# --- step functions ----------------------------------------------------------

def get_digest(value: object) -> str:
    """SHA-256 of ``repr(value)``: stable across processes (unlike ``hash``)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()


def apply_hash_chain(state: State, observation: Observation) -> State:
    """Injective in practice: every state names its whole history."""
    return get_digest((state, observation))


def apply_selective_read(state: State, observation: Observation) -> State:
    """State ``(log, counter)``. User and tool items append their values to the
    log; memory items only bump the counter (their values are never read); an
    event is a compaction that keeps the last two log entries. Different
    streams can therefore reach equal states: ``F`` is not injective."""
    log, counter = state
    if observation.kind in ("user", "tool"):
        return log + tuple(item.value for item in observation.items), counter
    if observation.kind == "memory":
        return log, counter + len(observation.items)
    return log[-2:], counter


def sample_token(rng: random.Random, observation: Observation) -> str:
    """One sampled "token": a word the observation offers, plus random bits."""
    words = [item.value for item in observation.items] + [observation.kind]
    return f"{rng.choice(words)}:{rng.getrandbits(24):06x}"


def make_seeded_sampler(seed: int) -> Callable[[State, Observation], State]:
    def apply(state: State, observation: Observation) -> State:
        rng = random.Random(int(get_digest((seed, state, observation)), 16))
        return state + (sample_token(rng, observation),)
    return apply


def apply_unseeded_sampler(state: State, observation: Observation) -> State:
    """The seeded sampler with fresh entropy per call: A1 fails."""
    rng = random.Random(int(get_digest((draw_unseeded_entropy(), state, observation)), 16))
    return state + (sample_token(rng, observation),)


#: ``R_init`` of each step-function family (the name before any ``(``).
INITIAL_STATES: dict[str, State] = {
    "hash_chain": "0" * 64,
    "selective_read": ((), 0),
    "seeded_sampler": (),
    "unseeded_sampler": (),
    "undeclared_sampler": (),
}


def get_initial_state(step: StepFunction) -> State:
    return INITIAL_STATES[step.name.split("(")[0]]


HASH_CHAIN = StepFunction("hash_chain", apply_hash_chain, "none")
SELECTIVE_READ = StepFunction("selective_read", apply_selective_read, "none")
UNSEEDED_SAMPLER = StepFunction("unseeded_sampler", apply_unseeded_sampler, "unseeded")
#: Unseeded but declared ``none``: only the empirical probe of
#: :func:`unsee.spec.is_deterministic` (two evaluations must agree) catches it.
UNDECLARED_SAMPLER = StepFunction("undeclared_sampler", apply_unseeded_sampler, "none")


def seeded_sampler(seed: int) -> StepFunction:
    return StepFunction(f"seeded_sampler(seed={seed})", make_seeded_sampler(seed), "seeded")


def hash_chains() -> st.SearchStrategy[StepFunction]:
    return st.just(HASH_CHAIN)


def selective_readers() -> st.SearchStrategy[StepFunction]:
    return st.just(SELECTIVE_READ)


def seeded_samplers() -> st.SearchStrategy[StepFunction]:
    return st.integers(0, 3).map(seeded_sampler)


def unseeded_samplers() -> st.SearchStrategy[StepFunction]:
    """Step functions that violate A1: declared unseeded, or unseeded in disguise."""
    return st.sampled_from((UNSEEDED_SAMPLER, UNDECLARED_SAMPLER))


def step_functions() -> st.SearchStrategy[StepFunction]:
    """Step functions that satisfy A1: greedy (injective or not) or seeded."""
    return st.one_of(hash_chains(), selective_readers(), seeded_samplers())


def any_step_functions() -> st.SearchStrategy[StepFunction]:
    """All of them, A1 violators included."""
    return st.one_of(step_functions(), unseeded_samplers())


# --- sanitizers --------------------------------------------------------------

@attrs.frozen
class Sanitizer:
    """A named ``Sanitize(o, z)`` (a bare function would print as an address)."""

    name: str
    apply: Callable[[Observation, str], Observation] = attrs.field(eq=False, repr=False)

    def __call__(self, observation: Observation, target: str) -> Observation:
        return self.apply(observation, target)


def keep_everything(observation: Observation, target: str) -> Observation:
    return observation


def redact_string(observation: Observation, target: str) -> Observation:
    """Keep the item, replace its content (B6-style string redaction)."""
    items = tuple(Item(i.source_id, "[REDACTED]", i.key) if i.source_id == target else i
                  for i in observation.items)
    return attrs.evolve(observation, items=items)


def amputate_observation(observation: Observation, target: str) -> Observation:
    """Drop every item of the observation that carries the target."""
    return attrs.evolve(observation, items=()) if target in observation.get_source_ids() else observation


def drop_with_successor(observation: Observation, target: str) -> Observation:
    """Drop the target and the item that followed it (``s{n+1}`` after ``s{n}``):
    an over-eager "source and descendants" cut that also loses a clean item."""
    observation = remove_item(observation, target)
    if target.startswith("s") and target[1:].isdigit():
        observation = remove_item(observation, f"s{int(target[1:]) + 1}")
    return observation


CORRECT_SANITIZER = Sanitizer("sanitize_observation", sanitize_observation)
BAD_SANITIZERS = (
    Sanitizer("identity", keep_everything),
    Sanitizer("string_redaction", redact_string),
    Sanitizer("amputation", amputate_observation),
    Sanitizer("drop_with_successor", drop_with_successor),
)


def bad_sanitizers() -> st.SearchStrategy[Sanitizer]:
    """Sanitizers that break A2 on some runs."""
    return st.sampled_from(BAD_SANITIZERS)


def sanitizers() -> st.SearchStrategy[Sanitizer]:
    """The correct sanitizer first (it is what examples shrink to), then the bad ones."""
    return st.sampled_from((CORRECT_SANITIZER,) + BAD_SANITIZERS)


# --- provenance graphs -------------------------------------------------------

def read_patterns(length: int) -> st.SearchStrategy[tuple[frozenset[int], ...]]:
    """Attribution for :func:`unsee.spec.build_selective_graph`: for each turn
    ``t``, the earlier turns whose prompt blocks its model turn reads."""
    return st.tuples(*(st.frozensets(st.integers(1, t - 1), max_size=t - 1) if t > 1 else st.just(frozenset())
                       for t in range(1, length + 1)))


def read_patterns_skipping(length: int, skipped: int) -> st.SearchStrategy[tuple[frozenset[int], ...]]:
    """Read patterns in which no model turn reads the prompt block of turn ``skipped``."""
    return read_patterns(length).map(lambda reads: tuple(r - {skipped} for r in reads))


@st.composite
def provenance_graphs(draw, max_size: int = 8) -> ProvenanceGraph:
    """An arbitrary append-only graph built with :func:`unsee.spec.add_artifact`:
    turns never decrease, parents are earlier artifacts, source ids from ``s0, s1``."""
    graph = ProvenanceGraph()
    turn = 0
    for index in range(draw(st.integers(1, max_size))):
        turn += draw(st.integers(0, 1))
        known = [a.id for a in graph.artifacts]
        parents = draw(st.lists(st.sampled_from(known), unique=True, max_size=3)) if known else []
        sources = draw(st.frozensets(st.sampled_from(("s0", "s1")), max_size=1))
        graph = add_artifact(graph, Artifact(f"a{index}", "block", tuple(parents), sources, turn=turn))
    return graph


# --- splice cases and comparison helpers -----------------------------------

@attrs.frozen
class SpliceCase:
    """One input of Theorem 1 / Corollary 1."""

    step: StepFunction
    initial: State
    run: Run
    target: str
    checkpoints: tuple[int, ...]
    sanitizer: Sanitizer = CORRECT_SANITIZER

    @property
    def tau(self) -> int:
        return first_entry(self.run.observations, self.target)


@st.composite
def splice_cases(draw, steps: st.SearchStrategy[StepFunction] | None = None,
                 run_strategy: st.SearchStrategy[Run] | None = None,
                 sanitizer_strategy: st.SearchStrategy[Sanitizer] | None = None,
                 at_tau_minus_one: bool = False) -> SpliceCase:
    """A step function, a run, a target in it, checkpoints and a sanitizer.

    Defaults: A1-respecting steps, plain runs, the correct sanitizer. With
    ``at_tau_minus_one`` the checkpoint set contains ``tau - 1``.
    """
    step = draw(steps if steps is not None else step_functions())
    run = draw(run_strategy if run_strategy is not None else runs())
    target = draw(targets(run))
    if at_tau_minus_one:
        checkpoints = draw(checkpoint_sets_at(first_entry(run.observations, target) - 1, run.length))
    else:
        checkpoints = draw(checkpoint_sets(run.length))
    sanitizer = draw(sanitizer_strategy if sanitizer_strategy is not None else st.just(CORRECT_SANITIZER))
    return SpliceCase(step, get_initial_state(step), run, target, checkpoints, sanitizer)


def print_case(case: SpliceCase, title: str = "splice case") -> None:
    """Print every input of a case and both trajectories (real and counterfactual)."""
    stream = case.run.observations
    print(f"--- {title} ---")
    print(f"step function : {case.step.name} (randomness={case.step.randomness})")
    print(f"sanitizer     : {case.sanitizer.name}")
    print(f"target        : {case.target!r} (tau={case.tau}, T={case.run.length})")
    print(f"checkpoints   : {case.checkpoints}")
    print(f"environment   : {case.run.environment}")
    print(f"effects       : {case.run.effects}")
    for t, observation in enumerate(stream, start=1):
        print(f"  o_{t} = {observation}")
    real = trajectory(case.step, case.initial, stream)
    twin = trajectory(case.step, case.initial, counterfactual_stream(stream, case.target))
    for t, (r, c) in enumerate(zip(real, twin)):
        mark = "==" if r == c else "!="
        print(f"  R_{t} = {r!r}\n  {mark} R^-z_{t} = {c!r}")


def print_splice(case: SpliceCase, checkpoints: Sequence[int] | None = None) -> None:
    """:func:`print_case` plus what the splice did and its replayed trajectory."""
    print_case(case)
    checkpoints = case.checkpoints if checkpoints is None else tuple(checkpoints)
    stored = run_session(case.step, case.initial, case.run)
    result = splice(case.step, case.run, stored, case.target, checkpoints, sanitizer=case.sanitizer)
    print(f"splice        : checkpoints={checkpoints} boundary={result.boundary} "
          f"invocations={result.invocations} exact={result.is_exact} "
          f"violations={result.assumptions.get_violations()}")
    for t, state in enumerate(result.states, start=result.boundary):
        print(f"  ~R_{t} = {state!r}")


def check_splice(case: SpliceCase, checkpoints: Sequence[int] | None = None) -> None:
    """Assert :func:`unsee.spec.splice_equals_counterfactual` on a case,
    printing every input and all trajectories first when it fails."""
    checkpoints = case.checkpoints if checkpoints is None else tuple(checkpoints)
    holds = splice_equals_counterfactual(case.step, case.initial, case.run, case.target, checkpoints,
                                         sanitizer=case.sanitizer)
    if not holds:
        print_splice(case, checkpoints)
    assert holds, f"splice_equals_counterfactual fails for {case.step.name} at checkpoints {checkpoints}"


def is_splice_counterexample(case: SpliceCase) -> bool:
    """Whether the case breaks Theorem 1: splice claims exactness (at any single
    boundary ``b < tau`` or at the drawn checkpoint set) and misses ``R^-z``."""
    candidates = [case.checkpoints] + [(b,) for b in range(case.tau)]
    return any(not splice_equals_counterfactual(case.step, case.initial, case.run, case.target, c,
                                                sanitizer=case.sanitizer)
               for c in candidates)
