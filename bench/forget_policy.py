"""Drafts on real episodes (issue 42): B7 with drafts, B7 without, B5' and B5 on a fixed
sample of the evaluation's episodes, in CPU time and tokens, in one process on one loaded
model, and per turn where the drafts' time goes.

    OMP_NUM_THREADS=1 nice python -m unsee.bench.forget_policy --model qwen2.5-1.5b \\
        --engine llamacpp --episodes 10 --out out/forget-policy

The sample is the first ``--episodes`` cases of each of the four suites (impl/eval/suites.py,
seed 0), taken a suite at a time: the first episodes of docs/eval-qwen's archive. Per
episode the contaminated base state is built once and every method runs on a fork of it
(``apply_method``), the methods' order rotating from one episode to the next so that drift
in the machine's speed spreads over all of them. Each method is timed by the CPU time of
the process (``time.process_time``: the engine's loop thread computes the forwards, and
nothing else runs meanwhile), beside its wall
time, tokens prefilled and decoded, forwards and tokens fed to the model; every generate
call is recorded (its forwards' sizes and CPU time), so the forget's turns can be set
against the same turns without drafts. ``--methods`` may add ``replay-whole``: B7 with the
engine's draft policy removed, each forward feeding all it can (the whole draft, guesses of
up to eight tokens): the verification before the policy, less its probes' spent steps; and
``replay-drafts``: B7 with drafts forced on where the model's cost table says they cannot pay
(the replay's own stop kept; ``make drafts-bench``, bench/drafts_models.py).

Writes ``rows.jsonl`` (one row per episode; a rerun resumes), ``summary.json`` and
``forget_policy.md``. ``--docs docs/bench.md`` rewrites that page's generated region from
the summary (``--summary`` renders a committed one without running anything).

``--demo-episode`` runs ``unsee demo``'s episode instead, as it runs on the model (``get_model_episode``),
``--rounds`` times, each method and the compute floor (impl/methods/floor.py) timed in the
same round: the issue's goal of B7 within 1.05x its floor on that episode.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import attrs

from unsee.bench import options
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.cli.demo import get_model_episode
from unsee.impl.cli.docs import replace_region
from unsee.impl.engines.files import get_cpu_isa
from unsee.impl.engines.registry import load_engine
from unsee.impl.eval.report import render_table
from unsee.impl.eval.rows import interleave_suites
from unsee.impl.eval.run import generate_cases, make_runtime, run_method
from unsee.impl.methods.baselines import apply_method
from unsee.impl.methods.floor import compute_floor
from unsee.impl.util.build import get_build

#: B7 with drafts, without, B5' and B5; ``replay-whole`` (B7, every forward feeding all it can) on request
METHODS = ("replay", "replay-decode", "reset-prefix-cache", "reset")
NAMES = {"replay": "B7 with drafts", "replay-decode": "B7 without drafts", "reset-prefix-cache": "B5'",
         "reset": "B5", "replay-whole": "B7, whole drafts", "replay-drafts": "B7, drafts forced on"}
#: the generated region of docs/bench.md this bench's summary fills, the committed summary it
#: is rendered from, and the command that rewrites it (tests/test_docs.py checks the region)
REGION = "forget-policy"
SUMMARY_FILE = "docs/forget-policy.json"
DOCS_COMMAND = f"python -m unsee.bench.forget_policy --summary {SUMMARY_FILE} --docs docs/bench.md"


@contextlib.contextmanager
def record_turns(engine):
    """While open: the sizes of every forward ``engine`` runs (``hook_forwards``), and
    every ``generate`` call in order, with its CPU time, tokens and forwards' sizes."""
    turns: list[dict] = []
    fed: list[int] = []
    generate = engine.generate

    def recorded(*args, **kwargs):
        first, started = len(fed), time.process_time()
        out = generate(*args, **kwargs)
        turns.append({"cpu_s": round(time.process_time() - started, 4), "tokens": len(out), "sizes": fed[first:]})
        return out

    engine.generate = recorded
    try:
        with engine.hook_forwards(lambda n, _: fed.append(n)):
            yield turns, fed
    finally:
        del engine.generate


