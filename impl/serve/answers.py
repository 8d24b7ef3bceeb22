"""The model's answers: ``POST /v1/responses`` (stored in a conversation, or
stateless) and ``POST /v1/chat/completions``, streamed or not.

Each answer is computed by a ``work(listener)`` function run in a worker
thread (:func:`unsee.impl.serve.stream.open_stream` for a stream, a plain
thread otherwise); the listener, where given, reports tokens as they are
decoded. The route code in :mod:`.app` only reads the request and picks the
work.
"""

from __future__ import annotations

import secrets
import time

from unsee import Settings
from unsee.impl.agent.tools.client import Config
from unsee.impl.engines.counts import Counters
from unsee.impl.serve import compaction, shapes, turns
from unsee.impl.serve.bodies import SYSTEM_ROLES
from unsee.impl.serve.chat import check_messages, get_messages
from unsee.impl.serve.conversation import Conversation, get_output_tokens, get_prompt
from unsee.impl.serve.errors import bad_request
from unsee.impl.serve.pool import Pool
from unsee.impl.util.ids import ANSWER, CONTEXT, SYSTEM, compute_block_id


def get_target(pool: Pool, req: dict, owner: str) -> tuple[Conversation | None, str | None]:
    """The conversation a response continues and the response id it names (None, None: a new one)."""
    if req["conversation"]:
        return pool.get(req["conversation"], owner), None
    if req["previous_response_id"]:
        return pool.get_by_response(req["previous_response_id"], owner), req["previous_response_id"]
    return None, None


def get_usage(runtime, step_ids: list[str], kept: int = 0) -> dict:
    """Tokens of a response's turns: the first turn's prompt, every turn's output, and
    ``cached_tokens``: of the prompt, the ``kept`` tokens (:func:`get_kept_tokens`), none where
    the first turn re-rendered the context (new instructions: a new lineage, every token
    prefilled anew)."""
    blocks = [runtime.graph[compute_block_id(s, ANSWER)] for s in step_ids]
    output = sum(get_output_tokens(runtime, s) for s in step_ids)
    prompt = len(get_prompt(runtime, step_ids[0])) if blocks else 0  # with the answer's header, as OpenAI counts
    usage = shapes.usage(prompt, output)
    if blocks and compute_block_id(step_ids[0], SYSTEM) not in runtime.graph:
        usage["input_tokens_details"]["cached_tokens"] = min(kept, prompt)
    return usage


def get_compaction_cost(runtime, step_id: str) -> dict:
    """What a compaction cost and saved: the context it read (tokens, the summary request
    included), the summary's tokens (decoded, with its turn's header), the tool round it kept
    verbatim after the summary (tokens), the context it left."""
    turn = runtime.graph[compute_block_id(step_id, ANSWER)]
    left = runtime.graph[compute_block_id(step_id, CONTEXT)]
    kept = [b for b in runtime.graph.blocks() if b.id.startswith(f"{left.id}/")]  # the round's copies
    return {"step": step_id, "read_tokens": turn.token_span[0], "summary_tokens": len(turn.tokens),
            "kept_tokens": sum(len(b.tokens) for b in kept),
            "context_tokens_after": max([left.token_span[1], *(b.token_span[1] for b in kept)])}


def get_kept_tokens(engine, runtime, before: Counters) -> int:
    """The tokens of a conversation's context whose KV was in memory before this request and is
    reused by its turn: the live lineage's, less what this thread prefilled since ``before``
    (a session rebuilt from its store after an eviction prefilled them all again). Counted on
    this thread's counters (an engine keeps one per thread), so another request's work, even
    one interleaved between forwards, never moves it."""
    if runtime is None:
        return 0
    spent = engine.counters.snapshot() - before
    return max(0, len(engine.tokens(runtime.lineage)) - spent.prefilled_tokens)


def get_status(items: list[dict]) -> str:
    """``incomplete`` where the last answer hit the output cap."""
    return "incomplete" if items and items[-1].get("status") == "incomplete" else "completed"


def respond(pool: Pool, model: str, req: dict, conv: Conversation, previous: str | None, owner: str,
            listener=None) -> dict:
    """One response on ``conv``: its step (and any resumed replay) committed; the Response object."""
    response_id, created = "resp_" + secrets.token_hex(24), time.time()
    before = pool.engine.counters.snapshot()
    with pool.hold(conv) as c:  # rebuilds the session where it was evicted
        if previous is not None and c.record["responses"][-1]["id"] != previous:
            raise bad_request(f"previous_response_id: {previous!r} is not the latest response of its "
                              "conversation; this server continues only the latest (no branches)",
                              param="previous_response_id")
        if listener is not None:
            listener.describe = lambda settings: shapes.response(
                response_id, model, "in_progress", [], conversation_id=c.id, previous_response_id=previous,
                settings=settings, req=req, usage=None, created_at=created)
        t = c.runtime.t if c.runtime is not None else 0
        kept = get_kept_tokens(pool.engine, c.runtime, before)
        items, settings = turns.respond(c, pool.engine, req, pool.defaults, response_id, listener,
                                        pool.open_chat(owner))
        kept += (pool.engine.counters.snapshot() - before).reused_tokens  # a first step's served system block
        steps = [s.id for s in c.runtime.steps[t:]]
        compacted = [get_compaction_cost(c.runtime, s.id) for s in c.runtime.steps[t:] if s.kind == "compact"]
        extra = {"steps": steps, **({"compaction": compacted[0]} if compacted else {})}
        out = shapes.response(response_id, model, get_status(items), items, conversation_id=c.id,
                              previous_response_id=previous, settings=settings, req=req,
                              usage=get_usage(c.runtime, steps, kept), created_at=created,
                              extra=extra if len(steps) > 1 else None)
    pool.note_response(response_id, conv)
    return out


