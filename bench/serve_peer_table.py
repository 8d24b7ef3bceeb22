"""The peer benchmark's figures (bench/serve_peer.py): per system, from its
records, and the goals (issue 50's against llama-server where it ran, else issue
40's against llama_cpp.server), each with the measured ratio, as markdown; and the
scaling table of runs at several thread counts (``--scaling``). ``--docs PAGE`` (and
``serve_peer --docs``) writes a table into the page's generated region (:data:`REGIONS`),
keeping what it was rendered from beside the page (tests/test_docs.py renders it again)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from unsee.impl.cli.docs import replace_region

LABELS = {"peer": "llama_cpp.server (chat, history resent)", "llama-server": "llama-server (chat, history resent)",
          "unsee-chat": "unsee chat (history resent)", "unsee": "unsee responses (conversation)"}
#: per reference server: its name in a goal, the issue, and the bar of the most concurrent level
REFERENCES = {"llama-server": ("llama-server", 50, 1.0), "peer": ("llama_cpp.server", 40, 2.0)}
#: docs/serve.md's generated regions: kind -> (region, the JSON beside the page it is rendered
#: from, the command that rewrites it)
REGIONS = {"goals": ("serve-peer", "serve-peer.json", "make serve-peer"),
           "scaling": ("serve-peer-scaling", "serve-peer-scaling.json", "make serve-peer-scaling")}


def get_percentile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else None


def add_up(values: list) -> float | None:
    """The sum, or None where any is missing."""
    return None if not values or any(v is None for v in values) else sum(values)


def summarise_level(rows: list[dict]) -> dict:
    """One concurrency level's turns: aggregate output tokens/s over the level's wall (the walls
    of every round, with the tokens/s of each), latency, TTFT."""
    rounds = {r.get("round", 0): r for r in rows}  # each row of a round carries its level's wall, CPU, forwards
    per_round = [sum(r["output_tokens"] for r in rows if r.get("round", 0) == k) / rounds[k]["level_wall_s"]
                 for k in sorted(rounds)]
    engines = [rounds[k].get("level_engine") or {} for k in sorted(rounds)]
    engine = {key: add_up([e.get(key) for e in engines]) for key in ("forwards", "rows", "busy_s")}
    latency, ttft = [r["latency_s"] for r in rows], [r["ttft_s"] for r in rows]
    # each turn's decode alone: its time after the first streamed text over the tokens after the first
    # (turns that end at different lengths still compare, where tokens/s counts each turn's prefill in)
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in rows if r["output_tokens"] > 1]
    tokens = sum(r["output_tokens"] for r in rows)
    wall = sum(r["level_wall_s"] for r in rounds.values())
    cpu = add_up([r.get("level_cpu_s") for r in rounds.values()])
    forwards, busy = engine["forwards"], engine["busy_s"]
    return {"turns": len(rows), "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "forwards": forwards, "rows_per_forward": get_ratio(engine.get("rows"), forwards),
            "engine_busy_share": None if busy is None else busy / wall,
            "server_cpu_s": cpu, "cpu_per_token_s": cpu / tokens if cpu is not None and tokens else None,
            "p50_s": get_percentile(latency, 0.5), "p99_s": get_percentile(latency, 0.99),
            "ttft_p50_s": get_percentile(ttft, 0.5), "ttft_p99_s": get_percentile(ttft, 0.99),
            "tpot_p50_s": get_percentile(tpot, 0.5), "tokens_per_turn": tokens / len(rows),
            "round_tokens_per_s": per_round}


def summarise_system(rows: list[dict], floor: dict | None) -> dict:
    out: dict = {"levels": {}}
    for level in sorted({r["level"] for r in rows if r["phase"] == "load"}):
        out["levels"][level] = summarise_level([r for r in rows if r["phase"] == "load" and r["level"] == level])
    steps = {r["step"]: r for r in rows if r["phase"] in ("history", "delete")}
    out["history"] = {step: steps[step]["latency_s"] for step in ("first", "warm", "after another") if step in steps}
    out["history_cpu"] = {step: steps[step].get("server_cpu_s") for step in out["history"]}
    deletes = [r for r in rows if r["phase"] == "delete" and r["step"] == "delete"]
    if deletes:
        out["delete"] = summarise_deletes(deletes, floor)
    alone = [r["latency_s"] for r in rows if r["phase"] == "delete" and r["step"] == "other alone"]
    during = [r["latency_s"] for r in rows if r["phase"] == "delete" and r["step"] == "other during delete"]
    if alone and during:
        slowdowns = [d / a for a, d in zip(alone, during)]
        out["other_turn"] = {"alone_s": get_median(alone), "during_delete_s": get_median(during),
                             "slowdown": get_median(slowdowns), "round_slowdown": slowdowns}
    if "resend without the item" in steps:
        out["resend_s"] = steps["resend without the item"]["latency_s"]
        out["resend_cpu_s"] = steps["resend without the item"].get("server_cpu_s")
    return out


def summarise_deletes(deletes: list[dict], floor: dict | None) -> dict:
    """The DELETE rounds: the medians of each figure, and of each round's ratios to the floor
    timed right after its DELETE (a run before --delete-rounds timed one ``floor`` at its end)."""
    floors = [r.get("floor") or floor for r in deletes]
    out = {key: get_median([r.get(key) for r in deletes])
           for key in ("latency_s", "report_wall_s", "server_cpu_s", "prefilled_tokens", "decoded_tokens",
                       "forward_calls") if all(r.get(key) is not None for r in deletes)}
    if all(floors):
        cpu = [get_ratio(r.get("server_cpu_s"), f["cpu_s"]) for r, f in zip(deletes, floors)]
        out |= {"floor_wall_s": get_median([f["wall_s"] for f in floors]),
                "floor_cpu_s": get_median([f["cpu_s"] for f in floors]),
                "x_floor": get_median([r["latency_s"] / f["wall_s"] for r, f in zip(deletes, floors)]),
                "x_floor_cpu": get_median(cpu), "round_x_floor_cpu": cpu,
                "reset_digest_equal": all(f["reset_digest_equal"] for f in floors)}
    return out


def get_median(values: list) -> float | None:
    """The median, or None where any is missing."""
    return None if not values or None in values else statistics.median(values)


def get_ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def get_rounds(ratios: list | None) -> str:
    """Each round's ratio, after the median a goal reads, where there was more than one round."""
    if not ratios or len(ratios) < 2:
        return ""
    return f"median of rounds {', '.join(_fmt(r) + 'x' for r in ratios)}"


