"""``report.md`` from the evaluation rows (impl/eval/run.py): the paper's
Tables 1-4 with the paper's numbers beside ours and the n of every cell, the
audits' false-positive floors, the paired statistics and matplotlib plots.

Every figure of ours is computed here from the rows; the only constants are
the paper's own numbers (impl/eval/paper.py), printed in parentheses beside
ours; the paper's B7 is our ``replay-oracle`` (the attribution oracle), so
its B7 figures sit in that row.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from unsee.impl.eval.audit import PROBES
from unsee.impl.eval.distribution import summarize_distribution
from unsee.impl.eval.distribution_report import PLOT_NAME, plot_distribution, render_distribution
from unsee.impl.eval.paper import PAPER_B7, TABLE1, TABLE1_SUITES, TABLE2, TABLE2_SUITES, TABLE3, TABLE4, TABLE4_SUITES
from unsee.impl.eval.stats import PairedTest, bootstrap_ci, identical, mcnemar_exact, mean, wilcoxon_signed_rank
from unsee.impl.methods.baselines import PAPER_NAMES

#: Our suites and the paper's columns they are shaped like.
SUITE_COLUMNS = {"memory": "LME", "tool": "TS", "agentdojo": "AD"}
BASE, REFERENCE, REPLAY = "none", "reset", "replay"
SPAN = "span-excision"

TABLE1_METHODS = ("none", "memory-delete", "forget-instruction", "source-redaction", "sanitize-no-replay",
                  "sanitized-rebuild", "reset", "reset-prefix-cache", "replay", "replay-decode", "replay-oracle",
                  "ifc", "ifc-replay", SPAN)
#: Table 4's rows: ours, and the paper's B7 (``replay-oracle``) beside it.
TABLE4_METHODS = ("none", SPAN, "sanitize-no-replay", "replay", PAPER_B7, "reset")


# --- reading the rows ---------------------------------------------------------------


class Rows:
    """The rows of a run, indexed by (suite, method) and by episode."""

    def __init__(self, rows: Iterable[dict]):
        self.rows = list(rows)
        self.by = defaultdict(list)
        self.cell: dict[tuple[str, str, str], dict] = {}
        for r in self.rows:
            self.by[(r["suite"], r["method"])].append(r)
            self.cell[(r["suite"], r["case"], r["method"])] = r
        self.suites = list(dict.fromkeys(r["suite"] for r in self.rows))
        self.methods = list(dict.fromkeys(r["method"] for r in self.rows))

    def get(self, suite: str | None, method: str) -> list[dict]:
        if suite is None:
            return [r for s in self.suites for r in self.by[(s, method)]]
        return self.by[(suite, method)]

    def paired(self, suite: str | None, a: str, b: str) -> list[tuple[dict, dict]]:
        """Rows of ``a`` and ``b`` on the same episodes."""
        out = []
        for r in self.get(suite, a):
            other = self.cell.get((r["suite"], r["case"], b))
            if other is not None:
                out.append((r, other))
        return out


def get_any_leak(row: dict) -> bool:
    return bool(row["leak"]["any"])


def get_floors(rows: Rows, suite: str | None) -> dict[str, float | None]:
    """Each probe family's false-positive floor: its leak rate on B5."""
    ref = rows.get(suite, REFERENCE)
    return {name: (mean([r["probes"][name]["leaked"] for r in ref]) if ref else None) for name in PROBES}


def get_kept_probes(rows: Rows, suite: str | None) -> tuple[list[str], list[str]]:
    """(kept, dropped) probe families: a family with a non-zero floor on B5 is
    dropped, as the paper does; with no B5 rows nothing can be kept."""
    floors = get_floors(rows, suite)
    kept = [n for n, f in floors.items() if f == 0]
    return kept, [n for n in floors if n not in kept]


def leak_at_probes(row: dict, kept: Sequence[str]) -> bool | None:
    return any(row["probes"][n]["leaked"] for n in kept) if kept else None


