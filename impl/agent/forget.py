"""Algorithm 1, Provenance-Guided Selective Replay, and B5, the full reset,
as functions over a runtime's state that return values (the verbs
:meth:`~unsee.impl.agent.runtime.AgentRuntime.forget` and ``full_reset`` call them).

A forget (:meth:`AgentRuntime.forget <unsee.impl.agent.runtime.AgentRuntime.forget>`,
which reads as the algorithm) is four steps over values:
:func:`plan_replay` (lines 1-4: tau, the taint closure, the checkpoint, the
drafts) reads the state; :func:`restore_checkpoint` (line 5) restores the
checkpoint into a replay runtime beside the old one (on a new lineage
sharing the checkpoint's prefix copy-on-write), which re-enacts the sanitized
suffix (lines 6-10); :func:`get_replayed` reads the new state back with what
the replay did (:class:`Replayed`: its drafts and costs included); the
runtime only then adopts it, so a forget that fails halfway leaves the
session as it was. :func:`compute_report` builds the report from the value.
``reset_sources`` does the same from ``R_0``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore
from unsee.impl.agent.drafts import Drafts, DraftsAccount, choose_drafts
from unsee.impl.agent.episode import Step
from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.report import ForgetReport, ReportExtra, RestoreAccount
from unsee.impl.agent.state import RuntimeState
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.files import get_cpu_isa
from unsee.impl.engines.protocol import Residue, RestoreReport, get_draft_bound, get_draft_policy
from unsee.impl.util.text import normalize

Progress = Callable[[int, int], None]


def sanitize_step(step: Step, source_id: str) -> Step:
    """Algorithm 1 line 7: remove the target's items, keep the rest verbatim."""
    return attrs.evolve(step, items=tuple(i for i in step.items if i.source != source_id))


class TargetNotFoundError(LookupError):
    """A target value that no observed item holds."""


class AmbiguousTargetError(LookupError):
    """A target value held by several sources."""


#: The runtime a forget works on (an ``AgentRuntime``; not imported here,
#: since the runtime imports this module).
Runtime = Any


@attrs.frozen
class ReplayPlan:
    """Algorithm 1 lines 1-4 as a value: what a replay restores and re-enacts."""

    pending: tuple[str, ...]  # the sources to forget
    tau: int  # the first step that observed one of them
    closure: tuple[str, ...]  # the taint closure, in the graph's order
    checkpoint: Checkpoint  # the latest checkpoint before tau
    shared: bool  # its lineage is in memory (else the restore rebuilds it from its manifest)
    drafts: Drafts | None  # the replay's drafts (None: every turn decoded)
    drafts_account: DraftsAccount  # the report's account of that choice


@attrs.frozen
class Forgotten:
    """What a forget or a reset did, as its report says it (:func:`compute_report`)."""

    method: str
    source_ids: tuple[str, ...]
    tau: int = 0
    checkpoint: Checkpoint | None = None
    closure: tuple[str, ...] = ()
    invocations: int = 0  # transitions the replay ran
    already_forgotten: bool = False
    drafts: DraftsAccount = attrs.field(factory=DraftsAccount.none)
    restore: RestoreAccount | None = None


@attrs.frozen
class Replayed:
    """What a replay computed beside the runtime (:func:`get_replayed`):
    the new state, the replay's extensions (whose branch state the runtime
    adopts with it), the state it was computed from, and what it did."""

    state: RuntimeState
    extensions: tuple[Extension, ...]
    base: RuntimeState
    forgotten: Forgotten


def get_restore_account(engine, checkpoint_tokens: int, shared: bool, lineage: str) -> RestoreAccount:
    """What a forget's restore of ``checkpoint_tokens`` kept and what it recomputed.

    The engine declares where a prefill resumes after a restore
    (:attr:`Determinism.restore_granularity`: 1, or vLLM's block size), so a
    shared checkpoint keeps its tokens rounded down to it and the replay's first
    prefill recomputes the rest; a checkpoint rebuilt from its manifest (evicted,
    or a session reopened from its store) keeps nothing. ``served``: what the
    engine saw its restored lineage's first request served, where it says
    (vLLM: whole cached blocks, which may run past the checkpoint into the
    unchanged steps after it, or fall short of it where blocks were evicted)."""
    kept, recomputed = engine.determinism.get_restore_split(checkpoint_tokens) if shared else (0, checkpoint_tokens)
    served = engine.get_restore(lineage) if isinstance(engine, RestoreReport) and lineage in engine.budget.lineages \
        else None
    return RestoreAccount(checkpoint_tokens, engine.determinism.restore_granularity, shared, kept, recomputed, served)


