"""The markdown of a bench/serve_compaction.py run (docs/serve.md, "Long conversations"): the
DELETE through a compaction against its floor, and the Agents SDK conversation turn by turn.

    python -m unsee.bench.serve_compaction --table out/serve-compaction/results.json
"""

from __future__ import annotations

#: the goal of issue 52: a DELETE through one compaction within this many times its compute floor
GOAL = 1.15


def get_label_line(label: dict) -> str:
    """The figure's label (bench/options.py's FIGURE_LABEL)."""
    return (f"> build `{label['build']}` · attention llama.cpp, the server's default threads · dtype "
            f"{label['model']} Q4_K_M, f16 KV · CPU {label['cpu']}, {label['cores']} cores shared (load average "
            f"{label['load_average']:.1f} at the start) · command `{label['command']}`")


def fmt(x, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def get_met(ratio: float | None) -> str:
    return "not measured" if ratio is None else "met" if ratio <= GOAL else "not met"


def get_delete_table(d: dict) -> list[str]:
    floor, cost = d["floor"], d["delete"]
    eq = d["equals_twin"]
    rows = [
        "| | the DELETE | its floor | ratio |",
        "|---|---:|---:|---:|",
        f"| CPU of the process, s | {fmt(cost['cpu_s'])} | {fmt(floor['cpu_s'])} | {fmt(d['cpu_over_floor'])}x |",
        f"| wall, s | {fmt(cost['wall_s'])} | {fmt(floor['wall_s'])} | {fmt(cost['wall_s'] / floor['wall_s'])}x |",
        f"| forwards | {cost['forwards']} | {floor['forwards']} | {fmt(d['forwards_over_floor'])}x |",
        f"| tokens prefilled + decoded | {cost['prefilled']} + {cost['decoded']} | {floor['prefilled']} + "
        f"{floor['decoded']} | {fmt(d['tokens_over_floor'])}x |",
        "",
        f"tau {d['report']['tau']}, T {d['report']['length']}, invocations {d['report']['invocations']} (the "
        f"summary one of them); compacted before turn(s) {d['compacted_at']} (the twin: {d['twin_compacted_at']}); "
        f"summaries that read the secret: {floor['summaries_that_read_the_secret']}. Equal to the twin: digest "
        f"{eq['digest']}, items {eq['items']}, next answer {eq['next_answer']}; the full reset's digest equal: "
        f"{floor['reset_digest_equal']}; after a restart the digest read back: {d['restart_digest_equal']}; files "
        f"holding the secret: {len(d['files_holding_secret'])}; the DELETE's reply (receipt included) holds it: "
        f"{d['reply_holds_secret']}. Goal {GOAL}x the floor: on CPU {get_met(d['cpu_over_floor'])}, on forwards "
        f"{get_met(d['forwards_over_floor'])}.",
    ]
    return rows


def get_agents_table(a: dict, ctx: int) -> list[str]:
    rows = ["| turn | requests | tool calls | largest prompt | compaction: read / summary / kept round / context after | "
            "conversation, tokens | CPU, s | wall, s | error |",
            "|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in a["turns"]:
        c = r["compaction"]
        cell = (f"{c['read_tokens']} / {c['summary_tokens']} / {c.get('kept_tokens', 0)} / "  # 0: a run before the round
                f"{c['context_tokens_after']}") if c else ""
        rows.append(f"| {r['turn']} | {r['requests']} | {r['tool_calls']} | {r['largest_prompt']} | {cell} | "
                    f"{r['conversation_tokens']} | {fmt(r['cpu_s'], 1)} | {fmt(r['wall_s'], 1)} | "
                    f"{r['error'] or ''} |")
    rows += ["", f"{a['conversation_tokens']} tokens of items ({fmt(a['times_the_context'])}x the {ctx}-token "
                 f"context), {a['compactions']} compactions, {len(a['errors'])} errors."]
    return rows


def get_table(result: dict) -> str:
    lines = [get_label_line(result["label"]), ""]
    if "delete" in result:
        lines += get_delete_table(result["delete"]) + [""]
    if "agents" in result:
        lines += get_agents_table(result["agents"], result["ctx_size"])
    return "\n".join(lines)


def is_ok(result: dict) -> bool:
    """Whether the run's checks held (the goal's ratio is reported, not checked here)."""
    ok = True
    if "delete" in result:
        d = result["delete"]
        ok &= all(d["equals_twin"].values()) and d["restart_digest_equal"] and not d["files_holding_secret"] \
            and not d["reply_holds_secret"] and d["floor"]["reset_digest_equal"]
    if "agents" in result:
        a = result["agents"]
        ok &= not a["errors"] and a["times_the_context"] >= result.get("times", 3)
    return bool(ok)


__all__ = ["GOAL", "get_table", "is_ok"]