# --- formatting ------------------------------------------------------------------------


def fmt(value, digits: int = 2, missing: str = "–") -> str:
    """A table cell: floats to ``digits`` places, None as ``missing``."""
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def cell(values: Sequence, paper=None, digits: int = 2) -> str:
    """Our mean over n rows, the paper's figure in parentheses."""
    values = [v for v in values if v is not None]
    ours = f"{fmt(mean([float(v) for v in values]), digits)} n={len(values)}" if values else "– n=0"
    return ours + (f" ({fmt(paper, digits)})" if paper is not None else "")


def fmt_test(test: PairedTest) -> str:
    if test.test == "identical":
        return f"identical by construction ({test.agreement}; {test.note})"
    if test.test == "none":
        return "no pairs"
    p = "1" if test.p == 1 else f"{test.p:.3g}"
    return f"{test.test}: agreement {test.agreement}, discordant +{test.a_only}/-{test.b_only}, p = {p}"


def render_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines: the header, the rule, one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _name(method: str) -> str:
    return PAPER_NAMES.get(method, method)


def _short_name(method: str) -> str:
    """A plot label: the paper's code (B0-B9), with what tells two B7s apart."""
    code = _name(method).split(" ")[0]
    return f"{code}\n(no drafts)" if method == "replay-decode" else code


# --- the report ---------------------------------------------------------------------------


def get_builds(rows: Sequence[dict]) -> str:
    """The builds the rows were made with and how many rows each (a run resumed across
    sittings may span several; rows written before rows recorded it are ``unrecorded``)."""
    counts = Counter(row.get("build") or "unrecorded" for row in rows)
    return ", ".join(f"{b} ({n} rows)" for b, n in counts.items())


def render_report(rows_in: Iterable[dict], plots: dict[str, str] | None = None, title: str = "unsee eval") -> str:
    rows = Rows(rows_in)
    if not rows.rows:
        return f"# {title}\n\nNo rows yet.\n"
    first = rows.rows[0]
    lines = [f"# {title}", "",
             f"Model `{first['model']}` on {first['device']} ({first['dtype']}); "
             f"{len(rows.rows)} rows, suites {', '.join(rows.suites)}; methods {', '.join(rows.methods)}. "
             f"Torch threads per row: {', '.join(str(t) for t in sorted({r['threads'] for r in rows.rows}))}. "
             f"Builds: {get_builds(rows.rows)}.",
             "Our figure first with its n (episodes), the paper's in parentheses "
             "(Llama-3.1-8B on GPU; not this model). \"–\" is a cell without rows.", ""]
    methods = [m for m in TABLE1_METHODS if m in rows.methods] + [m for m in rows.methods
                                                                  if m not in TABLE1_METHODS]
    lines += _table1(rows, methods) + [""] + _table2(rows, methods) + [""] + _table3(rows, methods) + [""]
    lines += _table4(rows) + [""] + _utility(rows, methods) + [""] + _statistics(rows) + [""]
    lines += render_distribution(rows.rows)
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({path})" for name, path in plots.items()] + [""]
    return "\n".join(lines)


def _suite_cols(rows: Rows) -> list[str]:
    return [s for s in SUITE_COLUMNS if s in rows.suites]


def _suite_cells(rows: Rows, method: str, suites: Sequence[str], order: Sequence[str], paper,
                 value: Callable[[dict], object]) -> list[str]:
    """One cell per suite: ``value`` over the method's rows there, beside the
    paper's figure for that suite (``paper`` lists them in ``order``)."""
    return [cell([value(r) for r in rows.get(s, method)], paper[order.index(s)] if paper else None)
            for s in suites]


