"""Tools, environment snapshots and side-effect-safe replay (assumption A3).

The paper's Section 3.4 (c), "Sanitized replay", and Algorithm 1 line 8,
``ReplayTools``: read-only tools are re-executed against the environment
snapshot (or served from recorded observations); consequential tools are
shadow-executed during replay with call-ID de-duplication, so real side
effects never fire twice. Theorem 1's (A3) asks that no committed external
side effect exists after the restore boundary; where one does and the
counterfactual would not have made it identically, the forget report names it
as an *irrevocable divergence* instead of dropping or re-sending anything.

Pieces:

- :class:`Environment`: a key-value world with content-addressed snapshots
  (:class:`SnapshotStore`), a call-ID ledger that refuses a second fire of the
  same call, and a per-call execution counter.
- :class:`Tool` and :func:`default_tools`: read-only ``fetch(key)`` and
  ``search(query)``; consequential ``send_message(to, body)`` and
  ``book(item, date)``. Each parameter has a *filler* saying where its value
  comes from: the model's plan text, the plan step's request text, or the
  latest tool result's address (the scaffold copies it, like a reply button).
- :class:`Call`: one tool call with its deterministic call ID
  ``f"{step_id}/call"``: the counterfactual replay of the same step has the
  same ID, which is what de-duplication keys on.
- :class:`ToolAgentRuntime`: the runtime with a tool layer, built on the
  hooks of :class:`~unsee.impl.agent.runtime.AgentRuntime`.

See docs/tools.md for the replay modes, the default, the report format and
what cannot be undone.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from unsee.impl.agent.checkpoints import Checkpoint
from unsee.impl.agent.episode import Episode, Settings, Step
from unsee.impl.agent.provenance import RuntimeBlock
from unsee.impl.agent.runtime import AgentRuntime, Progress, render
from unsee.impl.engines.protocol import Engine

#: How a read-only tool is served during replay.
#: ``reexecute``: run it again against the shadow environment restored from
#: the checkpoint's snapshot (the paper's A3 mechanism; the default).
#: ``recorded``: serve the result the trajectory recorded for the same call
#: ID and arguments; a call with other arguments falls back to re-execution.
READ_MODES = ("reexecute", "recorded")
# Default: re-execution. The environment here is fully snapshot-able and its
# only writers are the agent's consequential tools, so re-running a read
# against the restored snapshot plus the *counterfactual's* own shadow effects
# yields exactly the counterfactual observation o^cf_t, even when the twin's
# earlier side effects differ from the real ones (a recorded observation would
# hand the twin what the real world showed, e.g. an outbox holding a message
# the twin never sent). Results that differ from the recorded ones are listed
# in the report (``changed_reads``), which is how environment drift shows up.
DEFAULT_READ_MODE = "reexecute"

#: Where a tool parameter's value comes from.
#: ``model``: parsed from the plan the model decoded after ``CALL tool(``;
#: ``request``: parsed from the plan step's own text (the user's request);
#: ``address``: the last e-mail address in the latest tool result in context
#: (consequential calls' confirmations do not count), copied by the scaffold.
FILLERS = ("model", "request", "address")

ADDRESS = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_SPECIAL = re.compile(r"<\|[^|<>]{0,40}\|>")
_NAMED = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)\Z", re.S)
MAX_ARG_CHARS = 80

#: The divergence kinds a forget report lists.
DIVERGENCE_KINDS = ("changed_arguments", "new_call", "not_made")


def call_id_for(step_id: str) -> str:
    """A plan step's call ID: a function of the step ID alone, so the
    counterfactual replay of the same step issues the same ID."""
    return f"{step_id}/call"


def result_source(call_id: str) -> str:
    """The source ID of a call's result observation (a forget may name it)."""
    return f"{call_id}/result"


# --- calls and argument parsing ------------------------------------------------


