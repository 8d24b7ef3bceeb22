"""Where a forget's model work differs from its compute floor, turn by turn
(``get_excess``). The floor itself is :mod:`unsee.impl.methods.floor`; it is
re-exported here for the benches that import it from this module."""

from __future__ import annotations

from unsee.impl.methods.floor import Floor, FloorTurn, compute_floor, get_first_change, get_suffix_blocks, is_model_turn

#: Why a replayed model turn cost more than the floor's operations for it
#: (:func:`get_excess`), in the order the report lists them.
EXCESS_REASONS = {
    "wrong_later": "draft right at tokens 1-2, wrong later: its verification forward was not kept",
    "early_miss": "draft wrong at token 2, not probed: a verification forward for one token's news",
    "fallback": "an unstable (near-tie) decision: the turn re-decoded from its header",
    "probe_right": "a probe that found the draft right: one decode step spent",
    "lookup": "guesses from the context where a turn is decoded: guessed tokens verified, decode steps saved",
}


def get_reason(turn: dict) -> str | None:
    """Which of :data:`EXCESS_REASONS` explains a replayed turn's excess over
    the floor (a ``drafts.turns`` entry of the forget report), or None."""
    if turn.get("trusted"):
        return None
    if turn["fallback"]:  # also a turn with no draft, whose context guess met a near-tie
        return "fallback"
    if not turn["draft"]:
        return None
    if turn["prefilled"] - turn.get("looked_up", 0) > turn["generated"]:
        return "early_miss" if turn["accepted"] == 1 and not turn["probed"] else "wrong_later"
    if turn["probed"] and turn["accepted"] >= 2:
        return "probe_right"
    return None


def get_excess(turns: list[dict], floor: dict) -> list[dict]:
    """Where a replay's model work differs from the floor's, by reason: for
    each of :data:`EXCESS_REASONS`, the turns it explains, the tokens they
    prefilled beyond their canonical chunk, the tokens decoded beyond the
    floor's decode of that turn, and the one-token forwards spent on probes
    that found the draft right. A turn is listed once under its first draft
    reason; its probe step is counted wherever it falls. Context guesses
    (``lookup``) are a row of their own, since any turn may have them beside
    a draft reason: the guessed tokens it verified (prefilled) and, negative,
    the decode steps its accepted guesses saved, so a replay can fall below
    the floor there. ``turns`` is the forget report's ``drafts.turns``,
    ``floor`` a :meth:`Floor.to_json`."""
    floor_decoded = {t["block_id"]: t["decoded"] for t in floor["changed_turns"]}
    rows = {reason: {"reason": reason, "why": why, "turns": [], "prefilled": 0, "decoded": 0, "forwards": 0}
            for reason, why in EXCESS_REASONS.items()}
    for turn in turns:
        looked_up, saved = turn.get("looked_up", 0), turn.get("lookup_accepted", 0)
        if turn.get("lookups", 0):
            lookup = rows["lookup"]
            lookup["turns"].append(turn["block"])
            lookup["prefilled"] += looked_up
            lookup["decoded"] -= saved
        reason = get_reason(turn)
        if reason is None:
            continue
        row = rows[reason]
        row["turns"].append(turn["block"])
        row["prefilled"] += turn["prefilled"] - turn["generated"] - looked_up
        row["decoded"] += turn["decoded"] + saved - floor_decoded.get(turn["block"], 0)
        # a probe that found the draft right (any reason but an early miss) is one step spent
        early_miss = turn["accepted"] == 1 and turn["rejected"] > 0 and not turn["fallback"]
        row["forwards"] += int(turn["probed"] and not early_miss)
    return [row for row in rows.values() if row["turns"]]


__all__ = ["EXCESS_REASONS", "Floor", "FloorTurn", "compute_floor", "get_excess", "get_first_change", "get_reason",
           "get_suffix_blocks", "is_model_turn"]
