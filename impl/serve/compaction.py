"""Compaction in the server (docs/serve.md, "Long conversations"): a Responses request's
``context_management: [{"type": "compaction", "compact_threshold": N}]`` or ``truncation:
"auto"``. Where a conversation's next turn would pass the threshold (or, with ``truncation:
"auto"``, the model's context), the conversation's runtime first runs a ``compact`` step: the
model writes a summary of the context, and the context is rewritten as the system block, the
summary and the latest tool round verbatim (the call, its output, the answer:
:func:`~unsee.impl.agent.provenance.get_kept_round`), on a new cache lineage
(:meth:`~unsee.impl.agent.runtime.AgentRuntime.step`). The summary records, as provenance, every
source it read, and the kept blocks the sources of the blocks they copy, so a DELETE of one of
them replays from before it (Algorithm 1), the summary rewritten without the item and the round
kept as the replay finds it.

The compact step is a step of the conversation's log like any other: a forget's replay runs it
where it ran (it does not decide again whether to compact), so the twin a forget equals is the
conversation that never had the item and compacted at the same turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unsee import Settings, Step
from unsee.impl.agent.tools.client import ClientToolRuntime, get_context_length, get_step_id
from unsee.impl.serve.conversation import Conversation, get_compaction_item
from unsee.impl.serve.errors import bad_request
from unsee.impl.serve.fields import COMPACT_FIELDS, check_fields

TRUNCATIONS = ("disabled", "auto")


def read_context_management(body: Mapping[str, Any]) -> dict:
    """A request's ``context_management`` and ``truncation``: the compaction threshold (None:
    none asked) and the truncation, the body as the request echoes it."""
    raw = body.get("context_management")
    threshold = None
    if raw is not None:
        if not isinstance(raw, list) or len(raw) > 1:
            raise bad_request("context_management: must be a list of at most one entry, "
                              "[{\"type\": \"compaction\", \"compact_threshold\": N}]", param="context_management")
        for entry in raw:
            if not isinstance(entry, Mapping) or entry.get("type") != "compaction" or set(entry) - {
                    "type", "compact_threshold"}:
                raise bad_request(f"context_management[0]: {entry!r} is not served; only "
                                  "{\"type\": \"compaction\", \"compact_threshold\": N}", param="context_management")
            threshold = entry.get("compact_threshold")
            if threshold is not None and (not isinstance(threshold, int) or isinstance(threshold, bool)
                                          or threshold < 1):
                raise bad_request(f"context_management[0].compact_threshold: must be a positive integer, got "
                                  f"{threshold!r}", param="context_management")
    truncation = body.get("truncation") or "disabled"
    if truncation not in TRUNCATIONS:
        raise bad_request(f"truncation: must be one of {TRUNCATIONS}, got {truncation!r}", param="truncation")
    return {"compact_threshold": threshold, "truncation": truncation, "context_management": raw}


def read_compact_request(body: Any) -> str:
    """A ``POST /v1/responses/compact`` body: the response id whose conversation it compacts."""
    body = check_fields(body, COMPACT_FIELDS, "responses/compact")
    previous = body.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        raise bad_request("previous_response_id: the response whose conversation to compact is required "
                          "(a client's own input is not compacted here)", param="previous_response_id")
    return previous


def check_compactable(conv: Conversation, previous: str) -> None:
    """A conversation a compact request may compact now: ``previous`` its latest response, a turn
    to summarise, no call waiting for its output and no held replay (a summary goes between
    turns), and not just compacted."""
    runtime = conv.runtime
    if conv.record["responses"][-1]["id"] != previous:
        raise bad_request(f"previous_response_id: {previous!r} is not the latest response of its conversation",
                          param="previous_response_id")
    if not isinstance(runtime, ClientToolRuntime):
        raise bad_request("this conversation was stored before the server compacted; start a new one",
                          param="previous_response_id")
    if runtime.steps[-1].kind == "compact":
        raise bad_request(f"conversation {conv.id} was just compacted; nothing new to summarise",
                          param="previous_response_id")
    if conv.get_pending_calls() or conv.record["held"] or conv.record["held_outputs"]:
        raise bad_request(f"conversation {conv.id} waits for function_call_output items; send them first",
                          param="previous_response_id", code="pending_tool_calls")


def get_limit(engine, req: dict, settings: Settings) -> int | None:
    """The prompt length past which a turn compacts first: the request's threshold, and with
    ``truncation: "auto"`` what the context holds before the turn's output (all of the cap the
    request named, else one token); None where the request asked for neither."""
    limits = [req["compact_threshold"]] if req.get("compact_threshold") is not None else []
    context = get_context_length(engine.lm)
    if req.get("truncation") == "auto" and context is not None:
        limits.append(context - (settings.max_new_tokens if req["max_new_tokens"] is not None else 1))
    return min(limits) if limits else None


def is_compaction_due(conv: Conversation, step: Step, config, roles, limit: int | None) -> bool:
    """Whether ``step``'s turn compacts first: the conversation has a context to summarise, the
    step is a user step (a tool step answers the calls of the turn before it, which it must follow),
    the last step was not itself a compaction (one summary per turn), and the turn's prompt would
    pass ``limit``."""
    runtime = conv.runtime
    if limit is None or not isinstance(runtime, ClientToolRuntime) or step.kind != "user" or not runtime.t:
        return False
    if runtime.steps[-1].kind == "compact":
        return False
    return runtime.get_turn_length(step, config, roles) > limit


def compact(conv: Conversation) -> dict:
    """Run a ``compact`` step on the conversation's runtime (committed to its store); its
    compaction item."""
    step = Step(get_step_id(conv.runtime.t), "compact")
    conv.session.step(step)
    return get_compaction_item(conv.runtime, step.id)


__all__ = ["TRUNCATIONS", "check_compactable", "compact", "get_limit", "is_compaction_due", "read_compact_request",
           "read_context_management"]
