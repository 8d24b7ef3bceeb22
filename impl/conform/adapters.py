"""Four implementations of the conformance contract (docs/conformance.md).

Each is a Python entry point ``fn(episode_path, forget) -> dict`` that
``unsee conform --entry unsee.impl.conform.adapters:NAME`` calls in-process,
and a command, ``python -m unsee.impl.conform.adapters NAME [--model M]
--episode FILE --out FILE [--forget SOURCE]``, that ``unsee conform -- CMD``
runs as a subprocess:

============== ================================================================
``reference``  our runtime: ``forget`` is Algorithm 1, ``reset`` is B5. Conforms.
``memory``     forget deletes the target's memory-store records and nothing else
               (B1, :func:`~unsee.impl.methods.baselines.delete_memory_records`); it
               reports what it did (no transition re-run). Must be rejected.
``redaction``  forget drops the target's source block and rebuilds the cache,
               keeping every model turn derived from it (B3,
               :func:`~unsee.impl.methods.baselines.redact_source`), while it reports
               the tau, boundary and invocations a correct forget has. A check
               on counts alone passes it; must be rejected.
``self-consistent``
               forget is Algorithm 1 and reset is B5, each followed by the same
               forget log: a system note, appended to the context, naming the
               source and a fingerprint of its text (a derived artifact of the
               target). Its forget equals its own reset exactly (turns and
               digest) and every count is right; only the comparison with the
               plain run of the counterfactual episode catches it. Must be rejected.
``vllm``       ``reference`` on the vLLM engine (impl/engines/vllm/; ``tiny`` is
               vllm-tiny). Declares its own engine (``unsee-vllm``). Conforms.
``checkpoint-history``
               the reference, also keeping each step's context in an append-only
               checkpoint log its forget never reads: rejected by ``residue`` alone.
``uncommitted``
               the reference, forgetting in memory only: rejected by ``reopen``
               (and ``residue``: its store still holds the target).
``resync``     the reference, whose second forget rebuilds from its input log:
               rejected by ``idempotent`` alone.
``tools``      our runtime with its tool layer (consequential calls, shadow
               replay): conforms, ``effects once`` included.
``refire``     ``tools`` whose replay calls the consequential tools live:
               rejected by ``effects once`` alone.
``span-excision``
               cuts only the target's own KV rows out of the live cache and keeps
               every later position and turn (reporting correct counts): rejected
               by the attended-span checks by name (suite 1.1.0).
============== ================================================================

``reference`` and the three after ``vllm`` run on a session store and report
what they keep (``kept``), the reopened session and a second forget.

The first four declare the engine :data:`~unsee.impl.conform.harness.REFERENCE_ENGINE` and
the model they load, so the harness also compares their plain runs' tokens
with its own reference.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from unsee.impl.agent.episode import Episode, load_episode
from unsee.impl.agent.render import render
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.conform.contract import REFERENCE_ENGINE, make_answer
from unsee.impl.engines.registry import make_engine
from unsee.impl.methods.baselines import delete_memory_records, excise_span, redact_source
from unsee.impl.store.records import session_files
from unsee.impl.store.session import PersistentSession
from unsee.impl.util.ids import ANSWER, NOTE, PLAN, get_block_part, get_step_id

#: The suffixes of the block ids the runtime gives its decoded model turns
#: (``<step id>/answer``, ``/plan``, ``/note``); a compaction's re-prefilled
#: summary (``/context``) is not a decoded turn.
TURN_SUFFIXES = (ANSWER, PLAN, NOTE)


class ModelCache:
    """The models the adapters loaded, at most ``size`` of them: a load costs
    more than a tiny episode, so a process keeps the model it answers with;
    a request for another one releases the oldest (an unbounded cache held
    every model a long-lived process ever loaded, issue 28)."""

    def __init__(self, size: int = 1):
        self.size = size
        self._models: dict[tuple[str, str], object] = {}

    def __len__(self) -> int:
        return len(self._models)

    def get(self, backend: str, model: str, load: Callable[[], object]) -> object:
        key = (backend, model)
        if key not in self._models:
            while len(self._models) >= self.size:  # release before loading: two models need not fit at once
                del self._models[next(iter(self._models))]
            self._models[key] = load()
        return self._models[key]

    def clear(self) -> None:
        self._models.clear()


#: The adapters' models in this process (one at a time).
MODELS = ModelCache()


def _load(model: str):
    from unsee.impl.engines.hf.models import load_model

    return MODELS.get("transformers", model, lambda: load_model(model))


def get_turns(runtime: AgentRuntime) -> dict[str, list[int]]:
    """The contract's ``turns``: per step id, the token ids its model turn
    decoded (the assistant header the runtime prefilled is not part of them)."""
    turns = {}
    for block in runtime.graph.blocks():
        step_id = get_step_id(block.id)
        if get_block_part(block.id) in TURN_SUFFIXES and block.type != "memory_record":
            header = block.chunks[0] if block.chunks else 0
            turns[step_id] = list(block.tokens[header:])
    return turns


def _load_other(backend: str, model: str):
    """Another backend's model (vLLM), kept like :func:`_load`: it declares its own
    engine, so the harness compares it with its own counterfactual runs only."""
    from unsee.impl.engines.registry import load_model_for

    return MODELS.get(backend, model, lambda: load_model_for(backend, model))


def _state(runtime: AgentRuntime) -> dict:
    return {"turns": get_turns(runtime), "digest": runtime.digest()}


def _run_fields(runtime: AgentRuntime) -> dict:
    """The contract's ``run`` of a runtime that checkpoints: T, turns, digest, checkpoints."""
    return {"T": runtime.t, **_state(runtime), "checkpoints": [c.boundary for c in runtime.checkpoints.all()]}


