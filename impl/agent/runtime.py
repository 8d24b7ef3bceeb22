"""The agent runtime: the transition ``F`` (:meth:`AgentRuntime.step`), ``forget`` (Algorithm 1, over the
functions of impl/agent/forget.py) and ``full_reset`` (B5).

State ``R_t`` (:class:`~unsee.impl.agent.state.RuntimeState`) is the KV cache of the current lineage, the context
blocks in order, the plaintext memory store, the pending tool plans, the provenance graph and the checkpoints, one
value the runtime replaces at every change. ``step`` always goes through the same canonical chunks (one prefill per
block, one per committed model turn), so two runs of the same transitions produce bitwise-identical caches. A forget
builds the new state beside the old one, which the runtime then adopts.

The runtime pins the lineage it extends (:meth:`engine.budget.pin <unsee.impl.engines.protocol.KVBudget.pin>`): under
a KV budget any other may be evicted, and a restore from an evicted checkpoint rebuilds it from its manifest
(:meth:`rebuild_lineage`). Extensions (:mod:`unsee.impl.agent.extensions`, e.g. the tool layer) are components it calls at
fixed points; they change its state through the public verbs (:meth:`append_block`, :meth:`mark_committed`), as the
baselines do (:meth:`rebuild_context`, :meth:`keep_memory`, :meth:`excise_spans`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore, is_checkpoint_due
from unsee.impl.agent.drafts import Drafts, TurnCost, time_forwards
from unsee.impl.agent.episode import STEP_KINDS, Episode, Settings, Step
from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.forget import (
    AmbiguousTargetError,
    Forgotten,
    Progress,
    Replayed,
    TargetNotFoundError,
    begin_forget,
    compute_report,
    find_one_source,
    find_sources,
    get_replayed,
    plan_replay,
    reset_sources,
    restore_checkpoint,
    sanitize_step,
    sanitize_steps,
)
from unsee.impl.agent.provenance import DERIVED_TYPES, RuntimeBlock, get_kept_round, get_turn_chunks
from unsee.impl.agent.render import (
    SUMMARY_OPENING,
    get_edit_tokens,
    get_memory_text,
    get_observation_message,
    get_renderer,
)
from unsee.impl.agent.report import ForgetReport
from unsee.impl.agent.state import RuntimeState
from unsee.impl.engines.lineage import rebuild
from unsee.impl.engines.opening import open_lineage
from unsee.impl.engines.protocol import Assist, Engine, PendingChunks
from unsee.impl.util import ids
from unsee.impl.util.exclusive import Exclusive

if TYPE_CHECKING:  # the decoding rule imports torch; `import unsee` and the conform CLI stay without it
    from unsee.impl.engines.decoding import Rule

SYSTEM_ID = "system"
#: The model turn each kind of step ends with: (its block id's suffix, its block type).
#: A memory step and a new session change the context without one.
TURNS = {"user": (ids.ANSWER, "answer"), "tool": (ids.ANSWER, "answer"), "plan": (ids.PLAN, "plan"),
         "remember": (ids.NOTE, "memory_write"), "compact": (ids.ANSWER, "summary")}


def _view(name: str, doc: str, copy: bool = False) -> property:
    """A read-only attribute of the runtime that reads its state's field (``copy``: a sequence, as a new list)."""
    return property((lambda self: list(getattr(self._state, name))) if copy else (lambda self: getattr(self._state, name)),
                    doc=doc)


