"""Stateless chat completions over the engine's exact prefix cache.

Each request runs a throwaway runtime: the system prompt, then every earlier
message as one block (one prefill chunk each), then the last user message as
a step whose answer is the completion. The prefills run inside the engine's
prefix cache (B5'), whose sources are the lineages of the last
:attr:`ChatCache.size` chat completions: a block whose chunk history and
tokens equal a cached lineage's is served from that lineage's KV, which is
the KV a prefill computes, bit for bit; nothing else is reused. The cache
never reads a conversation's lineages, so a conversation's forget has
nothing to chase here.
"""

from __future__ import annotations

import collections
import contextlib

from unsee import AgentRuntime, Item, Settings, Step
from unsee.impl.engines.protocol import PrefixCache
from unsee.impl.util.ids import ANSWER, compute_block_id


class ChatCache:
    """The lineages of recent chat completions (unpinned: the KV budget may evict them)."""

    def __init__(self, engine, size: int = 8):
        self.engine = engine
        self.size = size
        self.handles: collections.deque[str] = collections.deque()

    def get_sources(self) -> list[str]:
        return [h for h in self.handles if h in self.engine.budget.lineages]

    def keep(self, handle: str) -> None:
        self.handles.append(handle)
        while len(self.handles) > self.size:
            old = self.handles.popleft()
            if old in self.engine.budget.lineages:
                self.engine.drop(old)

    def complete(self, messages: list[tuple[str, str]], settings: Settings, system: str) -> dict:
        """The answer to ``messages`` (the caller holds the engine lock)."""
        if messages[0][0] in ("system", "developer"):
            system, messages = messages[0][1], messages[1:]
        before = self.engine.counters.snapshot()
        # an engine without a prefix cache recomputes the prefix: the same tokens, more work
        cache = (self.engine.prefix_cache(self.get_sources()) if isinstance(self.engine, PrefixCache)
                 else contextlib.nullcontext())
        with cache:
            runtime = AgentRuntime.start(self.engine, system=system, settings=settings)
            for i, (role, text) in enumerate(messages[:-1]):
                rendered = (runtime.renderer.render_message("assistant", text) if role == "assistant"
                            else runtime.render_block("user", text))
                # typed as an instruction: the assistant text already carries its closing
                runtime.append_block(f"m{i}", "user" if role == "user" else "instruction", rendered,
                                     parents=(), sources=frozenset())
            runtime.step(Step("chat", "user", (Item("last", messages[-1][1]),)))
        spent = self.engine.counters.snapshot() - before
        block = runtime.graph[compute_block_id("chat", ANSWER)]
        finished = bool(block.tokens) and block.tokens[-1] in set(self.engine.lm.eos_ids)
        self.keep(runtime.lineage)
        output_tokens = len(self.engine.lm.encode(block.text))
        return {"text": block.text, "finish_reason": "stop" if finished else "length",
                "usage": {"prompt_tokens": block.token_span[0], "completion_tokens": output_tokens,
                          "total_tokens": block.token_span[0] + output_tokens,
                          # the prompt's tokens served from the cache (the runtime's canonical
                          # re-prefill of a generated turn may be served too: not a prompt token)
                          "prompt_tokens_details": {"cached_tokens": min(spent.reused_tokens, block.token_span[0])}}}
