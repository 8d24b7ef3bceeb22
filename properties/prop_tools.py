"""Properties of the tool layer under repeated forgets (assumption A3).

Generated episodes mix user turns, tool results (some carrying addresses),
memory and plan steps over four tools, on the tiny model. Tiny generation is
garbage text, so argument parsing is total and deterministic, and most
arguments are filled by the scaffold from observations: the ``to`` of
``send_message`` is the last address in the latest tool result, and the other
arguments come from the plan step's request text (``body`` sometimes from the
model instead). That makes consequential calls depend on the forget target
when, and only when, the target reaches them through what the agent observed.

For every example, across the original run and every forget (selective
replay or full reset, drawn per forget):

1. at most once: each consequential call ID fires at most once in the real
   environment (counted by wrapping the tools, independently of the ledger),
   and exactly the committed calls fired;
2. the real environment is unchanged by every forget;
3. the report's divergence list is exactly the set of committed calls that
   differ from the counterfactual's, computed independently: the
   counterfactual episode (every target so far removed) runs on a fresh
   runtime with a fresh environment, and its calls are diffed against the
   real committed log;
4. the counterfactual environment: the shadow the forget ended in equals the
   fresh twin's environment, the runtime's texts equal the twin's, and where no
   divergence exists the real environment and the state digest equal the
   twin's too; otherwise the real and twin environments differ only at keys
   written by divergent calls.

(3) and (4) are claimed where replay is exact: read-only tools re-executed
against restored snapshots, or served from recorded observations when no
forget so far found a divergence (a recorded observation is the real world's,
which a divergent side effect changed). A second property interleaves new
steps between two forgets: after a forget with divergences, the real world
the later steps ran in is not the twin's, so there only (1), (2) and the
report's self-consistency are claimed.
"""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from unsee.impl.agent.checkpoints import CHECKPOINT_POLICIES
from unsee.impl.agent.episode import Episode, Item, Settings, Step
from unsee.impl.agent.tools import READ_MODES, Environment, Tool, ToolAgentRuntime, default_tools, result_source
from unsee.properties.engines import make_engine

ENGINE = make_engine("tiny")  # one engine per module


#: One intra-op thread for this module's model calls, restored after
#: (properties/conftest.py). The tiny model gains nothing from threads, and on
#: a shared 2-core machine OpenMP's spinning workers made examples 10-100x
#: slower. Every comparison runs both sides inside one example, under one
#: thread count.
pytestmark = pytest.mark.usefixtures("one_thread")

ADDRESSES = ("ann@a.test", "bob@b.test", "eve@evil.test")
INITIAL = {"k0": "contact bob@b.test", "k1": "see eve@evil.test", "k2": "nothing"}
TOOL_TEXTS = tuple(f"mail from {a}: hi" for a in ADDRESSES) + ("nothing new", "k1 changed")
REQUESTS = {"send_message": ("body=hi", "body=bye", ""),
            "book": ("item=room, date=fri", "item=car", ""),
            "fetch": ("key=k0", "key=k1", "key=k2"),
            "search": ("query=outbox", "query=bob", "query=evil")}
KINDS = ("user", "tool", "tool", "tool", "plan", "plan", "plan", "plan", "memory", "compact")


def scaled(fraction: float, floor: int = 3) -> settings:
    """A fraction of the active profile's ``max_examples`` (ci: 60)."""
    return settings(max_examples=max(floor, int(settings().max_examples * fraction)))


# --- episodes -------------------------------------------------------------------


@attrs.frozen
class Draft:
    """A step before numbering: kind, item texts, tool."""

    kind: str
    texts: tuple[str, ...] = ()
    tool: str | None = None


@st.composite
def drafts(draw) -> Draft:
    kind = draw(st.sampled_from(KINDS))
    if kind == "user":
        return Draft("user", (draw(st.sampled_from(("hello", "please reply"))),))
    if kind == "tool":
        return Draft("tool", tuple(draw(st.lists(st.sampled_from(TOOL_TEXTS), min_size=1, max_size=2))), "fetch")
    if kind == "plan":
        tool = draw(st.sampled_from(tuple(REQUESTS)))
        return Draft("plan", (draw(st.sampled_from(REQUESTS[tool])),), tool)
    if kind == "memory":
        return Draft("memory", ("likes tea",))
    return Draft(kind)


