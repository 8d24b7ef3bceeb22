"""Stateless completions over the engine's exact prefix cache: chat
completions, and responses that store nothing (``store: false``, or a
client's own history with the model's items in it).

Each request runs a throwaway runtime (:class:`ClientToolRuntime`): the
system block (its system text and tools), then every earlier message as one
block (one prefill chunk each; a run of tool results is one block, as a
conversation's tool step is; a system message after the first is the
template's system message), then the last user message, or the last run
of tool results, with the system messages after it, as a step whose answer
is the completion. The prefills run
inside the engine's prefix cache (B5'), whose sources are the lineages of the
owner's last :attr:`ChatCache.size` completions: a block whose chunk history
and tokens equal a cached lineage's is served from that lineage's KV, which
is the KV a prefill computes, bit for bit; nothing else is reused. Each API
key has its own cache (:meth:`~unsee.impl.serve.pool.Pool.open_chat`), so ``cached_tokens`` tells no
key what another sent.

A conversation's first block (its system prompt and tools) is served from
the same cache (:meth:`ChatCache.start`), as llama-server reuses a slot's
prompt: a computed one is kept as a copy of that block alone. The cache
never reads a conversation's lineages past that block, which no item's
forget reaches; a conversation's ``DELETE`` drops the copy it made
(:meth:`ChatCache.release`), so nothing derived from a deleted conversation
stays in memory (a conversation served from another's copy made none).
"""

from __future__ import annotations

import collections
import contextlib

from unsee import Item, Settings, Step
from unsee.impl.agent.provenance import RuntimeBlock
from unsee.impl.agent.tools.client import ClientToolRuntime, Config, get_context_length
from unsee.impl.agent.tools.native import FunctionCall
from unsee.impl.agent.tools.observed import Role
from unsee.impl.engines.book import KVBackend
from unsee.impl.engines.protocol import PrefixCache
from unsee.impl.serve.bodies import SYSTEM_ROLES
from unsee.impl.serve.conversation import get_answer_items, get_output_tokens, get_prompt
from unsee.impl.serve.errors import bad_request
from unsee.impl.serve.turns import add_logprobs
from unsee.impl.util.ids import ANSWER, compute_block_id

STEP = "chat"


def get_messages(items: list[dict]) -> list[dict]:
    """A response's input items as chat messages: function calls join the assistant message
    before them, function outputs are tool messages."""
    out: list[dict] = []
    for item in items:
        if item["kind"] == "function_call":
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "text": "", "calls": (), "call_ids": (), "call_id": None})
            call = {"calls": (*out[-1]["calls"], FunctionCall(item["name"], item["arguments"])),
                    "call_ids": (*out[-1]["call_ids"], item["call_id"])}
            out[-1] = {**out[-1], **call}
        elif item["kind"] == "function_call_output":
            out.append({"role": "tool", "text": item["text"], "calls": (), "call_ids": (), "call_id": item["call_id"]})
        else:
            out.append({"role": item["role"], "text": item["text"], "calls": (), "call_ids": (), "call_id": None})
    return out


def check_messages(messages: list[dict]) -> None:
    """Every tool message answers a call of the assistant message before its run."""
    calls: tuple[str, ...] = ()
    for i, m in enumerate(messages):
        if m["role"] == "tool" and m["call_id"] not in calls:
            raise bad_request(f"messages[{i}].tool_call_id: {m['call_id']!r} names no call of the assistant "
                              "message before it", param=f"messages[{i}].tool_call_id")
        if m["role"] != "tool":
            calls = m["call_ids"]


def split_last(messages: list[dict]) -> tuple[list[dict], Step, dict[str, Role]]:
    """The history, and the completion's step: the last user message or run of tool results,
    then the system messages after it (with their roles: :mod:`~unsee.impl.agent.tools.observed`)."""
    end = len(messages)
    while end and messages[end - 1]["role"] in SYSTEM_ROLES:
        end -= 1
    trailing = [Item(f"system{i}", m["text"]) for i, m in enumerate(messages[end:])]
    roles = {item.source: (m["role"],) for item, m in zip(trailing, messages[end:])}
    if messages[end - 1]["role"] == "user":
        return messages[:end - 1], Step(STEP, "user", (Item("last", messages[end - 1]["text"]), *trailing)), roles
    n = end
    while n and messages[n - 1]["role"] == "tool":
        n -= 1
    results = tuple(Item(f"result{i}", m["text"]) for i, m in enumerate(messages[n:end]))
    return messages[:n], Step(STEP, "tool", results + tuple(trailing), "tool"), roles


