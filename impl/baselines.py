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
B7    replay                 Provenance-Guided Selective Replay (Algorithm 1),
                             model turns replayed as verified drafts (impl/drafts.py)
B7    replay-decode          the same, every model turn re-decoded (no drafts)
B7o   replay-oracle          the paper's variant: turns labelled independent of z
                             re-prefilled unverified (attribution oracle; not
                             exact when a label is wrong)
B8    ifc                    FIDES-style sink policy on plans, no cleanup
B9    ifc-replay             B7 then the same sink policy
====  =====================  ===================================================
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import attrs

from .text import get_variants, normalize
from .provenance import DERIVED_TYPES, RuntimeBlock
from .runtime import AgentRuntime, ForgetReport, render

METHODS = ("none", "memory-delete", "forget-instruction", "source-redaction", "sanitize-no-replay", "reset",
           "reset-prefix-cache", "sanitized-rebuild", "replay", "replay-decode", "replay-oracle", "ifc", "ifc-replay")
PAPER_NAMES = {"none": "B0 No-Forget", "memory-delete": "B1 Memory-Delete",
               "forget-instruction": "B2 Forget-Instruction", "source-redaction": "B3 Source-Redaction",
               "sanitize-no-replay": "B4 Sanitize-no-Replay", "reset": "B5 Full-Reset",
               "reset-prefix-cache": "B5' +PrefixCache", "sanitized-rebuild": "B6 Sanitized-Rebuild",
               "replay": "B7 Selective-Replay", "replay-decode": "B7 Selective-Replay (no drafts)",
               "replay-oracle": "B7-oracle (attribution oracle)", "ifc": "B8 FIDES-style IFC",
               "ifc-replay": "B9 IFC + Replay"}


@attrs.frozen
class MethodResult:
    method: str
    invocations: int  # transitions of F re-run
    prefilled_tokens: int
    decoded_tokens: int
    wall_s: float
    digest: str
    blocked_plans: tuple[str, ...] = ()  # B8/B9: plans the sink policy refuses
    report: ForgetReport | None = None
    draft_accepted_tokens: int = 0  # B7: draft tokens verified instead of decoded
    draft_rejected_tokens: int = 0
    reused_tokens: int = 0  # B5': prefill tokens the prefix cache served (not in prefilled_tokens)

    @property
    def recomputed_tokens(self) -> int:
        return self.prefilled_tokens + self.decoded_tokens

    def to_json(self) -> dict:
        out = attrs.asdict(self, recurse=False)
        out["paper_name"] = PAPER_NAMES[self.method]
        out["recomputed_tokens"] = self.recomputed_tokens
        out["report"] = self.report.to_json() if self.report else None
        return out


def apply_method(base: AgentRuntime, method: str, source_id: str, value: str | None = None) -> tuple[
        AgentRuntime, MethodResult]:
    """Run one method on a fork of ``base``; ``base`` is left unchanged."""
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
        with runtime.engine.prefix_cache(runtime.checkpoints.lineages() | {runtime.lineage}):
            report = runtime.full_reset(source_id)
        invocations = report.invocations
    else:
        _EDITS[method](runtime, source_id, value)
        invocations = runtime.transitions - transitions_before
    if method in ("ifc", "ifc-replay"):
        blocked = get_blocked_plans(runtime, source_id)
    spent = runtime.engine.counters.snapshot() - before
    result = MethodResult(method, invocations, spent.prefilled_tokens, spent.decoded_tokens,
                          time.perf_counter() - started, runtime.digest(), blocked, report,
                          spent.draft_accepted_tokens, spent.draft_rejected_tokens, spent.reused_tokens)
    return runtime, result


# --- the edit-style baselines --------------------------------------------------