def time_method(engine, base, method: str, case, keep: dict | None = None) -> dict:
    """One method on a fork of ``base``: CPU and wall time, tokens, forwards, the turns.
    ``case``: an evaluation case, or an episode (the demo's); ``keep`` gets the runtime."""
    policy = engine.draft_policy
    if method == "replay-whole":
        engine.draft_policy = None
    elif method == "replay-drafts" and policy is not None:  # drafts wherever the measured costs say or not
        engine.draft_policy = attrs.evolve(policy, pays=True)
    try:
        with record_turns(engine) as (turns, fed):
            started, cpu = time.perf_counter(), time.process_time()
            runtime, result = run_any(base, "replay" if method in ("replay-whole", "replay-drafts") else method, case)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - started
    finally:
        engine.draft_policy = policy
    row = {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "prefilled": result.prefilled_tokens,
           "decoded": result.decoded_tokens, "recomputed": result.recomputed_tokens, "forwards": len(fed),
           "fed": sum(fed), "digest": result.digest, "turns": turns}
    drafts = result.report.drafts.to_json() if result.report else {}
    if drafts:
        row["drafts_account"] = {k: drafts.get(k) for k in ("mode", "why", "stopped")}
    if drafts.get("mode") == "verify":
        row["drafts"] = {"totals": drafts.get("totals"), "policy": drafts.get("policy"),
                         "turns": drafts.get("turns")}
    if result.report is not None:
        row["boundary"] = result.report.boundary
    if keep is not None:
        keep[method] = runtime
    return row


def run_any(base, method: str, case):
    """``run_method`` for an evaluation case, ``apply_method`` for a bare episode."""
    if hasattr(case, "suite"):
        return run_method(base, method, case)
    return apply_method(base, method, case.target.source, case.target.value)


def run_demo_episode(engine, rounds: int) -> list[dict]:
    """The demo's episode, ``rounds`` times: each method on a fork of one session and
    the compute floor from the reset's counterfactual and the forget's boundary."""
    episode = get_model_episode(engine.lm.name)
    base = AgentRuntime.from_episode(engine, episode)
    out = []
    for index in range(rounds):
        runtimes: dict = {}
        order = METHODS[index % len(METHODS):] + METHODS[:index % len(METHODS)]
        row = {"round": index, "methods": {m: time_method(engine, base, m, episode, runtimes) for m in order}}
        floor = compute_floor(engine, base, runtimes["reset"], row["methods"]["replay"]["boundary"])
        row["floor"] = floor.to_json()
        row["replay_over_floor_cpu"] = row["methods"]["replay"]["cpu_s"] / floor.cpu_s
        out.append(row)
        print(f"round {index}: " + ", ".join(f"{m} {r['cpu_s']:.1f} s" for m, r in row["methods"].items())
              + f", floor {floor.cpu_s:.1f} s", file=sys.stderr, flush=True)
    return out


def run_case(engine, case, methods: tuple[str, ...], index: int) -> dict:
    """Every method of ``methods`` on one case, in an order rotated by ``index``."""
    started = time.process_time()
    base = make_runtime(engine, case)
    row = {"suite": case.suite, "case": case.id, "T": len(case.episode.steps), "base_cpu_s":
           round(time.process_time() - started, 3), "order": [], "methods": {}}
    order = methods[index % len(methods):] + methods[:index % len(methods)]
    for method in order:
        row["order"].append(method)
        row["methods"][method] = time_method(engine, base, method, case)
    # against the full reset where it ran, else against the forget without drafts (itself checked
    # against the reset by the properties)
    reference = (row["methods"].get("reset") or row["methods"]["replay-decode"])["digest"]
    row["equal_digests"] = {m: r["digest"] == reference for m, r in row["methods"].items()}
    return row


# --- what the rows say ----------------------------------------------------------------


