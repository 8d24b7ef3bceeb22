"""Differential comparisons of the runtime (:mod:`unsee.impl`), one per operation.

Each ``compare_*`` function runs two sides of one claim on the same episode
(forget against the full reset, forget against a twin that never saw the
target, the runtime against the executable spec, ...), prints *every* input
(the episode as JSON, the target) and both outputs when they disagree, fails
with an :class:`AssertionError` naming what differed, and otherwise returns
the value both sides agreed on. The properties in ``prop_impl*.py`` are thin
wrappers around these.

The spec comparison lifts the runtime into :mod:`unsee.spec`: a
:class:`LiftedRuntime` is a spec :class:`~unsee.spec.StepFunction` whose
states are runtime digests. Its ``apply(digest, observation)`` looks the
digest up in a registry of runtimes, forks that runtime, turns the spec
observation back into a runtime step and steps it, registers the result
under its digest and returns the digest. Every runtime step becomes a spec
observation whose items are the step's items preceded by a structural marker
item (source id :data:`MARKER`) that carries the step's id, kind and tool, so
the lifted ``F`` can rebuild the step; the marker is never a forget target.

Model caches are engine state: wrap each example in :func:`engine_scope` so
the lineages it created are dropped when it ends.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch

from unsee.impl.agent.episode import Episode, Settings, Step
from unsee.impl.agent.episode import Item as StepItem
from unsee.impl.agent.runtime import AgentRuntime, ForgetReport, sanitize_step
from unsee.impl.conform.episodes import get_tau
from unsee.impl.engines.protocol import Engine
from unsee.spec import (
    Item,
    Observation,
    Run,
    SpliceResult,
    StepFunction,
    compute_replay_invocations,
    counterfactual_trajectory,
    first_entry,
    first_entry_turn,
    get_influence_set,
    get_restore_boundary,
    influence_is_monotone,
    locate_source,
    run_session,
    splice,
)

#: The source id of the structural item that carries a step's id, kind and tool.
MARKER = "@step"

#: How runtime step kinds map onto the spec's observation kinds.
SPEC_KINDS = {"user": "user", "memory": "memory", "tool": "tool", "plan": "user",
              "remember": "event", "compact": "event", "session": "event"}


# --- engine hygiene -------------------------------------------------------------

@contextlib.contextmanager
def engine_scope(engine: Engine) -> Iterator[Engine]:
    """Drop every lineage created inside the block (runtimes made inside it
    must not be used afterwards). Keeps a module-wide engine from growing."""
    before = set(engine.budget.lineages)
    try:
        yield engine
    finally:
        for lineage in engine.budget.lineages:
            if lineage not in before:
                engine.drop(lineage)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads, then restore the count.

    On a shared 2-core machine, OpenMP's spinning workers slowed the tiny
    model 10-100x (3 s instead of 0.02 s for one episode) and SmolLM2 5-20x
    (31-140 s instead of 7 s for one forget-vs-reset comparison); one
    thread avoids the oversubscription. Both sides of a comparison run inside
    one block, so they always share a thread count, which the engine's
    bitwise repeatability assumes."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --- printing and asserting -------------------------------------------------------

def describe_episode(episode: Episode) -> str:
    return json.dumps(episode.to_json(), sort_keys=True)


def describe_runtime(runtime: AgentRuntime) -> dict[str, Any]:
    """What a mismatch report shows of a runtime: its digest, texts, checkpoints, tokens."""
    return {"digest": runtime.digest(), "t": runtime.t, "lineage": runtime.lineage,
            "kv_digest": runtime.engine.digest(runtime.lineage),
            "texts": runtime.texts(), "checkpoints": [c.get_record() for c in runtime.checkpoints.all()],
            "generated_tokens": runtime.generated_tokens()}


def check_agreement(title: str, inputs: dict[str, Any], outputs: dict[str, Any],
                    checks: Sequence[tuple[str, Any, Any]]) -> None:
    """Assert every ``(what, left, right)`` pair is equal; on any mismatch,
    print all inputs, all outputs and every failed pair first."""
    failed = [(what, left, right) for what, left, right in checks if left != right]
    if not failed:
        return
    print(f"=== {title}: {len(failed)} mismatch(es) ===")
    for name, value in inputs.items():
        print(f"input  {name}: {value}")
    for name, value in outputs.items():
        text = json.dumps(value, sort_keys=True, default=repr) if isinstance(value, (dict, list)) else value
        print(f"output {name}: {text}")
    for what, left, right in failed:
        print(f"MISMATCH {what}:\n   left  = {left!r}\n   right = {right!r}")
    raise AssertionError(f"{title}: " + "; ".join(f"{what}: {left!r} != {right!r}" for what, left, right in failed))


# --- running episodes -------------------------------------------------------------

def counting_runtime() -> tuple[type[AgentRuntime], list[str]]:
    """A runtime class that logs the id of every ``F`` call (``step``), in
    itself and in every runtime it spawns (forget's replay, the reset's
    fresh run): an independent count of Corollary 1's invocations."""
    calls: list[str] = []

    class CountingRuntime(AgentRuntime):
        def step(self, step: Step) -> None:
            calls.append(step.id)
            super().step(step)

    return CountingRuntime, calls