def delete_memory_records(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B1: what deployed stacks do: delete the stored records, touch nothing else."""
    runtime.memory = [b for b in runtime.memory if source_id not in runtime.graph[b].source_ids]


def append_forget_instruction(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B2: tell the model to forget (the value stays resident)."""
    runtime._prefill_block(f"forget:{source_id}", "instruction",
                           render("system", f"Forget this and never use or reveal it: {value}"),
                           parents=tuple(runtime.context), sources=runtime._resident_sources())


def redact_source(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B3: drop the source block(s); derived artifacts stay."""
    sources = {b.id for b in runtime.graph.locate_source(source_id)}
    _rebuild(runtime, keep=lambda b: b.id not in sources)


def drop_closure(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B4: drop the source and its descendants; regenerate nothing (over-deletes)."""
    closure = set(runtime.graph.taint_closure(source_id))
    # the system prompt re-prefilled by a compaction inherits nothing; keep system blocks
    _rebuild(runtime, keep=lambda b: b.id not in closure or b.type == "system")


def redact_strings(runtime: AgentRuntime, source_id: str, value: str | None) -> None:
    """B6: string-redact the target's variants in every block, then rebuild."""
    pattern = re.compile("|".join(re.escape(v) for v in get_variants(value)), re.IGNORECASE)

    def redact(block: RuntimeBlock) -> RuntimeBlock:
        text = pattern.sub("[REDACTED]", block.text)
        if normalize(text) != normalize(block.text) or block.text != text:
            return attrs.evolve(block, id=f"{block.id}~redacted", text=text, parents=())
        return block

    _rebuild(runtime, keep=lambda b: True, transform=redact)


_EDITS: dict[str, Callable[[AgentRuntime, str, str | None], None]] = {
    "none": lambda runtime, source_id, value: None,
    "memory-delete": delete_memory_records,
    "forget-instruction": append_forget_instruction,
    "source-redaction": redact_source,
    "sanitize-no-replay": drop_closure,
    "sanitized-rebuild": redact_strings,
    "ifc": lambda runtime, source_id, value: None,
}


def _rebuild(runtime: AgentRuntime, keep: Callable[[RuntimeBlock], bool],
             transform: Callable[[RuntimeBlock], RuntimeBlock] = lambda b: b) -> None:
    """Re-prefill the kept context blocks into a new lineage, one chunk each.

    Model turns are re-prefilled from their text (their recorded tokens
    include the decoded ids); stored records and plans are filtered too."""
    blocks = [transform(runtime.graph[b]) for b in runtime.context if keep(runtime.graph[b])]
    runtime.memory = [m.id for m in (transform(runtime.graph[b]) for b in runtime.memory if keep(runtime.graph[b]))
                      if _ensure(runtime, m)]
    runtime.plans = [p.id for p in (transform(runtime.graph[b]) for b in runtime.plans if keep(runtime.graph[b]))
                     if _ensure(runtime, p)]
    runtime.lineage = runtime.engine.new_lineage()
    runtime.context = []
    for block in blocks:
        runtime.engine.use(runtime.lineage)
        start = runtime.engine.length()
        tokens = _get_tokens(runtime, block)
        runtime.engine.prefill(list(tokens))
        rebuilt = attrs.evolve(block, tokens=tuple(tokens), token_span=(start, start + len(tokens)))
        if rebuilt.id in runtime.graph:
            runtime.graph.replace(rebuilt)
        else:
            runtime.graph.add(rebuilt)
        runtime.context.append(rebuilt.id)


def _get_tokens(runtime: AgentRuntime, block: RuntimeBlock) -> tuple[int, ...]:
    """Recorded tokens for an unchanged block; an edited block is re-encoded
    (a model turn keeps its assistant framing)."""
    if block.id in runtime.graph and runtime.graph[block.id] is block and block.tokens:
        return block.tokens
    text = render("assistant", block.text) if block.type in DERIVED_TYPES else block.text
    return tuple(runtime.engine.lm.encode(text))


def _ensure(runtime: AgentRuntime, block: RuntimeBlock) -> bool:
    if block.id not in runtime.graph:
        runtime.graph.add(block)
    return True


# --- IFC -----------------------------------------------------------------------

def get_blocked_plans(runtime: AgentRuntime, source_id: str) -> tuple[str, ...]:
    """B8's sink policy: a pending plan labelled with the target may not fire."""
    return tuple(p for p in runtime.plans if source_id in runtime.graph[p].source_ids)
