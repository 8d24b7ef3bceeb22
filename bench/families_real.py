"""Real models of several families through ``unsee serve``, each driven by the clients this
machine has (issue 51's item 5; docs/serve.md, "Model families").

    make families-real                 # the catalogue's models, the clients installed
    python -m unsee.bench.families_real --models smollm2,gemma3-270m,qwen2.5-1.5b [--scenarios a,b]
    python -m unsee.bench.families_real --table out/families-real/results.json   # the table again

Each model is served as a user starts it (``unsee serve --engine llamacpp --model NAME``),
with one option: a default output cap (``--max-output-tokens 256``; a client's own
``max_tokens`` still wins), so that a small model that never ends its turn costs seconds,
not its whole context; and driven by bench/serve_agents.py's scenarios, its proxy and its
verdicts (no second harness): the Agents SDK's ``Runner`` with a function tool, its
session whose first user message is deleted and compared with a twin written without it
(digest and items, then the next answer), the ten tool-needing prompts in ``auto`` (the
goal: at least 9 parsed calls), and the other frameworks where their interpreter has
them. A scenario whose framework the interpreter lacks is not run, and its cell says so.

The model's family is what the server reports at startup (the call format it read from
the template: ``--tool-format``'s names) and the GGUF's architecture (the catalogue's).
``results.json`` keeps every record; ``table.md`` is the families x clients table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from unsee.bench import options, serve_agents

#: the models this target runs: the real-size GGUFs of the catalogue and the smollm2 dependency
MODELS = ("smollm2", "gemma3-270m", "qwen2.5-1.5b")
#: the scenarios run by default: issue 51's (Agents SDK tool agent, its DELETE and twin, the ten
#: prompts) and one per other framework (bench/serve_agents.py's SCENARIOS)
SCENARIOS = ("agents-chat", "agents-session", "openai-auto", "openai-required", "langgraph-react",
             "pydantic-ai-chat", "smolagents", "llamaindex")
#: the module a scenario's client imports (its first word): present or not in the interpreter
CLIENT_MODULES = {"agents": "agents", "openai": "openai", "langgraph": "langgraph.prebuilt",
                  "langchain": "langchain_openai", "pydantic": "pydantic_ai", "smolagents": "smolagents",
                  "llamaindex": "llama_index.llms.openai_like"}
#: each server's default output cap (``--max-output-tokens``): a call or a short answer needs far
#: fewer, and SmolLM2-135M, asked with no cap, wrote past 3 minutes of decode on one prompt
MAX_OUTPUT_TOKENS = 256
#: the server's startup line naming the call format it read from the template
FORMAT_LINE = re.compile(r"tools are called in the `([a-z0-9_]+)` format")


def get_client_module(scenario: str) -> str:
    return CLIENT_MODULES[scenario.split("-")[0]]


def get_missing(python: str, module: str) -> str | None:
    """Why ``python`` cannot run a client that imports ``module`` (None: it can)."""
    if not Path(python).exists() and shutil.which(python) is None:
        return f"no interpreter {python}"
    done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": ""})
    return None if done.returncode == 0 else f"{module} is not installed in {python}"


def get_python(args: argparse.Namespace, scenario: str) -> str:
    venv = serve_agents.get_scenario(scenario).venv
    return args.clients_python if venv == "clients" else args.llamaindex_python


def get_family(model: str, server_log: Path) -> dict:
    """The model's architecture (the catalogue's; SmolLM2's GGUF is a Llama) and the call format
    its server reported."""
    from unsee.impl.engines.catalog import get_entry

    entry = get_entry(model)
    found = FORMAT_LINE.search(server_log.read_text(errors="replace")) if server_log.exists() else None
    return {"architecture": entry.family if entry else "llama" if model == "smollm2" else "?",
            "size": entry.size if entry else None, "call_format": found.group(1) if found else "?"}


def run_model(args: argparse.Namespace, model: str, scenarios: list[str], out: Path) -> dict:
    """One model's server and scenarios through serve_agents; its records and family."""
    shutil.rmtree(out / "logs", ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    run_args = argparse.Namespace(model=model, scenarios=scenarios, clients_python=args.clients_python,
                                  llamaindex_python=args.llamaindex_python, timeout=args.timeout,
                                  start_timeout=args.start_timeout, server_port=None,
                                  server_options=("--max-output-tokens", str(args.max_output_tokens),
                                                  *shlex.split(args.serve_args)))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"families-real-{model}-") as tmp:
        records, exchanges = serve_agents.run_scenarios(run_args, Path(tmp), out) if scenarios else ([], [])
    (out / "exchanges.jsonl").write_text("".join(json.dumps(e, default=str) + "\n" for e in exchanges))
    return {"model": model, **get_family(model, out / "server.log"), "records": records,
            "wall_s": round(time.perf_counter() - started, 1)}


