"""The paper's methods B0-B9 (Section 4.1 "Methods").

Every method branches from the same contaminated base state (``fork`` shares
the cache copy-on-write), so comparisons are paired. Each returns the resulting runtime and
a :class:`MethodResult` with what it recomputed.

====  =====================  ===================================================
B0    none                   no forget
B1    memory-delete          delete the memory-store records that carry z
B2    forget-instruction     append an instruction to forget z
B3    source-redaction       drop the source block, keep derived ones, rebuild
B4    sanitize-no-replay     drop source and descendants, regenerate nothing
B5    reset                  full reset on the counterfactual stream
B5'   reset-prefix-cache     B5 served by the engine's prefix cache: the KV of
                             whole matching prefill chunks is reused, not
                             recomputed (``KVEngine.prefix_cache``)
B6    sanitized-rebuild      string-redact every block, rebuild the cache
--    span-excision          Table 4's "target span only": cut the target's token
                             span out of the live KV, keep the suffix KV as it was
B7    replay                 Provenance-Guided Selective Replay (Algorithm 1),
                             model turns replayed as verified drafts (impl/agent/drafts.py)
B7    replay-decode          the same, every model turn re-decoded (no drafts)
B7o   replay-oracle          the paper's variant: turns labelled independent of z
                             re-prefilled unverified (attribution oracle; not
                             exact when a label is wrong)
B8    ifc                    FIDES-style sink policy on plans, no cleanup:
                             identifier arguments (routing, selection) of a
                             tainted plan are blocked, free text passes
B9    ifc-replay             B7 then the same sink policy
====  =====================  ===================================================
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

import attrs

from unsee.impl.agent.provenance import DERIVED_TYPES, RuntimeBlock
from unsee.impl.agent.report import ForgetReport
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.agent.tools.calls import parse_arguments
from unsee.impl.engines.counts import Counters
from unsee.impl.engines.protocol import PendingChunks, PrefixCache, SpanExcision
from unsee.impl.util.ids import PLAN, compute_block_id
from unsee.impl.util.text import get_variants, normalize

METHODS = ("none", "memory-delete", "forget-instruction", "source-redaction", "sanitize-no-replay", "reset",
           "reset-prefix-cache", "sanitized-rebuild", "span-excision", "replay", "replay-decode", "replay-oracle",
           "ifc", "ifc-replay")
#: The sink classes B8's policy treats as identifiers: blocked when tainted.
IDENTIFIER_SINKS = ("routing", "selection")
PAPER_NAMES = {"none": "B0 No-Forget", "memory-delete": "B1 Memory-Delete",
               "forget-instruction": "B2 Forget-Instruction", "source-redaction": "B3 Source-Redaction",
               "sanitize-no-replay": "B4 Sanitize-no-Replay", "reset": "B5 Full-Reset",
               "reset-prefix-cache": "B5' +PrefixCache", "sanitized-rebuild": "B6 Sanitized-Rebuild",
               "span-excision": "Span-only excision (Table 4)",
               "replay": "B7 Selective-Replay", "replay-decode": "B7 Selective-Replay (no drafts)",
               "replay-oracle": "B7-oracle (attribution oracle)", "ifc": "B8 FIDES-style IFC",
               "ifc-replay": "B9 IFC + Replay"}


@attrs.frozen
class MethodResult:
    """What one method did on a fork of the session: the engine's work over it
    (``spent``, the one record of counts, shown by name) and its outcome."""

    method: str
    invocations: int  # transitions of F re-run
    spent: Counters  # the engine's work over the method (prefilled, decoded, draft and reused tokens)
    wall_s: float
    digest: str
    blocked_plans: tuple[str, ...] = ()  # B8/B9: tainted plans with an argument the sink policy blocks
    #: B8/B9: (plan block id, argument) pairs the sink policy blocks
    blocked_args: tuple[tuple[str, str], ...] = ()
    report: ForgetReport | None = None

    prefilled_tokens = property(lambda self: self.spent.prefilled_tokens)
    decoded_tokens = property(lambda self: self.spent.decoded_tokens)
    draft_accepted_tokens = property(lambda self: self.spent.draft_accepted_tokens,
                                     doc="B7: draft tokens verified instead of decoded.")
    draft_rejected_tokens = property(lambda self: self.spent.draft_rejected_tokens)
    reused_tokens = property(lambda self: self.spent.reused_tokens,
                             doc="B5': prefill tokens the prefix cache served (not in prefilled_tokens).")

    @property
    def recomputed_tokens(self) -> int:
        return self.prefilled_tokens + self.decoded_tokens

    def to_json(self) -> dict:
        """As plain data, keys in the order its rows have always had (:data:`RESULT_KEYS`)."""
        out = {key: getattr(self, key) for key in RESULT_KEYS}
        out["paper_name"] = PAPER_NAMES[self.method]
        out["recomputed_tokens"] = self.recomputed_tokens
        out["report"] = self.report.to_json() if self.report else None
        return out


#: The keys of :meth:`MethodResult.to_json` before ``paper_name`` and ``recomputed_tokens``, in order.
RESULT_KEYS = ("method", "invocations", "prefilled_tokens", "decoded_tokens", "wall_s", "digest", "blocked_plans",
               "blocked_args", "report", "draft_accepted_tokens", "draft_rejected_tokens", "reused_tokens")


def apply_method(base: AgentRuntime, method: str, source_id: str, value: str | None = None,
                 sinks: Mapping[str, Mapping[str, str]] | None = None) -> tuple[AgentRuntime, MethodResult]:
    """Run one method on a fork of ``base``; ``base`` is left unchanged.

    ``sinks`` (``{tool: {argument: sink class}}``, e.g. from
    :data:`unsee.impl.eval.suites.TOOL_SINKS`) is what B8 and B9's policy reads;
    a tool it does not describe has every argument treated as an identifier
    (the whole tainted plan is blocked, the conservative reading)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    base.graph.locate_source(source_id)  # an unknown source fails before any work
    if method in ("forget-instruction", "sanitized-rebuild") and not value:
        raise ValueError(f"method {method!r} needs the target's value (the episode's target.value)")
    runtime = base.fork()
    started, before = time.perf_counter(), runtime.engine.counters.snapshot()
    transitions_before = runtime.transitions
    report, blocked, invocations = None, (), 0
    if method in ("replay", "ifc-replay", "replay-decode", "replay-oracle"):
        report = runtime.forget(source_id, drafts=False if method == "replay-decode" else None,
                                oracle=method == "replay-oracle")
        invocations = report.invocations
    elif method == "reset":
        report = runtime.full_reset(source_id)
        invocations = report.invocations
    elif method == "reset-prefix-cache":
        # The same transitions as B5; the engine serves what it can from the
        # old session's lineages (the fork's current one shares base's).
        if not isinstance(runtime.engine, PrefixCache):
            raise NotImplementedError(f"reset-prefix-cache needs an engine with a prefix cache; "
                                      f"{type(runtime.engine).__name__} has none")
        with runtime.engine.prefix_cache(runtime.checkpoints.lineages() | {runtime.lineage}):
            report = runtime.full_reset(source_id)
        invocations = report.invocations
    else:
        _EDITS[method](runtime, source_id, value)
        invocations = runtime.transitions - transitions_before
    blocked_args: tuple[tuple[str, str], ...] = ()
    if method in ("ifc", "ifc-replay"):
        blocked_args = get_blocked_args(runtime, source_id, sinks)
        blocked = tuple(dict.fromkeys(plan for plan, _ in blocked_args))
    if isinstance(runtime.engine, PendingChunks):  # the state it leaves, computed: its last turn's last token too
        runtime.engine.flush(runtime.lineage)
    spent = runtime.engine.counters.snapshot() - before
    result = MethodResult(method, invocations, spent, time.perf_counter() - started, runtime.digest(), blocked,
                          blocked_args, report)
    return runtime, result


