"""Properties of persisted sessions (:mod:`unsee.impl.store.sqlite`) on the tiny model.

=====================================  ========================================================
test                                   checks
=====================================  ========================================================
forget_leaves_no_residue               after a committed forget, no byte of any file the session
                                       owns (database, journal; live rows and free pages) holds
                                       the target: its UTF-8 bytes, the value case-insensitively,
                                       its normalised variants, its packed token ids; the stored
                                       observation at tau is the sanitized one; no stored block's
                                       tokens hold the value's ids as a contiguous run
two_forgets_equal_reset_and_many       forget(z1), reopen, forget(z2) == full_reset([z1, z2]) on a
                                       fork == forget_many([z1, z2]) (digests), over episodes
                                       with at least two sources
malformed_episodes_raise_episode_error mutations of a valid episode (wrong types, missing fields,
                                       unknown kinds, duplicate ids and sources, bad versions and
                                       settings, random JSON, random bytes) raise EpisodeError
                                       and nothing else
bad_requests_change_nothing            unknown ids, never-read and ambiguous values, empty and
                                       partly unknown lists, repeated forgets, duplicate and
                                       malformed steps: a clear error or the documented no-op,
                                       and the digest, the stored record and the stored bytes
                                       are unchanged
=====================================  ========================================================

What the residue property covers. The tiny model writes random bytes, so its
answers, notes and summaries never copy the target by themselves. The
property therefore runs every episode twice: on :class:`AgentRuntime`, and on
:class:`ExtractiveRuntime`, a scaffold whose model turns are *extractive*:
an answer (or plan) copies the latest observation in context, a memory
write-back or a compaction summary copies every observation in context.
Those turns are committed exactly like decoded ones (a prefill of the header,
then one chunk of the turn), with the provenance the runtime records for any
model turn (every resident block is a parent). So the value really enters
derived artifacts before the forget - answers, plans, memory notes, summaries,
the memory block a new session re-injects, and every later prompt and token
run - and the property checks that none of it survives in the stored bytes.
The episodes' other texts never contain a variant of the target (its targets
come from ``rare_secrets`` in impl/conform/episodes.py), so any hit is residue
(a value that another source also holds is not the target's alone; the store
cannot and does not erase it, see docs/persistence.md).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from unsee.impl.agent.episode import (
    CHECKPOINT_POLICIES,
    FORMAT,
    READ_VERSIONS,
    STEP_KINDS,
    VERSION,
    Episode,
    EpisodeError,
    Item,
    Step,
    load_episode,
    parse_episode,
)
from unsee.impl.agent.provenance import RuntimeBlock, UnknownSourceError
from unsee.impl.agent.render import END, START
from unsee.impl.agent.runtime import AgentRuntime, AmbiguousTargetError, TargetNotFoundError
from unsee.impl.conform.episodes import TARGET, texts
from unsee.impl.conform.episodes import episode_jsons as shared_episode_jsons
from unsee.impl.conform.episodes import rare_secrets as secrets  # the store's targets: values no other text holds
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.sqlite import find_residue, session_files
from unsee.impl.util.text import normalize
from unsee.properties.engines import get_model, make_engine

# --- set-up ------------------------------------------------------------------------------


#: One torch thread (the store tests' convention, see tests/test_store.py; properties/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


def budget(fraction: float, floor: int) -> settings:
    """A fraction of the profile's ``max_examples`` (ci 60, nightly 2000)."""
    return settings(max_examples=max(floor, int(settings().max_examples * fraction)),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def scratch() -> Path:
    """A fresh folder for one example's store (Hypothesis examples share fixtures)."""
    return Path(tempfile.mkdtemp(prefix="unsee-store-"))


# --- episodes --------------------------------------------------------------------------------

def episode_jsons(min_steps: int = 2, max_steps: int = 6) -> st.SearchStrategy[dict]:
    """The shared generator (impl/conform/episodes.py) with targets no other text
    holds (``rare_secrets``, imported as ``secrets``), framed in a longer observation, and short turns."""
    return shared_episode_jsons(min_steps, max_steps, max_new_tokens=(1, 3), secrets=secrets(), framed=True)


# --- a runtime whose model turns copy what they read -----------------------------------------

#: Block types that are observations (what an extractive turn copies).
OBSERVATION_TYPES = ("user", "tool", "plan", "memory", "summary")


class ExtractiveRuntime(AgentRuntime):
    """Model turns that copy their input: an answer or plan repeats the latest
    observation in context; a memory note or a summary repeats every one.
    Committed like a decoded turn (header chunk, turn chunk), so the session
    record rebuilds its caches bitwise like any other."""

    def _answer(self, block_id: str, type_: str, header_suffix: str = "") -> RuntimeBlock:
        observed = [self.graph[b] for b in self.context if self.graph[b].type in OBSERVATION_TYPES]
        picked = observed[-1:] if type_ in ("answer", "plan") else observed
        text = " / ".join(b.text.replace(START, "").replace(END, "").strip() for b in picked)[:1000] or "-"
        lm = self.engine.lm
        header = tuple(lm.encode(f"{START}assistant\n{header_suffix}"))
        body = tuple(lm.encode(text)) + (lm.eos_ids[0],)
        start = len(self.engine.tokens(self.lineage))
        self.engine.prefill(self.lineage, list(header))
        self.engine.prefill(self.lineage, list(body))
        block = RuntimeBlock(block_id, type_, text, header + body, tuple(self.context), self.get_resident_sources(),
                             (start, start + len(header) + len(body)), self.t, chunks=(len(header), len(body)))
        return self.commit_block(block)


def start(cls: type[AgentRuntime], episode: Episode) -> AgentRuntime:
    runtime = cls.start(make_engine("tiny"), episode.system, episode.settings)
    runtime.run(episode.steps)
    return runtime


def holds_run(tokens, needle) -> bool:
    n = len(needle)
    return any(list(tokens[i:i + n]) == needle for i in range(len(tokens) - n + 1))


# --- zero residue ----------------------------------------------------------------------------

SCANNED = {"episodes": 0, "files": 0, "copies": 0}


@budget(1.0, 15)
@given(raw=episode_jsons(), extractive=st.booleans())
def test_forget_leaves_no_residue(raw, extractive):
    episode = parse_episode(raw)
    secret = episode.target.value
    runtime = start(ExtractiveRuntime if extractive else AgentRuntime, episode)
    encode = get_model("tiny").encode
    path = scratch() / "s.db"
    with PersistentSession.create(path, runtime) as session:
        assert find_residue([path], secret, encode), "the scan must see the value before the forget"
        derived = [b.id for b in runtime.graph.blocks()
                   if b.type in ("answer", "plan", "summary", "memory_write") and secret in b.text]
        if extractive and any(s.kind in ("user", "tool", "plan") and TARGET in {i.source for i in s.items}
                              for s in episode.steps):
            assert derived, "an extractive answer copies the target"
        SCANNED["copies"] += len(derived)
        session.forget(TARGET)
        record = session.store.read_record()
        files = session_files(path)
        found = find_residue(files, secret, encode)
        note(f"derived copies before the forget: {derived}")
        assert found == [], found
    assert find_residue(session_files(path), secret, encode) == []
    # the observation at tau is stored sanitized, every other item verbatim
    for stored, step in zip(record["steps"], episode.steps):
        assert stored["items"] == [{"source": i.source, "text": i.text} for i in step.items if i.source != TARGET]
    needle = encode(secret)
    for block in record["blocks"]:
        assert not holds_run(block["tokens"], needle), block["id"]
        assert normalize(secret) not in normalize(block["text"]), block["id"]
    SCANNED["episodes"] += 1
    SCANNED["files"] += len(files)


def test_zz_report_scanned():
    """(Runs after the property in this module: prints what it scanned.)"""
    print(f"zero residue: {SCANNED['episodes']} episodes scanned ({SCANNED['files']} files, "
          f"{SCANNED['copies']} derived copies of a target before its forget)")


# --- several targets -------------------------------------------------------------------------


@budget(0.5, 8)
@given(raw=episode_jsons(min_steps=2, max_steps=5), data=st.data())
def test_two_forgets_equal_reset_and_many(raw, data):
    episode = parse_episode(raw)
    others = [s for s in episode.get_sources() if s != TARGET]
    assume(others)
    second = data.draw(st.sampled_from(others), label="second source")
    first, second = data.draw(st.permutations([TARGET, second]), label="order")
    runtime = start(AgentRuntime, episode)
    reset, many = runtime.fork(), runtime.fork()
    reset.full_reset([first, second])
    many.forget_many([first, second])
    path = scratch() / "s.db"
    with PersistentSession.create(path, runtime) as session:
        session.forget(first)
    with PersistentSession.open(path, make_engine("tiny")) as session:  # reopened between the two
        session.forget(second)
        assert session.digest() == reset.digest() == many.digest()
        assert session.store.get_summary()["forgotten"] == [first, second]


# --- malformed episodes ----------------------------------------------------------------------

def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
               | st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=max_leaves)


