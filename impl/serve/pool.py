"""Many conversations on one engine.

- **Locks.** A request holds its conversation's lock for its whole run
  (requests on one conversation are serialised; one that waits longer than
  ``busy_wait`` seconds is refused with 409 and Retry-After), and a session of
  the engine's loop (:class:`~unsee.impl.engines.scheduler.Scheduler`) around
  its model work: the loop runs every forward, and lets another request's work
  run while one's forward is computed, so requests on other conversations wait
  for a forward, not for a whole turn or replay. Both are taken one way,
  :meth:`Pool.hold`, which enforces the budget as it lets go.
- **The KV budget.** One evictor, the engine's budget
  (:class:`~unsee.impl.engines.lineage.Budget`), decides under one bound
  (``kv_budget``, set on the engine) and one LRU clock (the one llama.cpp's
  slots go by too): it evicts the lineages no runtime pins (checkpoints,
  the chat prefix cache) itself, and after each operation the pool asks it
  which resident sessions must let go of theirs
  (:meth:`~unsee.impl.engines.lineage.Budget.get_releases`), offering every
  one no request is using (its turn may be paused between forwards), and
  evicts those. An evicted session keeps everything in its store and is
  rebuilt (its digest checked) by its next request.
- **Owners.** A conversation belongs to the API key that created it (its
  owner, a hash of the key; one made without keys has none until a server
  with keys gives it to its first key, :meth:`Pool.claim_unowned`); a
  request under another key is answered 404 for it, as for an id that does
  not exist. The chat prefix cache is one per
  owner, so no key's ``cached_tokens`` counts what another sent.
- **Files.** ``root/<conversation id>/`` per conversation
  (:mod:`unsee.impl.serve.conversation`); a deleted one is renamed to
  ``<id>.deleting`` first (one atomic rename) and then removed, and a leftover
  of a crash is removed at the next start.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from unsee import Settings
from unsee.impl.agent.render import get_renderer
from unsee.impl.agent.tools.client import get_context_length, get_model_tool_format
from unsee.impl.serve.chat import ChatCache
from unsee.impl.serve.conversation import SIDECAR, Conversation
from unsee.impl.serve.errors import ApiError, busy, not_found

DELETING = ".deleting"
#: the output cap of an engine whose context length is unknown, where no default is given
FALLBACK_CAP = 4096


def get_default_settings(engine, max_output_tokens: int | None = None) -> Settings:
    """The server's defaults: greedy, seed 0, and the output cap ``max_output_tokens``, else the
    model's whole context (a turn's cap is then the rest of the context after its prompt, as
    llama.cpp's and vLLM's servers do). A conversation's session records them when it is created;
    a request's own settings are recorded with its turn (docs/serve.md, "Sampling")."""
    return Settings(max_new_tokens=max_output_tokens or get_context_length(engine.lm) or FALLBACK_CAP)