#: A forget as an adapter performs it: it changes the runtime and returns
#: what it reports (``tau``, ``boundary``, ``invocations``).
Forget = Callable[[AgentRuntime, str], dict]
#: A full reset as an adapter performs it: it changes the runtime and
#: returns the transitions it ran.
Reset = Callable[[AgentRuntime, str], int]


def _reset(runtime: AgentRuntime, source: str) -> int:
    return runtime.full_reset(source).invocations


def _answer(episode_path: str, forget: str | None, model: str, name: str, forget_with: Forget,
            reset_with: Reset = _reset, backend: str = "transformers") -> dict:
    """Run the episode; with ``forget``, forget on one copy (``forget_with``)
    and reset another (``reset_with``, B5 unless said), both from the same state."""
    with _one_thread():
        return _run(episode_path, forget, model, name, forget_with, reset_with, backend)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread for the block, then the caller's count again: the
    harness's reference answers in-process with the same count as an adapter
    in a subprocess (same reductions, same bits), and one thread is also the
    fast choice on a shared CPU (properties/differential.py, torch_threads)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run(episode_path: str, forget: str | None, model: str, name: str, forget_with: Forget,
         reset_with: Reset, backend: str = "transformers") -> dict:

    episode = load_episode(episode_path)
    engine = make_engine(_load(model) if backend == "transformers" else _load_other(backend, model))
    runtime = AgentRuntime.from_episode(engine, episode)
    run = _run_fields(runtime)
    declared = REFERENCE_ENGINE if backend == "transformers" else f"unsee-{backend}"
    out = make_answer(name, declared, model, run)
    if forget is None:
        return out
    twin = runtime.fork()
    claimed = forget_with(runtime, forget)
    invocations = reset_with(twin, forget)
    out["forget"] = {"source": forget, **claimed, "digest_before": run["digest"],
                     "digest_after": runtime.digest(), "turns": get_turns(runtime)}
    out["reset"] = {"invocations": invocations, "digest_before": run["digest"],
                    "digest_after": twin.digest(), "turns": get_turns(twin)}
    return out