@st.composite
def reply_chains(draw) -> tuple[list[Draft], int]:
    """A genuine mail, then maybe a later tool result (the likely target: it
    names another address, or none), then a reply. Returns the drafts and the
    index of the later tool result (-1 if none)."""
    chain = [Draft("tool", (draw(st.sampled_from(TOOL_TEXTS[:3])),), "fetch")]
    later = draw(st.sampled_from(("none",) + TOOL_TEXTS))
    if later != "none":
        chain.append(Draft("tool", (later,), "fetch"))
    chain.append(Draft("plan", (draw(st.sampled_from(REQUESTS["send_message"])),), "send_message"))
    return chain, len(chain) - 2 if later != "none" else -1


def number(episode_drafts: list[Draft]) -> tuple[Step, ...]:
    """Step ids ``s0, s1, ...``; item sources ``s{i}.{j}`` (user and plan: the step id)."""
    out = []
    for i, d in enumerate(episode_drafts):
        sid = f"s{i}"
        if d.kind in ("user", "plan"):
            items = (Item(sid, d.texts[0]),)
        else:
            items = tuple(Item(f"{sid}.{j}", t) for j, t in enumerate(d.texts))
        out.append(Step(sid, d.kind, items, d.tool))
    return tuple(out)


@st.composite
def episodes_with_preferred_target(draw) -> tuple[tuple[Step, ...], str | None]:
    """1-5 random steps, plus (often) a reply chain inserted among them; the
    chain's later tool result is the preferred first target."""
    episode_drafts = draw(st.lists(drafts(), min_size=1, max_size=5))
    preferred = None
    if draw(st.booleans()):
        chain, later = draw(reply_chains())
        at = draw(st.integers(0, len(episode_drafts)))
        episode_drafts[at:at] = chain
        if later >= 0:
            preferred = f"s{at + later}.0"
    if not any(d.kind == "plan" for d in episode_drafts):
        episode_drafts.append(Draft("plan", ("body=hi",), "send_message"))
    return number(episode_drafts), preferred


def candidates(episode_steps: tuple[Step, ...]) -> list[str]:
    """Source ids a forget may name: observed items and call results."""
    out = [i.source for s in episode_steps for i in s.items]
    out += [result_source(f"{s.id}/call") for s in episode_steps if s.kind == "plan"]
    return out


@attrs.frozen
class Case:
    episode: Episode
    targets: tuple[str, ...]
    methods: tuple[str, ...]
    read_mode: str
    fill: tuple[tuple[str, str], ...]  # (tool.param, filler) for the model-or-request arguments


@st.composite
def cases(draw) -> Case:
    episode_steps, preferred = draw(episodes_with_preferred_target())
    settings_ = Settings(max_new_tokens=4, checkpoint_policy=draw(st.sampled_from(CHECKPOINT_POLICIES)))
    targets = draw(st.lists(st.sampled_from(candidates(episode_steps)), min_size=1, max_size=3, unique=True))
    if preferred is not None and draw(st.booleans(), label="forget the later tool result first"):
        targets = [preferred] + [t for t in targets if t != preferred][:2]
    methods = draw(st.lists(st.sampled_from(("forget", "full_reset")), min_size=len(targets),
                            max_size=len(targets)))
    fill = tuple((arg, draw(st.sampled_from(("request", "model")), label=arg)) for arg in ("send_message.body",
                                                                                         "book.item"))
    return Case(Episode("You are an agent.", episode_steps, settings_), tuple(targets), tuple(methods),
                draw(st.sampled_from(READ_MODES)), fill)


# --- tools that count real executions --------------------------------------------