def compact(pool: Pool, conv: Conversation, previous: str) -> dict:
    """``POST /v1/responses/compact``: a ``compact`` step on the conversation of ``previous`` (its
    latest response); the compaction object: its compaction item and the summary's usage."""
    with pool.hold(conv) as c:  # rebuilds the session where it was evicted
        compaction.check_compactable(c, previous)
        item = compaction.compact(c)
        usage = get_usage(c.runtime, [c.runtime.steps[-1].id])
    return {"id": "resp_" + secrets.token_hex(24), "object": "response.compaction", "created_at": int(time.time()),
            "output": [item], "usage": usage}


def respond_new(pool: Pool, model: str, req: dict, owner: str, listener=None) -> dict:
    """A response with no conversation: a new one (a first system or developer item is its
    system prompt, as in a conversation's create), removed again if the response is refused."""
    items = req["items"]
    system = items[:1] if items and items[0]["role"] in SYSTEM_ROLES else []
    conv = pool.create(system, {}, owner)
    try:
        return respond(pool, model, {**req, "items": items[len(system):]}, conv, None, owner, listener)
    except BaseException:
        pool.delete(conv)
        raise


def get_settings(pool: Pool, req: dict) -> Settings:
    """The settings a stateless request's turn runs with (the server's defaults, the request's own over them)."""
    return turns.get_sampling(req, pool.defaults, pool.defaults).get_settings(pool.defaults)


def split_system(pool: Pool, messages: list[dict], instructions: str | None) -> tuple[str, list[dict]]:
    """The system text and the other messages: ``instructions`` where given (every system
    message is then a message, as OpenAI puts the instructions before the input), else a first
    system or developer message, else the server's. Later system messages stay messages,
    each rendered as the template renders a system message after the first."""
    system = pool.system if instructions is None else instructions
    if instructions is None and messages and messages[0]["role"] in SYSTEM_ROLES:
        system, messages = messages[0]["text"], messages[1:]
    last = next((m for m in reversed(messages) if m["role"] not in SYSTEM_ROLES), None)
    if last is None or last["role"] not in ("user", "tool"):
        raise bad_request("input: the last message other than system ones must be the user's (or function "
                          "outputs)", param="input")
    return system, messages


def complete(pool: Pool, req: dict, messages: list[dict], owner: str, listener=None) -> dict:
    """A stateless completion of ``messages`` (the chat route's and a stateless response's)."""
    system, messages = split_system(pool, messages, req.get("instructions"))
    check_messages(messages)
    sampling = turns.get_sampling(req, pool.defaults, pool.defaults)
    config = Config(system, req["tools"], req["choice"], req["function"], req["parallel"], req.get("format"), sampling)
    with pool.hold():  # the engine's lock alone: a completion has no conversation
        out = pool.open_chat(owner).complete(messages, pool.defaults, config, listener,
                                             explicit=req["max_new_tokens"] is not None, logprobs=req["logprobs"])
    return {**out, "settings": sampling.get_settings(pool.defaults)}


def respond_stateless(pool: Pool, model: str, req: dict, owner: str, listener=None) -> dict:
    """A response that stores nothing: computed as a chat completion is."""
    response_id, created = "resp_" + secrets.token_hex(24), time.time()
    if listener is not None:
        listener.describe = lambda _: shapes.response(
            response_id, model, "in_progress", [], conversation_id=None, previous_response_id=None,
            settings=get_settings(pool, req), req=req, usage=None, created_at=created)
    out = complete(pool, req, get_messages(req["items"]), owner, listener)
    usage = shapes.usage(out["prompt_tokens"], out["output_tokens"])
    usage["input_tokens_details"]["cached_tokens"] = out["cached_tokens"]
    return shapes.response(response_id, model, "completed" if out["complete"] or out["finish_reason"] == "tool_calls"
                           else "incomplete", out["items"], conversation_id=None, previous_response_id=None,
                           settings=out["settings"], req=req, usage=usage, created_at=created)


def complete_chat(pool: Pool, model: str, req: dict, owner: str, completion_id: str, listener=None) -> dict:
    """A chat completion: the completion object, its finish reason and usage."""
    out = complete(pool, req, req["messages"], owner, listener)
    text = next((i["content"][0]["text"] for i in out["items"] if i["type"] == "message"), None)
    calls = [shapes.tool_call(i["call_id"], i["name"], i["arguments"]) for i in out["items"]
             if i["type"] == "function_call"]
    usage = {"prompt_tokens": out["prompt_tokens"], "completion_tokens": out["output_tokens"],
             "total_tokens": out["prompt_tokens"] + out["output_tokens"],
             "prompt_tokens_details": {"cached_tokens": out["cached_tokens"]}}
    logprobs = None if out["logprobs"] is None else {"content": out["logprobs"], "refusal": None}
    reasoning = next((i["content"][0]["text"] for i in out["items"] if i["type"] == "reasoning"), None)
    completion = shapes.chat_completion(completion_id, model, shapes.chat_message(text, calls, reasoning),
                                        out["finish_reason"], usage, logprobs)
    return {"completion": completion, "finish_reason": out["finish_reason"], "usage": usage, "logprobs": logprobs}


__all__ = ["compact", "complete", "complete_chat", "get_compaction_cost", "get_kept_tokens", "get_settings", "get_status",
           "get_target", "get_usage",
           "respond", "respond_new", "respond_stateless", "split_system"]
