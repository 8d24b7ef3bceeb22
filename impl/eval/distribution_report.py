"""The distributional audit's part of the report (impl/eval/distribution.py):
one table (per audited method and distance: its mean distance to B5, the
floor's, the Wilcoxon test against the floor) and a plot like the paper's
Figure 3 (one panel per distance, the floor dashed, stars for p)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from unsee.impl.eval.distribution import (
    AUDITED,
    DISTANCE_NAMES,
    DISTANCES,
    compare_to_floor,
    get_episode_distances,
    get_pairs,
)
from unsee.impl.eval.stats import compute_n_for_power, mean
from unsee.impl.methods.baselines import PAPER_NAMES

PLOT_NAME = "distribution"


def get_stars(p: float | None) -> str:
    """The paper's stars: ``***`` p < .001, ``**`` p < .01, ``*`` p < .05, else ''."""
    if p is None:
        return ""
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else ""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _fmt_p(p: float | None) -> str:
    return "–" if p is None else f"{p:.2g}{get_stars(p)}"


def render_distribution(rows: Sequence[dict]) -> list[str]:
    """The report's section: a note when the rows hold no sample sets, else
    one table, row per audited method, cells ``mean (floor) p`` per distance."""
    lines = ["## Distributional audit (independent seeds)", ""]
    distances = get_episode_distances(rows)
    if "floor" not in distances:
        return lines + ["No row holds the audit's sample sets (B5 with B7 or B6, `--samples` > 0).", ""]
    first = next(r["dist"] for r in rows if r.get("dist"))
    lines += [(f"k = {first['k']} samples per method at temperature {first['temperature']}, each method and "
              "each sample set under its own seeds; a sample is the next move (the task query, which tool next, "
              "the turn opened with `Tool: `; its tool: the first of the case's tools it names, else `other`). Per episode a method's distance is D(method, B5) and the "
              "floor's D(B5, B5) between B5's two independent sample sets; cells: mean distance (floor's mean), "
              "Wilcoxon signed-rank p against the floor over the episodes (n), stars as the paper's. "
              f"Embeddings: {first['embedder'] or 'none (this engine has no embedder)'}. "
              f"n-gram: word {first['ngram']}-grams. B6 is the positive control."), ""]
    header = ["method", "n"] + [DISTANCE_NAMES[d] for d in DISTANCES]
    body = []
    for method in AUDITED:
        if method not in distances:
            continue
        cells, n = [], 0
        for distance in DISTANCES:
            test, m, f = compare_to_floor(distances, method, distance)
            n = max(n, test.n)
            cells.append(f"{_fmt(m)} ({_fmt(f)}) p = {_fmt_p(test.p)}" if test.n else "–")
        body.append([PAPER_NAMES.get(method, method), str(n), *cells])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines + [""] + render_power(distances)


def render_power(distances: dict) -> list[str]:
    """The power the audit has: per audited method and distance, the effect the
    episodes show (mean paired difference to the floor over its sd) and the
    episodes a Wilcoxon test needs to detect it (80% power, p < .05)."""
    lines = ["Power: per method and distance, the standardised effect d (mean paired difference to the floor "
             "over its standard deviation) and the episodes a Wilcoxon test needs to detect an effect of that "
             "size with 80% power at p < .05 (normal approximation, efficiency 3/pi); \"none\" where the "
             "method is not farther from B5 than the floor on average.", ""]
    header = ["method"] + [DISTANCE_NAMES[d] for d in DISTANCES]
    body = []
    for method in AUDITED:
        if method not in distances:
            continue
        cells = []
        for distance in DISTANCES:
            effect, needed = compute_n_for_power(*get_pairs(distances, method, distance))
            cells.append("–" if effect is None else f"d = {effect:.2f}, n = {needed if needed else 'none'}")
        body.append([PAPER_NAMES.get(method, method), *cells])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in body] + [""]


def plot_distribution(rows: Sequence[dict], out: Path) -> str | None:
    """``distribution.png`` in ``out``: per distance, each episode's distance
    for the floor, B7 and B6 (points, mean bar), the floor's mean dashed,
    stars from the Wilcoxon test; None without matplotlib or sample sets."""
    distances = get_episode_distances(rows)
    if "floor" not in distances:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = ["floor", *(m for m in AUDITED if m in distances)]
    labels = {"floor": "B5 vs B5\n(floor)", "replay": "B7", "sanitized-rebuild": "B6"}
    fig, axes = plt.subplots(1, len(DISTANCES), figsize=(3.2 * len(DISTANCES), 3.2))
    for ax, distance in zip(axes, DISTANCES):
        _plot_panel(ax, distances, groups, labels, distance)
    fig.tight_layout()
    path = out / f"{PLOT_NAME}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def _plot_panel(ax, distances: dict, groups: Sequence[str], labels: dict, distance: str) -> None:
    floor_values = [r[distance] for r in distances["floor"] if r[distance] is not None]
    for i, group in enumerate(groups):
        values = [r[distance] for r in distances[group] if r[distance] is not None]
        if not values:
            continue
        jitter = [i + 0.25 * ((j % 7) / 6 - 0.5) for j in range(len(values))]
        ax.scatter(jitter, values, s=10, alpha=0.6)
        ax.hlines(mean(values), i - 0.3, i + 0.3, colors="black")
        if group != "floor":
            p = compare_to_floor(distances, group, distance)[0].p
            ax.text(i, max(values), get_stars(p) or "n.s.", ha="center", va="bottom", fontsize=9)
    if floor_values:
        ax.axhline(mean(floor_values), linestyle="--", color="grey", linewidth=1)
    ax.margins(y=0.2)  # room for the stars above the highest point
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([labels.get(g, g) for g in groups], fontsize=8)
    ax.set_title(DISTANCE_NAMES[distance], fontsize=10)
    ax.set_ylabel("distance to B5" if distance == DISTANCES[0] else "")


__all__ = ["PLOT_NAME", "get_stars", "plot_distribution", "render_distribution", "render_power"]