def get_ratio(row: dict, method: str, other: str, key: str = "cpu_s") -> float:
    return row["methods"][method][key] / row["methods"][other][key]


def get_turns_ratio(row: dict) -> float:
    """B7's model turns' CPU over the same turns decoded without drafts: the part of the
    forget the drafts change (the rest, restores and observations' prefill, is the same work)."""
    def total(method):
        return sum(t["cpu_s"] for t in row["methods"][method]["turns"])
    return total("replay") / total("replay-decode")


def get_work_ratio(row: dict) -> float:
    """The model turns' work in decode steps under the engine's cost model (a forward of n
    tokens costs 1 + r (n - 1), r measured at load), B7's over the same turns without
    drafts: what the CPU ratio measures without a shared machine's noise."""
    r = row["methods"]["replay"].get("drafts", {}).get("policy", {}).get("per_token", 0.45)
    def steps(method):
        return sum(1 + r * (n - 1) for t in row["methods"][method]["turns"] for n in t["sizes"])
    return steps("replay") / steps("replay-decode")


def get_shared_ratio(row: dict) -> float:
    """The CPU of the work both B7s do alike (everything but the model turns), B7's over the
    other's: 1.0 on a quiet machine; its spread is the measurement's noise."""
    def rest(method):
        m = row["methods"][method]
        return m["cpu_s"] - sum(t["cpu_s"] for t in m["turns"])
    return rest("replay") / rest("replay-decode")


def get_share(values: list[float], at_most: float) -> tuple[int, int]:
    return sum(v <= at_most for v in values), len(values)


def compute_summary(rows: list[dict], label: dict) -> dict:
    """The goals, per suite and over all episodes, and the per-turn account."""
    by_suite = {"all": rows, **{s: [r for r in rows if r["suite"] == s] for s in dict.fromkeys(r["suite"] for r in rows)}}
    groups = {}
    for name, group in by_suite.items():
        drafts = [get_ratio(r, "replay", "replay-decode") for r in group]
        prefix = [get_ratio(r, "replay", "reset-prefix-cache") for r in group]
        reset = [get_ratio(r, "replay", "reset") for r in group]
        turns = [get_turns_ratio(r) for r in group]
        shared = [get_shared_ratio(r) for r in group]
        work = [get_work_ratio(r) for r in group]
        groups[name] = {
            "episodes": len(group), "drafts_ratio_median": statistics.median(drafts),
            "drafts_at_most_1": get_share(drafts, 1.0), "drafts_worst": max(drafts),
            "prefix_ratio_median": statistics.median(prefix), "prefix_at_most_1": get_share(prefix, 1.0),
            "prefix_worst": max(prefix), "reset_ratio_median": statistics.median(reset),
            "turns_ratio_median": statistics.median(turns), "turns_at_most_1": get_share(turns, 1.0),
            "shared_ratio_range": [min(shared), max(shared)],
            "work_ratio_median": statistics.median(work), "work_at_most_1": get_share(work, 1.0),
            "tokens": {m: sum(r["methods"][m]["recomputed"] for r in group) for m in METHODS},
            "cpu_s": {m: round(sum(r["methods"][m]["cpu_s"] for r in group), 1) for m in METHODS},
            "exact": sum(all(r["equal_digests"].values()) for r in group)}
    return {"label": label, "groups": groups, "turns": compute_turn_account(rows, "replay"),
            "turns_whole": compute_turn_account(rows, "replay-whole")}