def run_episode(engine: Engine, episode: Episode, runtime_class: type[AgentRuntime] = AgentRuntime) -> AgentRuntime:
    runtime = runtime_class.start(engine, episode.system, episode.settings)
    runtime.run(episode.steps)
    return runtime


def get_target(episode: Episode, target: str | None) -> str:
    if target is not None:
        return target
    if episode.target is None:
        raise ValueError("the episode names no target and none was given")
    return episode.target.source


def get_counterfactual_steps(steps: Sequence[Step], removed: Sequence[str] | str) -> list[Step]:
    """The stream with every item of the ``removed`` sources taken out (all else verbatim)."""
    removed = (removed,) if isinstance(removed, str) else tuple(removed)
    out = list(steps)
    for source in removed:
        out = [sanitize_step(step, source) for step in out]
    return out


def run_counterfactual(engine: Engine, system: str, settings: Settings, steps: Sequence[Step],
                       removed: Sequence[str] | str) -> AgentRuntime:
    """The twin ``R^-z_T``: a fresh runtime that never observed the removed sources."""
    twin = AgentRuntime.start(engine, system, settings)
    twin.run(get_counterfactual_steps(steps, removed))
    return twin


def get_expected_boundary(policy: str, tau: int) -> int:
    """The restore boundary each checkpoint policy guarantees: a checkpoint at
    ``tau - 1`` for ``every_turn`` and ``before_injection`` (the target enters
    through an observed step), only session start for ``session_start``."""
    return 0 if policy == "session_start" else tau - 1


# --- forget against the full reset (Theorem 1, Corollary 1) -----------------------------

def compare_forget_with_reset(engine: Engine, episode: Episode, target: str | None = None,
                              drafts: bool | None = None) -> ForgetReport:
    """Run the episode, fork it, ``forget`` on one copy and ``full_reset`` on
    the other. They must agree on the digest and on every generated token id;
    forget must invoke ``F`` ``T - boundary`` times (``T - tau + 1`` when a
    checkpoint sits at ``tau - 1``), the reset ``T`` times. ``drafts`` is
    passed to forget (the reset never uses drafts). Returns forget's report."""
    target = get_target(episode, target)
    length, tau = len(episode.steps), get_tau(episode, target)
    original = run_episode(engine, episode)
    other = original.fork()
    forget = original.forget(target, drafts=drafts)
    reset = other.full_reset(target)
    boundary = get_expected_boundary(episode.settings.checkpoint_policy, tau)
    check_agreement(
        "forget vs full_reset",
        {"episode": describe_episode(episode), "target": target, "T": length, "tau": tau},
        {"forget report": forget.to_json(), "reset report": reset.to_json(),
         "forget state": describe_runtime(original), "reset state": describe_runtime(other)},
        [("digest", forget.digest, reset.digest),
         ("runtime digest", original.digest(), other.digest()),
         ("generated tokens", original.generated_tokens(), other.generated_tokens()),
         ("texts", original.texts(), other.texts()),
         ("forget tau", forget.tau, tau), ("reset tau", reset.tau, tau),
         ("forget T", forget.length, length), ("reset T", reset.length, length),
         ("forget boundary", forget.boundary, boundary),
         ("forget invocations = T - boundary", forget.invocations, length - forget.boundary),
         ("forget invocations = T - tau + 1", forget.invocations,
          length - tau + 1 if boundary == tau - 1 else length),
         ("forget closure", forget.closure, reset.closure),
         ("reset invocations = T", reset.invocations, length)])
    return forget