class Counted:
    """The tools of a case, wrapped so that every execution of a consequential
    tool against the real world is counted here, beside the runtime's ledger."""

    def __init__(self, fill: tuple[tuple[str, str], ...]):
        self.world = Environment(INITIAL)
        self.fired: Counter[str] = Counter()
        self.tools = {name: self._wrap(tool) for name, tool in case_tools(fill).items()}

    def _wrap(self, tool: Tool) -> Tool:
        if not tool.consequential:
            return tool

        def run(env, call, _run=tool.run):
            if env is self.world:
                self.fired[call.call_id] += 1
            return _run(env, call)
        return attrs.evolve(tool, run=run)


def case_tools(fill: tuple[tuple[str, str], ...]) -> dict[str, Tool]:
    """Scaffold-filled arguments (``to`` from the latest tool result, the rest
    from the request), except those ``fill`` hands to the model's plan text."""
    tools = default_tools()
    tools["book"] = tools["book"].with_fill(item="request", date="request")
    tools["fetch"] = tools["fetch"].with_fill(key="request")
    tools["search"] = tools["search"].with_fill(query="request")
    tools["send_message"] = tools["send_message"].with_fill(body="request")
    for arg, filler in fill:
        name, param = arg.split(".")
        tools[name] = tools[name].with_fill(**{param: filler})
    return tools


def counterfactual(case: Case, forgotten: list[str], tools) -> ToolAgentRuntime:
    """A twin that never saw ``forgotten``: a fresh runtime, a fresh environment."""
    gone = set(forgotten)
    cf_steps = tuple(attrs.evolve(s, items=tuple(i for i in s.items if i.source not in gone))
                     for s in case.episode.steps)
    return ToolAgentRuntime.from_episode(ENGINE, attrs.evolve(case.episode, steps=cf_steps),
                                         world=Environment(INITIAL), tools=tools, read_mode=case.read_mode,
                                         withheld=[s for s in forgotten if s.endswith("/result")])


def expected_divergences(committed, twin_calls) -> set:
    """The independent diff: (call id, kind, committed args, counterfactual args)."""
    real = {c.call_id: (c.tool, dict(c.args)) for c in committed}
    twin = {c.call_id: (c.tool, dict(c.args)) for c in twin_calls if c.consequential}
    out = set()
    for cid in real.keys() | twin.keys():
        if cid in real and cid in twin:
            if real[cid] != twin[cid]:
                out.add((cid, "changed_arguments", _key(real[cid]), _key(twin[cid])))
        elif cid in real:
            out.add((cid, "not_made", _key(real[cid]), None))
        else:
            out.add((cid, "new_call", None, _key(twin[cid])))
    return out


def _key(version) -> tuple | None:
    if version is None:
        return None
    tool, args = version
    return (tool, tuple(sorted(args.items())))


def reported(report) -> set:
    out = set()
    for d in report.extra.fields["divergences"]:
        versions = [None if d[s] is None else _key((d[s]["tool"], d[s]["args"])) for s in ("committed",
                                                                                           "counterfactual")]
        out.add((d["call_id"], d["kind"], *versions))
    return out


def release(*runtimes: ToolAgentRuntime) -> None:
    """Free the caches of runtimes a property is done with."""
    for rt in runtimes:
        for lineage in rt.checkpoints.lineages() | {rt.lineage}:
            if lineage in ENGINE.budget.lineages:
                ENGINE.drop(lineage)


def check_fired_once(counted: Counted, rt: ToolAgentRuntime) -> None:
    assert all(n == 1 for n in counted.fired.values()), counted.fired
    assert set(counted.fired) == {c.call_id for c in rt.effects}
    assert rt.world.executions == counted.fired


def check_report_shape(report) -> None:
    divergences = report.extra.fields["divergences"]
    assert report.assumptions["A3"]["holds"] is (not divergences)
    for d in divergences:
        assert f"{d['call_id']} ({d['kind']})" in report.assumptions["A3"]["why"]
        assert (d["committed"] is None) == (d["kind"] == "new_call")
        assert (d["counterfactual"] is None) == (d["kind"] == "not_made")
        if d["counterfactual"] is not None:
            assert d["counterfactual"]["sent"] is False  # nothing divergent is ever sent by a forget
    assert report.extra.fields["held"] == [d["call_id"] for d in divergences if d["kind"] == "new_call"]
    assert report.extra.fields["world"]["unchanged"]


