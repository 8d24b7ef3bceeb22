"""The tool layer: the runtime extension whose plans become tool calls, with
side-effect-safe replay (assumption A3; the paper's Section 3.4 (c),
"Sanitized replay", and Algorithm 1 line 8, ``ReplayTools``).

A ``plan`` step's decoded plan is parsed into a :class:`Call`
(``f"{step_id}/call"``), run, and its result prefilled into context in the
same transition as a ``tool`` block ``f"{call_id}/result"`` carrying its own
source ID ``f"{call_id}/result"``. A call with a required argument empty is
not made: the result block says so and nothing runs. Read-only tools are
re-executed against the environment snapshot during replay (or served from
recorded observations); consequential tools are shadow-executed with call-ID
de-duplication, so real side effects never fire twice. Where a committed
effect after the restore boundary differs from what the counterfactual would
do, the forget report names it as an *irrevocable divergence*.

See docs/tools.md for the replay modes, the default, the report format and
what cannot be undone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from unsee.impl.agent.checkpoints import Checkpoint
from unsee.impl.agent.episode import Step
from unsee.impl.agent.provenance import RuntimeBlock
from unsee.impl.agent.tools.calls import (
    ADDRESS,
    DEFAULT_READ_MODE,
    READ_MODES,
    Call,
    call_id_for,
    parse_arguments,
    parse_json_arguments,
    result_source,
)
from unsee.impl.agent.tools.catalog import Tool, default_tools
from unsee.impl.agent.tools.environment import Environment, SnapshotStore
from unsee.impl.agent.tools.records import (
    get_call_record,
    get_environment_record,
    get_tool_record,
    load_call,
    load_environment,
    load_tool,
)
from unsee.impl.util.ids import PLAN, compute_block_id

#: The name the tool layer is recorded under (the session record's ``extra``).
TOOLS = "tools"


def get_empty_replay_log() -> dict[str, list]:
    return {"shadow_calls": [], "deduplicated": [], "reads_reexecuted": [], "reads_served": [],
            "read_fallbacks": [], "changed_reads": []}


class ToolLayer:
    """The tool layer (an :class:`~unsee.impl.agent.extensions.Extension`).

    - ``world``: the real environment; only a non-replaying runtime (or an
      operator's :meth:`release_held`) ever executes against it;
    - ``effects``: the committed consequential calls, in firing order; real and
      irrevocable, so no forget rewrites it;
    - ``calls``: the calls of the current trajectory (after a forget: the
      counterfactual's), part of the state record;
    - ``shadow``: in a replay's layer, the environment restored from the
      checkpoint's snapshot that replayed calls run against; after a forget,
      the counterfactual environment that replay ended in;
    - ``withheld``: forgotten call-result source IDs (and, harmlessly, every
      other forgotten source ID); a result named here is prefilled empty when
      replay re-makes its call, as a sanitized tool step would be. A fresh
      counterfactual run takes them as ``withheld=``.
    """

    name = TOOLS

    def __init__(self, world: Environment | None = None, tools: Mapping[str, Tool] | None = None,
                 read_mode: str = DEFAULT_READ_MODE, withheld: Iterable[str] = ()):
        if read_mode not in READ_MODES:
            raise ValueError(f"unknown read mode {read_mode!r}; expected one of {READ_MODES}")
        self.world = world if world is not None else Environment()
        self.tools = dict(tools) if tools is not None else default_tools()
        self.read_mode = read_mode
        self.withheld = set(withheld)
        self.effects: list[Call] = []
        self.calls: list[Call] = []
        self.shadow: Environment | None = None
        self.replay_log: dict[str, list] = get_empty_replay_log()
        self._recorded_reads: dict[str, Call] = {}  # replay layers: the trajectory's read results
        self._forgetting: tuple[str, ...] = ()
        self._world_before: str | None = None
        self._last_replay: dict[str, list] = get_empty_replay_log()

    def get_tool_definitions(self) -> list[dict]:
        """The tools' definitions, by name, for the system block (impl/agent/render.py)."""
        return [self.tools[name].get_definition() for name in sorted(self.tools)]

    # --- the plan -> call -> observation transition ---------------------------

    def after_plan(self, runtime, step: Step, plan: RuntimeBlock) -> None:
        call_id = call_id_for(step.id)
        tool = self.tools.get(step.tool or "")
        if tool is None:
            body, call = f"error: no tool named {step.tool!r}", None
        else:
            args, parse = self._resolve_arguments(runtime, tool, step, plan)
            missing = [p for p in tool.required if not args[p]]
            call = Call(call_id, tool.name, tuple((p, args[p]) for p in tool.params), tool.consequential,
                        step.id, runtime.t, "ok" if parse else "fallback")
            if missing:
                body, call = f"not called: missing {', '.join(missing)}", None
            else:
                call = self._execute(runtime, tool, call, plan)
                body = call.result
                self.calls.append(call)
        source = result_source(call_id)
        withheld = source in self.withheld  # the result observation was forgotten: sanitized away
        text = runtime.render_block(*runtime.renderer.get_call_result(step.tool, call_id, "" if withheld else body))
        runtime.append_block(source, "tool", text, parents=tuple(runtime.context),
                             sources=runtime.get_resident_sources() | (frozenset() if withheld else {source}))

    def _resolve_arguments(self, runtime, tool: Tool, step: Step, plan: RuntimeBlock) -> tuple[dict[str, str], bool]:
        # the model wrote JSON where the template's own call format opened the turn, else `a, b=c)`
        parse = parse_json_arguments if runtime.renderer.has_native_calls() else parse_arguments
        from_model, well_formed = parse(tool.params, plan.text)
        request = "\n".join(i.text for i in step.items)
        from_request, _ = parse_arguments(tool.params, request)
        address = self._latest_address(runtime)
        args = {}
        for p in tool.params:
            filler = tool.filler(p)
            args[p] = from_model[p] if filler == "model" else from_request[p] if filler == "request" else address
        return args, well_formed

    def _latest_address(self, runtime) -> str:
        """The last address in the latest tool result in context: episode tool
        steps and read-only call results; consequential calls' confirmations
        and results sanitized away to nothing (a forgotten tool step, a
        withheld call result) are skipped, as if never received."""
        steps = runtime.steps
        skip = {result_source(c.call_id) for c in self.calls if c.consequential}
        skip |= {result_source(call_id_for(s.id)) for s in steps if s.kind == "plan"} & self.withheld
        skip |= {s.id for s in steps if s.kind == "tool" and not s.items}
        for block_id in reversed(runtime.context):
            block = runtime.graph[block_id]
            if block.type == "tool" and block_id not in skip:
                found = ADDRESS.findall(block.text)
                return found[-1] if found else ""
        return ""

    def _execute(self, runtime, tool: Tool, call: Call, plan: RuntimeBlock) -> Call:
        """Run a call: against the real world, or (replaying) ``ReplayTools``."""
        if not runtime.replaying:
            if not tool.consequential:
                return attrs.evolve(call, result=self.world.read(call, tool))
            result, fired = self.world.fire(call, tool)
            if not fired:  # de-duplicated: this call ID already fired in the real world
                return attrs.evolve(call, result=result)
            call = attrs.evolve(call, result=result, committed=True)
            self.effects.append(call)
            runtime.mark_committed(plan.id)
            return call
        if tool.consequential:
            return self._shadow_fire(runtime, tool, call, plan)
        return self._replay_read(tool, call)

    def _shadow_fire(self, runtime, tool: Tool, call: Call, plan: RuntimeBlock) -> Call:
        # Shadow execution: only the shadow sees the side effect. The real
        # world is not touched, so a call ID that already fired there never
        # fires again; whether the real effect matches is what `committed` says.
        log = self.replay_log
        result, _ = self.shadow.fire(call, tool)
        real = self._committed_by_id().get(call.call_id)
        log["shadow_calls"].append(call.call_id)
        if real is not None:
            log["deduplicated"].append(call.call_id)
        committed = real is not None and real.same_call(call)
        if committed:
            runtime.mark_committed(plan.id)
        return attrs.evolve(call, result=result, committed=committed)

    def _replay_read(self, tool: Tool, call: Call) -> Call:
        log = self.replay_log
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

    def _committed_by_id(self) -> dict[str, Call]:
        return {c.call_id: c for c in self.effects}

    # --- snapshots, branches, forget, adopt ------------------------------------

    def take_snapshot(self, runtime) -> str | None:
        """A replay checkpoints its shadow (the counterfactual world); a live
        session checkpoints the real world."""
        return (self.shadow if runtime.replaying else self.world).snapshot()

    def _initial_snapshot(self, runtime) -> str:
        first = [c for c in runtime.checkpoints.all() if c.boundary == 0]
        if first and first[0].env_snapshot is not None:
            return first[0].env_snapshot
        return self.world.snapshot()

    def branch(self, runtime, checkpoint: Checkpoint | None) -> ToolLayer:
        """A replay's (or, at ``checkpoint`` None, a full reset's) layer: the
        same real world and effect log, which it only reads; a shadow at the
        checkpoint's snapshot (``R_0``'s for a reset) and the calls made up
        to the checkpoint."""
        other = ToolLayer(self.world, self.tools, self.read_mode,
                          self.withheld | set(runtime.forgotten) | set(self._forgetting))
        other.effects = self.effects  # read-only while replaying
        other._recorded_reads = {c.call_id: c for c in self.calls if not c.consequential}
        if checkpoint is None:
            other.shadow = self.world.branch(self._initial_snapshot(runtime))
            return other
        if checkpoint.env_snapshot is None:
            raise LookupError(f"checkpoint at {checkpoint.boundary} recorded no environment snapshot")
        other.shadow = self.world.branch(checkpoint.env_snapshot)
        other.calls = [c for c in self.calls if c.turn <= checkpoint.boundary]
        return other

    def begin_forget(self, runtime, source_ids: Sequence[str]) -> None:
        """Note the sources a forget removes (so the replay withholds a
        forgotten call result) and the real world's snapshot."""
        self._forgetting, self._world_before = tuple(source_ids), self.world.snapshot()
        self._last_replay = get_empty_replay_log()

    def adopt(self, other: ToolLayer) -> None:
        self.calls = list(other.calls)
        self.shadow = other.shadow
        self.withheld = set(other.withheld)
        self._last_replay = other.replay_log

    def fork(self) -> ToolLayer:
        """A layer sharing nothing mutable, with a copy of the real world (a
        branch's side effects stay in its own world)."""
        other = ToolLayer(self.world.copy(), self.tools, self.read_mode, self.withheld)
        other.effects, other.calls = list(self.effects), list(self.calls)
        other.shadow = self.shadow.copy() if self.shadow is not None else None
        other._last_replay = self._last_replay
        return other

    # --- reports, divergences and A3 --------------------------------------------

    def get_report_fields(self) -> dict:
        divergences = self.get_divergences()
        after = self.world.snapshot()
        before = self._world_before or after
        log = self._last_replay
        return {
            "divergences": divergences,
            "held": [d["call_id"] for d in divergences if d["kind"] == "new_call"],
            "world": {"before": before, "after": after, "unchanged": after == before},
            "shadow_snapshot": self.shadow.snapshot() if self.shadow is not None else None,
            "tools": {"read_mode": self.read_mode, **{key: list(log[key]) for key in get_empty_replay_log()}},
        }

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
                        "counterfactual": _get_counterfactual_json(cf) if cf is not None else None})
        return out

    def get_assumptions(self, assumptions: dict) -> dict:
        """A3 as the tool layer sees it: holds iff no irrevocable divergence."""
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
        return assumptions | {"A3": {"holds": not divergences, "why": why,
                                     "divergences": [{"call_id": d["call_id"], "kind": d["kind"]}
                                                     for d in divergences]}}

    def release_held(self, runtime, call_id: str) -> Call:
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
        plan = compute_block_id(call.step_id, PLAN)
        if plan in runtime.graph:
            runtime.mark_committed(plan)
        return sent

    # --- records ---------------------------------------------------------------------

    def get_state_fields(self) -> dict:
        """The trajectory's calls are part of ``R_t`` (and so of the digest)."""
        return {"calls": [c.to_json() | {"result": c.result} for c in self.calls]}

    def get_record(self) -> dict:
        """The tool layer's part of the session record: the real world (content,
        call-ID ledger, execution counts, blocked re-fires), every environment
        snapshot the checkpoints name, the shadow (counterfactual) world, the
        effect log, the trajectory's calls, the read mode, the withheld result
        sources, and each tool's signature (not its code)."""
        return {"tool_config": {"read_mode": self.read_mode, "withheld": sorted(self.withheld),
                                "tools": [get_tool_record(t) for t in self.tools.values()]},
                "world": get_environment_record(self.world),
                "shadow": get_environment_record(self.shadow) if self.shadow is not None else None,
                "snapshots": self.world.store.get_record(),
                "effects": [get_call_record(c) for c in self.effects],
                "calls": [get_call_record(c) for c in self.calls]}

    @classmethod
    def from_record(cls, record: dict) -> ToolLayer:
        """The inverse of :meth:`get_record`; tools are rebuilt by name
        (:func:`~unsee.impl.agent.tools.records.load_tool`)."""
        config = record["tool_config"]
        store = SnapshotStore.from_record(record["snapshots"])
        layer = cls(load_environment(record["world"], store), {t["name"]: load_tool(t) for t in config["tools"]},
                    config["read_mode"], config["withheld"])
        layer.shadow = load_environment(record["shadow"], store) if record["shadow"] is not None else None
        layer.effects = [load_call(c) for c in record["effects"]]
        layer.calls = [load_call(c) for c in record["calls"]]
        return layer


def _get_counterfactual_json(call: Call) -> dict:
    out = call.to_json()
    out["sent"] = call.committed
    return out


__all__ = ["TOOLS", "ToolLayer", "get_empty_replay_log"]