# --- one run serving two methods -------------------------------------------------


#: the method whose run is this one's (B7-oracle's only where no step is labelled: :func:`get_equal_run`)
EQUAL_RUNS = {"ifc-replay": "replay", "replay-oracle": "replay-decode"}


def get_equal_run(base: AgentRuntime, method: str) -> str | None:
    """The method whose run on ``base`` is ``method``'s own run, step for step,
    so that an evaluation running both may run it once (:func:`derive_method`):

    - B9 (``ifc-replay``) is B7's forget (the same call) and then the sink policy;
    - B7-oracle (``replay-oracle``) where no step of the session is labelled
      independent: the oracle then vouches for no turn, and every turn is
      decoded as B7 without drafts (``replay-decode``) decodes it.

    None where ``method`` has no such twin."""
    if method == "replay-oracle" and any(getattr(s, "independent", False) for s in base.steps):
        return None
    return EQUAL_RUNS.get(method)


def derive_method(method: str, runtime: AgentRuntime, result: MethodResult, source_id: str,
                  sinks: Mapping[str, Mapping[str, str]] | None = None) -> tuple[AgentRuntime, MethodResult]:
    """``method``'s runtime and result from its equal run's (:func:`get_equal_run`):
    a fork of ``runtime``, the same counted work, and for B9 the sink policy
    applied (its time added to the run's). ``runtime`` is left unchanged."""
    if EQUAL_RUNS.get(method) is None or result.method != EQUAL_RUNS[method]:
        raise ValueError(f"{method!r} cannot be derived from a {result.method!r} run")
    fork = runtime.fork()
    started = time.perf_counter()
    blocked_args: tuple[tuple[str, str], ...] = ()
    if method == "ifc-replay":
        blocked_args = get_blocked_args(fork, source_id, sinks)
    blocked = tuple(dict.fromkeys(plan for plan, _ in blocked_args))
    return fork, attrs.evolve(result, method=method, blocked_plans=blocked, blocked_args=blocked_args,
                              wall_s=result.wall_s + time.perf_counter() - started)