def compute_turn_account(rows: list[dict], method: str) -> dict | None:
    """Where ``method``'s drafts' time goes, turn by turn against the same turns
    decoded without drafts: turns by what their draft did, proposals fed and
    kept, forwards, and the turns' CPU time with and without."""
    pairs = [(t, u, d) for r in rows if method in r["methods"]
             for t, u, d in zip(r["methods"][method]["turns"], r["methods"]["replay-decode"]["turns"],
                                r["methods"][method].get("drafts", {}).get("turns") or [])]
    if not pairs:
        return None
    kinds = {"whole": 0, "wrong at its first token": 0, "partly": 0, "no draft": 0}
    for _, _, d in pairs:
        kinds[get_turn_kind(d)] += 1
    return {"turns": len(pairs), "kinds": kinds,
            "offered": sum(d["draft"] for _, _, d in pairs), "accepted": sum(d["accepted"] for _, _, d in pairs),
            "guessed": sum(d["looked_up"] for _, _, d in pairs),
            "guesses_kept": sum(d["lookup_accepted"] for _, _, d in pairs),
            "forwards": sum(len(t["sizes"]) for t, _, _ in pairs),
            "forwards_without": sum(len(u["sizes"]) for _, u, _ in pairs),
            "fed": sum(sum(t["sizes"]) for t, _, _ in pairs), "fed_without": sum(sum(u["sizes"]) for _, u, _ in pairs),
            "cpu_s": round(sum(t["cpu_s"] for t, _, _ in pairs), 2),
            "cpu_s_without": round(sum(u["cpu_s"] for _, u, _ in pairs), 2),
            "turns_dearer": sum(t["cpu_s"] > u["cpu_s"] for t, u, _ in pairs)}


def get_turn_kind(turn: dict) -> str:
    if not turn["draft"]:
        return "no draft"
    if turn["accepted"] == turn["draft"] and not turn["fallback"]:
        return "whole"
    return "wrong at its first token" if turn["accepted"] == 0 else "partly"


# --- the tables -------------------------------------------------------------------------


def fmt_share(share: list[int] | tuple[int, int]) -> str:
    return f"{share[0]} of {share[1]} ({100 * share[0] / share[1]:.0f}%)"


def get_goal_rows(group: dict) -> list[list[str]]:
    """The issue's goals, each marked met or not with the measured figure."""
    share, median = group["drafts_at_most_1"], group["drafts_ratio_median"]
    prefix = group["prefix_at_most_1"]
    return [["B7 with drafts <= 1.0x B7 without, in >= 95% of episodes", fmt_share(share),
             met(share[0] >= 0.95 * share[1])],
            ["B7 with drafts / B7 without, median <= 0.90x", f"{median:.3f}x", met(median <= 0.90)],
            ["B7 <= B5' (prefix-cached reset), in >= 90% of episodes", fmt_share(prefix),
             met(prefix[0] >= 0.90 * prefix[1])]]


def get_noise_rows(group: dict) -> list[list[str]]:
    """Beside the goals: the model turns alone (what the drafts change) and the noise
    gauge (the same work's CPU in both B7s)."""
    low, high = group["shared_ratio_range"]
    return [["B7's model turns / the same turns without drafts: median", f"{group['turns_ratio_median']:.3f}x"],
            ["  episodes where B7's turns took <= 1.0x", fmt_share(group["turns_at_most_1"])],
            ["B7's model turns / without, in decode steps (the cost model, no noise): median",
             f"{group['work_ratio_median']:.3f}x"],
            ["  episodes where B7's turns cost <= 1.0x in decode steps", fmt_share(group["work_at_most_1"])],
            ["the work both B7s do alike, B7's CPU / the other's: range (1.0 on a quiet machine)",
             f"{low:.2f}x to {high:.2f}x"]]