# ------------------------------------------------------------------------ the table


def get_cell(scenario: str, record: dict | None, not_run: str | None) -> str:
    """One measured cell: ok or failed with the figure that decides it, the wall time."""
    if not_run is not None:
        return f"not run: {not_run}"
    if record is None:  # in none of this model's runs: a later run of its own, or the server exited before it
        return "not run in this model's runs"
    spec = serve_agents.get_scenario(scenario)
    ok, why = serve_agents.judge(spec, record)
    detail = serve_agents.get_tool_cell(spec, record)
    if spec.twin and record.get("twin"):
        detail += f"; {serve_agents.get_twin_words(record['twin'])}"
    verdict = "ok" if ok else "timed out" if record.get("timed_out") else "failed"
    reason = "" if ok or spec.at_least is not None or record.get("timed_out") else f": {serve_agents.get_cut(why, 90)}"
    return serve_agents.get_cell(f"{verdict}{reason} ({detail}; {record.get('wall_s', 0):.0f} s)")


def merge_results(results: list[dict]) -> dict:
    """Several runs as one (runs of other scenarios on the same models): each model's records
    together, a later run's record of a scenario replacing an earlier one's; a scenario is not
    run where no run ran it. The first run's label, each run's command and wall time kept."""
    if len(results) == 1:
        return results[0]
    scenarios = list(dict.fromkeys(s for r in results for s in r["scenarios"]))
    rows: dict[str, dict] = {}
    for result in results:
        for row in result["models"]:
            kept = rows.setdefault(row["model"], {**row, "records": [], "not_run": {}})
            ran = {r["scenario"] for r in row["records"]}
            kept["records"] = [r for r in kept["records"] if r["scenario"] not in ran] + row["records"]
            kept["not_run"] = {**kept["not_run"], **row["not_run"]}
    for row in rows.values():
        ran = {r["scenario"] for r in row["records"]}
        row["not_run"] = {s: why for s, why in row["not_run"].items() if s not in ran}
    label = {**results[0]["label"], "command": " and ".join(r["label"]["command"] for r in results),
             "builds": list(dict.fromkeys(r["label"]["build"] for r in results))}
    return {"label": label, "scenarios": scenarios, "models": list(rows.values()),
            "wall_s": sum(r.get("wall_s", 0) for r in results)}


def add_notes(result: dict, notes: dict[str, str]) -> dict:
    """``result`` with each scenario in ``notes`` that a model has no record of marked not run, why."""
    models = []
    for row in result["models"]:
        ran = {r["scenario"] for r in row["records"]}
        models.append({**row, "not_run": {**row["not_run"], **{s: why for s, why in notes.items() if s not in ran}}})
    return {**result, "models": models}


def format_label(label: dict) -> str:
    """The figure's label line (bench/options.py's FIGURE_LABEL): serve_agents' with every model's
    GGUF as shipped for the dtype (SmolLM2's is Q4_1, the catalogue's Q4_K_M)."""
    line = serve_agents.format_label({**label, "model": "MODEL"})
    line = line.replace("dtype MODEL Q4_K_M", "dtype each model's GGUF as shipped")
    others = [b for b in label.get("builds", []) if b != label["build"]]
    if others:  # merged runs: each run's build
        line = line.replace(" · attention", " (other runs at " + ", ".join(f"`{b}`" for b in others) + ") · attention", 1)
    return line