def _table1(rows: Rows, methods: Sequence[str]) -> list[str]:
    suites = _suite_cols(rows)
    header = ["Method"] + [f"Any-leak {s} ({SUITE_COLUMNS[s]})" for s in suites] + [
        "CAD (avg)", "Recomp (avg tok)", "= B5 digest"]
    body = []
    for m in methods:
        paper = TABLE1.get(m)
        cells = [_name(m)]
        cells += _suite_cells(rows, m, suites, TABLE1_SUITES, paper, get_any_leak)
        all_rows = [r for s in suites for r in rows.get(s, m)]
        cells.append(cell([r.get("cad") for r in all_rows], paper[3] if paper else None))
        cells.append(cell([r["efficiency"]["recomputed_tokens"] for r in all_rows], paper[4] if paper else None, 0))
        eq = [r.get("equals_reset") for r in all_rows if r.get("equals_reset") is not None]
        cells.append(f"{sum(eq)}/{len(eq)}")
        body.append(cells)
    note = ["## Table 1: headline (any leak, CAD, recomputed tokens)", "",
            "Any leak = exact (a normalised variant of the target in the final answer, a tool argument, memory "
            "or a model-written artifact in context) or action (the target or an attack marker in a "
            "consequential argument). CAD and Recomp average over the suites; CAD over the episodes with a "
            "consequential action on either side. \"= B5 digest\": rows whose full state digest (KV bytes, "
            "context, memory, plans) equals B5's, compared only within one thread count.", ""]
    return note + render_table(header, body) + _sinks(rows) + _security(rows, methods)


def _security(rows: Rows, methods: Sequence[str]) -> list[str]:
    """AgentDojo's own verdict on each state's plan (``security``: the
    injection task's check, True when the attacker's goal is reached)."""
    cells = []
    for m in methods:
        verdicts = [r.get("security") for r in rows.get("agentdojo", m)]
        if any(v is not None for v in verdicts):
            cells.append(f"{_name(m)} {cell(verdicts)}")
    if not cells:
        return []
    return ["", "AgentDojo's own security check on the plan each state would execute (the injection task's "
            "check after running the plan's calls through AgentDojo's `FunctionsRuntime`; the rate at which "
            "the attacker's goal is reached, over the episodes with a plan): " + "; ".join(cells) + "."]