def group_history(messages: list[dict]) -> list[list[dict]]:
    """The history's blocks: each message alone, a run of tool results together."""
    groups: list[list[dict]] = []
    for m in messages:
        if m["role"] == "tool" and groups and groups[-1][0]["role"] == "tool":
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def render_group(runtime: ClientToolRuntime, last: RuntimeBlock, group: list[dict]) -> tuple[str, str]:
    """``(type, text)`` of the block of ``group`` (one message, or a run of tool results) after the
    block ``last``, as the runtime renders it."""
    renderer, encode = runtime.renderer, runtime.engine.lm.encode
    first = group[0]
    if first["role"] == "tool":
        body = "".join(renderer.get_call_result("", "", m["text"])[1] for m in group)
        return "tool", renderer.render_after(last, encode, "tool", body)
    if first["role"] == "assistant":
        content = runtime.call_format.render_turn(first["text"], first["calls"]) if first["calls"] else first["text"]
        # an instruction: the assistant text already carries its closing
        return "instruction", renderer.render_after(last, encode, "assistant", content)
    if first["role"] in SYSTEM_ROLES:  # a system message after the first: the template's (else a user turn)
        return "user", renderer.render_after(last, encode, "system", first["text"])
    return "user", renderer.render_after(last, encode, "user", first["text"])


def render_history(runtime: ClientToolRuntime, groups: list[list[dict]]) -> list[RuntimeBlock]:
    """The blocks of ``groups`` after the runtime's system block, rendered in turn (a block's
    opening reads the one before it), not yet prefilled."""
    blocks = [runtime.graph[runtime.context[0]]]
    for i, group in enumerate(groups):
        type_, text = render_group(runtime, blocks[-1], group)
        blocks.append(RuntimeBlock(f"m{i}", type_, text, tuple(runtime.engine.lm.encode(text))))
    return blocks[1:]


