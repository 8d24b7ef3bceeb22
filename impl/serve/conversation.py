"""One conversation: a session store (``session.db``, the runtime's every
step and forget committed atomically) and a sidecar (``conversation.json``:
its id, owner, metadata, system prompt, the items added but not yet answered,
the recorded inputs a forget's replay has not yet replayed (``held``; where
it stopped at a call, ``held_outputs``, the outputs it matched for that
turn's calls, and ``held_extra``, the other items of that turn's tool step,
which follow the client's outputs), the call ids of tool outputs and of a
client's calls, its responses' ids, and the ids a DELETE removed, which no
new item takes again).

The store is created by the conversation's first response, which fixes the
sampling settings a replay must reuse. Items added before a response wait in
the sidecar; a response moves them into one step of the store. The sidecar
is replaced atomically (write, fsync, rename); a crash between a step's
commit and the sidecar's rewrite leaves items in both, and :meth:`reconcile`
drops from the sidecar what the store already holds. So a committed item is
never lost and never doubled.

The model's answers are read from the store: an answer's text and its calls
(parsed in the model's own format, :mod:`unsee.impl.agent.tools.native`),
with ids that are a hash of the answer's step and the tokens it was decoded
after, so an answer a forget's replay recomputed has new ids, one it left
alone keeps its own, and a stream can name an answer before it is decoded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from unsee import PersistentSession
from unsee.impl.agent.render import SUMMARY_OPENING
from unsee.impl.agent.tools.client import ClientToolRuntime
from unsee.impl.agent.tools.observed import DEFAULT_ROLES, get_role
from unsee.impl.serve import shapes
from unsee.impl.serve.errors import bad_request, not_found
from unsee.impl.util.ids import ANSWER, compute_block_id

SIDECAR = "conversation.json"
STORE = "session.db"


def write_json_atomic(path: Path, value: dict) -> None:
    """Replace ``path`` by ``value`` in one rename, durable when this returns."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compute_answer_key(step_id: str, prompt: Sequence[int]) -> str:
    """What an answer's ids are made of: its step and the tokens it was decoded after."""
    return hashlib.sha256(f"{step_id}\0{','.join(map(str, prompt))}".encode()).hexdigest()[:32]


def get_answer_ids(key: str, n_calls: int) -> tuple[str, list[tuple[str, str]]]:
    """An answer's message id, and each call's ``(item id, call id)``."""
    return f"msg_{key}", [(f"fc_{key[:24]}_{i}", f"call_{key[:24]}_{i}") for i in range(n_calls)]


def get_item_key(item: dict) -> list:
    """What an item the client named none is named by: its kind, role, tool name and text."""
    return [item["kind"], item["role"], item["name"] if item["kind"] == "function_call" else None, item["text"]]


def compute_item_id(item: dict, turn: int, occurrence: int) -> str:
    """The server's id for an item the client named none: a hash of the turn it is observed in,
    its content (:func:`get_item_key`) and how many items alike came before it in that turn,
    so two conversations given the same items in the same turns name them alike, and an item
    keeps its name where another of its turn is deleted (the twin of a forget, which never had
    that one: same digest, same items). Not of a tool output's call id: a replay reuses an
    output for the same call made anew, whose id is new."""
    key = json.dumps([turn, occurrence, *get_item_key(item)])
    prefix = {"function_call_output": "fco_", "function_call": "fc_"}.get(item["kind"], "msg_")
    return prefix + hashlib.sha256(key.encode()).hexdigest()[:24]


def get_item_role(item: dict) -> str:
    """An input item's role, as a step records it (:data:`~unsee.impl.agent.tools.observed.ROLES`)."""
    return item["kind"] if item["kind"] in ("function_call", "function_call_output") else item["role"]


def get_prompt(runtime, step_id: str) -> list[int]:
    """The tokens ``step_id``'s answer was decoded after (a session stored before client tools
    has no turn opening: its header is the plain one)."""
    if isinstance(runtime, ClientToolRuntime):
        return runtime.get_prompt(step_id)
    block = runtime.graph[compute_block_id(step_id, ANSWER)]
    header = runtime.engine.lm.encode(runtime.renderer.render_header())
    return [t for p in block.parents for t in runtime.graph[p].tokens] + list(block.tokens[:len(header)])


def get_output_tokens(runtime, step_id: str) -> int:
    """The tokens ``step_id``'s answer decoded: its block's, past what it was decoded after
    (:func:`get_prompt`; an end token it stopped on included), not its text encoded again."""
    return runtime.graph[compute_block_id(step_id, ANSWER)].token_span[1] - len(get_prompt(runtime, step_id))


