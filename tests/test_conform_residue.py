"""The residue check finds the target, not its digits inside other tokens
(issue 37; impl/util/residue.py, docs/conformance.md "The residue check").

A fresh clone on another CPU rejected our own reference once: the store's
random session id ``fb5ef1eb84ae4417bba1031986e24156`` holds the digits of the
secret ``4417 Elm``. The property below generates kept files full of random
ids, UUIDs, hashes, base64 runs and number fields that carry the target's
digits, and asks that none is a finding, while the same files with the
target's value written into them always are."""

from __future__ import annotations

import base64
import hashlib
import json

from hypothesis import example, given
from hypothesis import strategies as st

from unsee.impl.conform.checks import RESIDUE, check_residue
from unsee.impl.conform.episodes import secrets
from unsee.impl.store.records import find_residue
from unsee.impl.util.residue import find_hits, get_needles

#: The session id the false rejection was found in, and the secret it was found for.
OBSERVED_ID = "fb5ef1eb84ae4417bba1031986e24156"
OBSERVED_SECRET = "4417 Elm"


def kept(name: str, raw: bytes) -> list[dict]:
    return [{"name": name, "base64": base64.b64encode(raw).decode("ascii")}]


def test_the_observed_hex_id_is_no_residue(tmp_path):
    """The pinned case, through both entry points of the one matcher."""
    row = json.dumps({"session_id": OBSERVED_ID, "created": 1764255553}).encode()
    check = check_residue({"kept": kept("session.db", row)}, {"kept": []}, [OBSERVED_SECRET])
    assert check.name == RESIDUE and check.ok and check.actual == []
    path = tmp_path / "session.db"
    path.write_bytes(row)
    assert find_residue([path], OBSERVED_SECRET) == []
    # the same file with the secret in a text field is a finding, named where it stands
    path.write_bytes(row + b' {"text": "the party is at 4417 Elm."}')
    found = find_residue([path], OBSERVED_SECRET)
    assert found and all(f"in {path} at byte " in f for f in found), found
    assert "4417 Elm." in found[0]


def test_a_finding_names_the_file_the_offset_and_the_bytes_around_it():
    raw = b"x" * 100 + b" noted: 4417 Elm, then " + b"y" * 100
    (hit, *_) = find_hits("history.db", raw, get_needles([OBSERVED_SECRET]))
    assert (hit.name, hit.offset) == ("history.db", raw.index(b"4417"))
    assert b"noted: 4417 Elm, then" in hit.context and len(hit.context) < 80
    assert hit.describe().startswith(f"the value '4417 Elm' in history.db at byte {hit.offset}: b'")


def test_a_number_field_equal_to_the_targets_digits_is_no_hit_but_prose_is():
    """The hard case (docs/conformance.md): a count that equals the house number
    is not the house number; the same digits in text are."""
    needles = get_needles(["4417 Elm"])
    for field in (b'{"size": 4417}', b"[12, 4417, 5]", b'{"bytes":4417,"n":1}', b"a,4417,b", b'"t": -4417}'):
        assert find_hits("f", field, needles) == [], field
    for prose in (b"he paid 4417 dollars", b'"note": "4417"', b"(4417)", b"n=4417", b"#4417 Elm"):
        assert find_hits("f", prose, needles), prose


# --- the property -------------------------------------------------------------------------

HEX = "0123456789abcdef"


@st.composite
def id_carrying(draw, digits: str) -> str:
    """A random id, hash or blob, often carrying ``digits`` inside it."""
    kind = draw(st.sampled_from(["hex", "uuid", "sha256", "base64", "prefixed", "dotted", "path"]))
    hex_text = st.text(HEX, min_size=1, max_size=12)
    if kind == "hex":
        return draw(hex_text) + digits + draw(hex_text)
    if kind == "uuid":
        head = draw(st.uuids()).hex
        body = (head[:12] + digits + head[12:])[:32]
        return "-".join((body[:8], body[8:12], body[12:16], body[16:20], body[20:]))
    if kind == "sha256":
        return hashlib.sha256(draw(st.binary(max_size=16))).hexdigest()
    if kind == "base64":
        return base64.b64encode(draw(st.binary(min_size=1, max_size=12)) + digits.encode()).decode()
    if kind == "prefixed":
        return draw(st.sampled_from(["conv_", "resp_", "msg_", "fco_", "call-"])) + digits + draw(hex_text)
    if kind == "dotted":
        return f"{draw(st.integers(0, 9))}.{digits}"
    return f"/tmp/unsee-{draw(hex_text)}/{digits}/{draw(hex_text)}"


@st.composite
def kept_files(draw):
    """``(value, file)``: a target value and a kept file (JSON rows of ids and
    number fields) whose ids and numbers carry the target's digits but never
    its text."""
    value = draw(secrets())
    digits = value.split()[0]
    rows = draw(st.lists(st.fixed_dictionaries({
        "id": id_carrying(digits), "other": id_carrying(digits),
        "size": st.sampled_from([int(digits), len(digits)]),
        "tokens": st.lists(st.sampled_from([int(digits), 7, 12, 99]), max_size=4)}), min_size=1, max_size=4))
    return value, "\n".join(json.dumps(r) for r in rows)


@given(kept_files(), st.integers(min_value=0), st.sampled_from([str, str.upper, str.lower]))
@example((OBSERVED_SECRET, json.dumps({"id": OBSERVED_ID, "other": "x", "size": 4417, "tokens": [4417]})), 0, str)
def test_ids_and_number_fields_are_never_residue_and_the_value_always_is(case, position, casing):
    value, text = case
    clean = check_residue({"kept": kept("session.db", text.encode())}, {"kept": []}, [value])
    assert clean.ok, clean.describe()
    # the same file with the value written into it, anywhere, in any case
    at = position % (len(text) + 1)
    leaked = check_residue({"kept": kept("session.db", f"{text[:at]} {casing(value)} {text[at:]}".encode())},
                           {"kept": []}, [value])
    assert not leaked.ok and any(value.split()[0] in f for f in leaked.actual), leaked.describe()