def compute_goals(systems: dict) -> list[dict]:
    """The goals against the reference server (llama-server where it ran: issue 50's; else
    llama_cpp.server: issue 40's), each with its measured figure (None where not measured)."""
    reference = next((r for r in REFERENCES if r in systems), "peer")
    name, issue, concurrent_bar = REFERENCES[reference]
    peer, ours = systems.get(reference), systems.get("unsee")
    goals = []

    def add(goal: str, value: float | None, bar: float, at_least: bool, detail: str = "") -> None:
        met = None if value is None else (value >= bar if at_least else value <= bar)
        goals.append({"goal": goal, "value": value, "bar": bar, "met": met, "detail": detail, "issue": issue})

    def level(system: dict | None, n: int, key: str) -> float | None:
        return (system or {}).get("levels", {}).get(n, {}).get(key)

    def by_round(n: int) -> str:
        """Each round's ratio of tokens/s, where the load ran in more than one."""
        ratios = [get_ratio(a, b) for a, b in zip(level(ours, n, "round_tokens_per_s") or [],
                                                  level(peer, n, "round_tokens_per_s") or [])]
        return f"; by round: {', '.join(_fmt(r) + 'x' for r in ratios)}" if len(ratios) > 1 else ""

    per_token = get_ratio(level(peer, 1, "cpu_per_token_s"), level(ours, 1, "cpu_per_token_s"))
    add(f"1 conversation: output tokens/s vs {name}",
        get_ratio(level(ours, 1, "tokens_per_s"), level(peer, 1, "tokens_per_s")), 0.95, True,
        f"output tokens per server CPU second: {_fmt(per_token)}x{by_round(1)}")
    add(f"1 conversation: time to first token vs {name}",
        get_ratio(level(ours, 1, "ttft_p50_s"), level(peer, 1, "ttft_p50_s")), 1.1, False)
    if reference == "peer":
        theirs, mine = (peer or {}).get("history", {}), (ours or {}).get("history", {})
        after = get_ratio(mine.get("after another"), theirs.get("after another"))
        add(f"follow-up turn at the history: latency vs {name}'s (history resent, warm)",
            get_ratio(mine.get("warm"), theirs.get("warm")), 0.5, False,
            f"after another conversation's turn: {_fmt(after)}x")
    top = max(set((peer or {}).get("levels", {})) & set((ours or {}).get("levels", {})), default=None)
    add(f"{top or 'the most'} concurrent conversations: aggregate tokens/s vs {name}",
        get_ratio(ours["levels"][top]["tokens_per_s"], peer["levels"][top]["tokens_per_s"]) if top else None,
        concurrent_bar, True,
        f"digests against serial replays: not part of this bench (the scheduler's test){by_round(top) if top else ''}")
    delete, other = (ours or {}).get("delete", {}), (ours or {}).get("other_turn", {})
    add("DELETE vs the compute floor of its forget, by CPU seconds", delete.get("x_floor_cpu"), 1.15, False,
        "; ".join(filter(None, [f"by wall: {_fmt(delete.get('x_floor'))}x",
                                get_rounds(delete.get("round_x_floor_cpu"))])))
    add("another conversation's turn during a DELETE vs alone", other.get("slowdown"), 1.2, False,
        get_rounds(other.get("round_slowdown")))
    return goals