def compare_replay_with_and_without_drafts(engine: Engine, episode: Episode,
                                           target: str | None = None) -> ForgetReport:
    """Replay with verified drafts against replay that re-decodes every turn:
    same digest, same generated tokens, same invocations; the drafted replay
    decodes no more tokens. Returns the drafted replay's report."""
    target = get_target(episode, target)
    drafted = run_episode(engine, episode)
    decoded = drafted.fork()
    with_drafts = drafted.forget(target, drafts=True)
    without = decoded.forget(target, drafts=False)
    check_agreement(
        "replay with drafts vs replay without",
        {"episode": describe_episode(episode), "target": target},
        {"with drafts": with_drafts.to_json(), "without": without.to_json()},
        [("digest", with_drafts.digest, without.digest),
         ("generated tokens", drafted.generated_tokens(), decoded.generated_tokens()),
         ("invocations", with_drafts.invocations, without.invocations),
         ("drafts mode", (with_drafts.drafts.mode, without.drafts.mode), ("verify", "off")),
         ("decodes no more", with_drafts.decoded_tokens <= without.decoded_tokens, True)])
    return with_drafts


def compare_forget_with_counterfactual(engine: Engine, episode: Episode, target: str | None = None) -> str:
    """``forget`` against the definition itself: a fresh runtime that ran the
    counterfactual stream ``o^-z`` from ``R_0``. Returns the agreed digest."""
    target = get_target(episode, target)
    runtime = run_episode(engine, episode)
    report = runtime.forget(target)
    twin = run_counterfactual(engine, episode.system, episode.settings, episode.steps, target)
    check_agreement(
        "forget vs counterfactual twin",
        {"episode": describe_episode(episode), "target": target},
        {"forget report": report.to_json(), "forget state": describe_runtime(runtime),
         "twin state": describe_runtime(twin)},
        [("digest", report.digest, twin.digest()),
         ("generated tokens", runtime.generated_tokens(), twin.generated_tokens()),
         ("observation log", [attrs.asdict(s) for s in runtime.steps],
          [attrs.asdict(s) for s in get_counterfactual_steps(episode.steps, target)])])
    return report.digest


def compare_replay_cost(engine: Engine, episode: Episode, target: str | None = None) -> int:
    """Corollary 1 counted from outside: the ids of the ``F`` calls forget
    makes are exactly the suffix ``boundary+1..T`` (so ``T - boundary`` of
    them, ``T - tau + 1`` at boundary ``tau - 1``), and the report, the
    spec's cost model and the spec's choice of restore boundary agree.
    The reset's calls are all ``T`` steps. Returns forget's invocations."""
    target = get_target(episode, target)
    length, tau = len(episode.steps), get_tau(episode, target)
    runtime_class, calls = counting_runtime()
    runtime = run_episode(engine, episode, runtime_class)
    twin = runtime.fork()  # of the same class: its reset's F calls are counted too
    boundaries = [c.boundary for c in runtime.checkpoints.all()]
    del calls[:]
    report = runtime.forget(target)
    forget_calls = list(calls)
    del calls[:]
    reset = twin.full_reset(target)
    reset_calls = list(calls)
    ids = [s.id for s in episode.steps]
    boundary = get_expected_boundary(episode.settings.checkpoint_policy, tau)
    check_agreement(
        "replay cost",
        {"episode": describe_episode(episode), "target": target, "T": length, "tau": tau,
         "checkpoint boundaries": boundaries},
        {"forget report": report.to_json(), "forget calls": forget_calls, "reset calls": reset_calls},
        [("boundary (policy)", report.boundary, boundary),
         ("boundary (spec argmax)", report.boundary, get_restore_boundary(boundaries, tau)),
         ("F calls replayed", forget_calls, ids[report.boundary:]),
         ("invocations (report vs counted)", report.invocations, len(forget_calls)),
         ("invocations (spec cost model)", report.invocations, compute_replay_invocations(length, report.boundary)),
         ("expected_invocations", report.expected_invocations, report.invocations),
         ("T - tau + 1 at boundary tau-1", report.invocations,
          length - tau + 1 if report.boundary == tau - 1 else report.invocations),
         ("reset F calls", reset_calls, ids),
         ("reset invocations", reset.invocations, length)])
    return report.invocations


