"""A cold forget against a cold reset (issue 54): fresh ``unsee run`` processes of an
independent episode (the secret at step 2, six unrelated turns after it), the forget
(``--method replay``, B7 under the default policy) against the plain reset (``--method
reset``, B5), in interleaved pairs whose order alternates, on each model.

    make cold-forget    # or:
    OMP_NUM_THREADS=1 python -m unsee.bench.cold_forget --models qwen2.5-1.5b gemma3-270m smollm2 \\
        --pairs 5 --out out/cold-forget

Each measured process is ``unsee run EPISODE --forget notes.address --method M --engine
llamacpp --model MODEL --json`` run through ``unsee``'s own ``main`` by a child of this
script (``--child``) that adds a counter on the engine's forwards (every thread's, load
excluded) and the clock of each phase: interpreter start and imports, torch's import (the
engine's first import, timed apart: it is most of a cold start), the model's load
(facts and cost table read from their cache), the episode (the base run both methods
share) and the method. This parent times the whole process: its wall and CPU time (user
+ system, ``os.wait4``). Before a model's pairs one untimed process loads it, so that no
pair pays a first load's measurements (the facts, the cost table: a user's first run
pays them once, and then never again).

Prints each process's wall, CPU, tokens and forwards, and per model the forget over the
reset in wall and CPU time, every pair and the median (p50); writes ``rows.jsonl`` and
``cold_forget.md`` under ``--out``; ``--rows out/cold-forget/rows.jsonl --docs docs/drafts.md``
rewrites that page's ``cold-forget`` region from a run's rows and keeps them in
``docs/cold-forget.json``, which ``--summary`` renders again without running anything.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("qwen2.5-1.5b", "gemma3-270m", "smollm2")
METHODS = ("replay", "reset")
SOURCE = "notes.address"
REGION = "cold-forget"
#: the rows the committed region was rendered from, and the command that renders it again
#: (tests/test_bench_drafts.py checks the region is that rendering)
SUMMARY_FILE = "docs/cold-forget.json"
DOCS_COMMAND = f"python -m unsee.bench.cold_forget --summary {SUMMARY_FILE} --docs docs/drafts.md"
#: the issue's independent episode: the secret in a tool result at step 2, six unrelated user turns after it
EPISODE = {
    "format": "unsee.episode", "version": 1,
    "system": "You are a helpful assistant. Answer in one short sentence.",
    "settings": {"max_new_tokens": 32, "checkpoint_policy": "every_turn"},
    "steps": [
        {"id": "s1", "kind": "user", "text": "Hi, I am planning a dinner party for Saturday."},
        {"id": "s2", "kind": "tool", "tool": "fetch_notes", "fields": [
            {"source": "notes.venues", "text": "Venues: Rosa's Trattoria, Blue Harbor Grill."},
            {"source": SOURCE, "text": "The host's home address is 4417 Elm Street."}]},
        *({"id": f"s{i}", "kind": "user", "text": text} for i, text in enumerate((
            "How many grams are in three cups of flour?", "Suggest a name for a black cat.",
            "What is a good stretch for a stiff neck?", "Translate 'good morning' into French.",
            "How long should I boil an egg?", "Give me a word that rhymes with blue."), start=3))],
    "target": {"source": SOURCE, "value": "4417 Elm Street"},
}


# --- the child: one `unsee run`, counted ---------------------------------------------


def run_child(run_args: list[str]) -> dict:
    """``unsee run RUN_ARGS --json`` in this process through the CLI's ``main``, with the
    engine's forwards counted from its load on and each phase's clock."""
    from unsee.impl.cli import run as cli_run
    from unsee.impl.cli.main import main

    phases: dict[str, tuple[float, float]] = {}
    counts = {"forwards": 0, "fed": 0}
    build = cli_run.build_engine

    def on_forward(n: int, _started: float) -> None:
        counts["forwards"] += 1
        counts["fed"] += n

    def counted(args, **extra):
        wall, clock = time.perf_counter(), time.process_time()
        import torch  # noqa: F401  (the engine's first import; timed apart, the largest part of a cold start)

        phases["torch"] = (time.perf_counter() - wall, time.process_time() - clock)
        wall, clock = time.perf_counter(), time.process_time()
        engine = build(args, **extra)
        phases["load"] = (time.perf_counter() - wall, time.process_time() - clock)
        stack.enter_context(engine.hook_forwards(on_forward, every_thread=True))
        return engine

    out = io.StringIO()
    with contextlib.ExitStack() as stack, contextlib.redirect_stdout(out):
        cli_run.build_engine = counted
        wall, clock = time.perf_counter(), time.process_time()
        code = main(["run", *run_args, "--json"])
        before = [sum(phases[k][i] for k in ("torch", "load")) for i in (0, 1)]
        phases["run"] = (time.perf_counter() - wall - before[0], time.process_time() - clock - before[1])
    output = json.loads(out.getvalue())
    result = output["result"]
    return {"code": code, "digest": output["digest"], "phases": {k: [round(w, 3), round(c, 3)] for k, (w, c) in
                                                                 phases.items()},
            "method_wall_s": round(result["wall_s"], 3), "method_prefilled": result["prefilled_tokens"],
            "method_decoded": result["decoded_tokens"], **counts,
            "drafts": ((result.get("report") or {}).get("drafts") or {}).get("mode")}


# --- the parent: fresh processes, interleaved -----------------------------------------


def get_python() -> list[str]:
    """This interpreter as a child runs it (``-P`` kept where it was given: a path shim)."""
    return [sys.executable, *(["-P"] if sys.flags.safe_path else [])]


def run_process(args: list[str]) -> tuple[dict, float, float]:
    """One child process: its report, wall time and CPU time (user + system, its own)."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    child = subprocess.Popen([*get_python(), "-m", "unsee.bench.cold_forget", "--child", "--", *args],
                             stdout=subprocess.PIPE, text=True)
    stdout = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)}: exit {child.returncode}")
    report = json.loads(stdout.strip().splitlines()[-1])
    return {**report, "load_average": round(load, 2)}, wall, usage.ru_utime + usage.ru_stime