def check_against_twin(case: Case, rt: ToolAgentRuntime, report, twin: ToolAgentRuntime) -> None:
    expected = expected_divergences(rt.effects, twin.calls)
    assert reported(report) == expected
    assert rt.texts() == twin.texts()
    assert rt.shadow.state() == twin.world.state()  # the counterfactual environment
    if not expected:
        assert rt.world.state() == twin.world.state()
        assert rt.digest() == twin.digest()
    else:
        divergent = {d[0] for d in expected}
        for key in rt.world.state().keys() | twin.world.state().keys():
            if rt.world.get(key) != twin.world.get(key):
                assert any(key.endswith(f"/{cid}") for cid in divergent), key


# --- properties -----------------------------------------------------------------------


@scaled(1.0)
@given(cases())
def test_repeated_forgets_fire_once_and_report_exact_divergences(case: Case):
    counted = Counted(case.fill)
    rt = ToolAgentRuntime.from_episode(ENGINE, case.episode, world=counted.world, tools=counted.tools,
                                       read_mode=case.read_mode)
    check_fired_once(counted, rt)
    world_after_run = rt.world.state()
    forgotten: list[str] = []
    clean_so_far = True
    try:
        for target, method in zip(case.targets, case.methods):
            report = getattr(rt, method)(target)
            forgotten.append(target)
            check_fired_once(counted, rt)
            assert rt.world.state() == world_after_run
            check_report_shape(report)
            clean_so_far = clean_so_far and not report.extra.fields["divergences"]
            for d in report.extra.fields["divergences"]:
                event(f"divergence: {d['kind']}")
            event(f"{method}: {'A3 holds' if not report.extra.fields['divergences'] else 'A3 fails'}")
            if case.read_mode == "reexecute" or clean_so_far:
                twin = counterfactual(case, forgotten, counted.tools)
                try:
                    check_against_twin(case, rt, report, twin)
                finally:
                    release(twin)
    finally:
        release(rt)


@scaled(0.5)
@given(cases(), st.data())
def test_forget_then_continue_then_forget(case: Case, data):
    """New real steps run between two forgets; call IDs still fire at most once."""
    plain = [s for s in case.episode.steps]
    split = data.draw(st.integers(1, len(plain)), label="split")
    first_pool = candidates(tuple(plain[:split]))
    first = data.draw(st.sampled_from(first_pool), label="first") if first_pool else None
    rest = [c for c in candidates(case.episode.steps) if c != first]
    second = data.draw(st.sampled_from(rest), label="second") if rest else None
    counted = Counted(case.fill)
    rt = ToolAgentRuntime.start(ENGINE, case.episode.system, case.episode.settings, world=counted.world,
                                tools=counted.tools, read_mode=case.read_mode)
    try:
        rt.run(plain[:split])
        forgotten, clean_before = [], True
        for target, method, steps_after in ((first, case.methods[0], plain[split:]), (second, "forget", [])):
            if target is not None:
                before = rt.world.state()
                report = getattr(rt, method)(target)
                forgotten.append(target)
                assert rt.world.state() == before
                check_report_shape(report)
                assert reported(report) == expected_divergences(rt.effects, rt.calls)  # self-consistent
                clean = not report.extra.fields["divergences"]
                event(f"continued forget {len(forgotten)}: {'A3 holds' if clean else 'A3 fails'}")
                # exact only if no earlier forget diverged: the later steps then ran in the twin's world
                if clean_before and (case.read_mode == "reexecute" or clean):
                    twin = counterfactual(attrs.evolve(case, episode=attrs.evolve(
                        case.episode, steps=tuple(rt.steps))), forgotten, counted.tools)
                    try:
                        check_against_twin(case, rt, report, twin)
                    finally:
                        release(twin)
                clean_before = clean_before and clean
            rt.run(steps_after)
            check_fired_once(counted, rt)
    finally:
        release(rt)