def _forget(runtime: AgentRuntime, source: str) -> dict:
    report = runtime.forget(source)
    return {"tau": report.tau, "boundary": report.boundary, "invocations": report.invocations}


def _get_tau(runtime: AgentRuntime, source: str) -> int:
    return min(b.turn for b in runtime.graph.locate_source(source))


def _memory_delete(runtime: AgentRuntime, source: str) -> dict:
    tau = _get_tau(runtime, source)
    delete_memory_records(runtime, source, None)
    # what B1 did: no transition re-run, as if restored at T
    return {"tau": tau, "boundary": runtime.t, "invocations": 0}


def _source_redaction(runtime: AgentRuntime, source: str) -> dict:
    # What a correct forget would report (tau, the latest checkpoint before
    # it, T - boundary), taken from the runtime's own graph and checkpoints
    # before the redaction changes anything.
    tau = _get_tau(runtime, source)
    boundary = runtime.checkpoints.latest_before(tau).boundary
    redact_source(runtime, source, None)
    return {"tau": tau, "boundary": boundary, "invocations": runtime.t - boundary}


def _span_excision(runtime: AgentRuntime, source: str) -> dict:
    # The counts a correct forget reports (as ``_source_redaction``), then the
    # target's own KV rows cut out of the live cache: every later position's KV
    # and every later turn stay as computed while the target was in context.
    tau = _get_tau(runtime, source)
    boundary = runtime.checkpoints.latest_before(tau).boundary
    excise_span(runtime, source, None)
    return {"tau": tau, "boundary": boundary, "invocations": runtime.t - boundary}


#: The block id of the ``self-consistent`` adapter's forget log (no ``/``:
#: :func:`get_turns` never reads it as a turn).
FORGET_LOG = "forget-log"


def get_fingerprint(runtime: AgentRuntime, source: str) -> str:
    """A short hash of every text the runtime observed from ``source``: what
    a forget log keeps to recognise the source if it comes again (a function
    of the target, so a guess of it can be confirmed)."""
    texts = [item.text for step in runtime.steps for item in step.items if item.source == source]
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def append_forget_log(runtime: AgentRuntime, source: str, fingerprint: str) -> None:
    """The ``self-consistent`` adapter's residue: a system note at the end of
    the context naming the forgotten source and its fingerprint, claiming no
    source (so nothing later would forget it)."""
    note = render("system", f"Forgotten: source {source!r}, fingerprint {fingerprint}. Refuse it if it comes again.")
    runtime.append_block(FORGET_LOG, "instruction", note, parents=tuple(runtime.context), sources=frozenset())


def _logged_forget(runtime: AgentRuntime, source: str) -> dict:
    fingerprint = get_fingerprint(runtime, source)  # before the forget sanitizes the log
    claimed = _forget(runtime, source)
    append_forget_log(runtime, source, fingerprint)
    return claimed


def _logged_reset(runtime: AgentRuntime, source: str) -> int:
    fingerprint = get_fingerprint(runtime, source)
    invocations = _reset(runtime, source)
    append_forget_log(runtime, source, fingerprint)
    return invocations


# --- persisted: what stays behind (kept, reopened, again, effects) ---------------------------

def get_kept(path: Path, extra: Sequence[str] = ()) -> list[dict]:
    """The contract's ``kept``: every byte the session persists (the store's
    files, as ``unsee verify`` scans them), and ``extra`` texts an adapter also keeps."""
    kept = [{"name": p.name, "base64": base64.b64encode(p.read_bytes()).decode("ascii")} for p in session_files(path)]
    return kept + [{"name": f"kept-{i}", "text": text} for i, text in enumerate(extra)]


def get_context_text(runtime: AgentRuntime) -> str:
    """The text of every block in context: what a checkpoint table row holds."""
    return "\n".join(runtime.graph[b].text for b in runtime.context)