def get_run_args(episode: Path, model: str, method: str) -> list[str]:
    return [str(episode), "--forget", SOURCE, "--method", method, "--engine", "llamacpp", "--model", model]


def run_pairs(model: str, pairs: int, episode: Path, sink: Path, build: str) -> list[dict]:
    """``pairs`` pairs of fresh processes, forget and reset, the order alternating."""
    subprocess.run([*get_python(), "-c", f"from unsee.impl.engines.registry import load_engine; "
                    f"load_engine({model!r}, 'llamacpp')"], check=True)  # facts and cost table cached
    rows = []
    for pair in range(pairs):
        for method in METHODS if pair % 2 == 0 else METHODS[::-1]:
            report, wall, cpu = run_process(get_run_args(episode, model, method))
            spans = report["phases"].values()
            report["phases"]["start"] = [round(wall - sum(w for w, _ in spans), 3), round(cpu - sum(c for _, c in spans), 3)]
            row = {"build": build, "model": model, "pair": pair, "method": method, "wall_s": round(wall, 3),
                   "cpu_s": round(cpu, 3), **report}
            rows.append(row)
            with sink.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(fmt_process(row), file=sys.stderr, flush=True)
    return rows


def fmt_process(row: dict) -> str:
    p = row["phases"]
    return (f"{row['model']} pair {row['pair']} {row['method']}: wall {row['wall_s']:.1f} s, CPU {row['cpu_s']:.1f} s "
            f"(wall: start and imports {p['start'][0]:.1f}, torch {p['torch'][0]:.1f}, load {p['load'][0]:.1f}, episode "
            f"{get_episode_wall(row):.1f}, the method {row['method_wall_s']:.1f} s; CPU: start and imports "
            f"{p['start'][1]:.1f}, torch {p['torch'][1]:.1f} s), {row['forwards']} forwards feeding {row['fed']} tokens, "
            f"the method {row['method_prefilled']} + {row['method_decoded']} tokens, load average "
            f"{row['load_average']}")


