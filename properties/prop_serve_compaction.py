"""Forget through compaction at the server (issue 52; docs/serve.md, "Long conversations"):
``splice_equals_counterfactual`` and ``replay_cost_is_suffix_length`` on conversations run
through ``unsee serve``'s own code path (its HTTP API, the real ``openai`` client, the tiny model).

Hypothesis draws a stream: 2-4 turns of user items, a compaction point or none before each turn
but the first (a request carrying ``context_management`` with a ``compact_threshold`` every
prompt passes, or a ``POST /v1/responses/compact`` after the turn before), and a target among the
items of a turn before the last. The conversation runs, the target's item is deleted, and:

* forget equals reset: the conversation equals the reset the server runs for a client that
  sends the same requests without the target (digest, and every item listed);
* the invocations are ``T - tau + 1``, the summaries counted as transitions: ``T`` is the turns
  plus the compactions, ``tau`` the target's turn plus the compactions before it, both counted
  on the drawn stream, not read from the runtime.

prop_impl.py checks both statements on library episodes that draw compact steps; this module
checks the server's way to them (a summary decided per request, a replay through the store).
Under ``ci`` a third of the profile's examples (20): 21 s of examples on 2 cores shared with
other runs (load average 17), beside the tiny model's load and the server's start.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from unsee import Settings
from unsee.impl.serve.pool import Pool
from unsee.impl.serve.server import ServerThread
from unsee.properties.engines import make_engine
from unsee.properties.strategies import scaled_settings

pytestmark = pytest.mark.usefixtures("one_thread")

#: every prompt passes it: a request carrying it compacts first (where a summary may run)
ALWAYS = [{"type": "compaction", "compact_threshold": 1}]
WORDS = ("ada", "oslo", "ferry", "tide", "liv", "vault", "code", "north")
POINTS = ("threshold", "endpoint", None)


@attrs.frozen
class Stream:
    """Turns of user items (turn ``n``'s item ``k`` has id ``i{n}_{k}``), each turn's compaction
    point (None for the first), and the target, ``(turn, item)``."""

    turns: tuple[tuple[str, ...], ...]
    points: tuple[str | None, ...]
    target: tuple[int, int]

    @property
    def target_id(self) -> str:
        return "i{}_{}".format(*self.target)

    @property
    def length(self) -> int:
        """T: every turn and every summary is a transition."""
        return len(self.turns) + sum(p is not None for p in self.points)

    @property
    def tau(self) -> int:
        """The step that observed the target: its turn, after the summaries before it."""
        turn = self.target[0]
        return turn + 1 + sum(p is not None for p in self.points[:turn + 1])


@st.composite
def streams(draw) -> Stream:
    texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
    turns = [draw(st.lists(texts, min_size=1, max_size=2)) for _ in range(draw(st.integers(2, 4)))]
    points = (None, *(draw(st.sampled_from(POINTS)) for _ in turns[1:]))
    # the target's turn is not the last (a summary may come after it), and never holds the target
    # alone: the reset then sends that turn too, so the turns line up
    turn = draw(st.integers(0, len(turns) - 2))
    if len(turns[turn]) == 1:
        turns[turn].append(draw(texts))
    target = (turn, draw(st.integers(0, len(turns[turn]) - 1)))
    return Stream(tuple(map(tuple, turns)), points, target)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    pool = Pool(make_engine("tiny"), tmp_path_factory.mktemp("serve-compaction"), defaults=Settings(max_new_tokens=3))
    with ServerThread(pool, "tiny") as srv:
        yield openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)


def run_stream(client, stream: Stream, without: str | None = None) -> str:
    """The stream as requests on a new conversation, leaving out the item ``without``."""
    conv = client.conversations.create(items=[{"role": "system", "content": "Be brief."}]).id
    latest = None
    for n, (turn, point) in enumerate(zip(stream.turns, stream.points)):
        if point == "endpoint":
            client.responses.compact(model="tiny", previous_response_id=latest)
        items = [{"type": "message", "role": "user", "content": text, "id": f"i{n}_{k}"}
                 for k, text in enumerate(turn) if f"i{n}_{k}" != without]
        extra = {"context_management": ALWAYS} if point == "threshold" else {}
        latest = client.responses.create(model="tiny", conversation=conv, input=items, **extra).id
    return conv


def get_state(client, conv: str) -> tuple[str, list[dict]]:
    digest = client.conversations.retrieve(conv).model_extra["unsee"]["digest"]
    return digest, [i.model_dump(exclude_none=True) for i in client.conversations.items.list(
        conv, order="asc", limit=100).data]


@given(stream=streams())
@scaled_settings(1 / 3)
def test_forget_through_summaries_equals_reset_at_the_server(client, stream):
    """splice_equals_counterfactual and replay_cost_is_suffix_length through the server."""
    turn = stream.target[0]
    event(f"summaries before tau: {sum(p is not None for p in stream.points[:turn + 1])}")
    event(f"summaries after tau: {sum(p is not None for p in stream.points[turn + 1:])}")
    conv = run_stream(client, stream)
    gone = client.conversations.items.delete(stream.target_id, conversation_id=conv).model_extra
    report = gone["report"]
    assert gone["status"] == "completed"
    assert (report["tau"], report["length"]) == (stream.tau, stream.length), (stream, report)
    assert report["invocations"] == stream.length - stream.tau + 1, (stream, report)
    reset = run_stream(client, stream, without=stream.target_id)
    assert get_state(client, conv) == get_state(client, reset), stream