def get_answer_items(runtime, step_id: str) -> list[dict]:
    """The items of the model's answer to ``step_id``: its text (a message, where it has text or no
    call) and its function calls."""
    block = runtime.graph[compute_block_id(step_id, ANSWER)]
    if isinstance(runtime, ClientToolRuntime):  # an end of turn, or a stop text
        complete = runtime.is_finished(step_id)
    else:
        complete = bool(block.tokens) and block.tokens[-1] in set(runtime.engine.lm.eos_ids)
    text, calls = (runtime.get_turn(step_id)[:2] if isinstance(runtime, ClientToolRuntime) else (block.text, ()))
    message_id, call_ids = get_answer_ids(compute_answer_key(step_id, get_prompt(runtime, step_id)), len(calls))
    out = [shapes.output_message(message_id, text, complete)] if text or not calls else []
    return out + [shapes.function_call(item_id, call_id, c.name, c.arguments)
                  for (item_id, call_id), c in zip(call_ids, calls)]


def get_compaction_item(runtime, step_id: str) -> dict:
    """The compaction item of a ``compact`` step: the summary the model wrote (with the opening
    its turn was decoded after), its id a hash of the step and the tokens of its turn and of what
    it read, so a summary a forget's replay rewrote has a new id."""
    block = runtime.graph[compute_block_id(step_id, ANSWER)]
    read = [t for p in block.parents for t in runtime.graph[p].tokens] + list(block.tokens)
    return shapes.compaction(f"cmp_{compute_answer_key(step_id, read)}", f"{SUMMARY_OPENING} {block.text}")


def get_runtime_lineages(runtime) -> set[str]:
    """The engine lineages ``runtime`` holds: its own and its checkpoints'."""
    return {runtime.lineage} | runtime.checkpoints.lineages()


def get_call_ids(runtime, step_id: str | None) -> list[str]:
    """The call ids of ``step_id``'s answer, in its calls' order."""
    if step_id is None:
        return []
    return [i["call_id"] for i in get_answer_items(runtime, step_id) if i["type"] == "function_call"]


