"""mem0 through the conformance contract (the extra ``unsee[mem0]``).

An agent as a mem0 user writes one: every observed item is added to a
``mem0.Memory`` (``infer=False``: stored as given, no extraction model), with
its source in the metadata; every model turn searches the memory with the
step's text and answers from the hits. The store is local: Qdrant on disk and
mem0's SQLite history, embedded by :class:`TinyEmbeddings` (the mean of our
tiny model's input embeddings: nothing to download); the chat model is the
LangChain one of :mod:`.lang_graph`. Telemetry is off.

The forget is mem0's own ``delete`` of every memory whose source is the
target; nothing is re-run (``boundary = T``). ``kept`` is every file of the
store (the Qdrant folder, the history database, the agent's transcript),
``reopened`` a new ``Memory`` on them, ``again`` the same delete once more.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported: nothing leaves the machine

import mem0.memory.main
from langchain_core.embeddings import Embeddings
from mem0 import Memory

from unsee.impl.agent.episode import MODEL_TURN_KINDS, Episode, load_episode
from unsee.impl.conform.frameworks.common import (
    complete,
    get_answer,
    get_digest,
    get_model,
    get_step_text,
    get_tau,
)
from unsee.impl.conform.frameworks.lang_graph import TinyChatModel

# Also when mem0 was imported before this module (its flag is read at import):
# no telemetry, and no telemetry vector store under ~/.mem0.
mem0.memory.main.MEM0_TELEMETRY = False

USER = "user"
TOP_K = 3


class TinyEmbeddings(Embeddings):
    """The mean of the tiny model's input embedding rows of a text's token ids."""

    def embed_query(self, text: str) -> list[float]:
        import torch

        lm = get_model()
        ids = lm.encode(text) or [0]
        with torch.no_grad():
            rows = lm.model.get_input_embeddings().weight[torch.tensor(ids)]
        return [float(x) for x in rows.mean(dim=0)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]


def open_memory(folder: Path) -> Memory:
    dims = get_model().model.get_input_embeddings().weight.shape[1]
    return Memory.from_config({
        "vector_store": {"provider": "qdrant", "config": {"collection_name": "unsee", "path": str(folder / "qdrant"),
                                                          "embedding_model_dims": int(dims), "on_disk": True}},
        "embedder": {"provider": "langchain", "config": {"model": TinyEmbeddings()}},
        "llm": {"provider": "langchain", "config": {"model": TinyChatModel()}},
        "history_db_path": str(folder / "history.db"),
    })


def close(memory: Memory) -> None:
    memory.vector_store.client.close()  # Qdrant's local mode locks its folder


def get_memories(memory: Memory) -> list[dict]:
    found = memory.get_all(filters={"user_id": USER}, top_k=1000)
    items = found["results"] if isinstance(found, dict) else found
    return sorted(({"text": m["memory"], "source": (m.get("metadata") or {}).get("source")} for m in items),
                  key=lambda m: (m["source"] or "", m["text"]))


def run_steps(memory: Memory, episode: Episode, without: str | None = None) -> dict[str, list[int]]:
    turns = {}
    for step in episode.steps:
        for item in step.items:
            if item.source != without and item.text:
                memory.add(item.text, user_id=USER, infer=False, metadata={"source": item.source})
        if step.kind in MODEL_TURN_KINDS:
            query = get_step_text(step, without) or f"[{step.kind}]"
            found = memory.search(query, filters={"user_id": USER}, top_k=TOP_K)
            hits = [m["memory"] for m in (found["results"] if isinstance(found, dict) else found)]
            turns[step.id] = complete([("system", episode.system), ("system", "Memories:\n" + "\n".join(hits)),
                                       ("user", query)], episode.settings.max_new_tokens)
    return turns


def get_state(memory: Memory, turns: dict) -> dict:
    return {"turns": turns, "digest": get_digest({"turns": turns, "memories": get_memories(memory)})}


def forget_delete(memory: Memory, source: str) -> None:
    found = memory.get_all(filters={"user_id": USER}, top_k=1000)
    for m in found["results"] if isinstance(found, dict) else found:
        if (m.get("metadata") or {}).get("source") == source:
            memory.delete(m["id"])


def get_kept(folder: Path) -> list[dict]:
    return [{"name": str(p.relative_to(folder)), "base64": base64.b64encode(p.read_bytes()).decode("ascii")}
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(".lock")]


def delete(episode_path: str, forget: str | None = None) -> dict:
    """mem0, forgetting with ``Memory.delete`` of the target's memories."""
    episode = load_episode(episode_path)
    with tempfile.TemporaryDirectory(prefix="unsee-mem0-") as tmp:
        folder = Path(tmp)
        memory = open_memory(folder)
        turns = run_steps(memory, episode)
        (folder / "transcript.json").write_text(json.dumps(turns))
        state = get_state(memory, turns)
        run = {"T": len(episode.steps), "turns": turns, "digest": state["digest"]}
        out = get_answer("mem0 delete", run)
        if forget is None:
            close(memory)
            return out
        forget_delete(memory, forget)
        state = get_state(memory, turns)
        close(memory)
        T = len(episode.steps)
        out["forget"] = {"source": forget, "tau": get_tau(episode, forget), "boundary": T, "invocations": 0,
                         "digest_before": run["digest"], "digest_after": state["digest"], "turns": turns,
                         "kept": get_kept(folder)}
        memory = open_memory(folder)
        reopened = get_state(memory, json.loads((folder / "transcript.json").read_text()))
        out["forget"]["reopened"] = {"digest": reopened["digest"], "turns": reopened["turns"]}
        forget_delete(memory, forget)
        again = get_state(memory, reopened["turns"])
        out["forget"]["again"] = {"digest_after": again["digest"], "turns": again["turns"]}
        close(memory)
    with tempfile.TemporaryDirectory(prefix="unsee-mem0-reset-") as tmp:  # the user's reset: a new store
        memory = open_memory(Path(tmp))
        reset_turns = run_steps(memory, episode, forget)
        state = get_state(memory, reset_turns)
        close(memory)
    out["reset"] = {"invocations": T, "digest_before": run["digest"], "digest_after": state["digest"],
                    "turns": reset_turns}
    return out


__all__ = ["TinyEmbeddings", "delete"]
