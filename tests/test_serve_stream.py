"""``unsee serve`` on the tiny model (issue 38): tokens streamed as they are
decoded, a client that leaves mid-stream (the turn is committed whole),
instructions that change mid-conversation (the context re-rendered, and a
forget across the change equals a twin and verifies), API keys that each own
their conversations and chat prefix cache, and context_length_exceeded
before any write."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from unsee import Settings, verify_store
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.app import get_owner_of
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread

SETTINGS = Settings(max_new_tokens=16)
KEYS = ("sk-alpha-0123", "sk-beta-4567")


@pytest.fixture(scope="module")
def server(lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-stream")
    with ServerThread(Pool(make_engine(lm), root, defaults=SETTINGS), "tiny") as srv:
        srv.root = root
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def state(client, conv_id: str) -> dict:
    return client.conversations.retrieve(conv_id).model_extra["unsee"]


def listing(client, conv_id: str) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in client.conversations.items.list(conv_id, order="asc",
                                                                                     limit=100).data]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_streamed_turn_sends_its_tokens_as_they_are_decoded(client, server):
    conv = client.conversations.create()
    events = list(client.responses.create(model="tiny", conversation=conv.id, input=[user("s1", "Tell me more.")],
                                          stream=True))
    final = events[-1].response
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    # more than one delta: the text went out in pieces as it was decoded, not as one block at the end
    assert len(deltas) > 1 and "".join(d.delta for d in deltas) == final.output_text
    message = final.output[0]
    assert {d.item_id for d in deltas} == {message.id}  # the id streamed first is the stored item's
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert listing(client, conv.id)[-1]["id"] == message.id
    # the same turn, not streamed, in a twin: the same answer and digest
    twin = client.conversations.create()
    plain = client.responses.create(model="tiny", conversation=twin.id, input=[user("s1", "Tell me more.")])
    assert plain.output_text == final.output_text and state(client, twin.id)["digest"] == state(client, conv.id)[
        "digest"]


def test_chat_completions_stream_tokens_and_the_usage_chunk(client):
    messages = [{"role": "user", "content": "Count to ten."}]
    whole = client.chat.completions.create(model="tiny", messages=messages)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens and not chunks[-1].choices


def test_a_client_that_leaves_mid_stream_leaves_the_turn_committed_whole(client, server):
    conv = client.conversations.create()
    body = {"model": "tiny", "conversation": conv.id, "input": [user("d1", "A long story, please.")], "stream": True,
            "max_output_tokens": 600}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/responses", json=body) as reply:
        for line in reply.iter_lines():
            if '"response.output_text.delta"' in line:
                break  # the first token arrived: the client goes away
    assert server.pool.get(conv.id).lock.locked()  # the turn was still being decoded when it left
    after = state(client, conv.id)  # waits for the conversation: the worker finished the turn
    assert after["steps"] == 1
    twin = client.conversations.create()
    answer = client.responses.create(model="tiny", conversation=twin.id, input=[user("d1", "A long story, please.")],
                                     max_output_tokens=600)
    assert after["digest"] == state(client, twin.id)["digest"]
    assert listing(client, conv.id)[-1]["content"][0]["text"] == answer.output_text


def test_instructions_that_change_re_render_the_context_and_a_forget_replays_them(client, server):
    def run(conv_id: str, turns) -> None:
        for instructions, items in turns:
            client.responses.create(model="tiny", conversation=conv_id, input=items, instructions=instructions)

    secret = "I was born in Qaanaaq."
    turns = [("Be brief.", [user("i1", secret)]), ("Answer in French.", [user("i2", "Where was I born?")]),
             (None, [user("i3", "Thanks.")])]  # none: the conversation's own system prompt again
    conv = client.conversations.create(items=[{"role": "system", "content": "You are a helper."}])
    run(conv.id, turns)
    runtime = server.pool.get(conv.id).session.runtime
    assert [b for b in runtime.context if b.endswith("/system")] == ["turn_3/system"]  # re-rendered at turns 2, 3
    gone = client.conversations.items.delete("i1", conversation_id=conv.id).model_extra
    assert gone["status"] == "completed" and gone["report"]["tau"] == 1
    twin = client.conversations.create(items=[{"role": "system", "content": "You are a helper."}])
    run(twin.id, [("Be brief.", []), *turns[1:]])
    assert state(client, conv.id)["digest"] == state(client, twin.id)["digest"]
    assert listing(client, conv.id) == listing(client, twin.id)
    store = server.pool.get(conv.id).store_path
    assert verify_store(store, gone["receipt"], value="Qaanaaq").outcome == "verified"


def test_each_key_sees_only_its_own_conversations_and_chat_cache(lm, tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("\n".join(KEYS) + "\n")
    from unsee.impl.serve.server import read_api_keys

    pool = Pool(make_engine(lm), tmp_path / "store", defaults=SETTINGS)
    with ServerThread(pool, "tiny", api_keys=read_api_keys(key_file)) as srv:
        alpha, beta = (openai.OpenAI(base_url=srv.url, api_key=k, max_retries=0) for k in KEYS)
        conv = alpha.conversations.create(items=[user("k1", "mine")])
        first = alpha.responses.create(model="tiny", conversation=conv.id)
        for call in (lambda: beta.conversations.retrieve(conv.id), lambda: beta.conversations.items.list(conv.id),
                     lambda: beta.conversations.items.delete("k1", conversation_id=conv.id),
                     lambda: beta.responses.create(model="tiny", conversation=conv.id, input="hi"),
                     lambda: beta.responses.create(model="tiny", previous_response_id=first.id, input="hi"),
                     lambda: beta.conversations.delete(conv.id)):
            with pytest.raises(openai.NotFoundError):  # as if it did not exist: ids leak nothing
                call()
        assert pool.get(conv.id, get_owner_of(KEYS[0])).record["owner"] == get_owner_of(KEYS[0])
        assert KEYS[0] not in (tmp_path / "store" / conv.id / "conversation.json").read_text()
        messages = [{"role": "system", "content": "A long shared prefix " * 8}, {"role": "user", "content": "Hi."}]
        alpha.chat.completions.create(model="tiny", messages=messages)
        again = alpha.chat.completions.create(model="tiny", messages=messages)
        other = beta.chat.completions.create(model="tiny", messages=messages)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        assert other.usage.prompt_tokens_details.cached_tokens == 0  # a prefix alpha sent is not beta's cache
        assert other.choices[0].message.content == again.choices[0].message.content


def test_a_turn_past_the_context_is_400_context_length_exceeded_and_writes_nothing(client, server):
    conv = client.conversations.create()
    client.responses.create(model="tiny", conversation=conv.id, input=[user("c1", "hello")])
    before = snapshot(server.root)
    too_long = "word " * 1000  # the tiny model's context is 4096 byte tokens
    for call in (lambda: client.responses.create(model="tiny", conversation=conv.id, input=too_long),
                 lambda: client.responses.create(model="tiny", input=too_long),
                 lambda: client.responses.create(model="tiny", input=too_long, store=False),
                 lambda: client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": too_long}])):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert refused.value.body["code"] == "context_length_exceeded", refused.value.body
    assert snapshot(server.root) == before
    assert state(client, conv.id)["steps"] == 1


def test_a_stateless_response_stores_nothing(client, server):
    before = snapshot(server.root)
    history = [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi."},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again?"}]
    kept = client.responses.create(model="tiny", input=history)  # the model's own item: nothing stored
    unstored = client.responses.create(model="tiny", input="Hi.", store=False)
    assert kept.conversation is None and not kept.store and unstored.conversation is None
    assert snapshot(server.root) == before
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", previous_response_id=kept.id, input="more")
    chat = client.chat.completions.create(model="tiny", messages=[{"role": m["role"], "content": m["content"]}
                                                                   for m in history])
    assert kept.output_text == chat.choices[0].message.content  # computed as the chat completion is
    assert json.loads(kept.model_dump_json())["usage"]["input_tokens"] == chat.usage.prompt_tokens
