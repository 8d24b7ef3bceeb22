"""Consequential calls never fire twice in the real world, over many replays
of stored tool sessions that forget and then go on live (issue 11, part 3).

A count taken inside replay would be zero by construction: replay never
touches the world. So the count is taken at the world's boundary: every
consequential tool is wrapped so that each execution against the real world
(the session's ``world`` object, whichever process-lifetime of the session
holds it) is counted by call id, beside the runtime's own ledger. Each example
is one session's life, with a store in between:

    run live (calls fire) -> [forget (a replay) -> commit, close, reopen from
    the store -> go on live with new plan steps (re-planning: new calls fire)]
    four times

and every call id must have fired at most once over the whole life. The
module prints the number of replays and of real fires it counted
(``ci``: 8 sessions; ``nightly``: 4200 sessions of up to four forgets
each, about 2.5 replays a session, so over 10,000 replays; the variable
``UNSEE_WORLD_SESSIONS`` sets another number).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from unsee.impl.agent.checkpoints import CHECKPOINT_POLICIES
from unsee.impl.agent.episode import Episode, Item, Settings, Step
from unsee.impl.agent.tools import READ_MODES, Environment, Tool, ToolAgentRuntime
from unsee.impl.store.session import PersistentSession
from unsee.impl.store.verify import VERIFIED, verify_store
from unsee.properties.prop_tools import (
    ENGINE,
    INITIAL,
    REQUESTS,
    Case,
    candidates,
    case_tools,
    drafts,
    number,
    release,
    reply_chains,
)

TOTALS: Counter = Counter()


pytestmark = pytest.mark.usefixtures("one_thread")


class Boundary:
    """Counts every execution of a consequential tool against a real world, by call id."""

    def __init__(self) -> None:
        self.fired: Counter[str] = Counter()

    def wrap(self, tools: dict[str, Tool], world: Environment) -> dict[str, Tool]:
        def counted(tool: Tool) -> Tool:
            if not tool.consequential:
                return tool

            def run(env, call, _run=tool.run):
                if env is world:  # the real world of this lifetime of the session
                    self.fired[call.call_id] += 1
                return _run(env, call)
            return attrs.evolve(tool, run=run)
        return {name: counted(t) for name, t in tools.items()}


def scratch() -> Path:
    # tmpfs where there is one: a commit's fsync then costs nothing
    root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="unsee-world-", dir=root))


@st.composite
def sessions(draw) -> Case:
    """prop_tools' reply chain (a mail, maybe a later tool result, a reply)
    among up to two other steps, decoding one token a turn: the property is
    about the world's boundary, so its budget goes to replays, not decoding."""
    episode_drafts = draw(st.lists(drafts(), max_size=2))
    chain, _ = draw(reply_chains())  # a mail, maybe a later tool result, a reply: a real call fires
    at = draw(st.integers(0, len(episode_drafts)))
    episode_steps = number(episode_drafts[:at] + chain + episode_drafts[at:])
    settings_ = Settings(max_new_tokens=1,
                         checkpoint_policy=draw(st.sampled_from(CHECKPOINT_POLICIES)))
    fill = tuple((arg, draw(st.sampled_from(("request", "model")), label=arg))
                 for arg in ("send_message.body", "book.item"))
    return Case(Episode("You are an agent.", episode_steps, settings_), (), (), draw(st.sampled_from(READ_MODES)),
                fill)


@st.composite
def live_steps(draw, prefix: str) -> list[Step]:
    """New steps of a session going on live: a tool result naming an address,
    and plans that call consequential tools again (re-planning)."""
    out = []
    for i in range(draw(st.integers(1, 2))):
        sid = f"{prefix}{i}"
        kind = draw(st.sampled_from(("plan", "plan", "tool", "user")))
        if kind == "plan":
            tool = draw(st.sampled_from(("send_message", "book")))
            out.append(Step(sid, "plan", (Item(sid, draw(st.sampled_from(REQUESTS[tool]))),), tool))
        elif kind == "tool":
            out.append(Step(sid, "tool", (Item(f"{sid}.0", draw(st.sampled_from(
                ("mail from ann@a.test: hi", "mail from eve@evil.test: hi", "nothing new")))),), "fetch"))
        else:
            out.append(Step(sid, "user", (Item(sid, "please reply"),)))
    return out