@attrs.frozen
class Persisted:
    """How a persisted adapter differs from the reference (every flag off):
    ``history`` keeps each step's context in an append-only checkpoint log that
    its forget never reads; ``uncommitted`` forgets in memory and never
    commits the forget to its store; ``resync`` answers a forget of a source
    already forgotten by rebuilding from the input log it was given."""

    history: bool = False
    uncommitted: bool = False
    resync: bool = False


def _persisted(episode_path: str, forget: str | None, model: str, name: str, how: Persisted) -> dict:
    with _one_thread(), tempfile.TemporaryDirectory(prefix="unsee-adapter-") as tmp:
        return _run_persisted(load_episode(episode_path), forget, model, name, how, Path(tmp) / "session.db")


def _run_persisted(episode: Episode, forget: str | None, model: str, name: str, how: Persisted, path: Path) -> dict:
    engine = make_engine(_load(model))
    session = PersistentSession.create(path, AgentRuntime.start(engine, episode.system, episode.settings))
    log: list[str] = []
    try:
        for step in episode.steps:
            session.step(step)
            if how.history:
                log.append(get_context_text(session.runtime))
        runtime = session.runtime
        # this runtime calls no tool: no external call
        run = {**_run_fields(runtime), "kept": get_kept(path, log), "effects": []}
        out = make_answer(name, REFERENCE_ENGINE, model, run)
        if forget is None:
            return out
        twin = runtime.fork()
        reset = _reset(twin, forget)
        claimed = _forget(runtime, forget) if how.uncommitted else _report(session.forget(forget))
        out["forget"] = {"source": forget, **claimed, "digest_before": run["digest"], **_after(session.runtime),
                         "kept": get_kept(path, log), "effects": []}
        out["reset"] = {"invocations": reset, "digest_before": run["digest"], **_after(twin)}
    finally:
        session.close()
    with PersistentSession.open(path, engine) as reopened:
        out["forget"]["reopened"] = _state(reopened.runtime)
        if how.resync and forget in reopened.runtime.forgotten:
            again = AgentRuntime.from_episode(engine, episode)  # "resync" from the raw input log
        else:
            reopened.forget(forget)
            again = reopened.runtime
        out["forget"]["again"] = _after(again)
    return out


def _after(runtime: AgentRuntime) -> dict:
    return {"digest_after": runtime.digest(), "turns": get_turns(runtime)}


def _report(report) -> dict:
    return {"tau": report.tau, "boundary": report.boundary, "invocations": report.invocations}


# --- tools: consequential calls fire once (A3) -------------------------------------------------

def get_episode_tools() -> dict:
    """The tools the generated episodes' plans name (``send_message``, ``pay``),
    consequential and without arguments: each records that it ran. Without
    arguments a call never differs from the counterfactual's, so no forget
    meets an irrevocable divergence (A3 holds) and only firing twice is at stake."""
    from unsee.impl.agent.tools import Tool

    def record(env, call) -> str:
        env.put(f"{call.tool}/{call.call_id}", "done")
        return f"{call.tool} done ({call.call_id})"

    return {name: Tool(name, (), True, record) for name in ("send_message", "pay")}


def _tools(episode_path: str, forget: str | None, model: str, name: str, refire: bool) -> dict:
    from unsee.impl.agent.tools import ToolAgentRuntime

    with _one_thread():
        episode = load_episode(episode_path)
        runtime = ToolAgentRuntime.from_episode(make_engine(_load(model)), episode, tools=get_episode_tools())
        run = {"T": runtime.t, **_state(runtime), "effects": [c.call_id for c in runtime.effects]}
        # its own engine name: its turns read tool results the reference's never do
        out = make_answer(name, f"{REFERENCE_ENGINE}+tools", model, run)
        if forget is None:
            return out
        twin = runtime.fork()
        before = dict(runtime.world.executions)
        claimed = _forget(runtime, forget)
        fired = [c for c, n in runtime.world.executions.items() for _ in range(n - before.get(c, 0))]
        if refire:  # its replay calls the consequential tools live, as a plain re-run would
            fired += [c.call_id for c in runtime.calls if c.consequential and c.turn > claimed["boundary"]]
        out["forget"] = {"source": forget, **claimed, "digest_before": run["digest"], **_after(runtime),
                         "effects": fired}
        out["reset"] = {"invocations": _reset(twin, forget), "digest_before": run["digest"], **_after(twin)}
        return out