def met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def render_summary(summary: dict) -> str:
    """The markdown of the summary: its label, the goals, per suite, the turns."""
    label, groups = summary["label"], summary["groups"]
    lines = [get_label_line(label), ""]
    lines += render_table(["goal (CPU time, same process)", "measured", ""], get_goal_rows(groups["all"]))
    if "turns_ratio_median" in groups["all"]:
        lines += ["", *render_table(["where the drafts act, and the noise", "measured"], get_noise_rows(groups["all"]))]
    lines += ["", *render_table(
        ["suite", "episodes", "B7 / B7 without drafts: median", "<= 1.0x", "worst", "B7 / B5': median", "<= 1.0x",
         "worst", "B7 / B5: median", "tokens B7 / without / B5' / B5", "= B5"],
        [[name, str(g["episodes"]), f"{g['drafts_ratio_median']:.3f}x", fmt_share(g["drafts_at_most_1"]),
          f"{g['drafts_worst']:.2f}x", f"{g['prefix_ratio_median']:.3f}x", fmt_share(g["prefix_at_most_1"]),
          f"{g['prefix_worst']:.2f}x", f"{g['reset_ratio_median']:.3f}x",
          " / ".join(str(g["tokens"][m]) for m in METHODS), f"{g['exact']} of {g['episodes']}"]
         for name, g in groups.items()])]
    for key, title in (("turns", "B7 with drafts"), ("turns_whole", "B7, whole drafts")):
        if summary.get(key):
            lines += ["", *render_turn_account(summary[key], title)]
    return "\n".join(lines) + "\n"


def render_turn_account(account: dict, title: str) -> list[str]:
    kinds = ", ".join(f"{k} {v}" for k, v in account["kinds"].items() if v)
    return render_table(
        ["turns of " + title, "drafts: tokens offered / kept", "guessed / kept", "forwards (without)",
         "tokens fed (without)", "turns' CPU s (without)", "turns dearer than without"],
        [[f"{account['turns']} ({kinds})", f"{account['offered']} / {account['accepted']}",
          f"{account['guessed']} / {account['guesses_kept']}",
          f"{account['forwards']} ({account['forwards_without']})", f"{account['fed']} ({account['fed_without']})",
          f"{account['cpu_s']} ({account['cpu_s_without']})", str(account["turns_dearer"])]])


def get_label_line(label: dict) -> str:
    builds = " ".join(f"`{b}`" for b in label["build"].split(", "))
    return (f"> build {builds} · attention llama.cpp's own kernels ({label['kernels']}), flash attention "
            f"on · dtype {label['dtype']} · CPU {label['cpu']} ({label['threads']} thread, {label['load']}) · "
            f"command `{label['command']}`")


def get_label(engine, rows: list[dict], argv: list[str]) -> dict:
    """What the figures came from: the build(s) the rows were measured on, the model and CPU, the command."""
    lm = engine.lm
    return {"build": ", ".join(dict.fromkeys(r.get("build", "not recorded") for r in rows)), "model": lm.name,
            "dtype": "the file's weights, f16 KV",
            "kernels": "exact" if getattr(lm, "exact_kernels", False) else "repacked",
            "cpu": f"{get_cpu_name()} ({get_cpu_isa()})", "threads": getattr(lm, "threads", 1),
            "policy": engine.draft_policy.to_json() if engine.draft_policy else None,
            "load": get_load_label(rows),
            "command": "python -m unsee.bench.forget_policy " + shlex.join(argv)}


def get_load_label(rows: list[dict]) -> str:
    """The machine's load as the rows were measured: the range of the one-minute load
    average each episode started under (rows of older runs did not record it)."""
    loads = [r["load"] for r in rows if "load" in r]
    if not loads:
        return "the machine shared with other work: wall time under load"
    return f"load average {min(loads):.1f} to {max(loads):.1f} over {len(loads)} episodes on {os.cpu_count()} cores"


def get_cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (the machine's kind where there is none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine() or "unknown"


# --- running ------------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run(args, argv: list[str]) -> dict:
    build = get_build()  # now, before the checkout can move on while the run goes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = load_engine(args.model, backend=args.engine)
    cases = interleave_suites(generate_cases(args.suite, args.episodes))
    path = out / "rows.jsonl"
    rows = read_rows(path)
    done = {(r["suite"], r["case"]) for r in rows}
    shard, shards = (int(x) for x in args.shard.split("/"))
    for index, case in enumerate(cases):
        if (case.suite, case.id) in done or index % shards != shard:
            continue
        row = {"build": build, "load": round(os.getloadavg()[0], 2), **run_case(engine, case, tuple(args.methods.split(",")), index)}
        rows.append(row)
        with path.open("a") as sink:
            sink.write(json.dumps(row) + "\n")
        print(f"{case.suite}/{case.id}: " + ", ".join(f"{m} {r['cpu_s']:.1f} s" for m, r in row["methods"].items()),
              file=sys.stderr, flush=True)
    label = get_label(engine, rows, argv)
    (out / "label.json").write_text(json.dumps(label, indent=1))
    if not set(METHODS) <= set(args.methods.split(",")):  # the per-model bench (bench/drafts_models.py)
        return {"label": label}
    summary = compute_summary(rows, label)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "forget_policy.md").write_text(render_summary(summary))
    return summary


