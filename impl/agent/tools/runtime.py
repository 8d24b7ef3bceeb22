""":class:`ToolAgentRuntime`: an :class:`~unsee.impl.agent.runtime.AgentRuntime`
that owns a :class:`~unsee.impl.agent.tools.layer.ToolLayer`, with the layer's
state and operator verbs at hand (``runtime.world``, ``runtime.calls``,
``runtime.release_held(...)``). It adds no behaviour: the layer is an
extension, and ``AgentRuntime(engine, system, extensions=[ToolLayer(...)])``
runs the same transitions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from unsee.impl.agent.episode import Settings
from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.agent.tools.calls import DEFAULT_READ_MODE, Call
from unsee.impl.agent.tools.catalog import Tool
from unsee.impl.agent.tools.environment import Environment
from unsee.impl.agent.tools.layer import TOOLS, ToolLayer
from unsee.impl.engines.protocol import Engine


def _layer_view(name: str, doc: str) -> property:
    """An attribute of the runtime that is its tool layer's."""
    return property(lambda self: getattr(self.tool_layer, name), doc=doc)


class ToolAgentRuntime(AgentRuntime):
    """An :class:`AgentRuntime` whose plans become tool calls (see
    :class:`~unsee.impl.agent.tools.layer.ToolLayer`). ``world``, ``tools``,
    ``read_mode`` and ``withheld`` configure a new layer; ``extensions``
    (a fork, a replay, a reopened session) gives the runtime's extensions,
    among them its tool layer."""

    def __init__(self, engine: Engine, system: str, settings: Settings = Settings(), *,
                 world: Environment | None = None, tools: Mapping[str, Tool] | None = None,
                 read_mode: str = DEFAULT_READ_MODE, withheld: Iterable[str] = (),
                 extensions: Iterable[Extension] | None = None):
        if extensions is None:
            extensions = [ToolLayer(world, tools, read_mode, withheld)]
        super().__init__(engine, system, settings, extensions=extensions)
        layer = self.get_extension(TOOLS)
        if not isinstance(layer, ToolLayer):
            raise TypeError(f"a ToolAgentRuntime needs a ToolLayer among its extensions; got {self.extensions}")
        self.tool_layer: ToolLayer = layer

    world = _layer_view("world", "The real environment.")
    effects = _layer_view("effects", "The committed consequential calls, in firing order.")
    calls = _layer_view("calls", "The calls of the current trajectory.")
    shadow = _layer_view("shadow", "The counterfactual environment of the last replay (None before one).")
    read_mode = _layer_view("read_mode", "How a replay serves read-only tools (``READ_MODES``).")
    replay_log = _layer_view("replay_log", "What this runtime's replay did with each call.")

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools by name (settable: e.g. to put back a tool's implementation)."""
        return self.tool_layer.tools

    @tools.setter
    def tools(self, tools: Mapping[str, Tool]) -> None:
        self.tool_layer.tools = dict(tools)

    def get_divergences(self) -> list[dict]:
        """See :meth:`ToolLayer.get_divergences`."""
        return self.tool_layer.get_divergences()

    def release_held(self, call_id: str) -> Call:
        """See :meth:`ToolLayer.release_held`."""
        return self.tool_layer.release_held(self, call_id)


__all__ = ["ToolAgentRuntime"]
