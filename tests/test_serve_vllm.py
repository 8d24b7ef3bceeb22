"""``unsee serve --engine vllm`` on vLLM's tiny model (issue 50, item 6; in ``make test-vllm``):
vLLM schedules its own batches, so the engine's loop hands it whole requests from its one thread
(the requests' threads let go of the session meanwhile). Conversations at once, each equal to the
same conversation run alone, every vLLM request sent by the loop; a DELETE
equal to a twin that never had the item; a prompt past the context answered 400, not 500."""

from __future__ import annotations

import threading

import pytest

from unsee import Settings
from unsee.impl.engines.vllm import adapter

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.skipif(not adapter.available(), reason="vLLM is not installed (make vllm)")


@pytest.fixture(scope="module")
def server(engine_factory, tmp_path_factory):
    from unsee.impl.serve.pool import Pool
    from unsee.impl.serve.server import ServerThread

    pool = Pool(engine_factory("vllm-tiny"), tmp_path_factory.mktemp("serve-vllm"), defaults=Settings(max_new_tokens=6))
    with ServerThread(pool, "vllm-tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def user(item_id: str, text: str) -> dict:
    return {"type": "message", "role": "user", "content": text, "id": item_id}


def converse(client, script: list[str]) -> str:
    """A conversation of ``script``'s turns; its digest."""
    conv = client.conversations.create()
    for i, text in enumerate(script):
        client.responses.create(model="vllm-tiny", conversation=conv.id, input=[user(f"u{i}", text)])
    return client.conversations.retrieve(conv.id).model_extra["unsee"]["digest"]


def test_conversations_at_once_each_equal_the_same_conversation_alone(client, monkeypatch):
    senders: list[str] = []
    complete = adapter.complete
    monkeypatch.setattr(adapter, "complete", lambda *a: senders.append(threading.current_thread().name) or complete(*a))
    scripts = [[f"Conversation {j} says hello.", "And then what?"] for j in range(3)]
    digests: dict[int, str] = {}
    threads = [threading.Thread(target=lambda j=j: digests.__setitem__(j, converse(client, scripts[j])))
               for j in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(digests) == [0, 1, 2]
    assert len(senders) >= 6 and set(senders) == {"unsee-engine-loop"}  # the loop is vLLM's one caller
    assert [converse(client, scripts[j]) for j in range(3)] == [digests[j] for j in range(3)]


def test_a_delete_equals_a_twin_that_never_had_the_item(client):
    conv = client.conversations.create(items=[user("u1", "Hi, I am Dana.")])
    client.responses.create(model="vllm-tiny", conversation=conv.id)
    client.responses.create(model="vllm-tiny", conversation=conv.id, input=[user("u2", "I live at 4417 Elm Street.")])
    client.responses.create(model="vllm-tiny", conversation=conv.id, input=[user("u3", "Where do I live?")])
    deleted = client.conversations.items.delete("u2", conversation_id=conv.id)
    assert deleted.model_extra["mode"] == "exact"

    twin = client.conversations.create(items=[user("u1", "Hi, I am Dana.")])
    client.responses.create(model="vllm-tiny", conversation=twin.id)
    client.responses.create(model="vllm-tiny", conversation=twin.id, input=[])  # the turn u2 was, without it
    client.responses.create(model="vllm-tiny", conversation=twin.id, input=[user("u3", "Where do I live?")])
    digest = [client.conversations.retrieve(c).model_extra["unsee"]["digest"] for c in (conv.id, twin.id)]
    assert digest[0] == digest[1]


def test_a_prompt_past_the_context_is_400_and_changes_nothing(client):
    conv = client.conversations.create(items=[user("u1", "Hello.")])
    before = client.conversations.retrieve(conv.id).model_extra["unsee"]["digest"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="vllm-tiny", conversation=conv.id, input=[user("u2", "word " * 20000)])
    assert client.conversations.retrieve(conv.id).model_extra["unsee"]["digest"] == before


def test_a_conversation_keeps_no_copy_of_its_system_block_on_vllm(client, server):
    """vLLM's prefix cache is its own, salted per lineage: no kept lineage could serve another
    conversation's system block, so the key's cache keeps none (tests/test_serve_openings.py has
    the engines that compute their own KV)."""
    converse(client, ["Hello there."])
    converse(client, ["Hello again."])
    assert not server.pool.open_chat("").handles
