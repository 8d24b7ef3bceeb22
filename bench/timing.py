"""Where a forget's wall time goes, measured (issue 22, item 2).

:func:`time_engine` times, while it is open, every engine verb a runtime
calls and every model forward inside them, and sorts the time into
:data:`CATEGORIES`:

* ``restore``: the verbs that set up lineages (:data:`RESTORE_VERBS`:
  ``fork``, ``excise``, ``new_lineage``, ``drop``; ``rebuild`` and ``crop``
  are made of them): a forget's restore of its checkpoint, and a reset's new
  session;
* ``prefill``: forwards of ``prefill`` called by the runtime (observations,
  turn headers, turns committed as one chunk), and on llama.cpp the chunks a
  prefill left pending, computed together later (``LineageBook._flush``,
  inside whichever verb reads the KV first), a decoded turn's last token among
  them (``LineageBook._commit_decoded``);
* ``decode``: one-token forwards inside ``generate`` (decode steps, probes);
* ``verification``: forwards of more than one token inside ``generate``
  (a draft's verification, a decided token fed with its context guesses);
* ``canonical``: the prefill ``generate`` makes of a decoded turn to commit it
  as its canonical chunk (the engine's forward hook reports it apart:
  ``hook_forwards``' ``on_commit``);
* ``engine_other``: time inside engine verbs outside any forward (sampling,
  the margin guard, KV copies and bookkeeping);
* ``digest``: ``digest`` (the final state's hash);
* ``runtime``: everything else between the span's start and end: the agent
  runtime, provenance, checkpoints, the report.

Forwards are seen through the engine's forward hook
(:class:`~unsee.impl.engines.protocol.ForwardHooks`: the lineage book reports
every forward of its KV backend, and the one that commits a decoded turn
apart); on an engine whose forwards run inside requests (vLLM), forwards are
not split from their verb and the ``forwards`` count stays 0. The verbs'
wrappers are instance attributes, removed when the span closes; they add a
few microseconds a call, which the breakdown's ``runtime`` carries.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

from unsee.impl.engines.protocol import ForwardHooks, SpanExcision
from unsee.impl.eval.report import render_table

CATEGORIES = ("restore", "prefill", "decode", "verification", "canonical", "engine_other", "digest", "runtime")
#: Verbs whose time, outside forwards, is a lineage set-up (``restore``).
RESTORE_VERBS = ("fork", "excise", "new_lineage", "drop")
#: ``_flush``: the book's pending chunks, computed inside another verb, are prefill
TIMED_VERBS = RESTORE_VERBS + ("prefill", "generate", "digest", "_flush")


class Breakdown:
    """Seconds, forwards and tokens per category (:data:`CATEGORIES`).

    ``stack`` holds the verbs running now, each as ``[verb, seconds of its
    children]``: a verb's own time is its wall time less its children's
    (forwards, and verbs it calls), so every second is counted once."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.forwards = dict.fromkeys(CATEGORIES, 0)
        self.tokens = dict.fromkeys(CATEGORIES, 0)
        self.total_s = 0.0
        self.stack: list[list] = []

    def get_forward_category(self, n_tokens: int, commit: bool = False) -> str:
        """Which category a forward of ``n_tokens`` belongs to, from the verbs
        it runs under (``commit``: the forward that commits a decoded turn)."""
        verbs = [frame[0] for frame in self.stack]
        if verbs and verbs[-1] == "_flush":
            return "prefill"
        if "generate" in verbs:
            if commit:
                return "canonical"
            return "decode" if n_tokens == 1 else "verification"
        if verbs and verbs[-1] == "prefill" and len(verbs) == 1:
            return "prefill"
        return "restore"  # rebuild prefills its chunks itself

    def add_child(self, seconds: float) -> None:
        if self.stack:
            self.stack[-1][1] += seconds

    def to_json(self) -> dict:
        return {"total_s": self.total_s, "seconds": dict(self.seconds), "forwards": dict(self.forwards),
                "tokens": dict(self.tokens)}


def _verb_category(verb: str) -> str:
    if verb in RESTORE_VERBS:
        return "restore"
    return "digest" if verb == "digest" else "engine_other"


