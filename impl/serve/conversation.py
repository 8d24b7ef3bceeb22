"""One conversation: a session store (``session.db``, the runtime's every
step and forget committed atomically) and a sidecar (``conversation.json``:
its id, metadata, system prompt, the items added but not yet answered, the
function-call ids of tool outputs, and its responses' ids).

The store is created by the conversation's first response, which fixes the
sampling settings a replay must reuse. Items added before a response wait in
the sidecar; a response moves them into one step of the store. The sidecar
is replaced atomically (write, fsync, rename); a crash between a step's
commit and the sidecar's rewrite leaves items in both, and :meth:`reconcile`
drops from the sidecar what the store already holds. So a committed item is
never lost and never doubled.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from pathlib import Path

from unsee import AgentRuntime, Item, PersistentSession, Settings, Step
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


def compute_answer_id(step_id: str, text: str) -> str:
    """An assistant item's id: a function of its turn and its text, so a turn
    that a forget's replay rewrote has a new id and one it left alone keeps its own."""
    return "msg_" + hashlib.sha256(f"{step_id}\0{text}".encode()).hexdigest()[:32]


def new_item_id(kind: str) -> str:
    return ("fco_" if kind == "function_call_output" else "msg_") + secrets.token_hex(12)


class Conversation:
    """A conversation's files and, while it is resident, its open session."""

    def __init__(self, root: Path, record: dict):
        self.root = root
        self.record = record
        self.lock = threading.Lock()  # one request at a time (the pool takes it)
        self.session: PersistentSession | None = None
        self.last_used = time.monotonic()

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def store_path(self) -> Path:
        return self.root / STORE

    @property
    def started(self) -> bool:
        return self.store_path.exists()

    # --- files -----------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, conv_id: str, system: str, metadata: dict, items: list[dict]) -> Conversation:
        record = {"id": conv_id, "created_at": int(time.time()), "metadata": metadata, "system": system,
                  "pending": [], "tools": {}, "responses": []}
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
    def assign_ids(record: dict, items: list[dict], used: set[str]) -> list[dict]:
        """``items`` with an id each (the client's, or a new one), refused if one is taken."""
        taken = used | {p["id"] for p in record["pending"]}
        out = []
        for item in items:
            item_id = item["id"] or new_item_id(item["kind"])
            if item_id in taken:
                raise bad_request(f"item id {item_id!r} is already used in conversation {record['id']}",
                                  param="id")
            taken.add(item_id)
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
            for lineage in {runtime.lineage} | runtime.checkpoints.lineages():
                if lineage in engine.budget.lineages:
                    engine.drop(lineage)
        session.close()

    def get_used_ids(self) -> set[str]:
        """Every source id the store holds or has forgotten (an id is never reused)."""
        if self.session is None:
            return set()
        runtime = self.session.runtime
        return {i.source for s in runtime.steps for i in s.items} | set(runtime.forgotten)

    def digest(self) -> str | None:
        return self.session.digest() if self.session is not None else None

    # --- items -----------------------------------------------------------------

    def get_items(self) -> list[dict]:
        """The conversation's items in order: each step's inputs, its answer, then the pending ones."""
        out = []
        if self.session is not None:
            runtime = self.session.runtime
            eos = set(runtime.engine.lm.eos_ids)
            for step in runtime.steps:
                out += [shapes.input_item(i.source, i.text, step.kind, self.record["tools"].get(i.source))
                        for i in step.items]
                block_id = compute_block_id(step.id, ANSWER)
                if block_id in runtime.graph:
                    block = runtime.graph[block_id]
                    complete = bool(block.tokens) and block.tokens[-1] in eos
                    out.append(shapes.output_message(compute_answer_id(step.id, block.text), block.text, complete))
        out += [shapes.input_item(p["id"], p["text"], "tool" if p["kind"] == "function_call_output" else "user",
                                  {"call_id": p["call_id"], "name": p["name"]}) for p in self.record["pending"]]
        return out

    def get_item(self, item_id: str) -> dict:
        for item in self.get_items():
            if item["id"] == item_id:
                return item
        raise not_found(f"no item {item_id!r} in conversation {self.id}", param="item_id")

    # --- operations (the pool holds this conversation's lock and the engine's) ----

    def add_items(self, items: list[dict]) -> list[dict]:
        added = self.assign_ids(self.record, items, self.get_used_ids())
        self.save({**self.record, "pending": self.record["pending"] + added})
        ids = {a["id"] for a in added}
        return [i for i in self.get_items() if i["id"] in ids]

    def check_settings(self, sampling: dict, defaults: Settings) -> Settings:
        """The settings this response runs with: the conversation's (its first
        response fixed them), refused if the request asks for others."""
        if self.session is None:
            return Settings(max_new_tokens=sampling["max_new_tokens"] or defaults.max_new_tokens,
                            temperature=sampling["temperature"] if sampling["temperature"] is not None
                            else defaults.temperature,
                            seed=sampling["seed"] if sampling["seed"] is not None else defaults.seed)
        settings = self.session.runtime.settings
        fixed = {"temperature": settings.temperature, "seed": settings.seed, "max_new_tokens": settings.max_new_tokens}
        names = {"max_new_tokens": "max_output_tokens"}
        for key, value in sampling.items():
            if value is not None and value != fixed[key]:
                raise bad_request(f"{names.get(key, key)}: this conversation runs with {fixed[key]!r}, fixed by its "
                                  f"first response (a forget replays every turn with the same settings); got "
                                  f"{value!r}", param=names.get(key, key))
        return settings

    def get_step(self, items: list[dict]) -> Step:
        """The next step: the pending items and ``items`` (all user messages, or all function outputs)."""
        todo = self.record["pending"] + items
        kinds = {i["kind"] for i in todo}
        if len(kinds) > 1:
            raise bad_request("input: a turn is user messages or function_call_output items, not both: "
                              "add the outputs in a response of their own", param="input")
        t = self.session.runtime.t if self.session is not None else 0
        if kinds == {"function_call_output"}:
            names = sorted({i["name"] for i in todo})
            return Step(f"turn_{t + 1}", "tool", tuple(Item(i["id"], i["text"]) for i in todo), ",".join(names))
        return Step(f"turn_{t + 1}", "user", tuple(Item(i["id"], i["text"]) for i in todo))

    def respond(self, engine, items: list[dict], settings: Settings, response_id: str) -> tuple[Step, list[dict]]:
        """One step: the pending items and ``items`` observed, the model's answer decoded; committed."""
        items = self.assign_ids(self.record, items, self.get_used_ids())
        step = self.get_step(items)  # refuses before anything is written
        todo = self.record["pending"] + items
        first = self.session is None
        if first:
            runtime = AgentRuntime.start(engine, system=self.record["system"], settings=settings)
            self.session = PersistentSession.create(self.store_path, runtime)
        try:
            self.session.step(step)
        except BaseException:
            if first:  # a failed first response leaves no store (it would fix the settings)
                self.evict()
                self.store_path.unlink(missing_ok=True)
            raise
        tools = {**self.record["tools"], **{i["id"]: {"call_id": i["call_id"], "name": i["name"]}
                                            for i in todo if i["kind"] == "function_call_output"}}
        responses = self.record["responses"] + [{"id": response_id, "step": step.id}]
        self.save({**self.record, "pending": [], "tools": tools, "responses": responses})
        return step, [i for i in self.get_items() if i["id"] in {x["id"] for x in todo}]

    def get_answer(self, step: Step) -> dict:
        """The answer item of ``step`` (a committed step always has one)."""
        answer_id = compute_answer_id(step.id, self.session.runtime.graph[compute_block_id(step.id, ANSWER)].text)
        return next(i for i in self.get_items() if i["id"] == answer_id)

    def forget(self, item_id: str) -> dict:
        """An exact forget of ``item_id`` (Algorithm 1, one atomic commit), or
        of a pending item (nothing was derived from it yet)."""
        if any(p["id"] == item_id for p in self.record["pending"]):
            self.save({**self.record, "pending": [p for p in self.record["pending"] if p["id"] != item_id]})
            return {"rewritten": [], "removed": [item_id], "receipt": None, "report": None}
        before = self.get_items()
        item = next((i for i in before if i["id"] == item_id), None)
        if item is None:
            raise not_found(f"no item {item_id!r} in conversation {self.id}", param="item_id")
        if item["role"] == "assistant":
            raise bad_request(f"item {item_id!r} is the model's answer, derived from the items before it: "
                              "delete the input item it came from (a forget names a source)", param="item_id")
        report = self.session.forget(item_id)
        after = self.get_items()
        after_ids, before_ids = {i["id"] for i in after}, {i["id"] for i in before}
        self.save({**self.record, "tools": {k: v for k, v in self.record["tools"].items() if k != item_id}})
        return {"rewritten": [i for i in after if i["id"] not in before_ids],
                "removed": [i["id"] for i in before if i["id"] not in after_ids],
                "receipt": self.session.receipt,  # canonical JSON text: what `unsee verify --receipt` reads
                "report": {"tau": report.tau, "length": report.length, "invocations": report.invocations,
                           "prefilled_tokens": report.prefilled_tokens, "decoded_tokens": report.decoded_tokens,
                           "wall_s": report.wall_s, "assumptions": report.assumptions}}
