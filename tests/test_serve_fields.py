"""The request fields of ``unsee serve`` (issue 38, item 3): docs/serve.md's
table is the code's (impl/serve/fields.py), every field the server does not
honour refuses the values it cannot honour with a 400 that names it, and the
fields the Agents SDK sends by default are accepted (its Runner on the tiny
model, both its models, no tools)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from unsee import Settings
from unsee.impl.cli.docs import FIELDS_REGION, WRITE_COMMAND, get_region
from unsee.impl.engines.registry import make_engine
from unsee.impl.serve.fields import ACCEPTED, CHAT_FIELDS, HONOURED, REFUSED, RESPONSE_FIELDS, render_fields_table
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread

ROOT = Path(__file__).resolve().parent.parent
#: values tried, in order, for one a field's check refuses
CANDIDATES = (True, 3, "other", ["other"], {"other": 1})


@pytest.fixture(scope="module")
def server(lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-fields")
    with ServerThread(Pool(make_engine(lm), root, defaults=Settings(max_new_tokens=4)), "tiny") as srv:
        srv.http = httpx.Client(base_url=srv.url.removesuffix("/v1"))
        srv.conv = openai.OpenAI(base_url=srv.url, api_key="unused").conversations.create().id
        yield srv


def test_docs_field_table_is_the_code_s():
    committed = get_region((ROOT / "docs" / "serve.md").read_text(), FIELDS_REGION)
    assert committed == render_fields_table(), f"docs/serve.md's field table differs from the code: run {WRITE_COMMAND}"
    for fields in (RESPONSE_FIELDS, CHAT_FIELDS):
        assert all(f.status in (HONOURED, ACCEPTED, REFUSED) and f.why for f in fields)
        assert all(f.accept is not None for f in fields if f.status != HONOURED)


def refusable(fields):
    for field in fields:
        value = next((v for v in CANDIDATES if field.accept is not None and not field.accept(v)), None)
        if value is not None:
            yield field.name, value


@pytest.mark.parametrize("route,name,value", [
    *(("responses", n, v) for n, v in refusable(RESPONSE_FIELDS)),
    *(("chat/completions", n, v) for n, v in refusable(CHAT_FIELDS))])
def test_a_value_the_server_cannot_honour_is_400_naming_its_field(server, route, name, value):
    body = ({"conversation": server.conv} if route == "responses"
            else {"messages": [{"role": "user", "content": "hi"}]})
    reply = server.http.post(f"/v1/{route}", json={**body, name: value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == name, reply.text


def test_the_agents_sdk_s_default_fields_are_accepted(server):
    agents = pytest.importorskip("agents")
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    client = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0)

    async def run_both():
        out = []
        for model in (agents.OpenAIResponsesModel("tiny", client), agents.OpenAIChatCompletionsModel("tiny", client)):
            agent = agents.Agent(name="plain", instructions="Be brief.", model=model)
            try:
                out.append((await agents.Runner.run(agent, "Hello.")).final_output)
            except agents.exceptions.ModelBehaviorError as exc:
                out.append(str(exc))  # the SDK refuses an answer cut at the output cap (the tiny model's always is)
        return out

    import asyncio

    responses, chat = asyncio.run(run_both())  # `include: []`, `instructions`, `tools: []`... all read
    assert "status=incomplete" in responses and "max_output_tokens" in responses and isinstance(chat, str)
