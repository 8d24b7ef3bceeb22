"""The environment tools act on: a key-value world with content-addressed
snapshots, a call-ID ledger and an execution counter (assumption A3).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from typing import Protocol

import attrs

from unsee.impl.agent.tools.calls import Call


class Runnable(Protocol):
    """What the environment needs of a tool: its implementation (:class:`~unsee.impl.agent.tools.catalog.Tool`)."""

    def run(self, env: Environment, call: Call) -> str: ...


def snapshot_id(state: Mapping[str, str]) -> str:
    """Content address of an environment state: equal states, equal ids."""
    canonical = json.dumps(sorted(state.items()), ensure_ascii=False, separators=(",", ":"))
    return "env-" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class SnapshotStore:
    """Immutable environment states by content address (shared by the real
    world and every shadow branched from it)."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[tuple[str, str], ...]] = {}

    def __contains__(self, sid: str) -> bool:
        return sid in self._states

    def __len__(self) -> int:
        return len(self._states)

    def put(self, state: Mapping[str, str]) -> str:
        sid = snapshot_id(state)
        self._states.setdefault(sid, tuple(sorted(state.items())))
        return sid

    def get(self, sid: str) -> dict[str, str]:
        if sid not in self._states:
            raise KeyError(f"unknown environment snapshot {sid!r}")
        return dict(self._states[sid])

    def get_record(self) -> dict[str, list[list[str]]]:
        """Every stored state by its id, as plain data (sorted by id)."""
        return {sid: [list(kv) for kv in state] for sid, state in sorted(self._states.items())}

    @classmethod
    def from_record(cls, record: Mapping[str, list]) -> SnapshotStore:
        """The inverse of :meth:`get_record` (the ids are kept as recorded)."""
        store = cls()
        for sid, state in record.items():
            store._states[sid] = tuple((k, v) for k, v in state)
        return store


class Environment:
    """A key-value world that tools read and consequential tools write.

    ``ledger`` maps each call ID whose side effect was applied here to that
    call: a second :meth:`fire` of the same ID is refused (recorded in
    ``blocked``) and answers the first result. ``executions`` counts how many
    times each call ID's effect was applied (at most once, by the ledger).
    The ledger is bookkeeping about the world, not part of its content:
    snapshots and restores cover ``data`` only.
    """

    def __init__(self, data: Mapping[str, str] | None = None, store: SnapshotStore | None = None):
        self.data: dict[str, str] = dict(data or {})
        self.store = store if store is not None else SnapshotStore()
        self.ledger: dict[str, Call] = {}
        self.executions: Counter[str] = Counter()
        self.blocked: list[str] = []

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def put(self, key: str, value: str) -> None:
        self.data[key] = value

    def state(self) -> dict[str, str]:
        return dict(self.data)

    def snapshot(self) -> str:
        """Store the current content; returns its content address."""
        return self.store.put(self.data)

    def restore(self, sid: str) -> None:
        self.data = self.store.get(sid)

    def branch(self, sid: str | None = None) -> Environment:
        """A shadow: a new world over the same snapshot store, holding the
        snapshot ``sid`` (default: the current content), with an empty ledger."""
        return Environment(self.store.get(sid) if sid is not None else self.data, self.store)

    def copy(self) -> Environment:
        """An independent copy including the ledger (a forked session's world)."""
        other = Environment(self.data, self.store)
        other.ledger, other.executions, other.blocked = dict(self.ledger), Counter(self.executions), list(self.blocked)
        return other

    def fire(self, call: Call, tool: Runnable) -> tuple[str, bool]:
        """Apply a consequential call's side effect once per call ID.

        Returns ``(result, fired)``; a call ID already in the ledger is not
        applied again (``fired`` is false) and answers the recorded result."""
        if call.call_id in self.ledger:
            self.blocked.append(call.call_id)
            return self.ledger[call.call_id].result, False
        result = tool.run(self, call)
        self.ledger[call.call_id] = attrs.evolve(call, result=result, committed=True)
        self.executions[call.call_id] += 1
        return result, True

    def read(self, call: Call, tool: Runnable) -> str:
        return tool.run(self, call)


__all__ = ["Environment", "Runnable", "SnapshotStore", "snapshot_id"]