def summarise(rows: list[dict], floor: dict | None, args: argparse.Namespace) -> dict:
    systems = {s: summarise_system([r for r in rows if r["system"] == s], floor if s == "unsee" else None)
               for s in LABELS if any(r["system"] == s for r in rows)}
    return {"systems": systems, "goals": compute_goals(systems),
            "workload": {"turns": args.turns, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                         "history_tokens": args.history_tokens}}


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def get_table_rows(systems: dict, workload: dict) -> list[tuple[str, list[str]]]:
    """(metric, one cell per system) for the main table."""
    def cell(get):
        return [get(s) for s in systems.values()]

    rows = []
    for level in workload["concurrency"]:
        def lv(s: dict, k: str, level: int = level) -> float | None:
            return s["levels"].get(level, {}).get(k)

        rows.append((f"{level} conversation(s): output tokens/s", cell(lambda s: _fmt(lv(s, "tokens_per_s")))))
        rows.append((f"{level} conversation(s): p50 / p99 turn",
                     cell(lambda s: f"{_fmt(lv(s, 'p50_s'), ' s')} / {_fmt(lv(s, 'p99_s'), ' s')}")))
        rows.append((f"{level} conversation(s): time to first streamed text, p50",
                     cell(lambda s: _fmt(lv(s, "ttft_p50_s"), " s"))))
        rows.append((f"{level} conversation(s): time per output token after the first, p50",
                     cell(lambda s: _fmt(None if lv(s, "tpot_p50_s") is None else 1000 * lv(s, "tpot_p50_s"), " ms", 1))))
        rows.append((f"{level} conversation(s): server CPU per output token",
                     cell(lambda s: _fmt(lv(s, "cpu_per_token_s"), " s", 3))))
        if any(lv(s, "forwards") is not None for s in systems.values()):
            rows.append((f"{level} conversation(s): forwards; conversations per forward; engine busy",
                         cell(lambda s: "-" if lv(s, "forwards") is None else
                              f"{lv(s, 'forwards'):.0f}; {_fmt(lv(s, 'rows_per_forward'))}; "
                              f"{_fmt(None if lv(s, 'engine_busy_share') is None else 100 * lv(s, 'engine_busy_share'), '%', 0)}")))
    n = workload["history_tokens"]
    def both(wall: float | None, cpu: float | None) -> str:
        return "-" if wall is None and cpu is None else f"{_fmt(wall, ' s')}; {_fmt(cpu, ' s')}"

    for step, name in (("first", f"{n}+ tokens of history: first turn"), ("warm", "its follow-up, right after"),
                       ("after another", "its follow-up, after another conversation's turn")):
        rows.append((f"{name} (wall; server CPU)",
                     cell(lambda s, step=step: both(s["history"].get(step), s["history_cpu"].get(step)))))
    rows.append(("DELETE of a first-turn item, the exact forget (wall; server CPU)",
                 cell(lambda s: both(s.get("delete", {}).get("latency_s"), s.get("delete", {}).get("server_cpu_s")))))
    rows.append(("its compute floor (wall; CPU)", cell(lambda s: "-" if "floor_wall_s" not in s.get("delete", {})
                                                       else f"{s['delete']['floor_wall_s']:.2f} s; "
                                                            f"{s['delete']['floor_cpu_s']:.2f} s")))
    rows.append(("the conversation resent without the item, every turn anew (wall; server CPU)",
                 cell(lambda s: both(s.get("resend_s"), s.get("resend_cpu_s")) if "resend_s" in s else "-")))
    rows.append(("another conversation's turn: alone / during a DELETE",
                 cell(lambda s: "-" if "other_turn" not in s else
                      f"{s['other_turn']['alone_s']:.2f} s / {s['other_turn']['during_delete_s']:.2f} s")))
    return rows