class Conversation:
    """A conversation's files and, while it is resident, its open session."""

    def __init__(self, root: Path, record: dict):
        self.root = root
        self.record = {"owner": "", "held": [], "held_outputs": [], "held_extra": [], "retired": [], **record}
        self.lock = threading.Lock()  # one request at a time (the pool takes it)
        self.session: PersistentSession | None = None

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def store_path(self) -> Path:
        return self.root / STORE

    @property
    def started(self) -> bool:
        return self.store_path.exists()

    @property
    def runtime(self):
        return self.session.runtime if self.session is not None else None

    # --- files -----------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, conv_id: str, system: str, metadata: dict, items: list[dict],
               owner: str = "") -> Conversation:
        record = {"id": conv_id, "created_at": int(time.time()), "metadata": metadata, "system": system,
                  "owner": owner, "pending": [], "tools": {}, "responses": [], "held": [], "held_outputs": [],
                  "held_extra": [], "retired": []}
        record["pending"] = cls.assign_ids(record, items, used=set())
        root.mkdir(parents=True)
        write_json_atomic(root / SIDECAR, record)
        return cls(root, record)

    @classmethod
    def load(cls, root: Path) -> Conversation:
        return cls(root, json.loads((root / SIDECAR).read_text(encoding="utf-8")))

    def save(self, record: dict) -> None:
        write_json_atomic(self.root / SIDECAR, record)
        self.record = record

    @staticmethod
    def assign_ids(record: dict, items: list[dict], used: set[str], turn: int = 1) -> list[dict]:
        """``items`` (to be observed in step ``turn``, after the waiting ones) with an id each: the
        client's, or :func:`compute_item_id` (the next free one, where a forgotten item took it);
        refused if the client's is taken: by an item the conversation holds, or one a DELETE
        removed (``used``: the store's; ``retired``: the sidecar's, a waiting item deleted, the
        outputs a replay dropped)."""
        taken = used | {p["id"] for p in record["pending"]} | get_held_ids(record) | set(record.get("retired", ()))
        before = [get_item_key(p) for p in record["pending"]]  # the items of this turn so far
        out = []
        for item in items:
            item_id = item["id"]
            if item_id is None:
                base = item_id = compute_item_id(item, turn, before.count(get_item_key(item)))
                for n in itertools.count(2):
                    if item_id not in taken:
                        break
                    item_id = f"{base}_{n}"
            elif item_id in taken:
                raise bad_request(f"item id {item_id!r} is already used in conversation {record['id']} (an id "
                                  "is never reused, a deleted item's included)", param="id")
            taken.add(item_id)
            before.append(get_item_key(item))
            out.append({**item, "id": item_id})
        return out

    # --- the session -------------------------------------------------------------

    def open(self, engine) -> bool:
        """Make the session resident (rebuilding its caches from the store); True if it was rebuilt."""
        if self.session is not None or not self.started:
            return False
        self.session = PersistentSession.open(self.store_path, engine)
        self.reconcile()
        return True

    def reconcile(self) -> None:
        """Drop from the sidecar the pending items the store already committed (a crash after a step's commit)."""
        held = self.get_used_ids()
        pending = [p for p in self.record["pending"] if p["id"] not in held]
        if len(pending) != len(self.record["pending"]):
            self.save({**self.record, "pending": pending})

    def evict(self) -> None:
        """Close the session and free its caches; the store keeps everything."""
        session, self.session = self.session, None
        if session is None:
            return
        runtime = session.runtime
        if runtime is not None:
            engine = runtime.engine
            for lineage in get_runtime_lineages(runtime):
                if lineage in engine.budget.lineages:
                    engine.drop(lineage)
        session.close()

    def get_lineages(self) -> set[str]:
        """The engine lineages the resident session's runtime holds (its own and its
        checkpoints'); none where it is not resident."""
        runtime = self.session.runtime if self.session is not None else None
        return get_runtime_lineages(runtime) if runtime is not None else set()

    def get_used_ids(self) -> set[str]:
        """Every source id the store holds or has forgotten (an id is never reused)."""
        if self.session is None:
            return set()
        runtime = self.session.runtime
        return {i.source for s in runtime.steps for i in s.items} | set(runtime.forgotten)

    def digest(self) -> str | None:
        return self.session.digest() if self.session is not None else None

    # --- items -----------------------------------------------------------------

    def get_step_items(self, step, previous: str | None) -> list[dict]:
        """A step's input items, each in its role (a tool output with the call id of the call it
        answers, a client's call with the call id it gave)."""
        runtime = self.runtime
        clients = isinstance(runtime, ClientToolRuntime)
        roles = runtime.client.roles if clients else {}
        bound = runtime.client.bound if clients else {}
        calls = get_call_ids(runtime, previous) if clients and step.kind == "tool" else []
        out = []
        for item in step.items:
            role = get_role(roles, step, item)
            i = bound.get(item.source)
            call_id = calls[i] if i is not None and i < len(calls) else self.record["tools"].get(
                item.source, {}).get("call_id")
            out.append(shapes.observed_item(item.source, role[0], item.text, call_id, role[1] if role[1:] else None))
        return out

    def get_items(self) -> list[dict]:
        """The conversation's items in order: each step's inputs and its answer; then the inputs that
        wait: outputs kept for a pending call, the recorded inputs not yet replayed, the added ones."""
        out, previous = [], None
        runtime = self.runtime
        for step in runtime.steps if runtime is not None else ():
            out += self.get_step_items(step, previous)
            if step.kind == "compact":
                out.append(get_compaction_item(runtime, step.id))
            elif compute_block_id(step.id, ANSWER) in runtime.graph:
                out += get_answer_items(runtime, step.id)
            previous = step.id
        return out + get_waiting_items(self.record)

    def get_item(self, item_id: str) -> dict:
        for item in self.get_items():
            if item["id"] == item_id:
                return item
        raise not_found(f"no item {item_id!r} in conversation {self.id}", param="item_id")

    def get_next_turn(self) -> int:
        return (self.runtime.t if self.runtime is not None else 0) + 1

    def add_items(self, items: list[dict]) -> list[dict]:
        added = self.assign_ids(self.record, items, self.get_used_ids(), self.get_next_turn())
        self.save({**self.record, "pending": self.record["pending"] + added})
        ids = {a["id"] for a in added}
        return [i for i in self.get_items() if i["id"] in ids]

    def get_pending_calls(self) -> list[dict]:
        """The function calls of the last answer that no output answers yet."""
        runtime = self.runtime
        if not isinstance(runtime, ClientToolRuntime) or not runtime.t:
            return []
        answered = {o["call_index"] for o in self.record["held_outputs"]}
        calls = [i for i in get_answer_items(runtime, runtime.steps[-1].id) if i["type"] == "function_call"]
        return [c for k, c in enumerate(calls) if k not in answered]


def get_held_ids(record: dict) -> set[str]:
    return ({o["id"] for o in record["held_outputs"]} | {e["id"] for e in record["held_extra"]}
            | {i["id"] for g in record["held"] for i in g["items"]})


def get_waiting_items(record: dict) -> list[dict]:
    """The items that wait for a response, in the order they will be observed."""
    held = [shapes.observed_item(o["id"], "function_call_output", o["text"], o["call_id"])
            for o in record["held_outputs"]]
    held += [shapes.observed_item(e["id"], get_item_role(e), e["text"], e["call_id"], e["name"])
             for e in record["held_extra"]]
    for group in record["held"]:
        for i in group["items"]:
            role = i.get("role") or [DEFAULT_ROLES[group["kind"]]]
            held.append(shapes.observed_item(i["id"], role[0], i["text"], i["call_id"], i["name"]))
    return held + [shapes.observed_item(p["id"], get_item_role(p), p["text"], p["call_id"], p["name"])
                   for p in record["pending"]]


__all__ = ["SIDECAR", "STORE", "Conversation", "compute_answer_key", "compute_item_id", "get_answer_ids",
           "get_answer_items", "get_call_ids", "get_compaction_item", "get_held_ids", "get_item_key", "get_item_role", "get_output_tokens", "get_prompt",
           "get_runtime_lineages", "get_waiting_items", "write_json_atomic"]