def tools(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Our runtime with its tool layer (plans become calls; a forget's replay
    shadow-executes consequential ones, de-duplicated by call id): conforms."""
    return _tools(episode, forget, model, "unsee with tools", refire=False)


def refire(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """``tools`` whose forget replays the consequential calls after the
    boundary live: the state is right, a payment is made twice. Rejected by effects once."""
    return _tools(episode, forget, model, "replay calls tools live", refire=True)


def get_reference_turns(episode: str, model: str = "tiny") -> dict[str, list[int]]:
    """Our runtime's turns for a plain run (in memory: what the harness compares tokens with)."""
    return _answer(episode, None, model, "unsee reference", _forget)["run"]["turns"]


def reference(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Our runtime (Algorithm 1 for forget, B5 for reset) on a session store,
    reporting what it keeps, the reopened session and a second forget: conforms."""
    return _persisted(episode, forget, model, "unsee reference", Persisted())


def checkpoint_history(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """The reference, also keeping every step's context in an append-only
    checkpoint log its forget never reads: rejected by residue alone."""
    return _persisted(episode, forget, model, "checkpoint history kept", Persisted(history=True))


def uncommitted(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """The reference, forgetting in memory only: reopening brings the old
    session back (and its store still holds the target): rejected."""
    return _persisted(episode, forget, model, "forget never committed", Persisted(uncommitted=True))


def resync(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """The reference, whose forget of a source already gone rebuilds from the
    input log: a second forget brings the target back. Rejected by idempotent alone."""
    return _persisted(episode, forget, model, "forget resyncs from its input log", Persisted(resync=True))


def memory(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """B1 memory-delete as a forget: must be rejected."""
    return _answer(episode, forget, model, "B1 memory-delete", _memory_delete)


def redaction(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """B3 source redaction, reporting correct counts: must be rejected."""
    return _answer(episode, forget, model, "B3 source-redaction", _source_redaction)


def span_excision(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Drops only the target's KV rows (span excision, as KV quarantine and
    span erasers do), reporting correct counts: rejected by the attended-span
    checks by name."""
    return _answer(episode, forget, model, "span excision (target KV rows only)", _span_excision)


def self_consistent(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Algorithm 1 and B5, each keeping the same forget log: its forget equals
    its own reset, and must still be rejected (neither is the counterfactual)."""
    return _answer(episode, forget, model, "forget log kept by forget and reset", _logged_forget, _logged_reset)


def vllm(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Our runtime on the vLLM engine (the extra unsee[vllm]; ``tiny`` is vllm-tiny): conforms."""
    return _answer(episode, forget, model, "unsee on vLLM", _forget, backend="vllm")


ADAPTERS = {"reference": reference, "memory": memory, "redaction": redaction, "self-consistent": self_consistent,
            "vllm": vllm, "checkpoint-history": checkpoint_history, "uncommitted": uncommitted, "resync": resync,
            "tools": tools, "refire": refire, "span-excision": span_excision}


def main(argv: list[str] | None = None) -> int:
    """The command form of the adapters (the contract's argv)."""
    parser = argparse.ArgumentParser(prog="python -m unsee.impl.conform.adapters",
                                     description="An implementation of the unsee conformance contract.")
    parser.add_argument("adapter", choices=sorted(ADAPTERS))
    parser.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a local checkpoint")
    parser.add_argument("--episode", required=True, help="the episode file to run")
    parser.add_argument("--forget", metavar="SOURCE_ID", help="forget this source after the run (and reset it)")
    parser.add_argument("--out", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    result = ADAPTERS[args.adapter](args.episode, args.forget, args.model)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