# --- what the rows say --------------------------------------------------------------


def get_episode_wall(row: dict) -> float:
    """The wall time of the base episode the method ran on (the run less the method)."""
    return row["phases"]["run"][0] - row["method_wall_s"]


def get_pairs(rows: list[dict]) -> dict[str, list[dict]]:
    """model -> its complete pairs: ``{"pair", "replay", "reset"}`` (each a row)."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        pairs = out.setdefault(row["model"], [])
        if not pairs or pairs[-1]["pair"] != row["pair"]:
            pairs.append({"pair": row["pair"]})
        pairs[-1][row["method"]] = row
    return {m: [p for p in ps if all(k in p for k in METHODS)] for m, ps in out.items()}


def compute_ratios(pair: dict) -> dict:
    forget, reset = pair["replay"], pair["reset"]
    return {"wall": forget["wall_s"] / reset["wall_s"], "cpu": forget["cpu_s"] / reset["cpu_s"],
            "method_wall": forget["method_wall_s"] / reset["method_wall_s"]}


def get_machine() -> dict:
    """The CPU, its cores and the processes' llama.cpp decode threads, as a label names them: the
    ones $UNSEE_LLAMA_THREADS names (`make cold-forget` sets 1), else the loader's default, every
    core where the library has the split switch (model.get_default_decode_threads)."""
    from unsee.bench.forget_policy import get_cpu_name
    from unsee.impl.engines.llamacpp.kernels import find_setter
    from unsee.impl.engines.llamacpp.model import DEFAULT_DECODE_THREADS, get_cores, llama_module

    threads = int(os.environ.get("UNSEE_LLAMA_THREADS") or (
        get_cores() if find_setter(llama_module()) is not None else DEFAULT_DECODE_THREADS))
    return {"cpu": get_cpu_name(), "cores": os.cpu_count(), "threads": threads}


def get_threads_text(machine: dict) -> str:
    """The decode threads in a label (a summary kept before they were recorded ran on one)."""
    threads = machine.get("threads", 1)
    return "1 thread" if threads == 1 else f"{threads} decode threads"


def render(rows: list[dict], argv: list[str], machine: dict) -> str:
    """The label, every process, and per model the ratios of every pair and their median."""
    from unsee.impl.eval.report import render_table

    builds = " ".join(f"`{b}`" for b in dict.fromkeys(r["build"] for r in rows))
    loads = [r["load_average"] for r in rows]
    label = (f"> build {builds} · attention llama.cpp's own kernels, flash attention on · dtype the files' weights, "
             f"f16 KV · CPU {machine['cpu']} ({get_threads_text(machine)}; load average {min(loads):.1f} to {max(loads):.1f} on "
             f"{machine['cores']} cores) · command `python -m unsee.bench.cold_forget {shlex.join(argv)}`")
    body = [[r["model"], str(r["pair"]), "forget" if r["method"] == "replay" else "reset", f"{r['wall_s']:.1f}",
             f"{r['cpu_s']:.1f}", "{:.1f} ({:.1f})".format(*r["phases"]["start"]),
             "{:.1f} ({:.1f})".format(*r["phases"]["torch"]), "{:.1f} ({:.1f})".format(*r["phases"]["load"]),
             f"{get_episode_wall(r):.1f}",
             f"{r['method_wall_s']:.1f}", f"{r['method_prefilled']} + {r['method_decoded']}",
             f"{r['forwards']} ({r['fed']})", str(r["load_average"]), r["digest"][:12]] for r in rows]
    ratios = []
    for model, pairs in get_pairs(rows).items():
        each = [compute_ratios(p) for p in pairs]
        if not each:
            continue
        wall = [e["wall"] for e in each]
        ratios.append([model, str(len(each)), " ".join(f"{v:.2f}x" for v in wall),
                       f"{statistics.median(wall):.3f}x", f"{sum(v <= 1.0 for v in wall)} of {len(wall)}",
                       " ".join(f"{e['cpu']:.2f}x" for e in each), f"{statistics.median(e['cpu'] for e in each):.3f}x",
                       f"{statistics.median(e['method_wall'] for e in each):.3f}x",
                       "yes" if all(p["replay"]["digest"] == p["reset"]["digest"] for p in pairs) else "**no**"])
    asked = get_asked_models(argv)
    missing = [m for m in asked if not any(r["model"] == m for r in rows)]
    cut = [f"Not measured: {', '.join(missing)} (the run was stopped before their pairs)."] if missing else []
    return "\n".join([label, "", *render_table(
        ["model", "pair", "process", "wall s", "CPU s", "start and imports s (CPU)", "torch import s (CPU)", "load s (CPU)",
         "episode s",
         "the method s",
         "the method's tokens (prefilled + decoded)", "forwards (tokens fed), load excluded", "load average",
         "digest"], body), "", *render_table(
        ["model", "pairs", "forget / reset, wall: every pair", "p50", "<= 1.0x", "CPU: every pair", "p50",
         "the method alone, wall: p50", "digests equal"], ratios), *([""] + cut if cut else [])]) + "\n"


def get_asked_models(argv: list[str]) -> list[str]:
    """The models a run's command asked for (``--models``, else the default)."""
    if "--models" not in argv:
        return list(MODELS)
    after = argv[argv.index("--models") + 1:]
    return after[:next((i for i, word in enumerate(after) if word.startswith("--")), len(after))]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one measured process (run_process)
        print(json.dumps(run_child(argv[2:])))
        return
    from unsee.bench import options
    from unsee.impl.cli.docs import replace_region
    from unsee.impl.util.build import get_build

    parser = options.get_parser("cold_forget", __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"default: {' '.join(MODELS)}")
    parser.add_argument("--pairs", type=int, default=5, help="pairs of processes per model; default: 5")
    options.add_out(parser, "out/cold-forget")
    parser.add_argument("--rows", type=Path, help="render a run's rows.jsonl instead of running (with --docs, "
                                                   f"written to {SUMMARY_FILE} too)")
    parser.add_argument("--summary", type=Path, help=f"render a committed summary ({SUMMARY_FILE}) instead")
    parser.add_argument("--docs", type=Path, help="rewrite this page's cold-forget region")
    args = parser.parse_args(argv)
    if args.summary:
        summary = json.loads(args.summary.read_text())
        rows, command, machine = summary["rows"], summary["command"], summary["machine"]
    elif args.rows:
        rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
        kept = args.rows.parent / "machine.json"  # as the run saw it (its threads: the run's environment)
        command = json.loads((args.rows.parent / "command.json").read_text())
        machine = json.loads(kept.read_text()) if kept.exists() else get_machine()
    else:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        episode, sink, build, command, machine = out / "episode.json", out / "rows.jsonl", get_build(), argv, \
            get_machine()
        episode.write_text(json.dumps(EPISODE, indent=1))
        sink.unlink(missing_ok=True)
        (out / "command.json").write_text(json.dumps(command))
        (out / "machine.json").write_text(json.dumps(machine))
        rows = [row for model in args.models for row in run_pairs(model, args.pairs, episode, sink, build)]
        (out / "cold_forget.md").write_text(render(rows, command, machine))
    text = render(rows, command, machine)
    if args.docs:
        args.docs.write_text(replace_region(args.docs.read_text(), REGION, text, DOCS_COMMAND))
        if not args.summary:
            Path(SUMMARY_FILE).write_text(json.dumps({"command": command, "machine": machine, "rows": rows},
                                                     indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