# --- Lemma 1 -----------------------------------------------------------------------

def compare_prefix_with_counterfactual(engine: Engine, episode: Episode,
                                       target: str | None = None) -> tuple[str, ...]:
    """Lemma 1 on the runtime: step the real and the counterfactual streams
    side by side; the digests agree at every boundary ``t <= tau - 1`` and
    differ at ``tau`` (the target's tokens and source id have entered).
    Returns the shared prefix digests ``R_0..R_{tau-1}``."""
    target = get_target(episode, target)
    tau = get_tau(episode, target)
    real = AgentRuntime.start(engine, episode.system, episode.settings)
    twin = AgentRuntime.start(engine, episode.system, episode.settings)
    real_digests, twin_digests = [real.digest()], [twin.digest()]
    for t, step in enumerate(episode.steps, start=1):
        real.step(step)
        twin.step(sanitize_step(step, target) if t == tau else step)
        real_digests.append(real.digest())
        twin_digests.append(twin.digest())
    checks = [(f"R_{t} (t < tau)", real_digests[t], twin_digests[t]) for t in range(tau)]
    checks.append((f"R_{tau} differs from R^-z_{tau}", real_digests[tau] != twin_digests[tau], True))
    check_agreement(
        "prefix sharing (Lemma 1)",
        {"episode": describe_episode(episode), "target": target, "tau": tau},
        {"real digests": real_digests, "counterfactual digests": twin_digests,
         "real state": describe_runtime(real), "twin state": describe_runtime(twin)},
        checks)
    return tuple(real_digests[:tau])


# --- no forget (B0) against the reset ---------------------------------------------------

def get_resident_blocks(runtime: AgentRuntime) -> list[str]:
    """Blocks of the live state: context, memory store, pending plans."""
    return list(dict.fromkeys(runtime.context + runtime.memory + runtime.plans))


def compare_no_forget_with_reset(engine: Engine, episode: Episode, target: str | None = None) -> bool:
    """B0 (no forget) against the reset. The state differs from the
    counterfactual exactly when some resident block still carries the
    target (provenance soundness: an untainted state is the counterfactual
    one), and the KV cache itself differs while the target's own block is in
    the live cache. Returns whether B0 differs from the reset."""
    target = get_target(episode, target)
    runtime = run_episode(engine, episode)
    reset = runtime.fork()
    reset.full_reset(target)
    resident = get_resident_blocks(runtime)
    carriers = [b for b in resident if target in runtime.graph[b].source_ids]
    source_in_cache = any(b.id in runtime.context for b in runtime.graph.locate_source(target))
    differs = runtime.digest() != reset.digest()
    kv_differs = engine.digest(runtime.lineage) != engine.digest(reset.lineage)
    checks = [("B0 differs iff a resident block carries the target", differs, bool(carriers))]
    if source_in_cache:
        checks.append(("B0's KV differs while the target's block is cached", kv_differs, True))
    check_agreement(
        "no forget (B0) vs full_reset",
        {"episode": describe_episode(episode), "target": target},
        {"resident carriers": carriers, "target block in cache": source_in_cache,
         "B0 state": describe_runtime(runtime), "reset state": describe_runtime(reset)},
        checks)
    return differs


# --- the runtime against the executable spec ----------------------------------------------

def step_to_observation(step: Step) -> Observation:
    """A runtime step as a spec observation: a marker item, then the step's items."""
    marker = Item(MARKER, json.dumps({"id": step.id, "kind": step.kind, "tool": step.tool}, sort_keys=True))
    return Observation(SPEC_KINDS[step.kind], (marker,) + tuple(Item(i.source, i.text) for i in step.items))