# --- the edit-style baselines --------------------------------------------------

def delete_memory_records(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B1: what deployed stacks do: delete the stored records, touch nothing else."""
    runtime.keep_memory(lambda b: source_id not in b.source_ids)


def append_forget_instruction(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B2: tell the model to forget (the value stays resident)."""
    runtime.append_block(f"forget:{source_id}", "instruction",
                         runtime.render_block("system", f"Forget this and never use or reveal it: {value}"),
                         parents=tuple(runtime.context), sources=runtime.get_resident_sources())


def redact_source(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B3: drop the source block(s); derived artifacts stay."""
    sources = {b.id for b in runtime.graph.locate_source(source_id)}
    runtime.rebuild_context(keep=lambda b: b.id not in sources)


def drop_closure(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B4: drop the source and its descendants; regenerate nothing (over-deletes)."""
    closure = set(runtime.graph.taint_closure(source_id))
    # the system prompt re-prefilled by a compaction inherits nothing; keep system blocks
    runtime.rebuild_context(keep=lambda b: b.id not in closure or b.type == "system")


def redact_strings(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B6: string-redact the target's variants in every block, then rebuild."""
    pattern = re.compile("|".join(re.escape(v) for v in get_variants(value)), re.IGNORECASE)

    def redact(block: RuntimeBlock) -> RuntimeBlock:
        text = pattern.sub("[REDACTED]", block.text)
        if normalize(text) != normalize(block.text) or block.text != text:
            return attrs.evolve(block, id=f"{block.id}~redacted", text=text, parents=())
        return block

    runtime.rebuild_context(keep=lambda b: True, transform=redact)


def excise_span(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """Span-only excision (the paper's Table 4, "target span only"): in the
    live cache, cut out the tokens of the target item wherever its text sits
    verbatim in an observation block (the step it entered in, a memory block
    that re-injected it), and keep every other position's KV as it was
    computed, the suffix included. The stored records of the target go too;
    derived artifacts (answers, summaries, plans, notes) stay, as in B3.

    The suffix KV was computed while attending to the target, and its rotary
    positions no longer match the shorter cache; both are what the ablation
    measures. The token span is the shortest run of the block's tokens whose
    decoding contains the item's text."""
    lm, engine = runtime.engine.lm, runtime.engine
    if not isinstance(engine, SpanExcision):
        # checked first: the method must change nothing it cannot finish
        raise NotImplementedError(f"span-excision needs an engine that can cut a span out of its KV "
                                  f"(`excise`); {type(engine).__name__} cannot (the transformers engine can)")
    items = [i.text for s in runtime.steps for i in s.items if i.source == source_id]
    cuts: dict[str, tuple[int, int, str]] = {}  # block id -> (start, end) in its own tokens, the item text
    for block_id in runtime.context:
        block = runtime.graph[block_id]
        if block.type in DERIVED_TYPES or source_id not in block.source_ids:
            continue
        for text in items:
            span = _find_token_span(lm, block.tokens, text) if text and text in block.text else None
            if span is not None:
                cuts[block_id] = (*span, text)
                break
    runtime.keep_memory(lambda b: not (b.type == "memory_record" and source_id in b.source_ids))
    if cuts:
        runtime.excise_spans(cuts)


def _find_token_span(lm, tokens: tuple[int, ...], text: str) -> tuple[int, int] | None:
    """The shortest ``[a, b)`` with ``text`` in ``decode(tokens[a:b])``:
    the smallest such end ``b`` and then the largest start ``a``, each found
    by bisection (containment is monotone in both)."""
    if text not in lm.decode(list(tokens)):
        return None
    lo, hi = 0, len(tokens)
    while lo < hi:  # smallest b with text in decode(tokens[:b])
        mid = (lo + hi) // 2
        if text in lm.decode(list(tokens[:mid])):
            hi = mid
        else:
            lo = mid + 1
    end = lo
    lo, hi = 0, end
    while lo < hi:  # largest a with text in decode(tokens[a:end])
        mid = (lo + hi + 1) // 2
        if text in lm.decode(list(tokens[mid:end])):
            lo = mid
        else:
            hi = mid - 1
    return lo, end


_EDITS: dict[str, Callable[[AgentRuntime, str, str | None], None]] = {
    "none": lambda runtime, source_id, value: None,
    "memory-delete": delete_memory_records,
    "forget-instruction": append_forget_instruction,
    "source-redaction": redact_source,
    "sanitize-no-replay": drop_closure,
    "sanitized-rebuild": redact_strings,
    "span-excision": excise_span,
    "ifc": lambda runtime, source_id, value: None,
}


# --- IFC -----------------------------------------------------------------------

def get_blocked_plans(runtime: AgentRuntime, source_id: str,
                      sinks: Mapping[str, Mapping[str, str]] | None = None) -> tuple[str, ...]:
    """The pending plans labelled with the target that B8's policy stops
    from firing as planned: those with a blocked argument (:func:`get_blocked_args`)."""
    return tuple(dict.fromkeys(plan for plan, _ in get_blocked_args(runtime, source_id, sinks)))


def get_blocked_args(runtime: AgentRuntime, source_id: str,
                     sinks: Mapping[str, Mapping[str, str]] | None = None) -> tuple[tuple[str, str], ...]:
    """B8's sink policy, by sink class as FIDES applies it (paper, Section
    4.1 "Methods"): a pending plan labelled with the target (its block's
    source ids hold it) may not pass a value into an identifier sink
    (:data:`IDENTIFIER_SINKS`: routing, selection); free-text arguments of
    the same plan pass. Returns the blocked ``(plan block id, argument)``
    pairs. A tool that ``sinks`` does not describe has every argument
    treated as an identifier; with no arguments known, the pair
    ``(plan, "*")`` blocks the whole plan."""
    out: list[tuple[str, str]] = []
    tools = {compute_block_id(s.id, PLAN): s.tool for s in runtime.steps if s.kind == "plan"}
    for plan in runtime.plans:
        if source_id not in runtime.graph[plan].source_ids:
            continue
        classes = (sinks or {}).get(tools.get(plan) or "")
        if classes is None:
            out.append((plan, "*"))
            continue
        out.extend((plan, arg) for arg, cls in classes.items() if cls in IDENTIFIER_SINKS)
    return tuple(out)


def get_plan_arguments(runtime: AgentRuntime, params_by_tool: Mapping[str, tuple[str, ...]]) -> dict[
        str, dict[str, str]]:
    """``{plan block id: {argument: value}}`` of the pending plans: from the
    tool layer's calls where the runtime made them (scaffold-filled
    arguments included), else parsed from the plan text with the tool's
    parameters (:func:`~unsee.impl.agent.tools.parse_arguments`)."""
    calls = {compute_block_id(c.step_id, PLAN): dict(c.args) for c in getattr(runtime, "calls", ())}
    tools = {compute_block_id(s.id, PLAN): s.tool for s in runtime.steps if s.kind == "plan"}
    out = {}
    for plan in runtime.plans:
        if plan in calls:
            out[plan] = calls[plan]
        else:
            params = params_by_tool.get(tools.get(plan) or "", ())
            out[plan] = parse_arguments(tuple(params), runtime.graph[plan].text)[0]
    return out


# --- method names (the CLI's --method) --------------------------------------------------


def get_method_names() -> dict[str, str]:
    """Every accepted spelling of a method -> its slug: the slugs of :data:`METHODS`,
    and the paper's numbers, read from :data:`PAPER_NAMES` (the first word of a
    name: ``B0``..``B9``, ``B5'``, ``B7-oracle``; where two methods share a
    number the first listed keeps it, so ``B7`` is ``replay``), plus ``B5p``
    (``B5'`` without a quote for the shell) and ``B7-decode`` (replay without
    drafts, which the paper also numbers B7)."""
    names = {method: method for method in METHODS}
    for method, paper_name in PAPER_NAMES.items():
        number = paper_name.split()[0]
        if number[:1] == "B" and number[1:2].isdigit():
            names.setdefault(number, method)
    names.setdefault("B5p", "reset-prefix-cache")
    names.setdefault("B7-decode", "replay-decode")
    return names


def get_method(name: str) -> str:
    """The slug of method ``name``: a slug or the paper's number (case-insensitive;
    :func:`get_method_names`). An unknown name is a ValueError listing the valid ones."""
    by_folded = {spelling.casefold(): method for spelling, method in get_method_names().items()}
    method = by_folded.get(name.strip().casefold())
    if method is None:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(get_method_names())} "
                         "(case-insensitive)")
    return method