def get_delete_counts(result: dict) -> str:
    """The DELETE's own counts from its report, to set beside the floor's (a run before they
    were recorded has none)."""
    delete = result["summary"]["systems"].get("unsee", {}).get("delete", {})
    if "forward_calls" not in delete:
        return ""
    return (f" The DELETE (its report, the median of its rounds): {delete['prefilled_tokens']:g} tokens prefilled, "
            f"{delete['decoded_tokens']:g} decoded, {delete['forward_calls']:g} forwards.")


def get_threads_note(label: dict) -> str:
    """The servers' threads: a count each, or each server's own defaults."""
    if label.get("threads") is None:
        unsee = ("unsee decoding a lone conversation's steps on one thread" if "unsee_threads" not in label else
                 f"unsee decoding a lone conversation's steps on {label['unsee_threads']} thread(s)")
        return ("each server with its own thread defaults (llama-server and llama_cpp.server as they start, "
                f"{unsee}, its prefill and its conversations' batched steps on every core)")
    return f"{label['threads']} thread(s) each{get_batch_note(label)}"


def get_batch_note(label: dict) -> str:
    """The prefill threads, where they differ from the decode threads."""
    batch = label.get("batch_threads")
    return f" ({batch} for forwards of several tokens)" if batch and batch != label["threads"] else ""