def not_a(*types: type) -> st.SearchStrategy[Any]:
    """JSON values of none of ``types`` (bool counts as its own type)."""
    def wrong(v):
        if isinstance(v, bool):
            return bool not in types
        return not isinstance(v, types)
    return json_values().filter(wrong)


@st.composite
def malformed(draw) -> tuple[Any, str]:
    """(a mutated episode, what was broken): every one is malformed."""
    raw = copy.deepcopy(draw(episode_jsons(min_steps=2, max_steps=4)))
    steps = raw["steps"]
    i = draw(st.integers(0, len(steps) - 1))
    step = steps[i]
    kind = step["kind"]
    choice = draw(st.sampled_from((
        "drop-top", "format", "version", "system", "steps", "settings", "target", "probes", "drop-step-field",
        "step-id", "step-kind", "step-text", "step-items", "item", "tool", "duplicate-id", "duplicate-source",
        "settings-key", "max_new_tokens", "temperature", "seed", "policy", "target-source", "target-value",
        "random-json", "step-not-object", "extra-text")))
    if choice == "drop-top":
        del raw[draw(st.sampled_from(("format", "version", "system", "steps")))]
    elif choice == "format":
        raw["format"] = draw(json_values().filter(lambda v: v != FORMAT))
    elif choice == "version":
        # bools and 1.0 compare equal to 1 in Python: see the known laxities below
        raw["version"] = draw(json_values().filter(lambda v: not (v in READ_VERSIONS or isinstance(v, bool))))
    elif choice == "system":
        raw["system"] = draw(not_a(str))
    elif choice == "steps":
        raw["steps"] = draw(not_a(list) | st.just([]))
    elif choice == "settings":
        raw["settings"] = draw(not_a(dict))
    elif choice == "target":
        raw["target"] = draw(not_a(dict, type(None)))
    elif choice == "probes":
        raw["probes"] = draw(not_a(list) | st.lists(not_a(str), min_size=1, max_size=2))
    elif choice == "drop-step-field":
        field = draw(st.sampled_from(["id", "kind"] + (["text"] if kind in ("user", "plan") else [])
                                     + (["records"] if kind == "memory" else [])))
        del step[field]
    elif choice == "step-id":
        step["id"] = draw(not_a(str) | st.just(""))
    elif choice == "step-kind":
        step["kind"] = draw(json_values().filter(lambda v: not isinstance(v, str) or v not in STEP_KINDS))
    elif choice == "step-text":
        assume(kind in ("user", "plan"))
        step["text"] = draw(not_a(str))
    elif choice == "step-items":
        assume(kind in ("memory", "tool"))
        key = "records" if kind == "memory" else "fields"
        step.pop("text", None)
        step[key] = draw(not_a(list) | st.just([]))
    elif choice == "item":
        assume(kind in ("memory", "tool"))
        items = step.get("records" if kind == "memory" else "fields")
        assume(items)  # not the one-field shorthand
        j = draw(st.integers(0, len(items) - 1))
        broken = draw(st.sampled_from(("not-object", "source", "text", "drop-source", "drop-text")))
        if broken == "not-object":
            items[j] = draw(not_a(dict))
        elif broken == "source":
            items[j]["source"] = draw(not_a(str) | st.just(""))
        elif broken == "text":
            items[j]["text"] = draw(not_a(str))
        else:
            del items[j][broken.split("-")[1]]
    elif choice == "tool":
        step["tool"] = draw(not_a(str, type(None)))
    elif choice == "duplicate-id":
        j = draw(st.integers(0, len(steps) - 1).filter(lambda j: j != i))
        steps[j]["id"] = step["id"]
    elif choice == "duplicate-source":
        sources = [(s, it) for s in steps for it in _items(s)]
        assume(len(sources) >= 2)
        (_, a), (_, b) = draw(st.permutations(sources))[:2]
        b["source"] = a["source"]
    elif choice == "settings-key":
        raw["settings"][draw(st.text(min_size=1, max_size=8).filter(
            lambda k: k not in ("max_new_tokens", "temperature", "seed", "checkpoint_policy")))] = 1
    elif choice == "max_new_tokens":
        raw["settings"]["max_new_tokens"] = draw(st.integers(-10, 0) | st.integers(4097, 10**9)
                                                 | not_a(int, bool))
    elif choice == "temperature":
        raw["settings"]["temperature"] = draw(st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)
                                              | st.just(float("nan")) | not_a(int, float, bool))
    elif choice == "seed":
        raw["settings"]["seed"] = draw(not_a(int, bool))
    elif choice == "policy":
        raw["settings"]["checkpoint_policy"] = draw(json_values().filter(lambda v: v not in CHECKPOINT_POLICIES))
    elif choice == "target-source":
        raw["target"]["source"] = draw(not_a(str) | st.text(max_size=8).filter(
            lambda s: s not in {it["source"] for st_ in steps for it in _items(st_)}))
    elif choice == "target-value":
        raw["target"]["value"] = draw(not_a(str, type(None)))
    elif choice == "random-json":
        raw = draw(json_values(10))
        assume(not (isinstance(raw, dict) and raw.get("format") == FORMAT))
    elif choice == "step-not-object":
        steps[i] = draw(not_a(dict))
    elif choice == "extra-text":
        assume(kind in ("remember", "compact", "session"))
        step["text"] = draw(texts())
    return raw, choice


