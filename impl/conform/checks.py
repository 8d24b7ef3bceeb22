"""The named checks of one episode's answers, and the checks for what stays
behind after a forget (docs/conformance.md, "The checks").

A :class:`Check` compares what the implementation said with what it had to
be; a check the implementation cannot answer (it persists nothing, it reports
no external calls, the episode calls no tool) is N/A with the reason, never a
pass. The four checks for what stays behind read optional fields of the
answer:

- ``residue``: ``forget.kept`` (every byte the implementation persists or
  holds after the forget) holds none of the target's text or its normalised
  variants standing as their own tokens (not digits inside a random id, not a
  number field: :mod:`unsee.impl.util.residue`), beyond what the
  counterfactual run's ``run.kept`` holds (another item may carry the same
  number);
- ``reopen``: ``forget.reopened`` (the session reopened from what it
  persisted) is the forgotten state;
- ``idempotent``: ``forget.again`` (a second forget of the same source) changes
  nothing;
- ``effects once (A3)``: ``forget.effects`` (the external calls the forget
  made, by call id) repeats none of ``run.effects``, and no call id fired
  twice.

Pure Python: no torch and no runtime import, so a vector check runs without them.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import attrs

from unsee.impl.util.residue import Hit, find_hits, get_needles

PASS, FAIL, NA = "pass", "fail", "n/a"

# The checks, each a named constant whose value is its label in every report.
# The harness makes a Check under a constant; the scorecard's columns, the
# JUnit test cases and the groupings below read the constants, so a label is
# spelled once and renaming it cannot drop a column.

# --- the counts
T = "T"
TWIN_T = "counterfactual T"
TAU = "tau (first_entry)"
BOUNDARY = "boundary (get_restore_boundary)"
INVOCATIONS = "invocations = T - boundary (replay_cost_is_suffix_length)"
RESET_INVOCATIONS = "reset invocations = T"
DIGEST_BEFORE = "digest_before = run digest"
# --- the state after a forget and after a reset
FORGET_TWIN_TURNS = "forget = counterfactual: turns"
FORGET_TWIN_DIGEST = "forget = counterfactual: digest"
FORGET_RESET_TURNS = "forget = own reset: turns"
FORGET_RESET_DIGEST = "forget = own reset: digest"
RESET_TWIN_TURNS = "reset = counterfactual: turns"
RESET_TWIN_DIGEST = "reset = counterfactual: digest"
PREFIX = "prefix turns before tau (prefix_is_shared)"
# --- what stays behind (this module's checks)
RESIDUE = "residue (kept)"
REOPEN = "reopen = forget"
IDEMPOTENT = "idempotent (second forget)"
EFFECTS = "effects once (A3)"
# --- against our runtime, when the implementation declares our engine and model
RUN_REFERENCE = "run turns = reference"
TWIN_REFERENCE = "counterfactual turns = reference"
# --- the attended span (suite 1.1.0): what later turns computed while the target was in context
ATTENDED_TURNS = "attended span: later turns = counterfactual"
ATTENDED_STATE = "attended span: state after = counterfactual"
#: The one "check" of an episode the implementation did not answer.
ANSWERED = "implementation answered"

#: The checks on counts alone.
COUNT_CHECKS = (T, TWIN_T, TAU, BOUNDARY, INVOCATIONS, RESET_INVOCATIONS)
#: The checks whose failure means a forget that is not the counterfactual
#: (tokens or state), as opposed to a wrong count.
STATE_CHECKS = (FORGET_TWIN_TURNS, FORGET_TWIN_DIGEST, FORGET_RESET_TURNS, FORGET_RESET_DIGEST, RESET_TWIN_TURNS,
                RESET_TWIN_DIGEST)
#: The checks for what stays behind, in report order.
AFTERMATH_CHECKS = (RESIDUE, REOPEN, IDEMPOTENT, EFFECTS)
#: The attended-span family: a forget that drops only the target's own tokens or
#: KV rows keeps what later positions computed from it, and fails these by name.
ATTENDED_CHECKS = (ATTENDED_TURNS, ATTENDED_STATE)
#: Every check, in report order.
CHECKS = (*COUNT_CHECKS, DIGEST_BEFORE, *STATE_CHECKS, PREFIX, *AFTERMATH_CHECKS, RUN_REFERENCE, TWIN_REFERENCE,
          *ATTENDED_CHECKS)


@attrs.frozen
class Check:
    """One comparison: ``name`` (with the statement it realises), what the
    implementation said, what it had to be; ``na`` the reason it cannot be
    answered (then it is neither passed nor failed)."""

    name: str = attrs.field(validator=attrs.validators.in_(CHECKS))  # one of the constants above
    actual: Any
    expected: Any
    na: str | None = None

    @property
    def ok(self) -> bool:
        return self.na is not None or self.actual == self.expected

    @property
    def status(self) -> str:
        return NA if self.na is not None else PASS if self.actual == self.expected else FAIL

    def describe(self) -> str:
        if self.na is not None:
            return f"{self.name}: N/A ({self.na})"
        return f"{self.name}:\n      got      {_short(self.actual)}\n      expected {_short(self.expected)}"


def _short(value: Any, limit: int = 600) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


# --- residue --------------------------------------------------------------------------

def get_kept_bytes(kept: list[dict]) -> dict[str, bytes]:
    """``kept`` entries (``{"name", "text"}`` or ``{"name", "base64"}``) as bytes by name."""
    out = {}
    for entry in kept:
        raw = entry["text"].encode("utf-8", "surrogatepass") if "text" in entry else base64.b64decode(entry["base64"])
        out[entry["name"]] = out.get(entry["name"], b"") + raw
    return out


def find_needles(kept: dict[str, bytes], values: list[str]) -> dict[str, list[Hit]]:
    """Where the needles of ``values`` stand in each kept entry
    (:mod:`unsee.impl.util.residue`): needle description -> its hits, one a file."""
    needles = get_needles(values)
    found: dict[str, list[Hit]] = {}
    for name, raw in kept.items():
        for hit in find_hits(name, raw, needles):
            found.setdefault(hit.needle, []).append(hit)
    return found


def check_residue(forget: dict, twin_run: dict, values: list[str]) -> Check:
    """No needle of the target stands in what the implementation keeps after
    the forget, beyond the needles the counterfactual run's kept bytes hold too
    (another item may carry the same number). Each finding names the file, the
    byte offset and the bytes around it."""
    if forget.get("kept") is None:
        return Check(RESIDUE, None, None, na="the implementation reports no kept bytes (forget.kept)")
    after = find_needles(get_kept_bytes(forget["kept"]), values)
    baseline = find_needles(get_kept_bytes(twin_run.get("kept") or []), values)
    residue = sorted(hit.describe() for needle, hits in after.items() if needle not in baseline for hit in hits)
    return Check(RESIDUE, residue, [])


# --- reopen, idempotent, effects ----------------------------------------------------------

def check_reopen(forget: dict) -> Check:
    reopened = forget.get("reopened")
    if reopened is None:
        return Check(REOPEN, None, None, na="the implementation persists nothing to reopen (forget.reopened)")
    return Check(REOPEN, {"digest": reopened["digest"], "turns": reopened["turns"]},
                 {"digest": forget["digest_after"], "turns": forget["turns"]})


def check_idempotent(forget: dict) -> Check:
    again = forget.get("again")
    if again is None:
        return Check(IDEMPOTENT, None, None, na="the implementation reports no second forget (forget.again)")
    return Check(IDEMPOTENT, {"digest": again["digest_after"], "turns": again["turns"]},
                 {"digest": forget["digest_after"], "turns": forget["turns"]})


def check_effects(run: dict, forget: dict, calls_tools: bool) -> Check:
    if not calls_tools:
        return Check(EFFECTS, None, None, na="the episode calls no tool")
    if run.get("effects") is None or forget.get("effects") is None:
        return Check(EFFECTS, None, None, na="the implementation reports no external calls (run/forget.effects)")
    fired = list(run["effects"])
    twice = sorted({c for c in fired if fired.count(c) > 1})
    again = sorted(set(forget["effects"]) & set(fired))
    return Check(EFFECTS, {"fired twice in the run": twice, "fired again by the forget": again},
                 {"fired twice in the run": [], "fired again by the forget": []})


def check_aftermath(answer: dict, counterfactual: dict, values: list[str], calls_tools: bool) -> list[Check]:
    """The four checks for what stays behind (see the module docstring)."""
    run, forget = answer["run"], answer["forget"]
    return [check_residue(forget, counterfactual["run"], values), check_reopen(forget), check_idempotent(forget),
            check_effects(run, forget, calls_tools)]


# --- the attended span ---------------------------------------------------------------------

def check_attended(run: dict, forget: dict, twin: dict, later_steps: tuple[str, ...], later: bool) -> list[Check]:
    """The attended-span family: the turns decoded after the target's step
    (``later_steps``, which attended to it) and the state after the forget
    are the counterfactual's. A forget that cuts out only the target's own
    tokens or KV rows keeps those turns and the positions computed from it.

    ``later``: the episode has a step after the target's (else nothing attended
    to it: both N/A). The turns check is N/A where the plain runs' later turns
    equal the counterfactual's: the target changed no later token there, so
    tokens cannot show what attended to it (the state check still applies)."""
    if not later:
        why = "the target enters at the last step: nothing after it attended to it"
        return [Check(ATTENDED_TURNS, None, None, na=why), Check(ATTENDED_STATE, None, None, na=why)]
    state = Check(ATTENDED_STATE, forget["digest_after"], twin["digest"])
    if not later_steps:
        return [Check(ATTENDED_TURNS, None, None, na="no model turn after the target's step"), state]
    if all(run["turns"][s] == twin["turns"][s] for s in later_steps):
        return [Check(ATTENDED_TURNS, None, None, na="the target changed no later token in the plain runs"), state]
    return [Check(ATTENDED_TURNS, {s: forget["turns"][s] for s in later_steps},
                  {s: twin["turns"][s] for s in later_steps}), state]


# --- reading the optional fields -------------------------------------------------------------

def read_aftermath(raw: dict, problem) -> None:
    """Validate the optional fields these checks read; ``problem(where, message)``
    makes the error (the harness's, naming the field)."""
    for part in ("run", "forget"):
        node = raw.get(part) or {}
        kept = node.get("kept")
        if kept is not None:
            if not isinstance(kept, list):
                raise problem(f"{part}.kept", "must be a list of {name, text} or {name, base64} objects")
            for i, entry in enumerate(kept):
                ok = isinstance(entry, dict) and isinstance(entry.get("name"), str) and (
                    isinstance(entry.get("text"), str) or isinstance(entry.get("base64"), str))
                if not ok:
                    raise problem(f"{part}.kept[{i}]", "must be {name, text} or {name, base64}")
                if "base64" in entry:
                    try:
                        base64.b64decode(entry["base64"], validate=True)
                    except ValueError:
                        raise problem(f"{part}.kept[{i}].base64", "is not base64") from None
        effects = node.get("effects")
        if effects is not None and not (isinstance(effects, list) and all(isinstance(c, str) for c in effects)):
            raise problem(f"{part}.effects", "must be a list of call ids (strings)")
    forget = raw.get("forget") or {}
    for key, digest in (("reopened", "digest"), ("again", "digest_after")):
        node = forget.get(key)
        if node is None:
            continue
        if not isinstance(node, dict) or not isinstance(node.get(digest), str) or not isinstance(
                node.get("turns"), dict):
            raise problem(f"forget.{key}", f"must be an object with {digest!r} and 'turns'")


__all__ = ["AFTERMATH_CHECKS", "ANSWERED", "ATTENDED_CHECKS", "ATTENDED_STATE", "ATTENDED_TURNS", "BOUNDARY", "CHECKS", "COUNT_CHECKS", "DIGEST_BEFORE", "EFFECTS", "FAIL",
           "FORGET_RESET_DIGEST", "FORGET_RESET_TURNS", "FORGET_TWIN_DIGEST", "FORGET_TWIN_TURNS", "IDEMPOTENT",
           "INVOCATIONS", "NA", "PASS", "PREFIX", "REOPEN", "RESET_INVOCATIONS", "RESET_TWIN_DIGEST",
           "RESET_TWIN_TURNS", "RESIDUE", "RUN_REFERENCE", "STATE_CHECKS", "TAU", "TWIN_REFERENCE", "TWIN_T", "Check",
           "T", "check_aftermath", "check_attended", "check_effects", "check_idempotent", "check_reopen", "check_residue",
           "find_needles", "get_kept_bytes", "get_needles", "read_aftermath"]