def sanitize_steps(steps: Sequence[Step], source_ids: Sequence[str]) -> list[Step]:
    """Algorithm 1 line 7 over a stream: every step without the items of ``source_ids``."""
    out = []
    for step in steps:
        for source_id in source_ids:
            step = sanitize_step(step, source_id)
        out.append(step)
    return out


# --- Algorithm 1 -------------------------------------------------------------

def plan_replay(state: RuntimeState, engine, pending: Sequence[str], drafts: bool | None = None,
                oracle: bool = False, lookup: bool = True) -> ReplayPlan:
    """Algorithm 1 lines 1-4 over ``state``: tau, the taint closure, the
    checkpoint to restore and the drafts to replay with."""
    tau = min(min(b.turn for b in state.graph.locate_source(s)) for s in pending)  # lines 1-2
    closure = get_closure(state, pending)  # line 3
    checkpoint = state.checkpoints.latest_before(tau)  # line 4
    shared = checkpoint.lineage in engine.budget.lineages
    bound, bound_source = get_draft_bound(engine)
    policy = get_draft_policy(engine)
    chosen, account = choose_drafts(engine.lm, bound, state.graph.blocks(), state.steps, checkpoint.boundary,
                                    drafts, oracle, pending, lookup, policy)
    # the policy only where drafts are replayed: how each turn sized its forwards (the credit rule)
    account = account.with_plan(bound_source, policy if chosen is not None else None, get_cpu_isa())
    return ReplayPlan(tuple(pending), tau, closure, checkpoint, shared, chosen, account)


def get_replayed(runtime: Runtime, base: RuntimeState, plan: ReplayPlan, replay: Runtime, restored: str,
                 method: str, source_ids: Sequence[str]) -> Replayed:
    """Read back a replay run beside ``runtime`` from its state ``base``
    (Algorithm 1 lines 5-10: ``replay``, restored by :func:`restore_checkpoint`
    on ``restored``, has re-enacted the sanitized suffix): the twin's state as
    a value, with the replay's drafts and costs, which the runtime adopts or
    drops (refused if the runtime has moved from ``base`` meanwhile)."""
    account = plan.drafts_account if replay.drafts is None else plan.drafts_account.with_turns(replay.drafts.turns, replay.drafts.stopped)
    checkpoint = plan.checkpoint
    forgotten = Forgotten(method, tuple(source_ids), plan.tau, checkpoint, plan.closure,
                          replay.transitions - base.transitions, drafts=account,
                          restore=get_restore_account(runtime.engine, checkpoint.token_offset, plan.shared, restored))
    return Replayed(replay.state, tuple(replay.extensions), base, forgotten)


def restore_checkpoint(runtime: Runtime, checkpoint: Checkpoint, forgetting: Sequence[str] = (),
                       drafts: Drafts | None = None) -> Runtime:
    """Algorithm 1 line 5: ``Restore(c*)`` into a new runtime beside ``runtime``
    that has also forgotten ``forgetting`` and replays with ``drafts``."""
    engine, state = runtime.engine, runtime.state
    extensions = [e.branch(runtime, checkpoint) for e in runtime.extensions]
    if checkpoint.lineage in engine.budget.lineages:
        # The first token_offset tokens, shared copy-on-write: O(layers)
        # whatever the length, and the replay's prefills never write into
        # the checkpoint's lineage, so the old state stays intact.
        lineage = engine.fork(checkpoint.lineage, checkpoint.token_offset)
    else:  # evicted by the KV budget, or a session reopened from its store
        lineage = runtime.rebuild_lineage(checkpoint.context)
        if len(engine.tokens(lineage)) != checkpoint.token_offset:
            raise RuntimeError(f"checkpoint {checkpoint.boundary}: manifest rebuilds "
                               f"{len(engine.tokens(lineage))} tokens, expected {checkpoint.token_offset}")
    restored = attrs.evolve(state.at_checkpoint(checkpoint, lineage), forgotten=(*state.forgotten, *forgetting))
    return runtime.spawn(extensions, restored, replaying=True, drafts=drafts)