def _items(step: Any) -> list[dict]:
    if not isinstance(step, dict):
        return []
    if step.get("kind") in ("user", "plan") or "text" in step:  # a tool's one-field shorthand too
        return [step] if "source" in step else []
    return [it for it in step.get("records", step.get("fields", [])) if isinstance(it, dict)]


BAD_INPUTS = {"episodes": 0, "files": 0, "requests": 0}


@budget(5.0, 60)
@given(case=malformed())
def test_malformed_episodes_raise_episode_error(case):
    raw, choice = case
    note(f"broken: {choice}")
    with pytest.raises(EpisodeError) as caught:
        parse_episode(raw)
    assert str(caught.value)
    BAD_INPUTS["episodes"] += 1


@budget(2.0, 30)
@given(content=st.binary(max_size=200) | malformed().map(lambda c: json.dumps(c[0]).encode())
       | st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_malformed_episode_files_raise_episode_error(content):
    path = scratch() / "episode.json"
    path.write_bytes(content)
    try:
        load_episode(path)
    except EpisodeError as exc:
        assert str(path) in str(exc)  # the message names the file
    else:  # random bytes are never a valid episode
        raise AssertionError("a malformed file was accepted")
    BAD_INPUTS["files"] += 1


# Laxities the episode reader once had (found by this fuzz, fixed in
# impl/agent/episode.py): each input is malformed and must raise EpisodeError.

LAXITIES = {
    "version true": lambda r: r.__setitem__("version", True),
    "version 1.0": lambda r: r.__setitem__("version", 1.0),
    "user source null": lambda r: r["steps"][0].__setitem__("source", None),
    "user source list": lambda r: r["steps"][0].__setitem__("source", [1]),
    "user source empty": lambda r: r["steps"][0].__setitem__("source", ""),
    "max_new_tokens true": lambda r: r["settings"].__setitem__("max_new_tokens", True),
    "temperature true": lambda r: r["settings"].__setitem__("temperature", True),
    "temperature infinite": lambda r: r["settings"].__setitem__("temperature", math.inf),
    "seed true": lambda r: r["settings"].__setitem__("seed", True),
}


@pytest.mark.parametrize("name", list(LAXITIES))
def test_episode_reader_rejects_former_laxity(name):
    raw = {"format": FORMAT, "version": VERSION, "system": "s", "settings": {},
           "steps": [{"id": "u1", "kind": "user", "text": "hi"}]}
    LAXITIES[name](raw)
    with pytest.raises(EpisodeError):
        parse_episode(json.loads(json.dumps(raw)))


@pytest.mark.parametrize("what", ["deeply nested JSON", "a directory"])
def test_load_episode_turns_os_and_recursion_errors_into_episode_errors(what, tmp_path):
    path = tmp_path / "episode.json"
    if what == "a directory":
        path.mkdir()
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(EpisodeError):
        load_episode(path)


# --- bad requests ----------------------------------------------------------------------------

REQUEST_EPISODE = {
    "format": FORMAT, "version": VERSION, "system": "You are a helpful agent.",
    "settings": {"max_new_tokens": 2},
    "steps": [{"id": "u1", "kind": "user", "text": "Ana paid for tea"},
              {"id": "f2", "kind": "tool", "fields": [{"source": "f2.a", "text": "room 12 is blue"},
                                                       {"source": TARGET, "text": "PIN 738215 Quillmere"}]},
              {"id": "m3", "kind": "memory", "records": [{"source": "m3.a", "text": "Ana likes tea"}]},
              {"id": "r4", "kind": "remember"},
              {"id": "u5", "kind": "user", "text": "call Bob at 7"}],
}


@functools.cache
def request_session() -> PersistentSession:
    """One stored session for every bad request (none of them may change it);
    ``m3.a`` is already forgotten, so forgetting it again is the no-op."""
    session = PersistentSession.create(scratch() / "s.db", start(AgentRuntime, parse_episode(REQUEST_EPISODE)))
    session.forget("m3.a")
    return session


SOURCES = ("u1", "f2.a", TARGET, "m3.a", "u5")


def requests() -> st.SearchStrategy[tuple[str, Any]]:
    unknown = st.text(max_size=12).filter(lambda s: s not in SOURCES)
    near = st.sampled_from(SOURCES).flatmap(lambda s: st.sampled_from(
        (s.upper(), s + " ", " " + s, s + "x", s[:-1]))).filter(lambda s: s not in SOURCES)
    return st.one_of(
        st.tuples(st.just("forget"), unknown | near),
        st.tuples(st.just("forget-again"), st.just("m3.a")),
        st.tuples(st.just("forget_many"), st.lists(st.sampled_from(SOURCES), max_size=2).flatmap(
            lambda ok: (unknown | near).map(lambda bad: ok + [bad])).flatmap(st.permutations)),
        st.tuples(st.just("forget_many"), st.just([])),
        st.tuples(st.just("forget_value"), st.text(max_size=16) | st.sampled_from(
            ("Ana", "tea", "a", "12", "738215", "PIN 738215", "Bob!", "?", "quillmere", "likes tea"))),
        st.tuples(st.just("step-duplicate"), st.sampled_from(("u1", "f2", "m3", "r4", "u5"))),
        st.tuples(st.just("step-malformed"), st.sampled_from(("dance", "", "USER", "Memory"))),
    )


@budget(4.0, 60)
@given(request=requests())
def test_bad_requests_change_nothing(request):
    session = request_session()
    runtime = session.runtime
    before = (session.digest(), session.store.record_hash(), _bytes(session))
    what, arg = request
    note(f"{what} {arg!r}")
    if what == "forget":
        with pytest.raises(UnknownSourceError, match="unknown source id"):
            session.forget(arg)
    elif what == "forget-again":
        assert session.forget(arg).already_forgotten
    elif what == "forget_many":
        with pytest.raises((UnknownSourceError, ValueError), match="unknown source id|at least one source"):
            session.forget_many(arg)
    elif what == "forget_value":
        wanted = normalize(arg)
        holders = [i.source for s in runtime.steps for i in s.items if wanted and wanted in normalize(i.text)]
        assume(len(holders) != 1)  # one holder: a valid request, not a bad input
        expected = (ValueError if not wanted else TargetNotFoundError if not holders else AmbiguousTargetError)
        with pytest.raises(expected) as caught:
            session.forget_value(arg)
        if expected is AmbiguousTargetError:
            assert all(repr(h) in str(caught.value) for h in holders)
    elif what == "step-duplicate":
        with pytest.raises(ValueError, match="already observed"):
            session.step(Step(arg, "user", (Item(f"{arg}-new", "again"),)))
    else:
        with pytest.raises(ValueError, match="unknown kind"):
            session.step(Step("new-step", arg, (Item("new-item", "text"),)))
    assert (session.digest(), session.store.record_hash(), _bytes(session)) == before
    session.runtime.check_invariants()
    BAD_INPUTS["requests"] += 1


def _bytes(session: PersistentSession) -> bytes:
    return b"".join(p.read_bytes() for p in session_files(session.store.path))


def test_zz_report_bad_inputs():
    """(Runs after the fuzz properties in this module: prints the counts.)"""
    total = sum(BAD_INPUTS.values())
    print(f"bad inputs tried: {total} ({BAD_INPUTS['episodes']} malformed episodes, {BAD_INPUTS['files']} "
          f"malformed files, {BAD_INPUTS['requests']} bad requests)")