class AgentRuntime:
    """A running agent over an :class:`~unsee.impl.engines.protocol.Engine` (it never asks which one).

    ``extensions``: the components it owns (at most one per name), e.g. ``[ToolLayer(...)]``
    (:class:`~unsee.impl.agent.tools.ToolAgentRuntime` builds that)."""

    def __init__(self, engine: Engine, system: str, settings: Settings = Settings(), *,
                 extensions: Iterable[Extension] = ()):
        self.engine = engine
        self.system = system
        self.settings = settings
        self.extensions: tuple[Extension, ...] = tuple(extensions)
        # the model's own chat template, checked append-only before any work (impl/agent/render.py)
        self.renderer = get_renderer(engine.lm, settings.template)
        names = [e.name for e in self.extensions]
        if len(set(names)) != len(names):
            raise ValueError(f"extension names must be distinct; got {names}")
        self._state = RuntimeState(checkpoints=CheckpointStore(settings.checkpoint_policy))
        self._lineage_pin = None  # the engine's pin on the state's lineage (see _set_state)
        self._replaying = False  # a replay runtime (spawned by a forget) re-enacts a sanitized stream
        self._drafts: Drafts | None = None  # a replay's drafts and its turns' costs so far, replaced per turn
        self._exclusive = Exclusive()  # one transition or forget at a time
        self._shared_lineages = False  # once forked or spawned: another runtime names our lineages

    # --- the state -----------------------------------------------------------

    @property
    def state(self) -> RuntimeState:
        """``R_t`` as one value (the runtime replaces it at every change)."""
        return self._state

    replaying = property(lambda self: self._replaying,
                         doc="Whether this runtime re-enacts a sanitized stream for a forget (tools shadow-execute).")
    drafts = property(lambda self: self._drafts,
                      doc="A replay's drafts, with the costs of the turns replayed so far (None outside a replay).")

    def _set_state(self, state: RuntimeState) -> None:
        if state.lineage != self._state.lineage:
            # The pin keeps the lineage out of the KV budget's reach while this runtime refers to it.
            released = self._lineage_pin is not None
            self._lineage_pin = self.engine.budget.pin(state.lineage) if state.lineage != ids.NO_LINEAGE else None
            self._state = state
            if released:
                self.engine.budget.enforce()  # the old lineage may now be evictable
        else:
            self._state = state

    def _update(self, **changes) -> None:
        self._set_state(attrs.evolve(self._state, **changes))

    lineage = _view("lineage", "The cache lineage this runtime extends (``NO_LINEAGE`` before ``R_0``).")
    graph = _view("graph", "The provenance graph (:class:`ArtifactGraph`).")
    checkpoints = _view("checkpoints", "The checkpoints (:class:`CheckpointStore`).")
    t = _view("t", "The number of observed steps.")
    transitions = _view("transitions", "Invocations of ``F`` so far.")
    steps = _view("steps", "The observation log o_1..o_t.", copy=True)
    context = _view("context", "The context block ids in order.", copy=True)
    memory = _view("memory", "The memory store's block ids.", copy=True)
    plans = _view("plans", "The pending plans' block ids.", copy=True)
    forgotten = _view("forgotten", "Source ids forgotten so far (ids, never values).", copy=True)

    def render_first(self) -> str:
        """The system prompt's block, with the definitions of the tools the extensions offer (a tool
        layer's ``get_tool_definitions``) where the template renders them (impl/agent/render.py)."""
        tools = [d for e in self.extensions for d in getattr(e, "get_tool_definitions", list)()]
        return self.renderer.render_first(self.system, tools, self.engine.lm.encode, self.engine.lm.name)

    def get_extension(self, name: str) -> Extension | None:
        return next((e for e in self.extensions if e.name == name), None)

    # --- construction ------------------------------------------------------

    @classmethod
    def start(cls, engine: Engine, system: str, settings: Settings = Settings(), **options) -> AgentRuntime:
        """``R_0``: a fresh lineage holding the system prompt; the session-start checkpoint."""
        runtime = cls(engine, system, settings, **options)
        runtime._begin()
        return runtime

    def _begin(self) -> None:
        """Make this empty runtime ``R_0``: a new lineage with the system prompt."""
        self._update(lineage=self.engine.new_lineage())
        self.append_block(SYSTEM_ID, "system", self.render_first(), parents=(), sources=frozenset())

    @classmethod
    def from_episode(cls, engine: Engine, episode: Episode, progress: Progress | None = None, **options) -> AgentRuntime:
        runtime = cls.start(engine, episode.system, episode.settings, **options)
        runtime.run(episode.steps, progress)
        return runtime

    def run(self, steps: Iterable[Step], progress: Progress | None = None) -> None:
        steps = list(steps)
        for i, step in enumerate(steps, start=1):
            self.step(step)  # the session lock is re-entrant: a caller holding it goes on, others wait
            if progress:
                progress(i, len(steps))

    def hold(self, what: str, wait: bool = True):
        """A block in which no step or forget of this session runs on another thread (a save's
        consistent snapshot); the holding thread may still step."""
        return self._exclusive(wait, what)

    # --- the transition F ---------------------------------------------------

    def step(self, step: Step, wait: bool = True) -> None:
        """``R_t = F(R_{t-1}, o_t)``: the step observed, answered by a model turn where its kind has one
        (:data:`TURNS`), then its kind's own change."""
        with self._exclusive(wait, f"step {step.id}"):
            if any(s.id == step.id for s in self._state.steps):
                raise ValueError(f"step id {step.id!r} was already observed in this session")
            if step.kind not in STEP_KINDS:  # checked before any change to the state
                raise ValueError(f"step {step.id!r}: unknown kind {step.kind!r}; expected one of {STEP_KINDS}")
            state = self._state
            checkpoints = state.checkpoints
            if is_checkpoint_due(checkpoints.policy, state.t, step):
                checkpoints = checkpoints.with_checkpoint(self._take_checkpoint())
            self._update(t=state.t + 1, transitions=state.transitions + 1, steps=(*state.steps, step),
                         checkpoints=checkpoints)
            if step.kind not in TURNS:  # no observation block, no model turn
                (self._on_memory if step.kind == "memory" else self._on_session)(step)
                return
            opening = self._observe(step)
            suffix, type_ = TURNS[step.kind]
            turn = self._answer(ids.compute_block_id(step.id, suffix), type_, header_suffix=opening)
            if step.kind in ("plan", "remember", "compact"):
                self._after_turn(step, turn)

    def _after_turn(self, step: Step, turn: RuntimeBlock) -> None:
        """What a plan, a note or a summary changes once its turn is committed."""
        if step.kind == "plan":
            self._update(plans=(*self._state.plans, turn.id))
            for extension in self.extensions:  # e.g. the tool layer turns the plan into a call (issue 4)
                extension.after_plan(self, step, turn)
        elif step.kind == "remember":
            self._update(memory=(*self._state.memory, turn.id))
        else:  # compaction: the summary and the latest tool round (verbatim) replace the context, on a new lineage
            kept = get_kept_round([self.graph[b] for b in self._state.context if b not in (step.id, turn.id)])
            self._new_lineage(step)
            summary = f"Summary of the earlier conversation:\n{SUMMARY_OPENING} {turn.text}"
            self.append_block(ids.compute_block_id(step.id, ids.CONTEXT), "summary", self.render_block("system", summary),
                              parents=(turn.id,), sources=turn.source_ids, extend_context=True)
            for n, block in enumerate(kept, start=1):  # its tokens in one prefill, its sources kept (a forget reaches it)
                start = len(self.engine.tokens(self.lineage))
                self.engine.prefill(self.lineage, list(block.tokens))
                self.commit_block(attrs.evolve(block, id=f"{step.id}/{ids.CONTEXT}/{n}", parents=(block.id,), chunks=(),
                                               token_span=(start, start + len(block.tokens)), turn=self.t, committed=False))

    def _on_memory(self, step: Step) -> None:
        records = []
        for item in step.items:
            record = self._record(ids.compute_record_id(step.id, item.source), "memory_record", item.text, (),
                                  frozenset({item.source}))
            records.append(record.id)
            self._update(memory=(*self._state.memory, record.id))
        self.append_block(step.id, "memory", self.render_block(*get_observation_message(step)), parents=tuple(self.context) + tuple(records),
                          sources=self.get_resident_sources() | {i.source for i in step.items})

    def _on_session(self, step: Step) -> None:
        """A new session: the plaintext memory store is re-injected into a fresh context."""
        records = [self.graph[r] for r in self._state.memory]
        self._new_lineage(step)
        sources = frozenset().union(*(r.source_ids for r in records))
        self.append_block(ids.compute_block_id(step.id, ids.MEMORY), "memory",
                          self.render_block("system", get_memory_text([r.text for r in records])),
                          parents=tuple(r.id for r in records), sources=sources, extend_context=True)

    # --- building blocks (the verbs extensions and baselines use) ------------

    def get_resident_sources(self) -> frozenset[str]:
        """Every source id carried by a block in context."""
        return frozenset().union(*(self.graph[b].source_ids for b in self._state.context))

    def _record(self, block_id: str, type_: str, text: str, parents: tuple[str, ...],
                sources: frozenset[str]) -> RuntimeBlock:
        """A block that is stored but not in context (a memory record)."""
        return self.commit_block(RuntimeBlock(block_id, type_, text, (), parents, sources, (0, 0), self.t),
                                 extend_context=False)

    def commit_block(self, block: RuntimeBlock, extend_context: bool = True) -> RuntimeBlock:
        """Record ``block`` (whose tokens the caller has put in the live cache)
        in the graph and, with ``extend_context``, at the end of the context."""
        self._set_state(self._state.with_block(block, extend_context))
        return block

    def append_block(self, block_id: str, type_: str, text: str, parents: tuple[str, ...],
                     sources: frozenset[str], extend_context: bool = True) -> RuntimeBlock:
        """Prefill ``text`` as one block (one chunk: the canonical chunking)
        at the end of the live cache, and commit it."""
        tokens = tuple(self.engine.lm.encode(text))
        start = len(self.engine.tokens(self.lineage))
        self.engine.prefill(self.lineage, list(tokens))
        block = RuntimeBlock(block_id, type_, text, tokens, parents, sources, (start, start + len(tokens)), self.t)
        return self.commit_block(block, extend_context)

    def mark_committed(self, block_id: str) -> None:
        """Mark a block committed (a plan whose call's side effect the real world holds)."""
        self._update(graph=self.graph.with_replaced(attrs.evolve(self.graph[block_id], committed=True)))

    def render_block(self, role: str, text: str) -> str:
        """The text of a ``role`` block ('user', 'system', or 'tool' with text the renderer gave) appended now."""
        last = self.graph[self._state.context[-1]] if self._state.context else None
        return self.renderer.render_after(last, self.engine.lm.encode, role, text)

    def _observe(self, step: Step) -> str:
        """Prefill ``step``'s observation as one block; returns what the model's
        turn answering it opens with, after the assistant header."""
        own = frozenset(i.source for i in step.items)
        # a plan step's prompt block is the user's request; "plan" is the model's call
        type_ = {"user": "user", "tool": "tool", "plan": "user"}.get(step.kind, "instruction")
        self.append_block(step.id, type_, self.render_block(*self.renderer.get_message(step)),
                          parents=tuple(self.context), sources=self.get_resident_sources() | own)
        if step.kind == "plan":
            return self.renderer.get_plan_opening(step.tool)
        return SUMMARY_OPENING if step.kind == "compact" else ""

    def _answer(self, block_id: str, type_: str, header_suffix: str = "") -> RuntimeBlock:
        """A model turn: its header prefilled (Mistral's has none), decoded, committed; it inherits all resident sources."""
        header = tuple(self.engine.lm.encode(self.renderer.render_header(header_suffix)))
        start = len(self.engine.tokens(self.lineage))
        if header:
            self.engine.prefill(self.lineage, list(header))
        draft = self._drafts.get(block_id) if self._drafts is not None else None
        if draft is not None and draft.trusted:
            self._drafts = self._drafts.with_turn(TurnCost.from_trusted(block_id, draft))
            # B7-oracle: an attribution oracle vouched for this turn; its old tokens are
            # re-materialised by prefill, unverified (not exact if the label is wrong)
            generated = list(draft.tokens)
            self.engine.prefill(self.lineage, generated)
        else:
            if isinstance(self.engine, PendingChunks):  # the observation and header: not the turn's forwards
                self.engine.flush(self.lineage)
            before = self.engine.counters.snapshot()
            assist = self._drafts.get_assist(draft) if self._drafts is not None else Assist()
            settings, rule = self.get_turn_rule(header)
            seed = self._seed(settings.seed) if settings.temperature > 0 else None
            with self._watch_turn(block_id), time_forwards(self.engine, self._drafts, timings := []):
                generated = self.engine.generate(self.lineage, settings.max_new_tokens, self.engine.lm.eos_ids,
                                                 settings.temperature, seed, assist, rule)
            if self._drafts is not None:  # with drafts, every turn's cost is logged
                spent = self.engine.counters.snapshot() - before
                self._drafts = self._drafts.with_turn(TurnCost.from_spent(block_id, draft, spent, len(generated), timings))
        body = [i for i in generated if i not in self.engine.lm.eos_ids]
        text = self.engine.lm.decode(body).strip()
        tokens = header + tuple(generated)
        block = RuntimeBlock(block_id, type_, text, tokens, tuple(self.context), self.get_resident_sources(),
                             (start, start + len(tokens)), self.t,
                             chunks=get_turn_chunks(self.engine.determinism, header, generated))
        return self.commit_block(block)

    def get_turn_rule(self, header: Sequence[int]) -> tuple[Settings, Rule | None]:
        """The settings and decoding rule of the next turn: the session's (A1), no rule; the
        server's runtime reads each step's own, recorded with it (so a replay decides alike)."""
        return self.settings, None

    def _watch_turn(self, block_id: str) -> contextlib.AbstractContextManager:
        """Around a decoded turn's ``generate``: where a runtime that streams watches its forwards; nothing here."""
        return contextlib.nullcontext()

    def _seed(self, seed: int) -> int:
        # A fixed randomness source per transition (A1 under sampling).
        return (seed * 1_000_003 + self.t) % (2**63)

    def _new_lineage(self, step: Step) -> None:
        first = self.graph[self._state.context[0]].get_chunks()[:1] if self._state.context else []
        tokens = tuple(self.engine.lm.encode(text := self.render_first()))
        self._update(lineage=open_lineage(self.engine, self.lineage, first, tokens), context=())
        self.commit_block(RuntimeBlock(ids.compute_block_id(step.id, ids.SYSTEM), "system", text, tokens, (),
                                       frozenset(), (0, len(tokens)), self.t))

    def _take_checkpoint(self) -> Checkpoint:
        """The checkpoint of the state now (``R_t``, before the next transition)."""
        return Checkpoint(self.t, self.lineage, len(self.engine.tokens(self.lineage)), self._state.context,
                          self._state.memory, self._state.plans, self.take_env_snapshot())

    def take_env_snapshot(self) -> str | None:
        """The environment snapshot a checkpoint records: an extension's (the tool layer's world), none without one."""
        ids = [e.take_snapshot(self) for e in self.extensions]
        return next((sid for sid in ids if sid is not None), None)

    # --- reading the state ---------------------------------------------------

    def get_state_record(self) -> dict:
        """Everything of ``R_t`` except the KV tensors, as plain data (with
        what the extensions add, e.g. the tool calls)."""
        record = {"t": self.t,
                  "context": [self.graph[b].get_record() for b in self._state.context],
                  "memory": [self.graph[b].get_record() for b in self._state.memory],
                  "plans": [self.graph[b].get_record() for b in self._state.plans]}
        for extension in self.extensions:
            record.update(extension.get_state_fields())
        return record

    def digest(self) -> str:
        """A hash over every KV tensor's bytes, every context block, the memory
        store and the pending plans. Cache handle names are not part of it."""
        h = hashlib.sha256()
        h.update(self.engine.digest(self.lineage).encode())
        h.update(json.dumps(self.get_state_record(), sort_keys=True).encode())
        return h.hexdigest()

    def generated_tokens(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every model-written block's token ids, in creation order."""
        return [(b.id, b.tokens) for b in self.graph.blocks() if b.type in DERIVED_TYPES]

    def probe(self, question: str, max_new_tokens: int | None = None, temperature: float = 0.0,
              seed: int | None = None) -> str:
        """Ask a question of the current state without changing it (on a lineage
        that shares the current one copy-on-write). Greedy, or sampled at
        ``temperature`` with ``seed`` (the stochastic audits, issue 10)."""
        ids = self.probe_ids(question, max_new_tokens, temperature, seed)
        return self.engine.lm.decode([i for i in ids if i not in self.engine.lm.eos_ids]).strip()

    def probe_ids(self, question: str, max_new_tokens: int | None = None, temperature: float = 0.0,
                  seed: int | None = None) -> list[int]:
        """The token ids of :meth:`probe`'s answer (what matched-seed agreement compares)."""
        if temperature > 0 and seed is None:
            raise ValueError("a sampled probe needs a seed (temperature > 0 without one is not repeatable)")
        branch = self.engine.fork(self.lineage)
        try:
            self.engine.prefill(branch, self.engine.lm.encode(self.render_block("user", question) + self.renderer.render_header()))
            return self.engine.generate(branch, max_new_tokens or self.settings.max_new_tokens, self.engine.lm.eos_ids,
                                        temperature, seed if temperature > 0 else None)
        finally:
            self.engine.drop(branch)

    def texts(self) -> list[tuple[str, str]]:
        """(block id, text) of every block in context, memory and plans."""
        ids = list(dict.fromkeys(self.context + self.memory + self.plans))
        return [(b, self.graph[b].text) for b in ids]

    def check_invariants(self) -> None:
        """The live cache holds exactly the context blocks' tokens, in order."""
        expected = [t for b in self._state.context for t in self.graph[b].tokens]
        actual = self.engine.tokens(self.lineage)
        if actual != expected:
            raise AssertionError(f"cache of {self.lineage} holds {len(actual)} tokens that differ from the "
                                 f"{len(expected)} tokens of the context blocks {self.context}")

    # --- forget (Algorithm 1 and B5, impl/agent/forget.py) -----------------

    def forget(self, source_id: str | Sequence[str], progress: Progress | None = None, wait: bool = True,
               drafts: bool | None = None, oracle: bool = False, lookup: bool = True) -> ForgetReport:
        """Provenance-Guided Selective Replay (Algorithm 1): after it, the state equals that of a
        twin that never observed ``source_id`` (or any of a sequence of ids, in one replay). A source
        already forgotten is a no-op that says so; a forget waits for a running step to commit, or
        raises :class:`SessionBusyError` when ``wait`` is false. ``drafts``: replay model turns as
        verified drafts (impl/agent/drafts.py; None: wherever the engine has a measured bound);
        ``lookup``: with drafts, also guess from the context (False measures drafts alone);
        ``oracle``: B7-oracle, turns labelled independent of the target re-prefilled unverified
        (a baseline; not exact when a label is wrong)."""
        source_ids = [source_id] if isinstance(source_id, str) else list(source_id)
        with self.hold("forget", wait):
            started, before = time.perf_counter(), self.engine.counters.snapshot()
            pending = begin_forget(self, source_ids)
            if not pending:
                return compute_report(self, Forgotten("replay", tuple(source_ids), already_forgotten=True),
                                      started, before)
            base = self._state  # a progress callback may step the session: adopt() then refuses
            plan = plan_replay(base, self.engine, pending, drafts, oracle, lookup)  # lines 1-4
            replay = restore_checkpoint(self, plan.checkpoint, plan.pending, plan.drafts)  # line 5
            restored = replay.lineage
            replay.run(sanitize_steps(base.steps[plan.checkpoint.boundary:], plan.pending), progress)  # lines 6-10
            replayed = get_replayed(self, base, plan, replay, restored, "replay-oracle" if oracle else "replay", source_ids)
            self.adopt(replayed, "forget")
            return compute_report(self, replayed.forgotten, started, before)

    def forget_many(self, source_ids: Sequence[str], progress: Progress | None = None,
                    wait: bool = True, drafts: bool | None = None, oracle: bool = False,
                    lookup: bool = True) -> ForgetReport:
        """Forget several sources in one replay: the twin never observed any of them."""
        return self.forget(list(source_ids), progress, wait, drafts, oracle, lookup)

    def full_reset(self, source_id: str | Sequence[str], progress: Progress | None = None,
                   wait: bool = True, upto: int | None = None) -> ForgetReport:
        """B5: replay the counterfactual stream from ``R_0`` through the same
        transitions. ``upto``: replay only the first ``upto`` observed steps
        (``unsee verify`` rebuilds a receipt's prefix of the log)."""
        source_ids = [source_id] if isinstance(source_id, str) else list(source_id)
        return reset_sources(self, source_ids, progress, wait, upto)

    def find_sources(self, value: str) -> list[str]:
        """Source ids of observed items whose text contains ``value`` (normalized)."""
        return find_sources(self._state, value)

    def forget_value(self, value: str, progress: Progress | None = None, wait: bool = True) -> ForgetReport:
        """Forget by value: exactly one observed source must hold it."""
        return self.forget(find_one_source(self._state, value), progress, wait)

    # --- branching -----------------------------------------------------------

    def spawn(self, extensions: Iterable[Extension], state: RuntimeState, *, replaying: bool = False,
              drafts: Drafts | None = None) -> AgentRuntime:
        """A runtime of the same kind and configuration with ``extensions`` at
        ``state`` (one with no lineage is begun as a fresh ``R_0``); its result
        is read back as a value (:attr:`state`). ``replaying``: it re-enacts
        a sanitized stream (tools shadow-execute), with ``drafts`` if given."""
        other = type(self)(self.engine, self.system, self.settings, extensions=extensions)
        other._replaying, other._drafts = replaying, drafts
        other._shared_lineages = True  # its checkpoints name our lineages: not its own to drop
        other._set_state(state)
        if state.lineage == ids.NO_LINEAGE:
            other._begin()
        return other

    def fork(self) -> AgentRuntime:
        """A copy that shares nothing mutable: its own current lineage, which
        shares the current one's KV copy-on-write, and a fork of every extension.
        Checkpoint lineages are shared read-only (restores never write into them)."""
        other = self.spawn([e.fork() for e in self.extensions], self._state.on_branch(self.engine.fork(self.lineage)))
        # the clone's checkpoints may still name our current lineage, and ours theirs
        self._shared_lineages = True
        return other

    def rebuild_lineage(self, block_ids: Sequence[str]) -> str:
        """A new lineage holding ``block_ids`` prefilled in their recorded chunks.

        Every block of a lineage was committed as whole prefill chunks, so this
        rebuilds its KV bitwise (the canonical chunking of the engine). The
        tokens count as ``rebuilt_tokens``."""
        return rebuild(self.engine, (chunk for block_id in block_ids for chunk in self.graph[block_id].get_chunks()))

    def adopt(self, replayed: Replayed, what: str) -> None:
        """Commit ``what`` (a forget or a reset): take a replay's new state and its extensions'
        branch state, then drop caches nothing names. A step this thread made since
        ``replayed.base`` (from a progress callback, say) would be lost: refused instead."""
        if self._state is not replayed.base:
            raise RuntimeError(f"{what} refused: the session changed while it replayed (a step on the same "
                               "thread, e.g. from its progress callback); nothing was adopted")
        old_lineages = self.checkpoints.lineages() | {self.lineage}
        self._set_state(replayed.state)
        for mine, theirs in zip(self.extensions, replayed.extensions, strict=True):
            mine.adopt(theirs)
        if not self._shared_lineages:
            for lineage in old_lineages - self.checkpoints.lineages() - {self.lineage}:
                # stored handles (is_stored_handle) name no cache; evicted ones are forgotten
                if lineage in self.engine.budget.lineages or self.engine.budget.is_evicted(lineage):
                    self.engine.drop(lineage)

    def get_assumptions(self) -> dict:
        """Theorem 1's assumptions as this runtime (and its extensions) can vouch for them."""
        a1 = "greedy decoding" if self.settings.temperature == 0 else "sampling with a fixed seed per transition"
        out = {"A1": {"holds": True, "why": f"{a1}; {self.engine.determinism.statement}"},
               "A2": {"holds": True, "why": "sanitize removes exactly the target's items; all else verbatim"},
               "A3": {"holds": True, "why": "no tools with external side effects in this runtime"}}
        for extension in self.extensions:
            out = extension.get_assumptions(out)
        return out

    # --- persistence --------------------------------------------------------

    def get_session_record(self) -> dict:
        """Everything needed to reopen the session, as plain data (no tensors:
        the caches are rebuilt from the blocks' recorded chunks); each
        extension's part under its name in ``extra``."""
        # a session without a template override keeps the record it always had
        settings = attrs.asdict(self.settings, filter=lambda a, v: a.name != "template" or v is not None)
        return {"system": self.system, "settings": settings, **self._state.get_record(),
                "extra": {e.name: e.get_record() for e in self.extensions}}

    @classmethod
    def from_session_record(cls, engine: Engine, record: dict, extensions: Iterable[Extension] = ()) -> AgentRuntime:
        """Reopen a session with its ``extensions`` (rebuilt from ``record["extra"]``
        by :func:`unsee.impl.agent.loading.load_runtime`): metadata as
        recorded, the live cache rebuilt by prefill. Checkpoint lineages are
        rebuilt on demand by a forget's restore."""
        runtime = cls(engine, record["system"], Settings(**record["settings"]), extensions=extensions)
        state = RuntimeState.from_record(record, runtime.settings.checkpoint_policy)
        runtime._set_state(state)
        lineage = runtime.rebuild_lineage(state.context)
        # checkpoints on the live lineage can crop it instead of rebuilding
        runtime._set_state(state.on_live_lineage(lineage, len(engine.tokens(lineage))))
        return runtime

    # --- edits: the verbs of the edit-style baselines (impl/methods/baselines.py)

    def keep_memory(self, keep: Callable[[RuntimeBlock], bool]) -> None:
        """Drop the memory store's records for which ``keep`` is false (the cache is not touched)."""
        self._update(memory=tuple(b for b in self._state.memory if keep(self.graph[b])))

    def rebuild_context(self, keep: Callable[[RuntimeBlock], bool],
                        transform: Callable[[RuntimeBlock], RuntimeBlock] = lambda b: b) -> None:
        """Re-prefill the kept context blocks, each through ``transform``, into a new lineage, one chunk
        each; memory records and plans are kept and transformed the same way (a transformed block with a
        new id is added to the graph). Unchanged blocks keep their recorded tokens; an edited one is
        re-encoded from its text (a model turn keeps its assistant framing)."""
        blocks = [transform(self.graph[b]) for b in self._state.context if keep(self.graph[b])]
        memory = [self._ensure(transform(self.graph[b])).id for b in self._state.memory if keep(self.graph[b])]
        plans = [self._ensure(transform(self.graph[b])).id for b in self._state.plans if keep(self.graph[b])]
        self._update(memory=memory, plans=plans)
        self._update(lineage=self.engine.new_lineage(), context=())
        for block in blocks:
            start = len(self.engine.tokens(self.lineage))
            tokens = get_edit_tokens(self.graph, self.renderer, self.engine.lm.encode, block)
            self.engine.prefill(self.lineage, list(tokens))
            rebuilt = attrs.evolve(block, tokens=tuple(tokens), token_span=(start, start + len(tokens)))
            if rebuilt.id in self.graph:
                self._update(graph=self.graph.with_replaced(rebuilt), context=(*self._state.context, rebuilt.id))
            else:
                self.commit_block(rebuilt)

    def _ensure(self, block: RuntimeBlock) -> RuntimeBlock:
        return block if block.id in self.graph else self.commit_block(block, extend_context=False)

    def excise_spans(self, cuts: Mapping[str, tuple[int, int, str]]) -> None:
        """Cut ``[a, z)`` of each named context block's own tokens out of the live cache, keeping every
        other position's KV as computed, and remove the cut text (the third field) from the block's
        record; later blocks' spans shift down. Needs an engine with ``excise``."""
        for block_id in reversed(self._state.context):  # back to front: earlier offsets stay valid
            if block_id in cuts:
                a, z, _ = cuts[block_id]
                start = self.graph[block_id].token_span[0]
                self.engine.excise(self.lineage, start + a, start + z)
        self._set_state(self._state.with_excised(cuts))


def run_episode(engine: Engine, episode: Episode, progress: Progress | None = None) -> AgentRuntime:
    return AgentRuntime.from_episode(engine, episode, progress)


__all__ = ["SUMMARY_OPENING", "SYSTEM_ID", "TURNS", "AgentRuntime", "AmbiguousTargetError", "ForgetReport", "Progress",
           "TargetNotFoundError", "run_episode", "sanitize_step"]
