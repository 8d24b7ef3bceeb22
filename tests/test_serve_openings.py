"""A conversation's first block (its system prompt and tools) served from its
owner's cache, as llama-server reuses a slot's prompt (issue 50): the served
conversation equals one that computed the block (digest, answers), another key
is never served, a conversation's DELETE drops the copy, and ``input_tokens``
counts the answer's header as OpenAI counts a prompt."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from unsee import Settings
from unsee.impl.agent.runtime import SYSTEM_ID
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.app import get_owner_of
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread, read_api_keys

SETTINGS = Settings(max_new_tokens=6)
KEYS = ("sk-alpha-0123", "sk-beta-4567")
SYSTEM = "You are a terse assistant for the store room. " * 4


def message(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def first_turn(c, text: str = "Where is item 7?"):
    """A new conversation with :data:`SYSTEM` and its first response."""
    conv = c.conversations.create(items=[{"type": "message", "role": "system", "content": SYSTEM}])
    return conv.id, c.responses.create(model="tiny", conversation=conv.id, input=[message(text)])


@pytest.fixture
def served(lm, tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("\n".join(KEYS) + "\n")
    pool = Pool(make_engine(lm), tmp_path / "store", defaults=SETTINGS)
    with ServerThread(pool, "tiny", api_keys=read_api_keys(key_file)) as srv:
        yield pool, [openai.OpenAI(base_url=srv.url, api_key=k, max_retries=0) for k in KEYS]


def get_system_tokens(pool: Pool, conv_id: str, owner: str) -> int:
    return len(pool.get(conv_id, owner).runtime.graph[SYSTEM_ID].tokens)


def test_a_second_conversation_is_served_its_system_block_and_equals_one_that_computed_it(served):
    pool, (alpha, beta) = served
    owner = get_owner_of(KEYS[0])
    a, first = first_turn(alpha)
    b, second = first_turn(alpha)
    n_system = get_system_tokens(pool, b, owner)
    assert n_system > 40
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens == n_system
    assert second.output_text == first.output_text and second.usage.input_tokens == first.usage.input_tokens
    state = [alpha.conversations.retrieve(c).model_extra["unsee"]["digest"] for c in (a, b)]
    assert state[0] == state[1]  # the served block's KV is the one its prefill computes, bit for bit
    nxt = [alpha.responses.create(model="tiny", conversation=c, input=[message("And item 9?")]).output_text
           for c in (a, b)]
    assert nxt[0] == nxt[1]
    # another key's first conversation computes the block: a prompt alpha sent is not beta's cache
    _, other = first_turn(beta)
    assert other.usage.input_tokens_details.cached_tokens == 0 and other.output_text == first.output_text


def test_a_conversations_delete_drops_the_copy_of_its_system_block(served):
    pool, (alpha, _) = served
    owner = get_owner_of(KEYS[0])
    a, _ = first_turn(alpha)
    kept = list(pool.open_chat(owner).handles)
    assert len(kept) == 1 and len(pool.engine.tokens(kept[0])) == get_system_tokens(pool, a, owner)
    alpha.conversations.delete(a)
    assert kept[0] not in pool.engine.budget.lineages and not pool.open_chat(owner).handles
    c, again = first_turn(alpha)  # computed anew: nothing of the deleted conversation was left to serve it
    assert again.usage.input_tokens_details.cached_tokens == 0
    # a conversation served from another's copy made none: its DELETE leaves that copy, the maker's drops it
    d, served_d = first_turn(alpha)
    assert served_d.usage.input_tokens_details.cached_tokens > 0
    alpha.conversations.delete(d)
    assert len(pool.open_chat(owner).handles) == 1
    alpha.conversations.delete(c)
    assert not pool.open_chat(owner).handles


def test_input_tokens_count_everything_the_answer_was_decoded_after(served):
    pool, (alpha, _) = served
    conv, reply = first_turn(alpha)
    assert reply.status == "incomplete"  # the output cap: the answer holds no end token
    lineage = pool.get(conv, get_owner_of(KEYS[0])).runtime.lineage
    assert reply.usage.input_tokens + reply.usage.output_tokens == len(pool.engine.tokens(lineage))
    chat = alpha.chat.completions.create(model="tiny", messages=[{"role": "system", "content": SYSTEM},
                                                                {"role": "user", "content": "Where is item 7?"}])
    assert chat.usage.prompt_tokens == reply.usage.input_tokens