def _wrap_verb(engine, verb: str, out: Breakdown) -> None:
    method = getattr(engine, verb)

    @functools.wraps(method)
    def timed(*args, **kwargs):
        frame = [verb, 0.0]
        out.stack.append(frame)
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            out.stack.pop()
            out.seconds[_verb_category(verb)] += spent - frame[1]
            out.add_child(spent)

    setattr(engine, verb, timed)


def _time_forward(out: Breakdown, n_tokens: int, started: float, commit: bool = False) -> None:
    spent = time.perf_counter() - started
    category = out.get_forward_category(n_tokens, commit)
    out.seconds[category] += spent
    out.forwards[category] += 1
    out.tokens[category] += n_tokens
    out.add_child(spent)


@contextlib.contextmanager
def _hook_forwards(engine, out: Breakdown) -> Iterator[None]:
    if not isinstance(engine, ForwardHooks):  # an engine that reports no forward
        yield
        return
    with engine.hook_forwards(lambda n_tokens, started: _time_forward(out, n_tokens, started),
                              on_commit=lambda n_tokens, started: _time_forward(out, n_tokens, started, True)):
        yield


@contextlib.contextmanager
def time_engine(engine) -> Iterator[Breakdown]:
    """Time every engine verb and model forward while open; the yielded
    :class:`Breakdown` is complete when the block exits."""
    out = Breakdown()
    verbs = [v for v in TIMED_VERBS if (v != "excise" or isinstance(engine, SpanExcision)) and hasattr(engine, v)]
    started = time.perf_counter()
    try:
        with _hook_forwards(engine, out):
            for verb in verbs:
                _wrap_verb(engine, verb, out)
            try:
                yield out
            finally:
                for verb in verbs:
                    engine.__dict__.pop(verb, None)
    finally:
        out.total_s = time.perf_counter() - started
        out.seconds["runtime"] = max(out.total_s - sum(v for k, v in out.seconds.items() if k != "runtime"), 0.0)


#: What each category holds, for the report.
CATEGORY_NOTES = {
    "restore": "lineage set-up: the forget's restore of its checkpoint (fork), a reset's new lineage",
    "prefill": "forwards of prefill: observations, turn headers, turns committed whole (llama.cpp: with a turn's last token)",
    "decode": "one-token forwards inside generate: decode steps, probes",
    "verification": "multi-token forwards inside generate: draft verification, tokens fed with context guesses",
    "canonical": "a decoded turn's re-prefill as its canonical chunk",
    "engine_other": "engine verbs outside forwards: sampling, the margin guard, cache bookkeeping",
    "digest": "the final state's digest",
    "runtime": "everything outside engine verbs: the runtime, provenance, checkpoints, the report",
}


def render_breakdown(table: dict) -> list[str]:
    """Markdown: where B7's and B5's time goes (their ``breakdown``, one
    profiled run each), beside the compute floor's wall and counts."""
    methods = {m: table["methods"][m]["breakdown"] for m in ("replay", "reset")
               if "breakdown" in table["methods"].get(m, {})}
    if not methods:
        return []
    floor = table.get("floor")
    names = {"replay": "B7 forget", "reset": "B5 reset"}
    header = ["category"] + [h for m in methods for h in (f"{names[m]} s", "share", "forwards / tokens")] + ["what"]
    rows = []
    for category in CATEGORIES:
        row = [category]
        for b in methods.values():
            row += [f"{b['seconds'][category]:.2f}", f"{b['seconds'][category] / max(b['total_s'], 1e-9):.0%}",
                    f"{b['forwards'][category]} / {b['tokens'][category]}" if b["forwards"][category] else "-"]
        rows.append(row + [CATEGORY_NOTES[category]])
    rows.append(["total"] + [c for b in methods.values() for c in (f"{b['total_s']:.2f}", "100%", "-")] + [""])
    intro = ("Where the time goes (one more run of each under `bench/timing.py`'s counters, outside the timed "
             "rounds; forwards timed by the engine's forward hook, around each forward of its KV backend):")
    lines = [intro, ""]
    lines += render_table(header, rows)
    if floor:
        lines += ["", (f"The compute floor for comparison: {floor['wall_p50_s']:.2f} s p50, {floor['prefilled']} "
                       f"prefilled tokens and {floor['decoded']} decoded, {floor['forwards']} forwards (suffix "
                       "prefill plus the changed tokens' decode only).")]
    return lines + [""]
