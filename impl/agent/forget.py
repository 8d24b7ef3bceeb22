"""Algorithm 1, Provenance-Guided Selective Replay, and B5, the full reset:
the forget verbs of :class:`~unsee.impl.agent.runtime.AgentRuntime`.

``forget`` restores the latest checkpoint before the target's first entry
into a replay runtime beside this one (on a new lineage sharing the
checkpoint's prefix copy-on-write) and re-enacts the sanitized suffix there:
that computes the new state as a value (:meth:`~SelectiveReplay._compute_replay`),
which the runtime only then adopts, so a forget that fails halfway leaves
the session as it was. ``full_reset`` does the same from ``R_0``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore
from unsee.impl.agent.drafts import choose_drafts
from unsee.impl.agent.episode import Step
from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.report import ForgetReport
from unsee.impl.agent.state import RuntimeState
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


@attrs.frozen
class Replayed:
    """What a replay computed beside the runtime (:meth:`SelectiveReplay._compute_replay`):
    the new state, the replay's extensions (whose branch state the runtime
    adopts with it), and what the report says of how it was reached."""

    state: RuntimeState
    extensions: tuple[Extension, ...]
    tau: int
    checkpoint: Checkpoint
    closure: tuple[str, ...]
    invocations: int  # transitions the replay ran
    drafts: dict
    restore: dict


def get_restore_fields(engine, checkpoint_tokens: int, shared: bool, lineage: str) -> dict:
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
    fields = {"checkpoint_tokens": checkpoint_tokens, "granularity": engine.determinism.restore_granularity,
              "shared": shared, "cached_tokens": kept, "recomputed_tokens": recomputed}
    served = engine.get_restore(lineage) if isinstance(engine, RestoreReport) and lineage in engine.budget.lineages \
        else None
    if served is not None:
        fields["served"] = served
    return fields


class SelectiveReplay:
    """The forget verbs, a part of :class:`~unsee.impl.agent.runtime.AgentRuntime`
    (which supplies the state, ``_restore``, ``_spawn`` and ``_adopt``)."""

    # --- Algorithm 1 ---------------------------------------------------------

    def forget(self, source_id: str, progress: Progress | None = None, wait: bool = True,
               drafts: bool | None = None, oracle: bool = False, lookup: bool = True) -> ForgetReport:
        """Provenance-Guided Selective Replay (Algorithm 1): after it, the state
        equals that of a twin that never observed ``source_id``.

        Forgetting a source that was already forgotten is a no-op (the state
        already is that twin's) and says so in the report. A forget that
        arrives while a step is running waits for that step to commit, or
        raises :class:`SessionBusyError` when ``wait`` is false.

        ``drafts``: replay model turns as verified drafts (impl/agent/drafts.py);
        None means on wherever the engine has a measured discrepancy bound.
        ``oracle``: B7-oracle, the paper's variant: turns whose step is
        labelled independent of the target are re-prefilled unverified (a
        baseline; not exact when a label is wrong). ``lookup``: with drafts,
        also guess from the context where a turn is decoded (impl/agent/drafts.py);
        False measures drafts alone.
        """
        return self.forget_many([source_id], progress, wait, drafts, oracle, lookup)

    def forget_many(self, source_ids: Sequence[str], progress: Progress | None = None,
                    wait: bool = True, drafts: bool | None = None, oracle: bool = False,
                    lookup: bool = True) -> ForgetReport:
        """Forget several sources in one replay: the twin never observed any of them."""
        with self._exclusive(wait, "forget"):
            started, before = time.perf_counter(), self.engine.counters.snapshot()
            pending = self._begin_forget(source_ids)
            if not pending:
                return self._report("replay", source_ids, 0, None, (), 0, started, before,
                                    already_forgotten=True)
            base = self._state
            replayed = self._compute_replay(pending, progress, drafts, oracle, lookup)
            self._check_unchanged(base, "forget")
            self._adopt(replayed.state, replayed.extensions)
            return self._report("replay-oracle" if oracle else "replay", source_ids, replayed.tau,
                                replayed.checkpoint, replayed.closure, replayed.invocations, started, before,
                                drafts=replayed.drafts, restore=replayed.restore)

    def _compute_replay(self, pending: Sequence[str], progress: Progress | None = None, drafts: bool | None = None,
                        oracle: bool = False, lookup: bool = True) -> Replayed:
        """Algorithm 1 beside this runtime: the state of a twin that never
        observed ``pending``, as a new value; this runtime is left as it was
        (forget adopts the result). The replay runs in a runtime of its
        own, spawned at the restored state, whose result is read back."""
        taus = [min(b.turn for b in self.graph.locate_source(s)) for s in pending]  # lines 1-2
        tau = min(taus)
        closure = self._closure(pending)  # line 3
        checkpoint = self.checkpoints.latest_before(tau)  # line 4
        shared = checkpoint.lineage in self.engine.budget.lineages  # else _restore rebuilds it from the manifest
        bound, bound_source = get_draft_bound(self.engine)
        policy = get_draft_policy(self.engine)
        chosen, draft_info = choose_drafts(self.engine.lm, bound, self.graph.blocks(), self.steps,
                                           checkpoint.boundary, drafts, oracle, pending, lookup, policy)
        draft_info["bound_source"] = bound_source  # "calibrated" (on this CPU) or shipped from another
        if chosen is not None and policy is not None:
            draft_info["policy"] = policy.to_json()  # how each turn sized its forwards (the credit rule)
        draft_info["cpu_isa"] = get_cpu_isa()
        # line 5: share the kept prefix of the lineage (a crop, no copy)
        replay = self._restore(checkpoint, pending, chosen)
        restored, transitions_before = replay.lineage, replay.transitions
        replay.run([self._sanitize(s, pending) for s in self.steps[checkpoint.boundary:]], progress)  # lines 6-10
        restore = get_restore_fields(self.engine, checkpoint.token_offset, shared, restored)
        if chosen is not None:
            draft_info["totals"] = chosen.get_totals()
            draft_info["turns"] = [attrs.asdict(t) for t in chosen.turns]
        return Replayed(replay.state, tuple(replay.extensions), tau, checkpoint, closure,
                        replay.transitions - transitions_before, draft_info, restore)

    def full_reset(self, source_id: str | Sequence[str], progress: Progress | None = None,
                   wait: bool = True, upto: int | None = None) -> ForgetReport:
        """B5: replay the counterfactual stream from ``R_0`` through the same
        transitions. ``upto``: replay only the first ``upto`` observed steps
        (``unsee verify`` rebuilds a receipt's prefix of the log)."""
        source_ids = [source_id] if isinstance(source_id, str) else list(source_id)
        with self._exclusive(wait, "reset"):
            started, before = time.perf_counter(), self.engine.counters.snapshot()
            pending = self._begin_forget(source_ids)
            tau = min((self.graph.first_entry(s) for s in pending), default=0)
            closure, base = self._closure(pending), self._state
            # a state before R_0 (no lineage): the spawned runtime begins it
            empty = RuntimeState(checkpoints=CheckpointStore(self.settings.checkpoint_policy),
                                 forgotten=(*self._state.forgotten, *pending))
            fresh = self._spawn([e.branch(self, None) for e in self.extensions], empty, replaying=True)
            steps = self._state.steps if upto is None else self._state.steps[:upto]
            fresh.run([self._sanitize(s, pending) for s in steps], progress)
            self._check_unchanged(base, "reset")
            self._adopt(fresh.state, fresh.extensions)
            return self._report("reset", source_ids, tau, None, closure, fresh.transitions, started, before)

    def _check_unchanged(self, base: RuntimeState, what: str) -> None:
        """The replay was computed from ``base``; a step this thread made
        meanwhile (the session lock is re-entrant: from a progress callback,
        say) would be lost by adopting it, so the forget is refused instead."""
        if self._state is not base:
            raise RuntimeError(f"{what} refused: the session changed while it replayed (a step on the same "
                               "thread, e.g. from its progress callback); nothing was adopted")

    def _begin_forget(self, source_ids: Sequence[str]) -> list[str]:
        """Every forget and full reset starts here, inside the session lock:
        the sources still to forget (an id never observed is an error that
        changes nothing), announced to the extensions."""
        pending = self._check_sources(source_ids)
        for extension in self.extensions:
            extension.begin_forget(self, pending)
        return pending

    def _check_sources(self, source_ids: Sequence[str]) -> list[str]:
        if not source_ids:
            raise ValueError("forget needs at least one source id")
        pending = []
        for source_id in dict.fromkeys(source_ids):
            if source_id in self._state.forgotten:
                continue
            self.graph.locate_source(source_id)  # raises UnknownSourceError naming it
            pending.append(source_id)
        return pending

    def _closure(self, source_ids: Sequence[str]) -> tuple[str, ...]:
        tainted = set().union(*(self.graph.taint_closure(s) for s in source_ids))
        return tuple(b.id for b in self.graph.blocks() if b.id in tainted)

    @staticmethod
    def _sanitize(step: Step, source_ids: Sequence[str]) -> Step:
        for source_id in source_ids:
            step = sanitize_step(step, source_id)
        return step

    def find_sources(self, value: str) -> list[str]:
        """Source ids of observed items whose text contains ``value`` (normalized)."""
        wanted = normalize(value)
        if not wanted:
            raise ValueError("a target value must contain letters or digits")
        return [i.source for s in self._state.steps for i in s.items if wanted in normalize(i.text)]

    def forget_value(self, value: str, progress: Progress | None = None, wait: bool = True) -> ForgetReport:
        """Forget by value: exactly one observed source must hold it."""
        sources = self.find_sources(value)
        if not sources:
            raise TargetNotFoundError(f"target value {value!r} was never read in this session")
        if len(sources) > 1:
            raise AmbiguousTargetError(
                f"target value {value!r} is present in several sources {sources}; "
                "name the one to forget, or forget them all with forget_many")
        return self.forget(sources[0], progress, wait)

    def _report(self, method: str, source_ids: Sequence[str], tau: int, checkpoint: Checkpoint | None,
                closure: Sequence[str], invocations: int, started: float, before,
                already_forgotten: bool = False, drafts: dict | None = None,
                restore: dict | None = None) -> ForgetReport:
        spent = self.engine.counters.snapshot() - before
        digest, assumptions = self.digest(), self.get_assumptions()
        extra = {"rendering": self.renderer.describe()}  # how the episode was rendered (impl/agent/render.py)
        for extension in self.extensions:
            extra.update(extension.get_report_fields())
        if isinstance(self.engine, Residue):  # an engine keeping blocks outside its lineages (vLLM)
            extra["engine_residue"] = self.engine.residue()
        if restore is not None:
            extra["restore"] = restore
        return ForgetReport(
            method=method, source_id=",".join(source_ids), tau=tau, length=self.t,
            boundary=checkpoint.boundary if checkpoint else (self.t if already_forgotten else 0),
            already_forgotten=already_forgotten,
            checkpoint=checkpoint.get_record() if checkpoint else None,
            checkpoint_bytes=checkpoint.nbytes if checkpoint else 0,
            closure=tuple(closure), invocations=invocations,
            prefilled_tokens=spent.prefilled_tokens, decoded_tokens=spent.decoded_tokens,
            forward_calls=spent.forward_calls, wall_s=time.perf_counter() - started,
            rebuilt_tokens=spent.rebuilt_tokens, reused_tokens=spent.reused_tokens,
            digest=digest, assumptions=assumptions, extra=extra, digest_means=self.engine.determinism.digest,
            draft_accepted_tokens=spent.draft_accepted_tokens, draft_rejected_tokens=spent.draft_rejected_tokens,
            drafts=drafts or {"mode": "off", "why": "no replay of model turns from drafts"})


__all__ = ["AmbiguousTargetError", "Progress", "Replayed", "SelectiveReplay", "TargetNotFoundError", "get_restore_fields",
           "sanitize_step"]