def reset_sources(runtime: Runtime, source_ids: Sequence[str], progress: Progress | None = None,
                  wait: bool = True, upto: int | None = None) -> ForgetReport:
    """B5: replay the counterfactual stream from ``R_0`` through the same
    transitions (``upto``: the first ``upto`` observed steps only)."""
    with runtime.hold("reset", wait):
        started, before = time.perf_counter(), runtime.engine.counters.snapshot()
        pending = begin_forget(runtime, source_ids)
        base = runtime.state
        tau = min((base.graph.first_entry(s) for s in pending), default=0)
        # a state before R_0 (no lineage): the spawned runtime begins it
        empty = RuntimeState(checkpoints=CheckpointStore(runtime.settings.checkpoint_policy),
                             forgotten=(*base.forgotten, *pending))
        fresh = runtime.spawn([e.branch(runtime, None) for e in runtime.extensions], empty, replaying=True)
        steps = base.steps if upto is None else base.steps[:upto]
        fresh.run(sanitize_steps(steps, pending), progress)
        forgotten = Forgotten("reset", tuple(source_ids), tau, None, get_closure(base, pending), fresh.transitions)
        runtime.adopt(Replayed(fresh.state, tuple(fresh.extensions), base, forgotten), "reset")
        return compute_report(runtime, forgotten, started, before)


def begin_forget(runtime: Runtime, source_ids: Sequence[str]) -> list[str]:
    """Every forget and full reset starts here, inside the session lock:
    the sources still to forget (an id never observed is an error that
    changes nothing), announced to the extensions."""
    pending = check_sources(runtime.state, source_ids)
    for extension in runtime.extensions:
        extension.begin_forget(runtime, pending)
    return pending


def check_sources(state: RuntimeState, source_ids: Sequence[str]) -> list[str]:
    """The sources of ``source_ids`` not yet forgotten, in order, once each."""
    if not source_ids:
        raise ValueError("forget needs at least one source id")
    pending = []
    for source_id in dict.fromkeys(source_ids):
        if source_id in state.forgotten:
            continue
        state.graph.locate_source(source_id)  # raises UnknownSourceError naming it
        pending.append(source_id)
    return pending


def get_closure(state: RuntimeState, source_ids: Sequence[str]) -> tuple[str, ...]:
    """Algorithm 1 line 3: the blocks tainted by ``source_ids``, in the graph's order."""
    tainted = set().union(*(state.graph.taint_closure(s) for s in source_ids))
    return tuple(b.id for b in state.graph.blocks() if b.id in tainted)


def find_sources(state: RuntimeState, value: str) -> list[str]:
    """Source ids of observed items whose text contains ``value`` (normalized)."""
    wanted = normalize(value)
    if not wanted:
        raise ValueError("a target value must contain letters or digits")
    return [i.source for s in state.steps for i in s.items if wanted in normalize(i.text)]


def find_one_source(state: RuntimeState, value: str) -> str:
    """The one observed source that holds ``value`` (forget by value)."""
    sources = find_sources(state, value)
    if not sources:
        raise TargetNotFoundError(f"target value {value!r} was never read in this session")
    if len(sources) > 1:
        raise AmbiguousTargetError(
            f"target value {value!r} is present in several sources {sources}; "
            "name the one to forget, or forget them all with forget_many")
    return sources[0]


def compute_report(runtime: Runtime, forgotten: Forgotten, started: float, before: Counters) -> ForgetReport:
    """The report of ``forgotten``, on the state ``runtime`` holds now; ``before``:
    the engine's counters when it started."""
    spent = runtime.engine.counters.snapshot() - before
    digest, assumptions = runtime.digest(), runtime.get_assumptions()
    fields = {}
    for extension in runtime.extensions:
        fields.update(extension.get_report_fields())
    # how the episode was rendered (impl/agent/render.py); what an engine keeps outside its lineages (vLLM)
    extra = ReportExtra(runtime.renderer.describe(), fields,
                        runtime.engine.residue() if isinstance(runtime.engine, Residue) else None, forgotten.restore)
    checkpoint, t = forgotten.checkpoint, runtime.t
    return ForgetReport(
        method=forgotten.method, source_id=",".join(forgotten.source_ids), tau=forgotten.tau, length=t,
        boundary=checkpoint.boundary if checkpoint else (t if forgotten.already_forgotten else 0),
        already_forgotten=forgotten.already_forgotten,
        checkpoint=checkpoint.get_record() if checkpoint else None,
        checkpoint_bytes=checkpoint.nbytes if checkpoint else 0,
        closure=forgotten.closure, invocations=forgotten.invocations,
        spent=spent, wall_s=time.perf_counter() - started, digest=digest, assumptions=assumptions, extra=extra,
        digest_means=runtime.engine.determinism.digest,
        drafts=forgotten.drafts)


__all__ = [
    "AmbiguousTargetError",
    "Forgotten",
    "Progress",
    "ReplayPlan",
    "Replayed",
    "TargetNotFoundError",
    "compute_report",
    "find_one_source",
    "find_sources",
    "get_closure",
    "get_replayed",
    "get_restore_account",
    "plan_replay",
    "reset_sources",
    "restore_checkpoint",
    "sanitize_step",
    "sanitize_steps",
]