def get_label_line(label: dict, workload: dict) -> str:
    """The figure's label in the docs' shape (tests/test_docs.py): build and workload, attention,
    dtype, CPU with its load and the threads, command."""
    gguf = label.get("gguf", "")
    quant = gguf.rsplit("-", 1)[-1].removesuffix(".gguf").upper() if gguf else "the GGUF's"
    build, dirty = label["build"].removesuffix("-dirty"), label["build"].endswith("-dirty")
    return (f"> build `{build}`{' with uncommitted changes' if dirty else ''}, {label['model']}, {workload['turns']} turns of up to "
            f"{workload['max_tokens']} tokens, greedy, streamed · attention llama.cpp's own kernels (unsee: exact; "
            f"llama_cpp.server: its default, repacked), flash attention on · dtype {quant} weights, f16 KV · "
            f"CPU {label['cpu']}, {label['cores']} cores (load average {label['load_average']:.1f} at the start, "
            f"{label.get('load_average_end', 0):.1f} at the end), {get_threads_note(label)}"
            f"{'; llama-server --parallel ' + str(label['parallel']) if label.get('parallel') else ''}"
            f"{get_rounds_note(label)} · command `{label['command']}`")


def get_rounds_note(label: dict) -> str:
    rounds = label.get("rounds", 1)
    return (f"; the load phase {rounds} times, every server started first, the systems' order reversed "
            "every other round" if rounds > 1 else "")


def format_markdown(result: dict) -> str:
    label, summary = result["label"], result["summary"]
    systems, workload = summary["systems"], summary["workload"]
    lines = [get_label_line(label, workload), "",
             "| | " + " | ".join(LABELS[s] for s in systems) + " |", "|---|" + "---:|" * len(systems)]
    lines += [f"| {metric} | " + " | ".join(cells) + " |" for metric, cells in get_table_rows(systems, workload)]
    issue = summary["goals"][0].get("issue", 40) if summary["goals"] else 40
    lines += ["", f"| goal (issue {issue}) | measured | bar | met |", "|---|---:|---:|---|"]
    for g in summary["goals"]:
        met = "not measured" if g["met"] is None else ("yes" if g["met"] else "**no**")
        detail = f" ({g['detail']})" if g["detail"] else ""
        lines.append(f"| {g['goal']}{detail} | {_fmt(g['value'], 'x')} | {'>=' if 'tokens/s' in g['goal'] else '<='} "
                     f"{g['bar']}x | {met} |")
    floor = result.get("floor")
    if floor:
        lines += ["", f"Compute floor: {floor['prefilled']} tokens prefilled, {floor['decoded']} decoded, "
                      f"{floor['forwards']} forwards; the full reset reaches the server's digest after the DELETE: "
                      f"{floor['reset_digest_equal']}.{get_delete_counts(result)}"]
    return "\n".join(lines) + "\n"


def read_result(result: dict) -> dict:
    """A run's result as JSON gave it back: its levels keyed by int again (JSON writes them as
    strings, and a table read by string keys shows no load figures)."""
    for system in (result.get("summary") or {}).get("systems", {}).values():
        if system and "levels" in system:
            system["levels"] = {int(k): v for k, v in system["levels"].items()}
    return result


def get_scaling_label(results: list[dict]) -> str:
    """The scaling table's label line: the first run's, with every run's thread count, command
    and the highest load average."""
    first = results[0]["label"]
    label = {**first, "threads": " and ".join(str(r["label"]["threads"]) for r in results), "batch_threads": None,
             "command": " and ".join(f"`{r['label']['command']}`" for r in results).strip("`"),
             "load_average": max(r["label"]["load_average"] for r in results),
             "load_average_end": max(r["label"].get("load_average_end", 0) for r in results)}
    return get_label_line(label, results[0]["summary"]["workload"])


def format_scaling(results: list[dict], labelled: bool = False) -> str:
    """Runs at several thread counts (``--threads``, one run each): per system and level, output
    tokens/s at each count and the growth from the fewest threads to the most (``labelled``:
    under the runs' label line)."""
    results = sorted(results, key=lambda r: r["label"]["threads"] or 0)
    counts = [r["label"]["threads"] for r in results]
    systems = [s for s in LABELS if any(s in r["summary"]["systems"] for r in results)]
    levels = sorted({lv for r in results for s in r["summary"]["systems"].values() for lv in s.get("levels", {})})
    lines = [get_scaling_label(results), ""] if labelled else []
    lines += ["| system | conversations | " + " | ".join(f"{t} thread(s): tokens/s" for t in counts)
             + f" | {counts[-1]} / {counts[0]} threads |", "|---|---:|" + "---:|" * (len(counts) + 1)]
    for system in systems:
        for lv in levels:
            values = [r["summary"]["systems"].get(system, {}).get("levels", {}).get(lv, {}).get("tokens_per_s")
                      for r in results]
            lines.append(f"| {LABELS[system]} | {lv} | " + " | ".join(_fmt(v) for v in values)
                         + f" | {_fmt(get_ratio(values[-1], values[0]), 'x')} |")
    return "\n".join(lines) + "\n"