@attrs.frozen
class Call:
    """One tool call. ``committed`` is true iff the real world holds exactly
    this call's side effect (consequential tools only)."""

    call_id: str
    tool: str
    args: tuple[tuple[str, str], ...]
    consequential: bool
    step_id: str
    turn: int
    parse: str = "ok"  # how the model's plan text parsed: 'ok' or 'fallback'
    result: str = ""
    committed: bool = False

    def arg(self, name: str) -> str:
        return dict(self.args).get(name, "")

    def same_call(self, other: Call) -> bool:
        """Same tool with the same arguments (the call ID is compared by the caller)."""
        return (self.tool, self.args) == (other.tool, other.args)

    def to_json(self) -> dict:
        return {"call_id": self.call_id, "tool": self.tool, "args": dict(self.args), "step_id": self.step_id,
                "turn": self.turn, "committed": self.committed}


def clean_value(text: str) -> str:
    """Make an argument printable and bounded: control and unassigned
    characters become spaces, whitespace collapses, quotes are stripped."""
    text = _SPECIAL.sub(" ", text)  # chat-template markers never reach an argument
    chars = [" " if unicodedata.category(c).startswith(("C", "Z")) or c == "\ufffd" else c for c in text]
    value = " ".join("".join(chars).split())
    return value.strip("\"'` ")[:MAX_ARG_CHARS].strip()


def parse_arguments(params: tuple[str, ...], text: str) -> tuple[dict[str, str], bool]:
    """Total, deterministic parse of ``a, name=b)`` into ``params``.

    Well formed: the argument list is closed by ``)``; the text before the
    first ``)`` is parsed. Fallback (no ``)``): the first line is parsed the
    same way. Parts split on commas (the last parameter takes the rest);
    ``name=value`` parts bind by name, the others fill the remaining
    parameters in order; anything missing is ``''``.
    """
    closed = ")" in text
    body = text[:text.index(")")] if closed else text.split("\n", 1)[0]
    args = {p: "" for p in params}
    if not params or not body.strip():
        return args, closed
    named: dict[str, str] = {}
    positional: list[str] = []
    for part in body.split(",", len(params) - 1):
        m = _NAMED.match(part)
        if m and m.group(1) in args and m.group(1) not in named:
            named[m.group(1)] = clean_value(m.group(2))
        else:
            positional.append(clean_value(part))
    free = iter(positional)
    for p in params:
        args[p] = named[p] if p in named else next(free, "")
    return args, closed


# --- the environment -------------------------------------------------------------


