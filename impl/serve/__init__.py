"""``unsee serve``: an OpenAI-compatible conversation server whose item delete
is an exact forget (Algorithm 1 on a persisted session; docs/serve.md).

- :mod:`.errors`        the OpenAI error object and the statuses it is sent with;
- :mod:`.bodies`        strict readers of request bodies (plain dicts in, plain data out);
- :mod:`.shapes`        the OpenAI objects the server answers with (items, responses, events);
- :mod:`.conversation`  one conversation: a session store plus a small sidecar file;
- :mod:`.pool`          many conversations on one engine: its locks (:meth:`.pool.Pool.hold`), the KV budget, eviction;
- :mod:`.chat`          stateless chat completions over the engine's exact prefix cache;
- :mod:`.app`           the FastAPI application (needs the ``serve`` extra).
"""
