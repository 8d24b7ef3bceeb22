"""The agent runtime: the transition ``F``, ``forget`` (Algorithm 1) and ``full_reset`` (B5).

State ``R_t`` is: the KV cache of the current lineage, the context blocks in
order, the plaintext memory store, the pending tool plans, the provenance
graph and the checkpoints. ``step`` is ``F``: one call per observation,
always through the same canonical chunks (one prefill per block, one prefill
per committed model turn), so that two runs of the same transitions produce
bitwise-identical caches.

``forget`` builds the new state beside the old one (on a new lineage that
shares the checkpoint's prefix copy-on-write, :meth:`Engine.share_prefix`)
and only then adopts it, so a forget that fails halfway leaves the session as
it was.

The runtime holds a pin (:meth:`Engine.pin`) on the lineage it is
extending, through the ``lineage`` attribute: under a KV budget the engine
may evict any other lineage, and a restore from an evicted checkpoint lineage
rebuilds it from the checkpoint's manifest (:meth:`rebuild_lineage`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence

import attrs

from unsee.impl.agent.checkpoints import Checkpoint, CheckpointStore, is_checkpoint_due
from unsee.impl.agent.drafts import Drafts, TurnCost
from unsee.impl.agent.episode import STEP_KINDS, Episode, Item, Settings, Step
from unsee.impl.agent.provenance import ArtifactGraph, RuntimeBlock
from unsee.impl.engines.protocol import Engine
from unsee.impl.util.exclusive import Exclusive
from unsee.impl.util.text import normalize

SYSTEM_ID = "system"
#: How each kind of prompt block is rendered (ChatML, which SmolLM2 uses).
START, END = "<|im_start|>", "<|im_end|>"
SUMMARY_REQUEST = "List the facts from this conversation."
#: The summary turn opens its list: small models then extract facts from the
#: context instead of writing a generic reply (measured on SmolLM2-135M, which
#: answers a plain "summarize" request with boilerplate).
SUMMARY_OPENING = "1."
NOTE_REQUEST = "Write one short note about the user worth remembering for future sessions."

Progress = Callable[[int, int], None]


def render(role: str, text: str) -> str:
    return f"{START}{role}\n{text}{END}\n"


def render_observation(step: Step) -> str:
    """The prompt block of an observation (or of a scaffold instruction)."""
    if step.kind in ("user", "plan"):
        return render("user", "\n".join(i.text for i in step.items))
    if step.kind == "tool":
        body = "\n".join(i.text for i in step.items)
        return render("user", f"[result of tool {step.tool}]\n{body}")
    if step.kind == "memory":
        return render_memory([i.text for i in step.items])
    if step.kind == "compact":
        return render("user", SUMMARY_REQUEST)
    if step.kind == "remember":
        return render("user", NOTE_REQUEST)
    raise ValueError(f"step {step.id!r}: kind {step.kind!r} has no observation block")


def render_memory(records: Sequence[str]) -> str:
    return render("system", "Memory notes:\n" + "\n".join(f"- {r}" for r in records))


def sanitize_step(step: Step, source_id: str) -> Step:
    """Algorithm 1 line 7: remove the target's items, keep the rest verbatim."""
    return attrs.evolve(step, items=tuple(i for i in step.items if i.source != source_id))


class TargetNotFoundError(LookupError):
    """A target value that no observed item holds."""


class AmbiguousTargetError(LookupError):
    """A target value held by several sources."""