def format_table(result: dict) -> str:
    """The families x clients table: a row per model, a column per scenario."""
    scenarios = result["scenarios"]
    heads = [serve_agents.get_scenario(s).client + f" ({s})" for s in scenarios]
    lines = [format_label(result["label"]),
             "", "| model (architecture, call format) | " + " | ".join(serve_agents.get_cell(h) for h in heads) + " |",
             "|---|" + "---|" * len(scenarios)]
    for row in result["models"]:
        by_name = {r["scenario"]: r for r in row["records"]}
        size = f", {row['size'] / 2**20:.0f} MiB" if row.get("size") else ""
        name = f"{row['model']} ({row['architecture']}{size}, `{row['call_format']}`)"
        cells = [get_cell(s, by_name.get(s), row["not_run"].get(s)) for s in scenarios]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    runs = len(result["label"].get("builds") or [None])
    took = "The whole run took" if runs == 1 and " and " not in result["label"]["command"] else "The runs took, in all,"
    lines += ["", f"{took} {result.get('wall_s', 0) / 60:.1f} min."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.get_parser("families_real", __doc__)
    names = [s.name for s in serve_agents.SCENARIOS]
    parser.add_argument("--models", type=lambda t: t.split(","), default=list(MODELS),
                        help=f"catalogue names, served one after another; default: {','.join(MODELS)}")
    parser.add_argument("--scenarios", type=lambda t: t.split(","), default=list(SCENARIOS),
                        help=f"of bench/serve_agents.py's {', '.join(names)}")
    parser.add_argument("--clients-python", default=".venv-clients/bin/python",
                        help="the interpreter with the frameworks (make serve-agents builds it)")
    parser.add_argument("--llamaindex-python", default=".venv-llamaindex/bin/python",
                        help="the interpreter with LlamaIndex")
    parser.add_argument("--timeout", type=float, default=600, metavar="SECONDS", help="per scenario")
    parser.add_argument("--start-timeout", type=float, default=1800, metavar="SECONDS")
    parser.add_argument("--max-output-tokens", type=int, default=MAX_OUTPUT_TOKENS, metavar="N",
                        help="the servers' default output cap (a small model that never ends its turn "
                             f"writes to its context's end otherwise); default {MAX_OUTPUT_TOKENS}")
    parser.add_argument("--note", action="append", default=[], metavar="SCENARIO=WHY",
                        help="with --table: why a scenario no run measured on a model was not run (repeatable)")
    parser.add_argument("--serve-args", default="", metavar="ARGS",
                        help="more options for every server (e.g. '--tool-format hermes'), recorded in the label")
    parser.add_argument("--table", metavar="RESULTS_JSON[,...]",
                        help="print the table of finished runs (several: merged by model), run nothing")
    options.add_out(parser, "out/families-real", help="a folder: results.json, table.md, a folder per model")
    args = parser.parse_args(argv)
    serve_agents.check_scenarios(parser, args.scenarios)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.table:
        result = merge_results([json.loads(Path(p).read_text()) for p in args.table.split(",")])
        print(format_table(add_notes(result, dict(n.split("=", 1) for n in args.note))), end="")
        return 0
    out, started = Path(args.out), time.perf_counter()
    not_run = {s: get_missing(get_python(args, s), get_client_module(s)) for s in args.scenarios}
    runnable = [s for s in args.scenarios if not_run[s] is None]
    label = serve_agents.get_label(argparse.Namespace(model=",".join(args.models)), argv)
    label["command"] = "python -m unsee.bench.families_real " + " ".join(argv)
    rows = []
    for model in args.models:
        serve_agents.say(f"{model}: {len(runnable)} scenarios ({', '.join(runnable)})")
        row = run_model(args, model, runnable, out / model)
        rows.append({**row, "not_run": {s: why for s, why in not_run.items() if why}})
    label["load_average_end"] = round(os.getloadavg()[0], 1)
    result = {"label": label, "scenarios": args.scenarios, "models": rows,
              "wall_s": round(time.perf_counter() - started, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    table = format_table(result)
    (out / "table.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