class ChatCache:
    """The lineages of one owner's recent completions (unpinned: the KV budget may evict them)."""

    def __init__(self, engine, size: int = 8):
        self.engine = engine
        self.size = size
        self.handles: collections.deque[str] = collections.deque()
        #: conversation id -> the kept copy of its system block it made
        self.openings: dict[str, str] = {}

    def get_sources(self) -> list[str]:
        return [h for h in self.handles if h in self.engine.budget.lineages]

    def keep(self, handle: str) -> None:
        self.handles.append(handle)
        while len(self.handles) > self.size:
            self.discard(self.handles.popleft())

    def discard(self, handle: str) -> None:
        """Drop ``handle`` (kept or not), and forget which conversation made it."""
        if handle in self.handles:
            self.handles.remove(handle)
        self.openings = {c: h for c, h in self.openings.items() if h != handle}
        if handle in self.engine.budget.lineages:
            self.engine.drop(handle)

    def start(self, conv_id: str, system: str, settings: Settings, config: Config) -> ClientToolRuntime:
        """Conversation ``conv_id``'s ``R_0``: its system block served from a kept lineage that opens
        with the same chunk (the KV its prefill computes, bit for bit), else computed, and a copy
        of that block alone kept for the owner's next conversation (:meth:`release` drops it
        with the conversation)."""
        engine = self.engine
        if not isinstance(engine, PrefixCache) or not isinstance(getattr(engine, "kv", None), KVBackend):
            # only an engine that computes its own KV serves a chunk from a kept lineage (vLLM's
            # cache is its own, salted per lineage): a copy would be kept for nothing
            return ClientToolRuntime.start(engine, system, settings, config=config)
        before = engine.counters.snapshot()
        with engine.prefix_cache(self.get_sources()):
            runtime = ClientToolRuntime.start(engine, system, settings, config=config)
        if not (engine.counters.snapshot() - before).reused_tokens:
            self.openings[conv_id] = engine.fork(runtime.lineage)
            self.keep(self.openings[conv_id])
        return runtime

    def release(self, conv_id: str) -> None:
        """Conversation ``conv_id`` deleted: drop the copy of its system block it kept, if the cache
        still holds it (a conversation served from another's copy made none: that copy is the
        other conversation's)."""
        handle = self.openings.pop(conv_id, None)
        if handle is not None:
            self.discard(handle)

    def complete(self, messages: list[dict], settings: Settings, config: Config, listener=None,
                 explicit: bool = True, logprobs: int | None = None) -> dict:
        """The answer to ``messages`` (the system message, if any, already in ``config``) under
        ``config`` (its decoding settings over the session's ``settings``): its items (with the
        tokens' log-probabilities where ``logprobs`` asks), finish reason and usage. ``explicit``:
        the request named its output cap (it must fit the context). The caller holds the engine lock."""
        _, step, roles = split_last(messages)
        before = self.engine.counters.snapshot()
        # an engine without a prefix cache recomputes the prefix: the same tokens, more work
        cache = (self.engine.prefix_cache(self.get_sources()) if isinstance(self.engine, PrefixCache)
                 else contextlib.nullcontext())
        with cache:
            runtime = ClientToolRuntime.start(self.engine, config.system, settings, config=config)
            try:
                self.observe_history(runtime, messages, config, explicit)
                if listener is not None:
                    listener.start()  # every check passed: the stream may open
                    listener.stops = config.sampling.stop
                runtime.client.expect(config, roles=roles)
                if listener is not None:
                    listener.prepare(runtime.get_opening(config), runtime.get_openings(config))
                runtime.listener, runtime.logprobs = listener, logprobs
                runtime.step(step)
            except BaseException:
                self.engine.drop(runtime.lineage)
                raise
        spent = self.engine.counters.snapshot() - before
        block = runtime.graph[compute_block_id(STEP, ANSWER)]
        prompt = len(get_prompt(runtime, STEP))  # with the answer's header, as OpenAI counts
        self.keep(runtime.lineage)
        items = get_answer_items(runtime, STEP)
        if logprobs is not None:
            items = add_logprobs(self.engine.lm, items, runtime.decisions)
        if listener is not None:
            listener.answer(items)
        output_tokens = get_output_tokens(runtime, STEP)
        finished = runtime.is_finished(STEP)  # an end of turn, or a stop text
        calls = [i for i in items if i["type"] == "function_call"]
        message = next((i for i in items if i["type"] == "message"), None)
        return {"items": items, "finish_reason": "tool_calls" if calls else "stop" if finished else "length",
                "logprobs": message["content"][0]["logprobs"] if message and logprobs is not None else None,
                "complete": finished, "prompt_tokens": prompt, "output_tokens": output_tokens,
                # the prompt's tokens served from the cache (the runtime's canonical
                # re-prefill of a generated turn may be served too: not a prompt token)
                "cached_tokens": min(spent.reused_tokens, block.token_span[0])}

    def observe_history(self, runtime: ClientToolRuntime, messages: list[dict], config: Config,
                        explicit: bool = True) -> None:
        """Prefill the history's blocks, refusing first (400 ``context_length_exceeded``) where the
        prompt leaves no room for output, or for all of the output cap where the request named it
        (``explicit``; a default cap is cut to what the context has left)."""
        history, step, roles = split_last(messages)
        blocks = render_history(runtime, group_history(history))
        # the step's block opens as after any block but a model turn: the history has none
        observed = runtime.get_observation(step, roles)
        header = runtime.renderer.render_header(runtime.get_opening(config))
        encode = self.engine.lm.encode
        prompt = (len(runtime.graph[runtime.context[0]].tokens) + sum(len(b.tokens) for b in blocks)
                  + len(encode(observed)) + len(encode(header)))
        limit = get_context_length(self.engine.lm)
        cap = config.sampling.get_settings(runtime.settings).max_new_tokens
        if limit is not None and (prompt >= limit or (explicit and prompt + cap > limit)):
            raise bad_request(f"messages: the prompt is {prompt} tokens" + (f" and the output cap {cap}" if explicit
                                                                            else "")
                              + f"; the model's context holds {limit}", param="messages",
                              code="context_length_exceeded")
        for block in blocks:
            runtime.append_block(block.id, block.type, block.text, parents=(), sources=frozenset())