@attrs.frozen
class ForgetReport:
    """What a forget (or a reset, or a baseline) did and cost."""

    method: str
    source_id: str
    tau: int
    length: int  # T
    boundary: int  # the restored checkpoint's boundary
    checkpoint: dict | None
    checkpoint_bytes: int
    closure: tuple[str, ...]
    invocations: int
    prefilled_tokens: int
    decoded_tokens: int
    forward_calls: int
    wall_s: float
    digest: str
    assumptions: dict
    extra: dict = attrs.field(factory=dict)  # subclass fields, e.g. irrevocable divergences
    already_forgotten: bool = False  # a repeated forget: nothing to do, state unchanged
    draft_accepted_tokens: int = 0  # draft tokens verified and kept instead of decoded
    draft_rejected_tokens: int = 0  # draft tokens verified and thrown away
    #: drafts: {"mode": "verify" | "oracle" | "off", "why": ..., "bound": ...,
    #: "totals": {...}, "turns": [per replayed model turn: draft, accepted,
    #: rejected, decoded, prefilled, fallback, trusted]}
    drafts: dict = attrs.field(factory=dict)
    rebuilt_tokens: int = 0  # of prefilled_tokens: rebuilding evicted or stored checkpoint lineages
    reused_tokens: int = 0  # served by the engine's prefix cache instead of prefilled (B5')

    @property
    def expected_invocations(self) -> int:
        """Corollary 1: ``T - boundary`` (``T - tau + 1`` at boundary ``tau - 1``)."""
        return self.length - self.boundary

    def to_json(self) -> dict:
        out = attrs.asdict(self)
        out["expected_invocations"] = self.expected_invocations
        out["closure"] = list(self.closure)
        return out


