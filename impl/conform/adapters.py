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
============== ================================================================

The first four declare the engine :data:`~unsee.impl.conform.harness.REFERENCE_ENGINE` and
the model they load, so the harness also compares their plain runs' tokens
with its own reference.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import sys
from collections.abc import Callable, Iterator

from unsee.impl.agent.episode import load_episode
from unsee.impl.agent.render import render
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.conform.contract import CONTRACT, CONTRACT_VERSION, REFERENCE_ENGINE
from unsee.impl.engines.registry import make_engine
from unsee.impl.methods.baselines import delete_memory_records, redact_source

#: The suffixes of the block ids the runtime gives its decoded model turns
#: (``<step id>/answer``, ``/plan``, ``/note``); a compaction's re-prefilled
#: summary (``/context``) is not a decoded turn.
TURN_SUFFIXES = ("answer", "plan", "note")


@functools.cache
def _load(model: str):
    # One load per process and model: the entry points are called once per
    # request, and a load costs more than a tiny episode.
    from unsee.impl.engines.hf.models import load_model

    return load_model(model)


def get_turns(runtime: AgentRuntime) -> dict[str, list[int]]:
    """The contract's ``turns``: per step id, the token ids its model turn
    decoded (the assistant header the runtime prefilled is not part of them)."""
    turns = {}
    for block in runtime.graph.blocks():
        step_id, _, suffix = block.id.rpartition("/")
        if suffix in TURN_SUFFIXES and block.type != "memory_record":
            header = block.chunks[0] if block.chunks else 0
            turns[step_id] = list(block.tokens[header:])
    return turns


@functools.cache
def _load_other(backend: str, model: str):
    """Another backend's model (vLLM), once per process: it declares its own
    engine, so the harness compares it with its own counterfactual runs only."""
    from unsee.impl.engines.registry import load_model_for

    return load_model_for(backend, model)


def _state(runtime: AgentRuntime) -> dict:
    return {"turns": get_turns(runtime), "digest": runtime.digest()}


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
    run = {"T": runtime.t, **_state(runtime), "checkpoints": [c.boundary for c in runtime.checkpoints.all()]}
    declared = REFERENCE_ENGINE if backend == "transformers" else f"unsee-{backend}"
    out = {"contract": CONTRACT, "version": CONTRACT_VERSION,
           "implementation": {"name": name, "engine": declared, "model": model}, "run": run}
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


def reference(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Our runtime (Algorithm 1 for forget, B5 for reset): conforms."""
    return _answer(episode, forget, model, "unsee reference", _forget)


def memory(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """B1 memory-delete as a forget: must be rejected."""
    return _answer(episode, forget, model, "B1 memory-delete", _memory_delete)


def redaction(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """B3 source redaction, reporting correct counts: must be rejected."""
    return _answer(episode, forget, model, "B3 source-redaction", _source_redaction)


def self_consistent(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Algorithm 1 and B5, each keeping the same forget log: its forget equals
    its own reset, and must still be rejected (neither is the counterfactual)."""
    return _answer(episode, forget, model, "forget log kept by forget and reset", _logged_forget, _logged_reset)


def vllm(episode: str, forget: str | None = None, model: str = "tiny") -> dict:
    """Our runtime on the vLLM engine (the extra unsee[vllm]; ``tiny`` is vllm-tiny): conforms."""
    return _answer(episode, forget, model, "unsee on vLLM", _forget, backend="vllm")


ADAPTERS = {"reference": reference, "memory": memory, "redaction": redaction, "self-consistent": self_consistent,
            "vllm": vllm}


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