def observation_to_step(observation: Observation) -> Step:
    """The inverse of :func:`step_to_observation` (items the spec removed stay removed)."""
    if not observation.items or observation.items[0].source_id != MARKER:
        raise ValueError(f"observation {observation!r} lost its {MARKER!r} marker item")
    marker, items = observation.items[0], observation.items[1:]
    meta = json.loads(marker.value)
    if SPEC_KINDS[meta["kind"]] != observation.kind:
        raise ValueError(f"observation kind {observation.kind!r} does not match step kind {meta['kind']!r}")
    return Step(meta["id"], meta["kind"], tuple(StepItem(i.source_id, i.value) for i in items), meta["tool"])


class LiftedRuntime:
    """The runtime's transition as a spec step function over digests."""

    def __init__(self, engine: Engine, system: str, settings: Settings):
        root = AgentRuntime.start(engine, system, settings)
        self.initial = root.digest()
        self.registry: dict[str, AgentRuntime] = {self.initial: root}
        self.calls = 0
        randomness = "none" if settings.temperature == 0 else "seeded"
        self.step = StepFunction("runtime-lift", self.apply, randomness)

    def apply(self, state: str, observation: Observation) -> str:
        self.calls += 1
        runtime = self.registry[state].fork()
        runtime.step(observation_to_step(observation))
        digest = runtime.digest()
        self.registry.setdefault(digest, runtime)  # equal digests: equal futures
        return digest


def compare_with_spec(engine: Engine, episode: Episode, target: str | None = None) -> SpliceResult:
    """The runtime's ``forget`` against the spec's ``splice`` over the lifted ``F``.

    The spec's splice (restore the stored digest at the impl's checkpoint
    boundaries, replay sanitized observations through the lifted runtime)
    must land on forget's digest with the same ``tau``, boundary and number
    of invocations, claim exactness, and equal the spec's counterfactual
    trajectory from the boundary on. Returns the spec's result."""
    target = get_target(episode, target)
    runtime = run_episode(engine, episode)
    checkpoints = [c.boundary for c in runtime.checkpoints.all()]
    lift = LiftedRuntime(engine, episode.system, episode.settings)
    run = Run(tuple(step_to_observation(s) for s in episode.steps))
    stored = run_session(lift.step, lift.initial, run)
    result = splice(lift.step, run, stored, target, checkpoints=checkpoints)
    twin = counterfactual_trajectory(lift.step, lift.initial, run.observations, target)
    real_final = runtime.digest()
    report = runtime.forget(target)
    check_agreement(
        "runtime forget vs spec splice (lifted F)",
        {"episode": describe_episode(episode), "target": target, "checkpoints": checkpoints,
         "observations": [repr(o) for o in run.observations]},
        {"forget report": report.to_json(),
         "spec": {"state": result.state, "states": list(result.states), "tau": result.tau,
                  "boundary": result.boundary, "invocations": result.invocations,
                  "violations": list(result.assumptions.get_violations())},
         "stored": list(stored), "counterfactual": list(twin)},
        [("stored R_T = runtime's R_T", stored[-1], real_final),
         ("final state", result.state, report.digest),
         ("invocations", result.invocations, report.invocations),
         ("tau", result.tau, report.tau),
         ("spec first_entry", first_entry(run.observations, target), report.tau),
         ("boundary", result.boundary, report.boundary),
         ("spec claims exactness (A1-A3)", result.is_exact, True),
         ("splice = counterfactual from the boundary", tuple(twin[result.boundary:]), tuple(result.states))])
    return result


def compare_graph_with_spec(runtime: AgentRuntime, target: str, episode: Episode | None = None) -> frozenset[str]:
    """The runtime's artifact graph lifted into the spec's: the influence set
    equals the taint closure, the source blocks and ``tau`` agree, and the
    influence set only grows turn by turn (Lemma 2 (i)). Returns the closure."""
    lifted = runtime.graph.to_spec()
    impl_closure = runtime.graph.taint_closure(target)
    spec_closure = get_influence_set(lifted, target)
    check_agreement(
        "artifact graph vs spec provenance",
        {"episode": describe_episode(episode) if episode is not None else "(none)", "target": target},
        {"lifted graph": [attrs.asdict(a) for a in lifted.artifacts], "impl closure": impl_closure,
         "spec influence set": sorted(spec_closure)},
        [("influence set", spec_closure, frozenset(impl_closure)),
         ("closure has no duplicates", len(impl_closure), len(set(impl_closure))),
         ("source blocks", sorted(a.id for a in locate_source(lifted, target)),
          sorted(b.id for b in runtime.graph.locate_source(target))),
         ("first entry turn", first_entry_turn(lifted, target), runtime.graph.first_entry(target)),
         ("influence_is_monotone", influence_is_monotone(lifted, target), True)])
    return spec_closure