class AgentRuntime:
    """A running agent over an :class:`~unsee.impl.engines.protocol.Engine` (it never asks which one)."""

    def __init__(self, engine: Engine, system: str, settings: Settings = Settings()):
        self.engine = engine
        self.system = system
        self.settings = settings
        self.graph = ArtifactGraph()
        self.checkpoints = CheckpointStore(settings.checkpoint_policy)
        self.steps: list[Step] = []  # the observation log o_1..o_t
        self.t = 0
        self._lineage_pin = None  # see the `lineage` property
        self.lineage = ""
        self.context: list[str] = []
        self.memory: list[str] = []
        self.plans: list[str] = []
        self.transitions = 0  # invocations of F
        self.replaying = False  # True while forget re-enacts the suffix (tools shadow-execute)
        self.forgotten: list[str] = []  # source ids forgotten so far (ids, never values)
        self.drafts: Drafts | None = None  # set while a forget replays with drafts (impl/agent/drafts.py)
        self._exclusive = Exclusive()  # one transition or forget at a time
        self._shared_lineages = False  # set when forked: lineages are not ours alone to drop

    @property
    def lineage(self) -> str:
        """The cache lineage this runtime extends ("" before ``R_0``)."""
        return self._lineage_pin.lineage if self._lineage_pin is not None else ""

    @lineage.setter
    def lineage(self, handle: str) -> None:
        # The pin keeps the lineage out of the KV budget's reach while this
        # runtime (or a copy of its attributes) still refers to it.
        released = getattr(self, "_lineage_pin", None) is not None
        self._lineage_pin = self.engine.pin(handle) if handle else None
        if released:
            self.engine.enforce_budget()  # the old lineage may now be evictable

    # --- construction ------------------------------------------------------

    @classmethod
    def start(cls, engine: Engine, system: str, settings: Settings = Settings()) -> AgentRuntime:
        """``R_0``: a fresh lineage holding the system prompt; the session-start checkpoint."""
        runtime = cls(engine, system, settings)
        runtime._begin()
        return runtime

    def _begin(self) -> None:
        """Make this empty runtime ``R_0``: a new lineage with the system prompt."""
        self.lineage = self.engine.new_lineage()
        self._prefill_block(SYSTEM_ID, "system", render("system", self.system), parents=(), sources=frozenset())

    @classmethod
    def from_episode(cls, engine: Engine, episode: Episode, progress: Progress | None = None) -> AgentRuntime:
        runtime = cls.start(engine, episode.system, episode.settings)
        runtime.run(episode.steps, progress)
        return runtime

    def run(self, steps: Iterable[Step], progress: Progress | None = None) -> None:
        steps = list(steps)
        for i, step in enumerate(steps, start=1):
            self._step(step) if self._exclusive.running else self.step(step)
            if progress:
                progress(i, len(steps))

    # --- the transition F ---------------------------------------------------

    def step(self, step: Step, wait: bool = True) -> None:
        """``R_t = F(R_{t-1}, o_t)``."""
        with self._exclusive(wait, f"step {step.id}"):
            self._step(step)

    def _step(self, step: Step) -> None:
        if any(s.id == step.id for s in self.steps):
            raise ValueError(f"step id {step.id!r} was already observed in this session")
        if step.kind not in STEP_KINDS:  # checked before any change to the state
            raise ValueError(f"step {step.id!r}: unknown kind {step.kind!r}; expected one of {STEP_KINDS}")
        if is_checkpoint_due(self.checkpoints.policy, self.t, step):
            self._register_checkpoint()
        self.t += 1
        self.transitions += 1
        self.steps.append(step)
        handler = {"user": self._on_message, "tool": self._on_message, "plan": self._on_plan,
                   "memory": self._on_memory, "remember": self._on_remember, "compact": self._on_compact,
                   "session": self._on_session}[step.kind]
        handler(step)

    def _on_message(self, step: Step) -> None:
        self._observe(step)
        self._answer(f"{step.id}/answer", "answer")

    def _on_plan(self, step: Step) -> None:
        self._observe(step)
        plan = self._answer(f"{step.id}/plan", "plan", header_suffix=f"CALL {step.tool}(")
        self.plans.append(plan.id)
        self._after_plan(step, plan)

    def _after_plan(self, step: Step, plan: RuntimeBlock) -> None:
        """Hook: a tool layer turns the pending plan into a call (issue 4)."""

    def _on_memory(self, step: Step) -> None:
        records = []
        for item in step.items:
            record = self._record(f"{step.id}/{item.source}", "memory_record", item.text, (), frozenset({item.source}))
            records.append(record.id)
            self.memory.append(record.id)
        self._prefill_block(step.id, "memory", render_observation(step), parents=tuple(self.context) + tuple(records),
                            sources=self._resident_sources() | {i.source for i in step.items})

    def _on_remember(self, step: Step) -> None:
        self._observe(step)
        note = self._answer(f"{step.id}/note", "memory_write")
        self.memory.append(note.id)

    def _on_compact(self, step: Step) -> None:
        """Compaction: the model rewrites the context into a summary that replaces
        it, on a new cache lineage (the prompt prefix changed)."""
        self._observe(step)
        summary = self._answer(f"{step.id}/answer", "summary", header_suffix=SUMMARY_OPENING)
        self._new_lineage(step)
        self._prefill_block(f"{step.id}/context", "summary",
                            render("system", f"Summary of the earlier conversation:\n{SUMMARY_OPENING} {summary.text}"),
                            parents=(summary.id,), sources=summary.source_ids, extend_context=True)

    def _on_session(self, step: Step) -> None:
        """A new session: the plaintext memory store is re-injected into a fresh context."""
        records = [self.graph[r] for r in self.memory]
        self._new_lineage(step)
        sources = frozenset().union(*(r.source_ids for r in records))
        self._prefill_block(f"{step.id}/memory", "memory", render_memory([r.text for r in records]),
                            parents=tuple(r.id for r in records), sources=sources, extend_context=True)

    # --- building blocks ---------------------------------------------------

    def _resident_sources(self) -> frozenset[str]:
        return frozenset().union(*(self.graph[b].source_ids for b in self.context))

    def _record(self, block_id: str, type_: str, text: str, parents: tuple[str, ...],
                sources: frozenset[str]) -> RuntimeBlock:
        """A block that is stored but not in context (a memory record)."""
        return self.graph.add(RuntimeBlock(block_id, type_, text, (), parents, sources, (0, 0), self.t))

    def _prefill_block(self, block_id: str, type_: str, text: str, parents: tuple[str, ...],
                       sources: frozenset[str], extend_context: bool = True) -> RuntimeBlock:
        tokens = tuple(self.engine.lm.encode(text))
        self.engine.use(self.lineage)
        start = self.engine.length(self.lineage)
        self.engine.prefill(list(tokens))  # one block, one chunk: the canonical chunking
        block = RuntimeBlock(block_id, type_, text, tokens, parents, sources, (start, start + len(tokens)), self.t)
        self.graph.add(block)
        if extend_context:
            self.context.append(block_id)
        return block

    def _observe(self, step: Step) -> RuntimeBlock:
        own = frozenset(i.source for i in step.items)
        # a plan step's prompt block is the user's request; "plan" is the model's call
        type_ = {"user": "user", "tool": "tool", "plan": "user"}.get(step.kind, "instruction")
        return self._prefill_block(step.id, type_, render_observation(step),
                                   parents=tuple(self.context), sources=self._resident_sources() | own)

    def _answer(self, block_id: str, type_: str, header_suffix: str = "") -> RuntimeBlock:
        """A model turn: prefill the assistant header, decode, commit canonically.

        Source ids propagate: the turn inherits every source resident in context.
        """
        header = tuple(self.engine.lm.encode(f"{START}assistant\n{header_suffix}"))
        self.engine.use(self.lineage)
        start = self.engine.length(self.lineage)
        self.engine.prefill(list(header))
        draft = self.drafts.get(block_id) if self.drafts is not None else None
        if draft is not None and draft.trusted:
            self.drafts.turns.append(TurnCost(block_id, len(draft.tokens), 0, 0, 0, len(draft.tokens), False, True,
                                              generated=len(draft.tokens)))
            # B7-oracle: an attribution oracle vouched for this turn; its old
            # tokens are re-materialised by prefill, unverified (not exact if
            # the label is wrong)
            generated = list(draft.tokens)
            self.engine.prefill(generated)
        else:
            before = self.engine.counters.snapshot()
            generated = self.engine.generate(self.settings.max_new_tokens, stop_ids=self.engine.lm.eos_ids,
                                             temperature=self.settings.temperature,
                                             seed=self._seed() if self.settings.temperature > 0 else None,
                                             draft=draft.tokens if draft is not None else None,
                                             probe=draft is not None and self.drafts.should_probe(draft),
                                             lookup=self.drafts is not None and self.drafts.lookup)
            if self.drafts is not None:
                spent = self.engine.counters.snapshot() - before
                self.drafts.turns.append(TurnCost(
                    block_id, len(draft.tokens) if draft else 0, spent.draft_accepted_tokens,
                    spent.draft_rejected_tokens, spent.decoded_tokens, spent.prefilled_tokens,
                    bool(spent.draft_fallbacks), probed=bool(spent.draft_probes), generated=len(generated),
                    quotes=draft is not None and draft.quotes, lookups=spent.lookup_forwards,
                    looked_up=spent.lookup_accepted_tokens + spent.lookup_rejected_tokens,
                    lookup_accepted=spent.lookup_accepted_tokens))
        body = [i for i in generated if i not in self.engine.lm.eos_ids]
        text = self.engine.lm.decode(body).strip()
        tokens = header + tuple(generated)
        block = RuntimeBlock(block_id, type_, text, tokens, tuple(self.context), self._resident_sources(),
                             (start, start + len(tokens)), self.t, chunks=self._turn_chunks(header, generated))
        self.graph.add(block)
        self.context.append(block_id)
        return block

    def _turn_chunks(self, header: Sequence[int], generated: Sequence[int]) -> tuple[int, ...]:
        """The chunks a rebuild prefills a model turn in, from what the engine
        guarantees (:attr:`Determinism.canonical_chunking`): where chunking
        matters, the header prefill and the canonical prefill of the turn
        (two chunks, as they were computed); on a chunk-invariant engine whose
        decode equals prefill, the whole turn as one chunk gives the same KV."""
        if self.engine.determinism.canonical_chunking == "block":
            return (len(header) + len(generated),)
        return (len(header), len(generated))

    def _seed(self) -> int:
        # A fixed randomness source per transition (A1 under sampling).
        return (self.settings.seed * 1_000_003 + self.t) % (2**63)

    def _new_lineage(self, step: Step) -> None:
        self.lineage = self.engine.new_lineage()
        self.context = []
        self._prefill_block(f"{step.id}/system", "system", render("system", self.system), parents=(),
                            sources=frozenset())

    def _register_checkpoint(self) -> Checkpoint:
        checkpoint = Checkpoint(self.t, self.lineage, self.engine.length(self.lineage), tuple(self.context),
                                tuple(self.memory), tuple(self.plans), self.env_snapshot_id())
        self.checkpoints.add(checkpoint)
        return checkpoint

    def env_snapshot_id(self) -> str | None:
        """The environment snapshot a checkpoint records (none without tools)."""
        return None

    # --- reading the state ---------------------------------------------------

    def get_state_record(self) -> dict:
        """Everything of ``R_t`` except the KV tensors, as plain data."""
        return {"t": self.t,
                "context": [self.graph[b].get_record() for b in self.context],
                "memory": [self.graph[b].get_record() for b in self.memory],
                "plans": [self.graph[b].get_record() for b in self.plans]}

    def digest(self) -> str:
        """A hash over every KV tensor's bytes, every context block, the memory
        store and the pending plans. Cache handle names are not part of it."""
        h = hashlib.sha256()
        h.update(self.engine.digest(self.lineage).encode())
        h.update(json.dumps(self.get_state_record(), sort_keys=True).encode())
        return h.hexdigest()

    def generated_tokens(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every model-written block's token ids, in creation order."""
        return [(b.id, b.tokens) for b in self.graph.blocks()
                if b.type in ("answer", "summary", "plan", "memory_write")]

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
        branch = self.engine.share_prefix(self.lineage)
        previous = self.lineage
        try:
            self.engine.use(branch)
            self.engine.prefill(self.engine.lm.encode(render("user", question) + f"{START}assistant\n"))
            return self.engine.generate(max_new_tokens or self.settings.max_new_tokens,
                                        stop_ids=self.engine.lm.eos_ids, temperature=temperature,
                                        seed=seed if temperature > 0 else None)
        finally:
            self.engine.drop(branch)
            self.engine.use(previous)

    def texts(self) -> list[tuple[str, str]]:
        """(block id, text) of every block in context, memory and plans."""
        ids = list(dict.fromkeys(self.context + self.memory + self.plans))
        return [(b, self.graph[b].text) for b in ids]

    # --- branching -----------------------------------------------------------

    def fork(self) -> AgentRuntime:
        """A copy that shares nothing mutable: its own current lineage, which
        shares the current one's KV copy-on-write.

        Checkpoint lineages are shared read-only (restores never write into them)."""
        other = self._spawn()
        other.graph = self.graph.copy()
        other.checkpoints = self.checkpoints.copy()
        other.steps = list(self.steps)
        other.forgotten = list(self.forgotten)
        other.t = self.t
        other.lineage = self.engine.share_prefix(self.lineage)
        other.context, other.memory, other.plans = list(self.context), list(self.memory), list(self.plans)
        other.transitions = self.transitions
        # the clone's checkpoints may still name our current lineage, and ours theirs
        self._shared_lineages = other._shared_lineages = True
        other._remap_current(self.lineage)
        return other

    def _remap_current(self, old: str) -> None:
        """Checkpoints that named the lineage we branched from now name our
        branch, whose prefix is identical."""
        for c in self.checkpoints.all():
            if c.lineage == old:
                self.checkpoints.add(attrs.evolve(c, lineage=self.lineage))

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
            pending = self._check_sources(source_ids)
            if not pending:
                return self._report("replay", source_ids, 0, None, (), 0, started, before,
                                    already_forgotten=True)
            taus = [min(b.turn for b in self.graph.locate_source(s)) for s in pending]  # lines 1-2
            tau = min(taus)
            closure = self._closure(pending)  # line 3
            checkpoint = self.checkpoints.latest_before(tau)  # line 4
            replay = self._restore(checkpoint)  # line 5: share the kept prefix of the lineage (a crop, no copy)
            suffix = [self._sanitize(s, pending) for s in self.steps[checkpoint.boundary:]]  # line 7
            transitions_before = replay.transitions
            replay.forgotten = self.forgotten + list(pending)
            replay.drafts, draft_info = self._get_drafts(checkpoint.boundary, drafts, oracle, pending, lookup)
            replay.run(suffix, progress)  # lines 6-10
            if replay.drafts is not None:
                draft_info["totals"] = replay.drafts.get_totals()
                draft_info["turns"] = [attrs.asdict(t) for t in replay.drafts.turns]
            replay.drafts = None
            self._adopt(replay)
            return self._report("replay-oracle" if oracle else "replay", source_ids, tau, checkpoint, closure,
                                self.transitions - transitions_before, started, before, drafts=draft_info)

    def _get_drafts(self, boundary: int, wanted: bool | None, oracle: bool,
                    pending: Sequence[str] = (), lookup: bool = True) -> tuple[Drafts | None, dict]:
        """The drafts of a replay from ``boundary``: the model turns written
        after it, before the forget; whether they are used and why. The items
        of the ``pending`` sources mark the drafts that quote them (probed);
        ``lookup`` adds guesses from the context where a turn is decoded."""
        bound = self.engine.draft_bound
        suffix_blocks = [b for b in self.graph.blocks() if b.turn > boundary]
        if oracle:
            labelled = {s.id for s in self.steps[boundary:] if getattr(s, "independent", False)}
            trusted = [b.id for b in suffix_blocks if b.id.rsplit("/", 1)[0] in labelled]
            # the oracle trusts its labels; unlabelled turns are decoded as B7 without drafts would
            chosen = [b for b in suffix_blocks if b.id in set(trusted)]
            return Drafts.from_blocks(chosen, bound, trusted, lookup=False), {
                "mode": "oracle", "bound": bound, "labelled_steps": sorted(labelled),
                "why": "B7-oracle: turns labelled independent re-prefilled unverified"}
        if wanted is False:
            return None, {"mode": "off", "bound": bound, "why": "drafts turned off by the caller"}
        if bound is None:
            if wanted:
                raise ValueError(f"drafts were asked for, but no prefill-versus-decode bound was measured for "
                                 f"{self.engine.lm.name} on {self.engine.lm.device} {self.engine.lm.dtype}")
            return None, {"mode": "off", "bound": None,
                          "why": f"no prefill-versus-decode bound measured for {self.engine.lm.name} on "
                                 f"{self.engine.lm.device} {self.engine.lm.dtype}: every turn re-decoded"}
        pending = set(pending)
        forgotten = [i.text for s in self.steps for i in s.items if i.source in pending]
        return Drafts.from_blocks(suffix_blocks, bound, forgotten=forgotten, lookup=lookup), {
            "mode": "verify", "bound": bound, "lookup": lookup,
            "why": f"verified drafts{' and context guesses' if lookup else ''}, decisions accepted above a "
                   f"margin of 2 x {bound:g}"}

    def full_reset(self, source_id: str | Sequence[str], progress: Progress | None = None,
                   wait: bool = True) -> ForgetReport:
        """B5: replay the counterfactual stream from ``R_0`` through the same transitions."""
        source_ids = [source_id] if isinstance(source_id, str) else list(source_id)
        with self._exclusive(wait, "reset"):
            started, before = time.perf_counter(), self.engine.counters.snapshot()
            pending = self._check_sources(source_ids)
            tau = min((self.graph.first_entry(s) for s in pending), default=0)
            closure = self._closure(pending)
            fresh = self._spawn()
            fresh._begin()
            fresh.replaying = True
            fresh.forgotten = self.forgotten + list(pending)
            fresh.run([self._sanitize(s, pending) for s in self.steps], progress)
            self._adopt(fresh)
            return self._report("reset", source_ids, tau, None, closure, fresh.transitions, started, before)

    def _check_sources(self, source_ids: Sequence[str]) -> list[str]:
        """The sources still to forget; an id never observed is an error that
        changes nothing."""
        if not source_ids:
            raise ValueError("forget needs at least one source id")
        pending = []
        for source_id in dict.fromkeys(source_ids):
            if source_id in self.forgotten:
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
        return [i.source for s in self.steps for i in s.items if wanted in normalize(i.text)]

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

    def _restore(self, checkpoint: Checkpoint) -> AgentRuntime:
        """Algorithm 1 line 5: ``Restore(c*)`` into a new runtime beside this one."""
        replay = self._spawn()
        replay.replaying = True
        if checkpoint.lineage in self.engine.lineages:
            # The first token_offset tokens, shared copy-on-write: O(layers)
            # whatever the length, and the replay's prefills never write into
            # the checkpoint's lineage, so the old state stays intact.
            replay.lineage = self.engine.share_prefix(checkpoint.lineage, checkpoint.token_offset)
        else:  # evicted by the KV budget, or a session reopened from its store
            replay.lineage = self.rebuild_lineage(checkpoint.context)
            if self.engine.length(replay.lineage) != checkpoint.token_offset:
                raise RuntimeError(f"checkpoint {checkpoint.boundary}: manifest rebuilds "
                                   f"{self.engine.length(replay.lineage)} tokens, expected {checkpoint.token_offset}")
        replay.graph = self.graph.copy()
        replay.graph.truncate(checkpoint.boundary)
        replay.checkpoints = self.checkpoints.copy()
        replay.checkpoints.drop_after(checkpoint.boundary)
        replay.steps = list(self.steps[:checkpoint.boundary])
        replay.t = checkpoint.boundary
        replay.context, replay.memory, replay.plans = (list(checkpoint.context), list(checkpoint.memory),
                                                       list(checkpoint.plans))
        replay.transitions = self.transitions
        replay._shared_lineages = True  # its checkpoints name our lineages until adopted
        # Checkpoints on the restored lineage now name the replay's, whose
        # prefix is the same; the original lineage then belongs to the old
        # state alone.
        for c in replay.checkpoints.all():
            if c.lineage == checkpoint.lineage:
                replay.checkpoints.add(attrs.evolve(c, lineage=replay.lineage))
        self._restore_extra(replay, checkpoint)
        return replay

    def rebuild_lineage(self, block_ids: Sequence[str]) -> str:
        """A new lineage holding ``block_ids`` prefilled in their recorded chunks.

        Every block of a lineage was committed as whole prefill chunks, so this
        rebuilds its KV bitwise (the canonical chunking of the engine). The
        tokens count as ``rebuilt_tokens``."""
        return self.engine.rebuild(chunk for block_id in block_ids for chunk in self.graph[block_id].get_chunks())

    def check_invariants(self) -> None:
        """The live cache holds exactly the context blocks' tokens, in order."""
        expected = [t for b in self.context for t in self.graph[b].tokens]
        actual = self.engine.tokens(self.lineage)
        if actual != expected:
            raise AssertionError(f"cache of {self.lineage} holds {len(actual)} tokens that differ from the "
                                 f"{len(expected)} tokens of the context blocks {self.context}")

    # --- persistence --------------------------------------------------------

    def get_session_record(self) -> dict:
        """Everything needed to reopen the session, as plain data (no tensors:
        the caches are rebuilt from the blocks' recorded chunks)."""
        return {"system": self.system, "settings": attrs.asdict(self.settings), "t": self.t,
                "transitions": self.transitions,
                "steps": [{"id": s.id, "kind": s.kind, "tool": s.tool,
                           "items": [{"source": i.source, "text": i.text} for i in s.items]} for s in self.steps],
                "blocks": [b.get_record() for b in self.graph.blocks()],
                "checkpoints": [c.get_record() for c in self.checkpoints.all()],
                "context": list(self.context), "memory": list(self.memory), "plans": list(self.plans),
                "forgotten": list(self.forgotten), "extra": self._extra_record()}

    @classmethod
    def from_session_record(cls, engine: Engine, record: dict) -> AgentRuntime:
        """Reopen a session: metadata as recorded, the live cache rebuilt by
        prefill. Checkpoint lineages are rebuilt on demand by ``_restore``."""
        runtime = cls(engine, record["system"], Settings(**record["settings"]))
        for block in record["blocks"]:
            runtime.graph.add(RuntimeBlock.from_record(block))
        runtime.steps = [Step(s["id"], s["kind"], tuple(Item(i["source"], i["text"]) for i in s["items"]), s["tool"])
                         for s in record["steps"]]
        runtime.t, runtime.transitions = record["t"], record["transitions"]
        runtime.context, runtime.memory, runtime.plans = (list(record["context"]), list(record["memory"]),
                                                          list(record["plans"]))
        runtime.forgotten = list(record["forgotten"])
        for c in record["checkpoints"]:
            # the recorded cache handle names a cache of the process that wrote it
            runtime.checkpoints.add(Checkpoint(c["boundary"], f"stored:{c['lineage']}", c["token_offset"],
                                               tuple(c["context"]), tuple(c["memory"]), tuple(c["plans"]),
                                               c.get("env_snapshot")))
        runtime._load_extra_record(record.get("extra", {}))
        runtime.lineage = runtime.rebuild_lineage(runtime.context)
        # checkpoints on the live lineage can crop it instead of rebuilding
        live_offset = engine.length(runtime.lineage)
        for c in runtime.checkpoints.all():
            if list(c.context) == runtime.context[:len(c.context)] and c.token_offset <= live_offset:
                runtime.checkpoints.add(attrs.evolve(c, lineage=runtime.lineage))
        return runtime

    def _extra_record(self) -> dict:
        """Hook: what a subclass adds to the session record (e.g. the environment)."""
        return {}

    def _load_extra_record(self, record: dict) -> None:
        """Hook: the inverse of :meth:`_extra_record`."""

    def _spawn(self) -> AgentRuntime:
        """An empty runtime of the same kind and configuration (subclasses extend)."""
        return type(self)(self.engine, self.system, self.settings)

    def _restore_extra(self, replay: AgentRuntime, checkpoint: Checkpoint) -> None:
        """Hook: restore what a subclass adds to the state (e.g. the environment)."""

    def _adopt_extra(self, other: AgentRuntime) -> None:
        """Hook: adopt what a subclass adds to the state."""

    def _report_extra(self) -> dict:
        """Hook: extra report fields (e.g. irrevocable divergences)."""
        return {}

    def _adopt(self, other: AgentRuntime) -> None:
        """Commit: take over ``other``'s state, then drop caches nothing names."""
        old_lineages = self.checkpoints.lineages() | {self.lineage}
        for name in ("graph", "checkpoints", "steps", "t", "lineage", "context", "memory", "plans", "transitions",
                     "forgotten"):
            setattr(self, name, getattr(other, name))
        self._adopt_extra(other)
        self.replaying = False
        if not self._shared_lineages:
            for lineage in old_lineages - self.checkpoints.lineages() - {self.lineage}:
                # "stored:" handles name no cache; evicted ones are forgotten
                if lineage in self.engine.lineages or self.engine.is_evicted(lineage):
                    self.engine.drop(lineage)

    def _report(self, method: str, source_ids: Sequence[str], tau: int, checkpoint: Checkpoint | None,
                closure: Sequence[str], invocations: int, started: float, before,
                already_forgotten: bool = False, drafts: dict | None = None) -> ForgetReport:
        spent = self.engine.counters.snapshot() - before
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
            digest=self.digest(), assumptions=self.get_assumptions(), extra=self._report_extra(),
            draft_accepted_tokens=spent.draft_accepted_tokens, draft_rejected_tokens=spent.draft_rejected_tokens,
            drafts=drafts or {"mode": "off", "why": "no replay of model turns from drafts"})

    def get_assumptions(self) -> dict:
        """Theorem 1's assumptions as this runtime can vouch for them."""
        a1 = "greedy decoding" if self.settings.temperature == 0 else "sampling with a fixed seed per transition"
        return {"A1": {"holds": True, "why": f"{a1}; {self.engine.lm.determinism}"},
                "A2": {"holds": True, "why": "sanitize removes exactly the target's items; all else verbatim"},
                "A3": {"holds": True, "why": "no tools with external side effects in this runtime"}}


def run_episode(engine: Engine, episode: Episode, progress: Progress | None = None) -> AgentRuntime:
    return AgentRuntime.from_episode(engine, episode, progress)


__all__ = ["AgentRuntime", "ForgetReport", "Item", "render", "run_episode", "sanitize_step"]