class Pool:
    """The server's conversations and the engine they share."""

    def __init__(self, engine, root: str | Path, kv_budget: int | None = None, busy_wait: float = 5.0,
                 system: str = "You are a helpful assistant.", defaults: Settings | None = None):
        self.engine = engine
        renderer = get_renderer(engine.lm)
        #: the model's call format: its family's (impl/agent/tools/families.py), or the generic one
        self.call_format = get_model_tool_format(renderer, engine.lm, None)
        self.chats: dict[str, ChatCache] = {}
        self.root = Path(root)
        if kv_budget is not None:
            engine.budget.set(kv_budget)  # one bound, the engine's: its evictor decides (_enforce_budget)
        self.busy_wait = busy_wait
        self.system = system
        self.defaults = defaults or get_default_settings(engine)
        self.loop = engine.scheduler  # the engine's loop: hold() takes a session of it (and close(), at shutdown)
        self.index_lock = threading.Lock()
        self.stats = {"evictions": 0, "rebuilds": 0}
        #: the KV bytes the engine held when the last hold let go (what /metrics reports: read in the
        #: loop's session, so a scrape never walks the engine's lineages while a request changes them)
        self.held_bytes = 0
        self._waiting = 0  # requests waiting for a conversation another request holds (under index_lock)
        self.conversations: dict[str, Conversation] = {}
        self.responses: dict[str, str] = {}  # response id -> conversation id
        self.root.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self) -> None:
        for path in sorted(self.root.iterdir()):
            if path.name.endswith(DELETING):
                shutil.rmtree(path, ignore_errors=True)
            elif (path / SIDECAR).exists():
                conv = Conversation.load(path)
                self.conversations[conv.id] = conv
                self.responses.update({r["id"]: conv.id for r in conv.record["responses"]})

    # --- finding and holding ---------------------------------------------------

    def get(self, conv_id: str, owner: str = "") -> Conversation:
        """The conversation, if ``owner`` owns it (another owner's is as unknown as a missing one)."""
        with self.index_lock:
            conv = self.conversations.get(conv_id)
        if conv is None or self.get_owner(conv) != owner:
            raise not_found(f"no conversation {conv_id!r}", param="conversation_id")
        return conv

    def get_owner(self, conv: Conversation) -> str:
        return conv.record["owner"]

    def claim_unowned(self, owner: str) -> list[str]:
        """Give every conversation stored with no owner (made while the server ran without keys) to
        ``owner``, recorded in its sidecar; the ids claimed. Called once, as a server with keys
        starts (docs/serve.md, "Keys": the file's first key), before any request: recorded, so
        a key file reordered later moves no conversation."""
        claimed = []
        for conv in list(self.conversations.values()):
            if not conv.record["owner"]:
                conv.save({**conv.record, "owner": owner})
                claimed.append(conv.id)
        return claimed

    def get_by_response(self, response_id: str, owner: str = "") -> Conversation:
        with self.index_lock:
            conv_id = self.responses.get(response_id)
        try:
            return self.get(conv_id or "", owner)
        except ApiError:
            raise not_found(f"no response {response_id!r}", param="previous_response_id") from None

    def open_chat(self, owner: str) -> ChatCache:
        """The owner's chat prefix cache (made on first use)."""
        with self.index_lock:
            return self.chats.setdefault(owner, ChatCache(self.engine))

    @contextlib.contextmanager
    def hold(self, conv: Conversation | None = None, background: bool = False) -> Iterator[Conversation | None]:
        """The one way serve takes its locks: the conversation's lock (when one
        is named), then the engine's, with the session resident; on the way
        out the KV budget is enforced, never evicting ``conv``. With no
        conversation it is a session of the engine's loop alone (a chat completion).
        ``background``: work that steps aside for any response waiting (a forget's replay)."""
        with self._hold_conversation(conv), self.loop.session(background):
            if conv is not None and conv.open(self.engine):
                self.stats["rebuilds"] += 1
            try:
                yield conv
            finally:
                self._enforce_budget(keep=conv)
                self.held_bytes = self.get_held_bytes()

    @contextlib.contextmanager
    def _hold_conversation(self, conv: Conversation | None) -> Iterator[None]:
        """``conv``'s lock (none for None): busy (409) after ``busy_wait``
        seconds, not found if it was deleted while we waited."""
        if conv is None:
            yield
            return
        if not conv.lock.acquire(blocking=False) and not self._wait_for(conv):
            raise busy(f"conversation {conv.id} is busy with another request; retry after it", 1)
        try:
            if self.conversations.get(conv.id) is not conv:  # deleted while we waited
                raise not_found(f"no conversation {conv.id!r}", param="conversation_id")
            yield
        finally:
            conv.lock.release()

    def _wait_for(self, conv: Conversation) -> bool:
        """Wait up to ``busy_wait`` seconds for ``conv``'s lock, counted as waiting (``/metrics``)."""
        with self.index_lock:
            self._waiting += 1
        try:
            return conv.lock.acquire(timeout=self.busy_wait)
        finally:
            with self.index_lock:
                self._waiting -= 1

    def get_stats(self) -> dict:
        """Evictions, rebuilds, the engine loop's forwards and the seconds it spent computing them
        (``forward_s``), its hand-overs of the session while a forward ran, and its forwards by the
        decode steps each batched (``{steps: forwards}``; one step or a prefill counts as 1), so far."""
        loop = self.loop.get_stats()
        return {**self.stats, "forwards": loop["forwards"], "forward_s": loop["busy_s"],
                "handovers": loop["handovers"], "decode_batches": loop["batch_sizes"]}

    def get_ops_state(self) -> dict:
        """What ``/metrics`` reads at a scrape (impl/serve/metrics.py): the KV bytes held (as the last
        request left them), conversations stored and resident, requests waiting for the engine or a
        busy conversation, evictions and rebuilds so far. Takes no lock a request holds for long."""
        with self.index_lock:
            conversations = list(self.conversations.values())
            waiting = self._waiting
        return {"held_bytes": self.held_bytes, "conversations": len(conversations),
                "resident": sum(c.session is not None for c in conversations),
                "waiting_engine": self.loop.get_waiting(), "waiting_conversation": waiting,
                "evictions": self.stats["evictions"], "rebuilds": self.stats["rebuilds"]}

    # --- the budget ------------------------------------------------------------

    @property
    def kv_budget(self) -> int | None:
        """The KV bound in bytes (None: none): the engine's budget's, the one evictor's."""
        return self.engine.budget.limit

    @kv_budget.setter
    def kv_budget(self, limit: int | None) -> None:
        self.engine.budget.set(limit)

    def get_held_bytes(self) -> int:
        return self.engine.budget.memory().held_bytes

    def _enforce_budget(self, keep: Conversation | None = None) -> None:
        """Evict the resident sessions the engine's budget names (in the loop's session:
        :meth:`hold` calls it). Offered to it: every resident conversation but ``keep`` and
        those whose lock a request holds (a turn may be paused between forwards, its runtime
        in use)."""
        if self.kv_budget is None:
            return
        offered = [(c, c.get_lineages()) for c in list(self.conversations.values())
                   if c.session is not None and c is not keep and not c.lock.locked()]
        for conv in self.engine.budget.get_releases(offered):
            conv.evict()
            self.stats["evictions"] += 1

    # --- conversations -----------------------------------------------------------

    def create(self, items: list[dict], metadata: dict, owner: str = "") -> Conversation:
        system = self.system
        if items and items[0]["role"] in ("system", "developer"):
            system, items = items[0]["text"], items[1:]
        conv_id = "conv_" + secrets.token_hex(24)
        conv = Conversation.create(self.root / conv_id, conv_id, system, metadata, items, owner)
        with self.index_lock:
            self.conversations[conv_id] = conv
        return conv

    def delete(self, conv: Conversation) -> None:
        """The conversation, its session and its store, gone (and the owner's cached copy of its
        system block: :meth:`ChatCache.release`)."""
        with self.hold(conv):
            with self.index_lock:
                del self.conversations[conv.id]
                for r in conv.record["responses"]:
                    self.responses.pop(r["id"], None)
                chat = self.chats.get(self.get_owner(conv))
            if chat is not None:
                chat.release(conv.id)
            conv.evict()
            tomb = conv.root.with_name(conv.root.name + DELETING)
            conv.root.rename(tomb)
            shutil.rmtree(tomb)

    def note_response(self, response_id: str, conv: Conversation) -> None:
        with self.index_lock:
            self.responses[response_id] = conv.id

    def close(self) -> None:
        with self.loop.session():
            for conv in list(self.conversations.values()):
                conv.evict()
