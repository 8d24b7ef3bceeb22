"""``unsee serve``: an OpenAI-compatible conversation server whose item delete
is an exact forget (Algorithm 1 on a persisted session; docs/serve.md).

- :mod:`.errors`        the OpenAI error object and the statuses it is sent with;
- :mod:`.fields`        every request field, honoured, accepted or refused (the docs' table);
- :mod:`.bodies`        strict readers of request bodies (plain dicts in, plain data out);
- :mod:`.shapes`        the OpenAI objects the server answers with (items, responses, events);
- :mod:`.conversation`  one conversation: a session store plus a small sidecar file;
- :mod:`.turns`         a conversation's turns and forgets, with the client's tools;
- :mod:`.pool`          many conversations on one engine: owners, its locks (:meth:`.pool.Pool.hold`), the KV budget;
- :mod:`.chat`          stateless completions over the engine's exact prefix cache;
- :mod:`.answers`       the responses and chat completions the routes compute;
- :mod:`.stream`        token streaming: the runtime's listener, events, the async bridge;
- :mod:`.app`           the FastAPI application (needs the ``serve`` extra).
"""