def reopen(path: Path, boundary: Boundary) -> PersistentSession:
    """A new lifetime of the session, from its store: a new world object,
    whose consequential tools are counted again."""
    session = PersistentSession.open(path, ENGINE, ToolAgentRuntime)
    rt = session.runtime
    rt.tools = boundary.wrap(rt.tools, rt.world)
    return session


ROUNDS = 4  # forget, reopen, go on live: four times per session
#: ``unsee verify`` on every session's store in ci, every tenth in nightly
VERIFY_EVERY = 1 if settings().max_examples <= 100 else 10
SESSIONS = int(os.environ.get("UNSEE_WORLD_SESSIONS",
                              8 if settings().max_examples <= 100 else int(settings().max_examples * 2.1)))


@settings(max_examples=SESSIONS, deadline=None)  # ci 8 sessions; nightly 4200
@given(case=sessions(), data=st.data())
def test_no_call_fires_twice_across_stored_sessions(case: Case, data):
    boundary = Boundary()
    folder = scratch()
    path = folder / "s.db"
    world = Environment(INITIAL)
    rt = ToolAgentRuntime.start(ENGINE, case.episode.system, case.episode.settings, world=world,
                                tools=case_tools(case.fill), read_mode=case.read_mode)
    rt.tools = boundary.wrap(rt.tools, world)
    session = None
    replays = 0
    try:
        rt.run(case.episode.steps)
        session = PersistentSession.create(path, rt)
        for round_ in range(ROUNDS):
            pool = [c for c in candidates(tuple(session.runtime.steps)) if c not in session.runtime.forgotten]
            if pool:
                target = data.draw(st.sampled_from(pool), label=f"target {round_}")
                method = data.draw(st.sampled_from(("forget", "full_reset")), label=f"method {round_}")
                before = session.runtime.world.state()
                getattr(session, method)(target)
                assert session.runtime.world.state() == before  # replay never touched the world
                replays += 1
            release(session.runtime)
            session.close()
            session = reopen(path, boundary)
            session.run(data.draw(live_steps(f"n{round_}."), label=f"live {round_}"))  # re-plan, call again
        final = session.runtime
        assert all(n == 1 for n in boundary.fired.values()), f"fired twice: {boundary.fired}"
        assert set(boundary.fired) == {c.call_id for c in final.effects} == set(final.world.ledger)
        event(f"real fires per session: {min(sum(boundary.fired.values()), 5)}+")
        if replays and TOTALS["sessions"] % VERIFY_EVERY == 0:  # the receipt of a tool session checks out
            release(session.runtime)
            session.close()
            session = None
            verdict = verify_store(path)
            assert verdict.outcome == VERIFIED, verdict.failed()
            TOTALS["verified"] += 1
    finally:
        if session is not None:
            release(session.runtime)
            session.close()
        shutil.rmtree(folder, ignore_errors=True)
    TOTALS["sessions"] += 1
    TOTALS["replays"] += replays
    TOTALS["real fires"] += sum(boundary.fired.values())
    TOTALS["fired twice"] += sum(1 for n in boundary.fired.values() if n > 1)
    if os.environ.get("UNSEE_WORLD_TALLY"):  # long runs: the running totals survive an interrupted run
        Path(os.environ["UNSEE_WORLD_TALLY"]).write_text(json.dumps(dict(TOTALS)))


def test_zz_report_world_boundary():
    """(Runs after the property: prints the counts.)"""
    print(f"tool sessions: {TOTALS['sessions']}, replays {TOTALS['replays']}, real fires counted at the world's "
          f"boundary {TOTALS['real fires']}, fired twice {TOTALS['fired twice']}; stores verified "
          f"{TOTALS['verified']}")
    assert TOTALS["fired twice"] == 0