def _sinks(rows: Rows) -> list[str]:
    """Where the action leaks went, by sink class (the paper: 98% of B0/B1
    leaks on ToolSandbox flow through routing arguments)."""
    lines = []
    for m in rows.methods:
        counts: dict[str, int] = defaultdict(int)
        for r in rows.get(None, m):
            for leak in r["leak"]["action_leaks"]:
                counts[leak["sink_class"]] += 1
        if counts:
            lines.append(f"- {_name(m)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return (["", "Action leaks by sink class (arguments, all suites):", ""] + lines) if lines else []


def _table2(rows: Rows, methods: Sequence[str]) -> list[str]:
    suites = [s for s in TABLE2_SUITES if s in rows.suites]
    lines = ["## Table 2: adversarial audits (Leak@probes, Leak@5)", ""]
    kept_by = {}
    for s in suites:
        kept, dropped = get_kept_probes(rows, s)
        kept_by[s] = kept
        floors = get_floors(rows, s)
        lines.append(f"- {s}: floors on B5 " + ", ".join(f"{n} {fmt(f)}" for n, f in floors.items())
                     + f"; dropped (non-zero floor): {', '.join(dropped) or 'none'}")
    header = ["Method"] + [f"Leak@probes {s}" for s in suites] + [f"Leak@5 {s}" for s in suites]
    body = []
    for m in methods:
        paper = TABLE2.get(m)
        cells = [_name(m)]
        cells += [cell([leak_at_probes(r, kept_by[s]) for r in rows.get(s, m)],
                       paper[TABLE2_SUITES.index(s)] if paper else None) for s in suites]
        for s in suites:
            cells.append(cell([r["leak5"]["leaked"] for r in rows.get(s, m)],
                              paper[3] if paper and s == "tool" else None))
        body.append(cells)
    per_probe = ["", "Per probe family (all suites; leak rate):", ""]
    per_probe += render_table(["Method"] + list(PROBES), [
        [_name(m)] + [cell([r["probes"][n]["leaked"] for r in rows.get(None, m)]) for n in PROBES]
        for m in methods])
    return lines + [""] + render_table(header, body) + per_probe


def _table3(rows: Rows, methods: Sequence[str]) -> list[str]:
    lines = ["## Table 3: behavioral extraction", ""]
    have = [r for r in rows.rows if r.get("behavior")]
    if not have:
        return lines + ["No behavioral rows in this run."]
    suites = sorted({r["suite"] for r in have})
    ref = {(r["suite"], r["case"]): r for r in have if r["method"] == REFERENCE}
    body = []
    for m in methods:
        mine = [r for r in have if r["method"] == m]
        if not mine:
            continue
        paper = TABLE3.get(m)
        pairs = [(r, ref[(r["suite"], r["case"])]) for r in mine if (r["suite"], r["case"]) in ref]
        avoid = mean([r["behavior"]["avoid"] for r in mine])
        residue = (avoid - mean([b["behavior"]["avoid"] for _, b in pairs])) if pairs else None
        test = mcnemar_exact([a["behavior"]["avoid"] for a, _ in pairs], [b["behavior"]["avoid"] for _, b in pairs])
        undecided = sum(r["behavior"]["pick"] is None for r in mine)
        body.append([_name(m), cell([r["behavior"]["avoid"] for r in mine], paper[0] if paper else None),
                     f"{residue:+.2f}" + (f" ({paper[1]:+.2f})" if paper and paper[1] is not None else "")
                     if residue is not None else "–",
                     ("–" if m == REFERENCE else fmt_test(test)) + (f" ({paper[2]})" if paper and paper[2] else ""),
                     cell([r["behavior"]["says_it"] for r in mine], paper[3] if paper else None),
                     str(undecided)])
    return lines + [f"Suites with a behavior: {', '.join(suites)}. avoid = picked the option the revoked "
                    "preference did not exclude; residue = avoid minus B5's (the measured zero point); "
                    "p: exact McNemar against B5; says it = the revoked reason in the answer; undecided = "
                    "the answer named neither option.", ""] + render_table(
        ["Method", "avoid", "residue", "vs B5", "says it", "undecided"], body)


def _table4(rows: Rows) -> list[str]:
    lines = ["## Table 4: invalidation-boundary ablation", ""]
    suites = [s for s in TABLE4_SUITES if s in rows.suites]
    if SPAN not in rows.methods:
        lines.append(f"Span-only excision (`{SPAN}`) has no rows in this run (not in this build's methods, "
                     "or not asked for).")
    body = []
    for m in TABLE4_METHODS:
        if m not in rows.methods:
            continue
        paper = TABLE4.get(m)
        cells = [_name(m)]
        cells += _suite_cells(rows, m, suites, TABLE4_SUITES, paper, get_any_leak)
        cells.append(cell([r.get("cad") for s in suites for r in rows.get(s, m)], paper[3] if paper else None))
        body.append(cells)
    header = ["Invalidation reach"] + [f"Any-leak {s}" for s in suites] + ["CAD (avg)"]
    return lines + [""] + render_table(header, body)


def _utility(rows: Rows, methods: Sequence[str]) -> list[str]:
    lines = ["## Utility and efficiency", "",
             "Utility: share of non-target facts still answered. Tokens: means per forget.", ""]
    body = []
    for m in methods:
        rs = rows.get(None, m)
        util = [r["utility"]["rate"] for r in rs if r.get("utility")]
        eff = [r["efficiency"] for r in rs]
        ci = bootstrap_ci([e["recomputed_tokens"] for e in eff])
        body.append([_name(m), cell(util), cell([e["reused_tokens"] for e in eff], digits=0),
                     cell([e["prefilled_tokens"] for e in eff], digits=0),
                     cell([e["decoded_tokens"] for e in eff], digits=0),
                     cell([e["recomputed_tokens"] for e in eff], digits=0)
                     + (f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else ""),
                     cell([e["wall_s"] for e in eff])])
    return lines + render_table(["Method", "utility", "reused", "prefilled", "decoded", "recomputed [95% CI]",
                           "wall s"], body)


def _statistics(rows: Rows) -> list[str]:
    lines = ["## Paired statistics", "",
             "Exact McNemar (binomial test on discordant pairs) for binary outcomes, Wilcoxon signed-rank for "
             "continuous ones, all paired on episodes; bootstrap 95% CIs (seeded) for rates.", ""]
    if {BASE, "memory-delete"} <= set(rows.methods):
        lines.append("- B1 vs B0 (any leak): " + _b1_vs_b0(rows))
    if {REPLAY, REFERENCE} <= set(rows.methods):
        pairs = rows.paired(None, REPLAY, REFERENCE)
        cads = [a.get("cad") for a, _ in pairs if a.get("cad") is not None]
        agree = [a["agreement"] for a, _ in pairs]
        eq = [a.get("equals_reset") for a, _ in pairs if a.get("equals_reset") is not None]
        lines.append(f"- B7 vs B5: CAD mean {fmt(mean(cads))} (n={len(cads)}); digest equal {sum(eq)}/{len(eq)}; "
                     f"matched-seed agreement {sum(a['matched'] for a in agree)}/{sum(a['draws'] for a in agree)} "
                     f"draws ({sum(1 for a, _ in pairs if a.get('asked_from'))} of {len(pairs)} episodes' draws "
                     f"reused from an identical state, the rest decoded from B7's own); any leak {fmt_test(mcnemar_exact(*_binary(pairs, get_any_leak)))}; recomputed "
                     f"tokens {fmt_test(wilcoxon_signed_rank(*_continuous(pairs, _recomp)))}")
    for m in rows.methods:
        if m in (REFERENCE, BASE):
            continue
        for other in (REFERENCE, BASE):
            if (m, other) == ("memory-delete", BASE):
                continue  # above, with the episodes where it is identical by construction
            pairs = rows.paired(None, m, other)
            if pairs:
                lines.append(f"- {_name(m)} vs {_name(other)}: any leak "
                             f"{fmt_test(mcnemar_exact(*_binary(pairs, get_any_leak)))}")
    for s in rows.suites:
        kept, _ = get_kept_probes(rows, s)
        for m in ("forget-instruction", "source-redaction"):
            pairs = rows.paired(s, m, REFERENCE)
            if pairs and kept:
                a = [bool(leak_at_probes(x, kept)) for x, _ in pairs]
                b = [bool(leak_at_probes(y, kept)) for _, y in pairs]
                ci = bootstrap_ci([float(x) for x in a])
                lines.append(f"- {_name(m)} Leak@probes on {s}: {fmt(mean(a))} "
                             f"[{fmt(ci[0])}, {fmt(ci[1])}] vs B5 {fmt(mean(b))}: {fmt_test(mcnemar_exact(a, b))}")
    if SPAN in rows.methods:
        for other in (BASE, "sanitize-no-replay"):
            pairs = [(a, b) for a, b in rows.paired(None, SPAN, other)
                     if a.get("cad") is not None and b.get("cad") is not None]
            if pairs:
                lines.append(f"- span-only excision vs {_name(other)} (CAD): "
                             f"{fmt_test(wilcoxon_signed_rank(*_continuous(pairs, lambda r: r['cad'])))}")
    return lines


def _b1_vs_b0(rows: Rows) -> str:
    pairs = rows.paired(None, "memory-delete", BASE)
    noop = [(a, b) for a, b in pairs if not a["memory_carries_target"]]
    tested = [(a, b) for a, b in pairs if a["memory_carries_target"]]
    parts = []
    if noop:
        parts.append(fmt_test(identical(len(noop), "no memory record carries the target: B1 deletes nothing")))
    if tested:
        parts.append(f"on {len(tested)} episodes where a record carries it: "
                     + fmt_test(mcnemar_exact(*_binary(tested, get_any_leak))))
    return "; ".join(parts) or "no pairs"


def _binary(pairs, key: Callable[[dict], bool]) -> tuple[list[bool], list[bool]]:
    return [bool(key(a)) for a, _ in pairs], [bool(key(b)) for _, b in pairs]


def _continuous(pairs, key: Callable[[dict], float]) -> tuple[list[float], list[float]]:
    return [float(key(a)) for a, _ in pairs], [float(key(b)) for _, b in pairs]


def _recomp(row: dict) -> float:
    return row["efficiency"]["recomputed_tokens"]


# --- plots and files ----------------------------------------------------------------------


def make_plots(rows_in: Iterable[dict], out: Path) -> dict[str, str]:
    """Bar charts of any-leak rate and recomputed tokens by method and suite,
    from the rows; {} when matplotlib is not installed (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    rows = Rows(rows_in)
    methods = [m for m in TABLE1_METHODS if m in rows.methods] + [m for m in rows.methods
                                                                  if m not in TABLE1_METHODS]
    plots = {}
    for name, key, ylabel in (("any_leak", lambda r: float(get_any_leak(r)), "any-leak rate"),
                              ("recomputed_tokens", _recomp, "recomputed tokens (mean)")):
        fig, ax = plt.subplots(figsize=(max(6, len(methods) * 0.8), 3.5))
        width = 0.8 / max(1, len(rows.suites))
        for i, s in enumerate(rows.suites):
            values = [mean([key(r) for r in rows.get(s, m)]) or 0.0 for m in methods]
            ax.bar([j + i * width for j in range(len(methods))], values, width, label=s)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))])
        ax.set_xticklabels([_short_name(m) for m in methods], rotation=0)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        plots[name] = path.name
    distribution = plot_distribution(rows.rows, out)
    return plots | ({PLOT_NAME: distribution} if distribution else {})


def write_report(rows: Sequence[dict], out: str | Path, title: str = "unsee eval") -> Path:
    out = Path(out)
    plots = make_plots(rows, out)
    path = out / "report.md"
    path.write_text(render_report(rows, plots, title), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summarize(rows), indent=2), encoding="utf-8")
    (out / "distribution.json").write_text(json.dumps(summarize_distribution(rows), indent=2), encoding="utf-8")
    return path


def summarize(rows_in: Iterable[dict]) -> dict:
    """The headline numbers per (suite, method), machine-readable."""
    rows = Rows(rows_in)
    out: dict = {}
    for s in rows.suites:
        kept, dropped = get_kept_probes(rows, s)
        for m in rows.methods:
            rs = rows.get(s, m)
            if not rs:
                continue
            out.setdefault(s, {})[m] = {
                "n": len(rs), "any_leak": mean([get_any_leak(r) for r in rs]),
                "exact_leak": mean([r["leak"]["exact"] for r in rs]),
                "action_leak": mean([r["leak"]["action"] for r in rs]),
                "cad": mean([r["cad"] for r in rs if r.get("cad") is not None]),
                "leak_at_probes": mean([leak_at_probes(r, kept) for r in rs]) if kept else None,
                "probes_dropped": dropped,
                "leak_at_5": mean([r["leak5"]["leaked"] for r in rs]),
                "recomputed_tokens": mean([_recomp(r) for r in rs]),
                "equals_reset": mean([r["equals_reset"] for r in rs if r.get("equals_reset") is not None]),
            }
    return out


__all__ = ["Rows", "cell", "fmt", "get_floors", "get_kept_probes", "make_plots", "render_report", "render_table",
           "summarize", "write_report"]
