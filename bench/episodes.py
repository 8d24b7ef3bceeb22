"""Benchmark episodes: a 12-step session with the target entering at a chosen step.

The shape follows the paper's episodes (setup, acquisition, contamination):
user turns, tool results, a memory note and a compaction, with the secret
inside a tool result at step ``tau``.
"""

from __future__ import annotations

from unsee.impl.episode import Episode, parse_episode

SECRET = "4417 Elm Street"

_USER = [
    "Hi, I am planning a dinner party for Saturday.",
    "Which day works best for eight guests?",
    "Can you suggest a starter?",
    "What wine goes with fish?",
    "How long should the main course take?",
    "Remind me what we decided so far.",
    "Should I send invitations today?",
    "What time should dinner start?",
    "Any idea for dessert?",
    "Thanks, anything I forgot?",
    "Please list the plan.",
    "Where should the party be?",
]


def make_bench_episode(tau: int, length: int = 12, max_new_tokens: int = 16,
                       policy: str = "every_turn") -> Episode:
    """``length`` steps; step ``tau`` is a tool result carrying the secret.

    Step 7 (if not tau) asks for a memory note and step 9 compacts, so the
    replayed suffix crosses a memory write-back and a cache lineage change
    whenever ``tau`` comes before them.
    """
    if not 1 <= tau <= length:
        raise ValueError(f"tau={tau} must be within 1..{length}")
    steps = []
    for t in range(1, length + 1):
        sid = f"s{t}"
        if t == tau:
            steps.append({"id": sid, "kind": "tool", "tool": "fetch_notes", "fields": [
                {"source": "notes.venues", "text": "Venues: Rosa's Trattoria, Blue Harbor Grill."},
                {"source": "notes.address", "text": f"The host's home address is {SECRET}."}]})
        elif t == 7:
            steps.append({"id": sid, "kind": "remember"})
        elif t == 9:
            steps.append({"id": sid, "kind": "compact"})
        else:
            steps.append({"id": sid, "kind": "user", "text": _USER[(t - 1) % len(_USER)]})
    return parse_episode({
        "format": "unsee.episode", "version": 1,
        "system": "You are a helpful party-planning assistant. Answer in one short sentence.",
        "settings": {"max_new_tokens": max_new_tokens, "checkpoint_policy": policy},
        "steps": steps,
        "target": {"source": "notes.address", "value": SECRET},
    })