def render_region(kind: str, kept) -> str:
    """The region's markdown from what :func:`write_docs` kept (read back as JSON gives it)."""
    kept = json.loads(json.dumps(kept))
    if kind == "goals":
        return format_markdown(read_result(kept))
    return format_scaling([read_result(r) for r in kept], labelled=True)


def write_docs(kind: str, results: list[dict], page: Path) -> None:
    """Rewrite ``page``'s region of ``kind`` (:data:`REGIONS`: the goal run's table from one
    result, or the scaling table from the runs at each thread count), and keep the labels
    and summaries it is rendered from beside the page."""
    name, file, command = REGIONS[kind]
    kept = [{k: r.get(k) for k in ("label", "summary", "floor")} for r in results]
    kept = kept[0] if kind == "goals" else kept
    (page.parent / file).write_text(json.dumps(kept, indent=1) + "\n")
    page.write_text(replace_region(page.read_text(), name, render_region(kind, kept), command))


def merge_results(results: list[dict]) -> dict:
    """Runs of one workload, one system each (run one after another, as the bench runs its
    servers), as one result: every row, the floor of the run that measured one, the first
    run's label with every run's command and the highest load average, the goals recomputed."""
    rows = [r for result in results for r in result["rows"]]
    floor = next((r["floor"] for r in results if r.get("floor")), None)
    label = {**results[0]["label"], "command": " and ".join(f"`{r['label']['command']}`" for r in results).strip("`"),
             "load_average": max(r["label"]["load_average"] for r in results),
             "load_average_end": max(r["label"].get("load_average_end", 0) for r in results)}
    workload = argparse.Namespace(**results[0]["summary"]["workload"])
    return {"label": label, "summary": summarise(rows, floor, workload), "floor": floor, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Print a run's markdown again from its serve-peer.json (``--gguf``: the file's name, for a run
    recorded before the label named it), or (``--scaling``) the scaling table of several runs' folders."""
    parser = argparse.ArgumentParser(prog="python -m unsee.bench.serve_peer_table", description=main.__doc__)
    parser.add_argument("json", nargs="+", help="a serve-peer.json, or with --scaling the runs' folders or files")
    parser.add_argument("--gguf", help="the GGUF's file name, where the run's label lacks it")
    parser.add_argument("--scaling", action="store_true", help="the scaling table of runs at several thread counts")
    parser.add_argument("--merge", action="store_true", help="runs of one workload, a system each, as one table")
    parser.add_argument("--docs", metavar="PAGE", help="also write the table into PAGE's generated region "
                        "(docs/serve.md), the runs' summaries beside it")
    args = parser.parse_args(argv)
    paths = [Path(p) / "serve-peer.json" if Path(p).is_dir() else Path(p) for p in args.json]
    results = [read_result(json.loads(p.read_text())) for p in paths]
    if args.scaling:
        print(format_scaling(results, labelled=True), end="")
        if args.docs:
            write_docs("scaling", results, Path(args.docs))
        return 0
    result = merge_results(results) if args.merge else results[0]
    if args.gguf and "gguf" not in result["label"]:
        result["label"]["gguf"] = args.gguf
    print(format_markdown(result), end="")
    if args.docs:
        write_docs("goals", [result], Path(args.docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
