"""bench/paper.py's plots: one PNG per table (matplotlib, imported on first use)."""

from __future__ import annotations

from pathlib import Path

from .paper_measure import LABELS
from .paper_tables import SHAPES


def _save(fig, out: Path, name: str, title: str) -> str:
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _plot_table1(plt, t: dict):
    floor = [t["floor"]] if "floor" in t else []
    names = list(t["methods"]) + ["floor"] * len(floor)
    pre = [t["methods"][m]["prefilled_tokens"] for m in t["methods"]] + [f["prefilled"] for f in floor]
    dec = [t["methods"][m]["decoded_tokens"] for m in t["methods"]] + [f["decoded"] for f in floor]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(names))
    ax.bar(xs, pre, label="prefilled")
    ax.bar(xs, dec, bottom=pre, label="decoded")
    ax.set_xticks(list(xs), [LABELS.get(n, n) for n in names], rotation=15, fontsize=8)
    ax.set(ylabel="tokens", title=f"Table 1 ({t['episode'].get('shape', 'current')} shape): recomputed tokens")
    ax.legend()
    return fig


def _plot_tau(plt, rows: list[dict]):
    taus = [r["tau"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(taus, [r["methods"]["replay"]["invocations"] for r in rows], "o-", label="B7")
    left.plot(taus, [r["methods"]["reset"]["invocations"] for r in rows], "s--", label="B5")
    left.plot(taus, [r["T"] - t + 1 for r, t in zip(rows, taus)], ":", color="gray", label="T - tau + 1")
    left.set(xlabel="tau", ylabel="transitions of F")
    left.legend()
    for method, style in (("replay", "o-"), ("reset", "s--")):
        right.plot(taus, [r["methods"][method]["recomputed_tokens"] for r in rows], style, label=LABELS[method])
    right.set(xlabel="tau", ylabel="recomputed tokens")
    right.legend()
    return fig


def _plot_indep(plt, rows: list[dict]):
    xs = [r["indep"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in rows[0]["methods"]:
        left.plot(xs, [r["methods"][method]["decoded_tokens"] for r in rows], "o-", label=LABELS.get(method))
        right.plot(xs, [r["methods"][method]["wall_p50_s"] for r in rows], "o-", label=LABELS.get(method))
    if all("floor" in r for r in rows):
        left.plot(xs, [r["floor"]["decoded"] for r in rows], ":", color="gray", label="floor")
        right.plot(xs, [r["floor"]["wall_p50_s"] for r in rows], ":", color="gray", label="floor")
    left.set(xlabel="indep", ylabel="decoded tokens")
    right.set(xlabel="indep", ylabel="wall p50 (s)")
    left.legend(fontsize=8)
    return fig


def _plot_pairs(plt, rows: list[dict], key: str, xlab: str):
    """B7 and B5's recomputed tokens side by side, one pair per row (granularity, position)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r["methods"]["replay"]["recomputed_tokens"] for r in rows], width,
           label=LABELS["replay"])
    ax.bar([x + width / 2 for x in xs], [r["methods"]["reset"]["recomputed_tokens"] for r in rows], width,
           label=LABELS["reset"])
    ax.set_xticks(list(xs), [r[key] for r in rows])
    ax.set(xlabel=xlab, ylabel="recomputed tokens")
    ax.legend()
    return fig


def plot(result: dict, out: Path) -> list[str]:
    """One PNG per table; returns the file names (none, with a note, where
    matplotlib is not installed: the vLLM venv has no ``plot`` extra)."""
    try:
        import matplotlib
    except ImportError:
        result["notes"].append("no plots: matplotlib is not installed (pip install 'unsee[plot]')")
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables, written = result["tables"], []
    title = f"{result['model']}, {result['device']} {result['dtype']}"
    for name in SHAPES.values():
        if name in tables:
            written.append(_save(_plot_table1(plt, tables[name]), out, f"{name}.png", title))
    if "tau" in tables and tables["tau"]["rows"]:
        written.append(_save(_plot_tau(plt, tables["tau"]["rows"]), out, "tau.png", title))
    if "indep" in tables and tables["indep"]["rows"]:
        written.append(_save(_plot_indep(plt, tables["indep"]["rows"]), out, "indep.png", title))
    for name, key, xlab in (("granularity", "policy", "checkpoint policy"), ("position", "where", "target position")):
        if name in tables and tables[name]["rows"]:
            written.append(_save(_plot_pairs(plt, tables[name]["rows"], key, xlab), out, f"{name}.png", title))
    return written
