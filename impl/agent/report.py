"""What a forget, a reset or a baseline did and cost: :class:`ForgetReport`."""

from __future__ import annotations

import attrs


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
    prefilled_tokens: int
    decoded_tokens: int
    forward_calls: int
    wall_s: float
    digest: str
    assumptions: dict
    extra: dict = attrs.field(factory=dict)  # the extensions' fields, e.g. irrevocable divergences
    already_forgotten: bool = False  # a repeated forget: nothing to do, state unchanged
    draft_accepted_tokens: int = 0  # draft tokens verified and kept instead of decoded
    draft_rejected_tokens: int = 0  # draft tokens verified and thrown away
    #: drafts: {"mode": "verify" | "oracle" | "off", "why": ..., "bound": ...,
    #: "totals": {...}, "turns": [per replayed model turn: draft, accepted,
    #: rejected, decoded, prefilled, fallback, trusted]}
    drafts: dict = attrs.field(factory=dict)
    rebuilt_tokens: int = 0  # of prefilled_tokens: rebuilding evicted or stored checkpoint lineages
    reused_tokens: int = 0  # served by the engine's prefix cache instead of prefilled (B5')
    #: what ``digest`` means, as the engine declares it (Determinism.digest): "kv" (bitwise
    #: equal K and V by position) or "tokens" (equal token ids, decisions within a measured bound)
    digest_means: str = "kv"

    @property
    def expected_invocations(self) -> int:
        """Corollary 1: ``T - boundary`` (``T - tau + 1`` at boundary ``tau - 1``)."""
        return self.length - self.boundary

    def to_json(self) -> dict:
        out = attrs.asdict(self)
        out["expected_invocations"] = self.expected_invocations
        out["closure"] = list(self.closure)
        return out


__all__ = ["ForgetReport"]
