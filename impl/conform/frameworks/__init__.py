"""Adapters that hold real agent frameworks to the conformance contract
(docs/conformance.md, "Real frameworks"), each written the way a user of
that framework would, with the framework's own forget; each is an optional
extra (pyproject.toml).

``common``      the deterministic tiny model as a chat function, and the
                episode's steps as chat messages (what every adapter shares)
``lang_graph``  LangGraph: ``RemoveMessage`` of the target's message, and
                time travel (fork from the checkpoint before the target,
                re-run the later inputs), on a SQLite checkpointer
``agents_sdk``  the OpenAI Agents SDK: ``SQLiteSession.pop_item`` back to the
                boundary, then the later inputs again
``google_adk``  Google ADK: ``Runner.rewind_async`` on an in-memory session
                service, then the later inputs again
``mem0_store``  mem0: ``Memory.delete`` of the target's memories (Qdrant on
                disk, a local embedder over the tiny model's embeddings)
``pydantic_ai_history``
                Pydantic AI: the message history the user owns, filtered of the
                target's prompt part (as a history processor would)
``llama_index_memory``
                LlamaIndex: ``Memory.set`` of the history without the target,
                on an SQLite file
"""