# --- the engine's services: KV budget and prefix cache ----------------------------------

def compare_forget_with_reset_under_budget(engine: Engine, episode: Episode,
                                           target: str | None = None) -> ForgetReport:
    """Forget against the full reset on an engine with a KV budget: the same
    digest and generated tokens, ``T - boundary`` invocations (a restore from
    an evicted checkpoint lineage rebuilds it from the manifest and reports
    it in ``rebuilt_tokens``), and the unpinned bytes, measured by
    :meth:`KVEngine.memory` after every step of the run, the forget's replay
    and the reset, never exceed the budget. Returns forget's report."""
    target = get_target(episode, target)
    length, budget = len(episode.steps), engine.budget.limit
    observed: list[int] = []

    def observe(done: int = 0, total: int = 0) -> None:
        observed.append(engine.budget.memory().unpinned_bytes)

    original = AgentRuntime.start(engine, episode.system, episode.settings)
    original.run(episode.steps, observe)
    other = original.fork()
    forget = original.forget(target, observe)
    reset = other.full_reset(target, observe)
    checks = [("digest", forget.digest, reset.digest),
              ("generated tokens", original.generated_tokens(), other.generated_tokens()),
              ("forget invocations = T - boundary", forget.invocations, length - forget.boundary),
              ("rebuilt tokens are prefilled tokens", forget.rebuilt_tokens <= forget.prefilled_tokens, True)]
    if budget is not None:
        checks.append(("unpinned bytes <= budget after every step", max(observed) <= budget, True))
    else:
        checks.append(("no budget: nothing evicted or rebuilt", (engine.budget.evictions, forget.rebuilt_tokens), (0, 0)))
    check_agreement(
        "forget vs full_reset under a KV budget",
        {"episode": describe_episode(episode), "target": target, "budget": budget},
        {"forget report": forget.to_json(), "reset report": reset.to_json(), "unpinned bytes": observed,
         "memory": engine.budget.memory().to_json(), "evictions": engine.budget.evictions,
         "forget state": describe_runtime(original), "reset state": describe_runtime(other)},
        checks)
    return forget


def compare_prefix_cache_reset_with_reset(engine: Engine, episode: Episode, target: str | None = None):
    """B5' (the full reset served by the engine's prefix cache) against B5 on
    the same base state: the same digest, generated tokens, transitions and
    decoded tokens; B5' prefills no more than B5, and what it did not
    prefill the cache served (prefilled' + reused' == prefilled). Returns
    B5''s :class:`~unsee.impl.methods.baselines.MethodResult`."""
    from unsee.impl.methods.baselines import apply_method  # baselines import the runtime; keep this module light

    target = get_target(episode, target)
    base = run_episode(engine, episode)
    reset, b5 = apply_method(base, "reset", target)
    served, b5p = apply_method(base, "reset-prefix-cache", target)
    check_agreement(
        "reset served by a prefix cache (B5') vs reset (B5)",
        {"episode": describe_episode(episode), "target": target, "budget": engine.budget.limit},
        {"B5": b5.to_json(), "B5'": b5p.to_json(), "B5 state": describe_runtime(reset),
         "B5' state": describe_runtime(served)},
        [("digest", b5p.digest, b5.digest),
         ("generated tokens", served.generated_tokens(), reset.generated_tokens()),
         ("invocations", b5p.invocations, b5.invocations),
         ("decoded tokens (decoding is never served)", b5p.decoded_tokens, b5.decoded_tokens),
         ("B5' prefills no more than B5", b5p.prefilled_tokens <= b5.prefilled_tokens, True),
         ("prefilled + reused = B5's prefilled", b5p.prefilled_tokens + b5p.reused_tokens, b5.prefilled_tokens),
         ("B5 reuses nothing", b5.reused_tokens, 0)])
    return b5p
