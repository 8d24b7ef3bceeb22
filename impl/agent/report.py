"""What a forget, a reset or a baseline did and cost: :class:`ForgetReport`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from unsee.impl.agent.drafts import DraftsAccount
from unsee.impl.engines.counts import Counters


@attrs.frozen
class RestoreAccount:
    """What a forget's restore of its checkpoint kept and what it recomputed
    (the report's ``extra["restore"]``, :func:`~unsee.impl.agent.forget.get_restore_account`)."""

    checkpoint_tokens: int
    granularity: int  # where a prefill resumes after a restore (Determinism.restore_granularity)
    shared: bool  # the checkpoint's lineage was in memory (else rebuilt from its manifest)
    cached_tokens: int
    recomputed_tokens: int
    served: dict | None = None  # what the engine saw the restored lineage's first request served, where it says

    def to_json(self) -> dict:
        """As plain data; ``served`` only where the engine says it."""
        return attrs.asdict(self, filter=lambda a, v: a.name != "served" or v is not None)


@attrs.frozen
class ReportExtra:
    """What a report adds beside the forget's counts (``ForgetReport.extra``): how the
    episode was rendered, the extensions' own fields (pluggable, so a mapping in the
    order they gave them, e.g. the tool layer's divergences), what an engine keeps
    outside its lineages (vLLM) and what the restore kept."""

    rendering: dict = attrs.field(factory=dict)  # impl/agent/render.py's describe()
    fields: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)  # Extension.get_report_fields()
    engine_residue: dict | None = None  # an engine with Residue only
    restore: RestoreAccount | None = None  # a forget's restore (not a reset's)

    def to_json(self) -> dict:
        """As the report writes it: the rendering, the extensions' fields, then the
        residue and the restore where there are any."""
        out = {"rendering": self.rendering, **self.fields}
        if self.engine_residue is not None:
            out["engine_residue"] = self.engine_residue
        if self.restore is not None:
            out["restore"] = self.restore.to_json()
        return out


@attrs.frozen
class ForgetReport:
    """What a forget (or a reset, or a baseline) did and cost."""

    method: str
    source_id: str
    tau: int
    length: int  # T
    boundary: int  # the restored checkpoint's boundary
    checkpoint: dict | None
    checkpoint_bytes: int
    closure: tuple[str, ...]
    invocations: int
    #: the engine's work over the forget (:class:`Counters`, the one record of counts); the
    #: report shows its prefilled, decoded, draft, rebuilt and reused tokens and its forwards
    spent: Counters
    wall_s: float
    digest: str
    assumptions: dict
    extra: ReportExtra = attrs.field(factory=ReportExtra)  # the rendering, the extensions' fields, the restore
    already_forgotten: bool = False  # a repeated forget: nothing to do, state unchanged
    #: how the replay used drafts: mode ("verify", "oracle", "off"), why, the bound, and
    #: what each replayed model turn cost (:class:`~unsee.impl.agent.drafts.DraftsAccount`)
    drafts: DraftsAccount = attrs.field(factory=DraftsAccount.none)
    #: what ``digest`` means, as the engine declares it (Determinism.digest): "kv" (bitwise
    #: equal K and V by position) or "tokens" (equal token ids, decisions within a measured bound)
    digest_means: str = "kv"

    prefilled_tokens = property(lambda self: self.spent.prefilled_tokens)
    decoded_tokens = property(lambda self: self.spent.decoded_tokens)
    forward_calls = property(lambda self: self.spent.forward_calls)
    draft_accepted_tokens = property(lambda self: self.spent.draft_accepted_tokens,
                                     doc="Draft tokens verified and kept instead of decoded.")
    draft_rejected_tokens = property(lambda self: self.spent.draft_rejected_tokens,
                                     doc="Draft tokens verified and thrown away.")
    rebuilt_tokens = property(lambda self: self.spent.rebuilt_tokens,
                              doc="Of prefilled_tokens: rebuilding evicted or stored checkpoint lineages.")
    reused_tokens = property(lambda self: self.spent.reused_tokens,
                             doc="Served by the engine's prefix cache instead of prefilled (B5').")

    @property
    def expected_invocations(self) -> int:
        """Corollary 1: ``T - boundary`` (``T - tau + 1`` at boundary ``tau - 1``)."""
        return self.length - self.boundary

    def to_json(self) -> dict:
        """The report as plain data: the counts of ``spent`` it shows by name, in the order
        its JSON has always had (:data:`JSON_KEYS`)."""
        fields = attrs.asdict(self, filter=lambda a, _: a.name not in ("spent", "extra", "drafts"))
        fields.update({name: getattr(self, name) for name in COUNTED}, extra=self.extra.to_json(),
                      drafts=self.drafts.to_json(),
                      closure=list(self.closure), expected_invocations=self.expected_invocations)
        return {key: fields[key] for key in JSON_KEYS}


#: The counts of :class:`Counters` a report shows, by name.
COUNTED = ("prefilled_tokens", "decoded_tokens", "forward_calls", "draft_accepted_tokens", "draft_rejected_tokens",
           "rebuilt_tokens", "reused_tokens")
#: The keys of :meth:`ForgetReport.to_json`, in order (stored and printed reports keep it).
JSON_KEYS = ("method", "source_id", "tau", "length", "boundary", "checkpoint", "checkpoint_bytes", "closure",
             "invocations", "prefilled_tokens", "decoded_tokens", "forward_calls", "wall_s", "digest", "assumptions",
             "extra", "already_forgotten", "draft_accepted_tokens", "draft_rejected_tokens", "drafts",
             "rebuilt_tokens", "reused_tokens", "digest_means", "expected_invocations")


__all__ = ["COUNTED", "JSON_KEYS", "ForgetReport", "ReportExtra", "RestoreAccount"]
