"""Extensions: components an :class:`~unsee.impl.agent.runtime.AgentRuntime`
owns beside its state (the tool layer, :class:`~unsee.impl.agent.tools.ToolLayer`,
is one).

The runtime calls each of its extensions at fixed points of a transition, a
checkpoint, a forget and a save; an extension changes the runtime's state
only through the runtime's public verbs (``append_block``, ``mark_committed``).
Each point is a method of :class:`Extension`:

- ``after_plan``: a ``plan`` step's decoded plan was committed (a tool layer
  turns it into a call and prefills the call's result);
- ``take_snapshot``: store the environment as it is now and return its id, which a new checkpoint records;
- ``branch``: the extension of a replay runtime that starts at a checkpoint
  (``None``: at ``R_0``, a full reset);
- ``begin_forget``: a forget or reset starts, removing these sources;
- ``adopt``: the forget commits; take over the finished replay's extension;
- ``get_report_fields``: what the forget report's ``extra`` adds;
- ``get_assumptions``: Theorem 1's assumptions as this extension sees them;
- ``get_state_fields``: what the state record (and so the digest) adds;
- ``get_record``: the extension's part of the session record, stored under
  its ``name``; a loader registered under that name rebuilds it
  (:data:`unsee.impl.agent.loading.EXTENSION_LOADERS`);
- ``fork``: an independent copy for a forked runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from unsee.impl.agent.checkpoints import Checkpoint
from unsee.impl.agent.episode import Step
from unsee.impl.agent.provenance import RuntimeBlock

#: The runtime that owns an extension (an ``AgentRuntime``; not imported
#: here, since the runtime imports this module).
Runtime = Any


@runtime_checkable
class Extension(Protocol):
    """A component of a runtime (see the module docstring)."""

    name: str

    def after_plan(self, runtime: Runtime, step: Step, plan: RuntimeBlock) -> None: ...

    def take_snapshot(self, runtime: Runtime) -> str | None: ...

    def branch(self, runtime: Runtime, checkpoint: Checkpoint | None) -> Extension: ...

    def begin_forget(self, runtime: Runtime, source_ids: Sequence[str]) -> None: ...

    def adopt(self, other: Extension) -> None: ...

    def get_report_fields(self) -> dict: ...

    def get_assumptions(self, assumptions: dict) -> dict: ...

    def get_state_fields(self) -> dict: ...

    def get_record(self) -> dict: ...

    def fork(self) -> Extension: ...


__all__ = ["Extension"]