def render_demo_episode(rows: list[dict]) -> str:
    """The demo's episode: each method's CPU time per round and B7 over its floor."""
    body = [[str(r["round"]), *(f"{r['methods'][m]['cpu_s']:.2f}" for m in METHODS), f"{r['floor']['cpu_s']:.2f}",
             f"{r['replay_over_floor_cpu']:.3f}x", " / ".join(str(r["methods"][m]["recomputed"]) for m in METHODS)
             + f" / {r['floor']['recomputed']}"] for r in rows]
    median = statistics.median(r["replay_over_floor_cpu"] for r in rows)
    return "\n".join(render_table(["round", *(f"{NAMES[m]} CPU s" for m in METHODS), "floor CPU s", "B7 / floor",
                                   "tokens B7 / without / B5' / B5 / floor"], body)) + \
        f"\n\nB7 / floor, median over rounds: {median:.3f}x ({met(median <= 1.05)}: goal <= 1.05x)\n"


def merge(folders: list[str], out: Path) -> dict:
    """The summary of several runs' rows (shards of one sample, each in a process of
    its own: every episode's methods still share one process), labelled as the first."""
    rows = [row for folder in folders for row in read_rows(Path(folder) / "rows.jsonl")]
    label = json.loads((Path(folders[0]) / "summary.json").read_text())["label"]
    commands = [json.loads((Path(f) / "summary.json").read_text())["label"]["command"] for f in folders]
    builds = ", ".join(dict.fromkeys(r.get("build", "not recorded") for r in rows))
    summary = compute_summary(rows, {**label, "build": builds, "command": "; ".join(commands)})
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def write_docs(summary: dict, page: Path) -> None:
    page.write_text(replace_region(page.read_text(), REGION, render_summary(summary), DOCS_COMMAND))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = options.get_parser("forget_policy", __doc__)
    options.add_model(parser)
    options.add_backend(parser)
    parser.add_argument("--suite", default="all")
    parser.add_argument("--episodes", type=int, default=10, help="per suite")
    parser.add_argument("--methods", default=",".join(METHODS))
    options.add_out(parser, "out/forget-policy")
    parser.add_argument("--docs", help="rewrite this page's generated region from the summary")
    parser.add_argument("--summary", help="render this summary.json instead of running")
    parser.add_argument("--shard", default="0/1", help="K/N: run the sample's episodes whose index is K modulo N")
    parser.add_argument("--merge", nargs="+", metavar="DIR", help="summarise these runs' rows instead of running")
    parser.add_argument("--demo-episode", action="store_true", help="the demo's episode against its compute floor")
    options.add_rounds(parser, help="with --demo-episode")
    args = parser.parse_args(argv)
    if args.demo_episode:
        rows = run_demo_episode(load_engine(args.model, backend=args.engine), args.rounds)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "demo_episode.json").write_text(json.dumps(rows, indent=1))
        print(render_demo_episode(rows))
        return
    if args.merge:
        summary = merge(args.merge, Path(args.out))
    else:
        summary = json.loads(Path(args.summary).read_text()) if args.summary else run(args, argv)
    if "groups" not in summary:
        return
    if args.docs:
        write_docs(summary, Path(args.docs))
    print(render_summary(summary))


if __name__ == "__main__":
    main()