def snapshot_id(state: Mapping[str, str]) -> str:
    """Content address of an environment state: equal states, equal ids."""
    canonical = json.dumps(sorted(state.items()), ensure_ascii=False, separators=(",", ":"))
    return "env-" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class SnapshotStore:
    """Immutable environment states by content address (shared by the real
    world and every shadow branched from it)."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[tuple[str, str], ...]] = {}

    def __contains__(self, sid: str) -> bool:
        return sid in self._states

    def __len__(self) -> int:
        return len(self._states)

    def put(self, state: Mapping[str, str]) -> str:
        sid = snapshot_id(state)
        self._states.setdefault(sid, tuple(sorted(state.items())))
        return sid

    def get(self, sid: str) -> dict[str, str]:
        if sid not in self._states:
            raise KeyError(f"unknown environment snapshot {sid!r}")
        return dict(self._states[sid])


class Environment:
    """A key-value world that tools read and consequential tools write.

    ``ledger`` maps each call ID whose side effect was applied here to that
    call: a second :meth:`fire` of the same ID is refused (recorded in
    ``blocked``) and answers the first result. ``executions`` counts how many
    times each call ID's effect was applied (at most once, by the ledger).
    The ledger is bookkeeping about the world, not part of its content:
    snapshots and restores cover ``data`` only.
    """

    def __init__(self, data: Mapping[str, str] | None = None, store: SnapshotStore | None = None):
        self.data: dict[str, str] = dict(data or {})
        self.store = store if store is not None else SnapshotStore()
        self.ledger: dict[str, Call] = {}
        self.executions: Counter[str] = Counter()
        self.blocked: list[str] = []

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def put(self, key: str, value: str) -> None:
        self.data[key] = value

    def state(self) -> dict[str, str]:
        return dict(self.data)

    def snapshot(self) -> str:
        """Store the current content; returns its content address."""
        return self.store.put(self.data)

    def restore(self, sid: str) -> None:
        self.data = self.store.get(sid)

    def branch(self, sid: str | None = None) -> Environment:
        """A shadow: a new world over the same snapshot store, holding the
        snapshot ``sid`` (default: the current content), with an empty ledger."""
        return Environment(self.store.get(sid) if sid is not None else self.data, self.store)

    def copy(self) -> Environment:
        """An independent copy including the ledger (a forked session's world)."""
        other = Environment(self.data, self.store)
        other.ledger, other.executions, other.blocked = dict(self.ledger), Counter(self.executions), list(self.blocked)
        return other

    def fire(self, call: Call, tool: Tool) -> tuple[str, bool]:
        """Apply a consequential call's side effect once per call ID.

        Returns ``(result, fired)``; a call ID already in the ledger is not
        applied again (``fired`` is false) and answers the recorded result."""
        if call.call_id in self.ledger:
            self.blocked.append(call.call_id)
            return self.ledger[call.call_id].result, False
        result = tool.run(self, call)
        self.ledger[call.call_id] = attrs.evolve(call, result=result, committed=True)
        self.executions[call.call_id] += 1
        return result, True

    def read(self, call: Call, tool: Tool) -> str:
        return tool.run(self, call)


# --- tools -------------------------------------------------------------------------


@attrs.frozen
class Tool:
    """A tool's signature, kind, where each argument comes from, and its
    implementation ``run(environment, call) -> result text``."""

    name: str
    params: tuple[str, ...]
    consequential: bool
    run: Callable[[Environment, Call], str] = attrs.field(eq=False, repr=False)
    required: tuple[str, ...] = ()
    fill: tuple[tuple[str, str], ...] = ()  # (param, filler); unlisted params: 'model'

    def __attrs_post_init__(self) -> None:
        for param, filler in self.fill:
            if param not in self.params or filler not in FILLERS:
                raise ValueError(f"tool {self.name!r}: bad filler {param}={filler!r}; fillers are {FILLERS}")

    def filler(self, param: str) -> str:
        return dict(self.fill).get(param, "model")

    def with_fill(self, **fill: str) -> Tool:
        merged = dict(self.fill) | fill
        return attrs.evolve(self, fill=tuple((p, merged[p]) for p in self.params if p in merged))


def _fetch(env: Environment, call: Call) -> str:
    key = call.arg("key")
    value = env.get(key)
    return f"{key} = {value}" if value is not None else f"{key}: not found"


def _search(env: Environment, call: Call) -> str:
    query = call.arg("query").casefold()
    hits = sorted((k, v) for k, v in env.data.items() if query in k.casefold() or query in v.casefold())[:3]
    return "\n".join(f"{k} = {v}" for k, v in hits) or f"no results for {call.arg('query')}"


def _send_message(env: Environment, call: Call) -> str:
    to, body = call.arg("to"), call.arg("body")
    env.put(f"outbox/{call.call_id}", f"to {to}: {body}")
    return f"message sent to {to} ({call.call_id})"


def _book(env: Environment, call: Call) -> str:
    what = f"{call.arg('item')} on {call.arg('date')}" if call.arg("date") else call.arg("item")
    env.put(f"bookings/{call.call_id}", what)
    return f"booked {what} ({call.call_id})"


def default_tools() -> dict[str, Tool]:
    """``fetch``/``search`` (read-only) and ``send_message``/``book`` (consequential).

    ``send_message`` replies to the latest tool result: its ``to`` is the last
    address in that result, copied by the scaffold, so the recipient depends
    on what the agent observed (and on a forget target that injected it).
    """
    return {t.name: t for t in (
        Tool("fetch", ("key",), False, _fetch, required=("key",)),
        Tool("search", ("query",), False, _search, required=("query",)),
        Tool("send_message", ("to", "body"), True, _send_message, required=("to",), fill=(("to", "address"),)),
        Tool("book", ("item", "date"), True, _book, required=("item",)),
    )}


# --- the runtime ---------------------------------------------------------------------


class ToolAgentRuntime(AgentRuntime):
    """An :class:`AgentRuntime` whose plans become tool calls.

    A ``plan`` step's decoded plan is parsed into a :class:`Call`
    (``f"{step_id}/call"``), run, and its result prefilled into context in the
    same transition as a ``tool`` block ``f"{call_id}/result"`` carrying its
    own source ID ``f"{call_id}/result"``. A call with a required argument
    empty is not made: the result block says so and nothing runs.

    State beside the base runtime's:

    - ``world``: the real environment; only a non-replaying runtime (or an
      operator's :meth:`release_held`) ever executes against it;
    - ``effects``: the committed consequential calls, in firing order; real and
      irrevocable, so no forget rewrites it;
    - ``calls``: the calls of the current trajectory (after a forget: the
      counterfactual's), part of the state record;
    - ``shadow``: in a replay runtime, the environment restored from the
      checkpoint's snapshot that replayed calls run against; after a forget,
      the counterfactual environment that replay ended in;
    - ``_withheld``: forgotten call-result source IDs (and, harmlessly, every
      other forgotten source ID); a result named here is prefilled empty when
      replay re-makes its call, as a sanitized tool step would be. A fresh
      counterfactual run takes them as ``withheld=``.
    """

    def __init__(self, engine: Engine, system: str, settings: Settings = Settings(), *,
                 world: Environment | None = None, tools: Mapping[str, Tool] | None = None,
                 read_mode: str = DEFAULT_READ_MODE, withheld: Iterable[str] = ()):
        super().__init__(engine, system, settings)
        self._configure(world, tools, read_mode, withheld)
        self.effects: list[Call] = []
        self.calls: list[Call] = []
        self.shadow: Environment | None = None
        self.replay_log: dict[str, list] = _empty_replay_log()
        self._recorded_reads: dict[str, Call] = {}  # replay runtimes: the trajectory's read results
        self._forgetting: tuple[str, ...] = ()
        self._world_before: str | None = None
        self._last_replay: dict[str, list] = _empty_replay_log()

    # --- construction ------------------------------------------------------

    @classmethod
    def start(cls, engine: Engine, system: str, settings: Settings = Settings(), *,
              world: Environment | None = None, tools: Mapping[str, Tool] | None = None,
              read_mode: str = DEFAULT_READ_MODE, withheld: Iterable[str] = ()) -> ToolAgentRuntime:
        runtime = super().start(engine, system, settings)  # R_0 touches no environment
        runtime._configure(world, tools, read_mode, withheld)
        return runtime

    def _configure(self, world: Environment | None, tools: Mapping[str, Tool] | None, read_mode: str,
                   withheld: Iterable[str]) -> None:
        if read_mode not in READ_MODES:
            raise ValueError(f"unknown read mode {read_mode!r}; expected one of {READ_MODES}")
        self.world = world if world is not None else Environment()
        self.tools = dict(tools) if tools is not None else default_tools()
        self.read_mode = read_mode
        self._withheld = set(withheld)

    @classmethod
    def from_episode(cls, engine: Engine, episode: Episode, progress: Progress | None = None, *,
                     world: Environment | None = None, tools: Mapping[str, Tool] | None = None,
                     read_mode: str = DEFAULT_READ_MODE, withheld: Iterable[str] = ()) -> ToolAgentRuntime:
        runtime = cls.start(engine, episode.system, episode.settings, world=world, tools=tools,
                            read_mode=read_mode, withheld=withheld)
        runtime.run(episode.steps, progress)
        return runtime

    # --- the plan -> call -> observation transition ---------------------------

    def _after_plan(self, step: Step, plan: RuntimeBlock) -> None:
        call_id = call_id_for(step.id)
        tool = self.tools.get(step.tool or "")
        if tool is None:
            body, call = f"error: no tool named {step.tool!r}", None
        else:
            args, parse = self._resolve_arguments(tool, step, plan)
            missing = [p for p in tool.required if not args[p]]
            call = Call(call_id, tool.name, tuple((p, args[p]) for p in tool.params), tool.consequential,
                        step.id, self.t, "ok" if parse else "fallback")
            if missing:
                body, call = f"not called: missing {', '.join(missing)}", None
            else:
                call = self._execute(tool, call, plan)
                body = call.result
                self.calls.append(call)
        source = result_source(call_id)
        withheld = source in self._withheld  # the result observation was forgotten: sanitized away
        text = render("user", f"[result of tool {step.tool} call {call_id}]\n{'' if withheld else body}")
        self._prefill_block(source, "tool", text, parents=tuple(self.context),
                            sources=self._resident_sources() | (frozenset() if withheld else {source}))

    def _resolve_arguments(self, tool: Tool, step: Step, plan: RuntimeBlock) -> tuple[dict[str, str], bool]:
        from_model, well_formed = parse_arguments(tool.params, plan.text)
        request = "\n".join(i.text for i in step.items)
        from_request, _ = parse_arguments(tool.params, request)
        address = self._latest_address()
        args = {}
        for p in tool.params:
            filler = tool.filler(p)
            args[p] = from_model[p] if filler == "model" else from_request[p] if filler == "request" else address
        return args, well_formed

    def _latest_address(self) -> str:
        """The last address in the latest tool result in context: episode tool
        steps and read-only call results; consequential calls' confirmations
        and results sanitized away to nothing (a forgotten tool step, a
        withheld call result) are skipped, as if never received."""
        skip = {result_source(c.call_id) for c in self.calls if c.consequential}
        skip |= {result_source(call_id_for(s.id)) for s in self.steps if s.kind == "plan"} & self._withheld
        skip |= {s.id for s in self.steps if s.kind == "tool" and not s.items}
        for block_id in reversed(self.context):
            block = self.graph[block_id]
            if block.type == "tool" and block_id not in skip:
                found = ADDRESS.findall(block.text)
                return found[-1] if found else ""
        return ""

    def _execute(self, tool: Tool, call: Call, plan: RuntimeBlock) -> Call:
        """Run a call: against the real world, or (replaying) ``ReplayTools``."""
        if not self.replaying:
            if not tool.consequential:
                return attrs.evolve(call, result=self.world.read(call, tool))
            result, fired = self.world.fire(call, tool)
            if not fired:  # de-duplicated: this call ID already fired in the real world
                return attrs.evolve(call, result=result)
            call = attrs.evolve(call, result=result, committed=True)
            self.effects.append(call)
            self._mark_committed(plan)
            return call
        log = self.replay_log
        if tool.consequential:
            # Shadow execution: only the shadow sees the side effect. The real
            # world is not touched, so a call ID that already fired there never
            # fires again; whether the real effect matches is what `committed` says.
            result, _ = self.shadow.fire(call, tool)
            real = self._committed_by_id().get(call.call_id)
            log["shadow_calls"].append(call.call_id)
            if real is not None:
                log["deduplicated"].append(call.call_id)
            committed = real is not None and real.same_call(call)
            if committed:
                self._mark_committed(plan)
            return attrs.evolve(call, result=result, committed=committed)
        recorded = self._recorded_reads.get(call.call_id)
        if self.read_mode == "recorded":
            if recorded is not None and recorded.same_call(call):
                log["reads_served"].append(call.call_id)
                return attrs.evolve(call, result=recorded.result)
            log["read_fallbacks"].append(call.call_id)
        result = self.shadow.read(call, tool)
        log["reads_reexecuted"].append(call.call_id)
        if recorded is not None and recorded.same_call(call) and recorded.result != result:
            log["changed_reads"].append({"call_id": call.call_id, "recorded": recorded.result, "replayed": result})
        return attrs.evolve(call, result=result)

    def _mark_committed(self, plan: RuntimeBlock) -> None:
        self.graph.replace(attrs.evolve(self.graph[plan.id], committed=True))

    def _committed_by_id(self) -> dict[str, Call]:
        return {c.call_id: c for c in self.effects}

    # --- hooks: snapshots, restore, adopt, report --------------------------------

    def env_snapshot_id(self) -> str | None:
        """A replay checkpoints its shadow (the counterfactual world); a live
        session checkpoints the real world."""
        return (self.shadow if self.replaying else self.world).snapshot()

    def _initial_snapshot(self) -> str:
        first = [c for c in self.checkpoints.all() if c.boundary == 0]
        if first and first[0].env_snapshot is not None:
            return first[0].env_snapshot
        return self.world.snapshot()

    def _spawn(self) -> ToolAgentRuntime:
        """A replay (or reset) runtime: the same real world and effect log,
        which it only reads; a shadow at ``R_0``'s snapshot, which
        :meth:`_restore_extra` moves to the checkpoint's."""
        other = type(self)(self.engine, self.system, self.settings, world=self.world, tools=self.tools,
                           read_mode=self.read_mode,
                           withheld=self._withheld | set(self.forgotten) | set(self._forgetting))
        other.effects = self.effects  # read-only while replaying
        other.shadow = self.world.branch(self._initial_snapshot())
        other._recorded_reads = {c.call_id: c for c in self.calls if not c.consequential}
        return other

    def _restore_extra(self, replay: AgentRuntime, checkpoint: Checkpoint) -> None:
        assert isinstance(replay, ToolAgentRuntime)
        if checkpoint.env_snapshot is None:
            raise LookupError(f"checkpoint at {checkpoint.boundary} recorded no environment snapshot")
        replay.shadow = self.world.branch(checkpoint.env_snapshot)
        replay.calls = [c for c in self.calls if c.turn <= checkpoint.boundary]

    def _adopt_extra(self, other: AgentRuntime) -> None:
        assert isinstance(other, ToolAgentRuntime)
        self.calls = list(other.calls)
        self.shadow = other.shadow
        self._withheld = set(other._withheld)
        self._last_replay = other.replay_log

    def _check_sources(self, source_ids: Sequence[str]) -> list[str]:
        """Every forget and full reset starts here, inside the session lock:
        note the sources it removes (so the replay runtime withholds a
        forgotten call result) and the real world's snapshot."""
        pending = super()._check_sources(source_ids)
        self._forgetting, self._world_before = tuple(pending), self.world.snapshot()
        self._last_replay = _empty_replay_log()
        return pending

    def _report_extra(self) -> dict:
        divergences = self.get_divergences()
        after = self.world.snapshot()
        before = self._world_before or after
        log = self._last_replay
        return {
            "divergences": divergences,
            "held": [d["call_id"] for d in divergences if d["kind"] == "new_call"],
            "world": {"before": before, "after": after, "unchanged": after == before},
            "shadow_snapshot": self.shadow.snapshot() if self.shadow is not None else None,
            "tools": {"read_mode": self.read_mode,
                      "shadow_calls": list(log["shadow_calls"]),
                      "deduplicated": list(log["deduplicated"]),
                      "reads_reexecuted": list(log["reads_reexecuted"]),
                      "reads_served": list(log["reads_served"]),
                      "read_fallbacks": list(log["read_fallbacks"]),
                      "changed_reads": list(log["changed_reads"])},
        }

    # --- divergences and A3 -----------------------------------------------------

    def get_divergences(self) -> list[dict]:
        """Committed consequential calls vs. the current trajectory's.

        - ``changed_arguments``: same call ID, other tool or arguments; the
          committed version was sent and cannot be re-sent (same ID);
        - ``new_call``: the trajectory makes a consequential call the real run
          never made; it was only shadow-executed: *not sent*, held for the
          operator (:meth:`release_held`);
        - ``not_made``: a committed call the trajectory does not make.
        """
        committed = self._committed_by_id()
        made = {c.call_id: c for c in self.calls if c.consequential}
        out = []
        for cid in sorted(committed.keys() | made.keys(),
                          key=lambda i: ((committed.get(i) or made.get(i)).turn, i)):
            real, cf = committed.get(cid), made.get(cid)
            if real is not None and cf is not None:
                if real.same_call(cf):
                    continue
                kind, status = "changed_arguments", ("irrevocable: the committed version was sent; the "
                                                     "counterfactual version is not sent (call ID already fired)")
            elif real is not None:
                kind, status = "not_made", "irrevocable: sent, but the counterfactual would not have sent it"
            else:
                kind, status = "new_call", "not sent: held for the operator (the real run never made this call)"
            out.append({"call_id": cid, "kind": kind, "status": status,
                        "committed": real.to_json() if real is not None else None,
                        "counterfactual": _counterfactual_json(cf) if cf is not None else None})
        return out

    def get_assumptions(self) -> dict:
        out = super().get_assumptions()
        divergences = self.get_divergences()
        if divergences:
            named = "; ".join(f"{d['call_id']} ({d['kind']})" for d in divergences)
            why = f"irrevocable divergences between committed and counterfactual tool calls: {named}"
        elif self.effects:
            reads = ("re-executes reads against the restored snapshot" if self.read_mode == "reexecute"
                     else "serves reads from recorded observations")
            why = (f"each of the {len(self.effects)} committed consequential call(s) is one the counterfactual "
                   f"makes with the same arguments; replay shadow-executes consequential tools with call-ID "
                   f"de-duplication and {reads}")
        else:
            why = "no consequential tool call was committed"
        out["A3"] = {"holds": not divergences, "why": why,
                     "divergences": [{"call_id": d["call_id"], "kind": d["kind"]} for d in divergences]}
        return out

    def release_held(self, call_id: str) -> Call:
        """The operator sends a held counterfactual call (a ``new_call``
        divergence) to the real world. Nothing else can be sent this way."""
        held = {d["call_id"]: d for d in self.get_divergences() if d["kind"] == "new_call"}
        if call_id not in held:
            raise ValueError(f"{call_id!r} is not a held call; held: {sorted(held)}")
        i, call = next((i, c) for i, c in enumerate(self.calls) if c.call_id == call_id)
        result, fired = self.world.fire(call, self.tools[call.tool])
        if not fired:
            raise ValueError(f"{call_id!r} already fired in the real world; it is never sent twice")
        sent = attrs.evolve(call, result=result, committed=True)
        self.effects.append(sent)
        self.calls[i] = attrs.evolve(call, committed=True)
        plan = f"{call.step_id}/plan"
        if plan in self.graph:
            self._mark_committed(self.graph[plan])
        return sent

    # --- persistence (impl/store/sqlite.py) ----------------------------------------------

    def _extra_record(self) -> dict:
        """The tool layer's part of the session record: the real world (content,
        call-ID ledger, execution counts, blocked re-fires), every environment
        snapshot the checkpoints name, the shadow (counterfactual) world, the
        effect log, the trajectory's calls, the read mode, the withheld result
        sources, and each tool's signature (not its code)."""
        return {"tool_config": {"read_mode": self.read_mode, "withheld": sorted(self._withheld),
                                "tools": [_tool_record(t) for t in self.tools.values()]},
                "world": _environment_record(self.world),
                "shadow": _environment_record(self.shadow) if self.shadow is not None else None,
                "snapshots": {sid: [list(kv) for kv in state]
                              for sid, state in sorted(self.world.store._states.items())},
                "effects": [_call_record(c) for c in self.effects],
                "calls": [_call_record(c) for c in self.calls]}

    def _load_extra_record(self, record: dict) -> None:
        """The inverse of :meth:`_extra_record`. Tools are rebuilt by name from
        :func:`default_tools` (with the stored argument fillers); a tool that
        is not a default one gets a stand-in that refuses to run until its
        implementation is put back in ``runtime.tools``."""
        if not record:
            return
        config = record["tool_config"]
        store = SnapshotStore()
        for sid, state in record["snapshots"].items():
            store._states[sid] = tuple((k, v) for k, v in state)
        self.world = _load_environment(record["world"], store)
        self.shadow = _load_environment(record["shadow"], store) if record["shadow"] is not None else None
        self.tools = {t["name"]: _load_tool(t) for t in config["tools"]}
        self.read_mode = config["read_mode"]
        self._withheld = set(config["withheld"])
        self.effects = [_load_call(c) for c in record["effects"]]
        self.calls = [_load_call(c) for c in record["calls"]]

    # --- state ------------------------------------------------------------------

    def get_state_record(self) -> dict:
        record = super().get_state_record()
        record["calls"] = [c.to_json() | {"result": c.result} for c in self.calls]
        return record

    def fork(self) -> ToolAgentRuntime:
        """A branch sharing nothing mutable: the base fork's state, plus a copy
        of the real world (a branch's side effects stay in its own world)."""
        base = super().fork()  # the base state: graph, checkpoints, a copy-on-write lineage, ...
        other = type(self)(self.engine, self.system, self.settings)
        other.__dict__.update(vars(base))
        other.world, other.tools, other.read_mode = self.world.copy(), dict(self.tools), self.read_mode
        other.effects, other.calls, other._withheld = list(self.effects), list(self.calls), set(self._withheld)
        other.forgotten = list(self.forgotten)  # a branch of a state that already forgot them
        other.shadow = self.shadow.copy() if self.shadow is not None else None
        other.replay_log, other._last_replay = _empty_replay_log(), self._last_replay
        other._recorded_reads, other._forgetting, other._world_before = {}, (), None
        return other


def _call_record(call: Call) -> dict:
    return {"call_id": call.call_id, "tool": call.tool, "args": [list(a) for a in call.args],
            "consequential": call.consequential, "step_id": call.step_id, "turn": call.turn, "parse": call.parse,
            "result": call.result, "committed": call.committed}


def _load_call(record: dict) -> Call:
    return Call(record["call_id"], record["tool"], tuple((k, v) for k, v in record["args"]),
                record["consequential"], record["step_id"], record["turn"], record["parse"], record["result"],
                record["committed"])


def _environment_record(env: Environment) -> dict:
    return {"data": [list(kv) for kv in sorted(env.data.items())],
            "ledger": [_call_record(c) for c in env.ledger.values()],
            "executions": [[cid, n] for cid, n in env.executions.items()], "blocked": list(env.blocked)}


def _load_environment(record: dict, store: SnapshotStore) -> Environment:
    env = Environment(dict((k, v) for k, v in record["data"]), store)
    env.ledger = {c["call_id"]: _load_call(c) for c in record["ledger"]}
    env.executions = Counter({cid: n for cid, n in record["executions"]})
    env.blocked = list(record["blocked"])
    return env


def _tool_record(tool: Tool) -> dict:
    return {"name": tool.name, "params": list(tool.params), "consequential": tool.consequential,
            "required": list(tool.required), "fill": [list(f) for f in tool.fill]}


def _load_tool(record: dict) -> Tool:
    fill = tuple((p, f) for p, f in record["fill"])
    default = default_tools().get(record["name"])
    if default is not None and (list(default.params), default.consequential, list(default.required)) == (
            record["params"], record["consequential"], record["required"]):
        return attrs.evolve(default, fill=fill)

    def missing(env: Environment, call: Call) -> str:
        raise LookupError(f"tool {record['name']!r} is not a default tool and its code is not stored: "
                          "put its implementation back in runtime.tools before running it")

    return Tool(record["name"], tuple(record["params"]), record["consequential"], missing,
                tuple(record["required"]), fill)


def _empty_replay_log() -> dict[str, list]:
    return {"shadow_calls": [], "deduplicated": [], "reads_reexecuted": [], "reads_served": [],
            "read_fallbacks": [], "changed_reads": []}


def _counterfactual_json(call: Call) -> dict:
    out = call.to_json()
    out["sent"] = call.committed
    return out


__all__ = ["ADDRESS", "Call", "DEFAULT_READ_MODE", "DIVERGENCE_KINDS", "Environment", "FILLERS", "READ_MODES",
           "SnapshotStore", "Tool", "ToolAgentRuntime", "call_id_for", "clean_value", "default_tools",
           "parse_arguments", "result_source", "snapshot_id"]
