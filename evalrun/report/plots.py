"""The report's plots: matplotlib figures rendered to inline SVG strings (docs/design.md "Report").

matplotlib is imported when the first plot is drawn (it takes a second to import; no other command
needs it). Figures are made with :class:`matplotlib.figure.Figure`, not pyplot: no global state, no
GUI backend, the SVG renderer only. The SVG is made repeatable: no date in its metadata and a fixed
``svg.hashsalt`` per plot (the ids of its clip paths and glyphs), so two builds of a report of the
same runs are byte for byte the same, and two plots on one page never share an id. Text stays text
(``svg.fonttype: none``): smaller, selectable, and drawn in the page's own sans-serif font.

Each function returns None when there is nothing to draw (the page says so in words instead).
"""

from __future__ import annotations

import io
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from evalrun.analysis.compare import CompareReport
from evalrun.analysis.nondet import NondetReport
from evalrun.report.data import SummaryLine, TrialMean

BLUE, ORANGE, GRAY, DARK = "#2563eb", "#ea580c", "#9ca3af", "#1f2937"
WIDTH = 6.0  # inches: about the width a plot is shown at in the page's two columns, so text keeps its size
STYLE = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.edgecolor": "#d1d5db",
    "axes.labelcolor": DARK,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.color": "#4b5563",
    "ytick.color": "#4b5563",
    "axes.grid": True,
    "grid.color": "#eef0f3",
    "grid.linewidth": 0.8,
}


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(figure: Any, name: str) -> str:
    """The figure as an ``<svg>`` element, repeatable (see the module docstring)."""
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": f"evalrun-{name}", "svg.fonttype": "none"}):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "evalrun report (matplotlib)"})
    text = buffer.getvalue()
    return text[text.index("<svg") :].strip()


def _styled(draw: Any) -> Any:
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return draw()


def _label(task: str, metric: str, one_task: bool) -> str:
    return metric if one_task else f"{task} · {metric}"


def scores_svg(estimates: Sequence[SummaryLine], name: str = "scores") -> str | None:
    """Per task and metric: the mean and its 95% interval over items (as summary.json states them)."""
    if not estimates:
        return None
    one_task = len({e.task for e in estimates}) == 1

    def draw() -> str:
        rows = list(reversed(estimates))
        fig = _figure(WIDTH, max(2.4, 0.9 + 0.42 * len(rows)))
        ax = fig.subplots()
        ys = range(len(rows))
        for y, e in zip(ys, rows, strict=True):
            if e.low is not None and e.high is not None:
                ax.plot([e.low, e.high], [y, y], color=BLUE, linewidth=2.2, solid_capstyle="butt", alpha=0.55)
                ax.plot([e.low, e.low], [y - 0.18, y + 0.18], color=BLUE, linewidth=1.2)
                ax.plot([e.high, e.high], [y - 0.18, y + 0.18], color=BLUE, linewidth=1.2)
            ax.plot([e.mean], [y], "o", color=BLUE, markersize=7, zorder=3)
            ci = f" [{e.low:.3f}, {e.high:.3f}]" if e.low is not None and e.high is not None else ""
            ax.annotate(f"{e.mean:.3f}{ci}", (e.mean, y), xytext=(0, 12), textcoords="offset points", ha="center",
                        fontsize=8.5, color=DARK)  # fmt: skip
        ax.set_yticks(list(ys), [_label(e.task, e.metric, one_task) for e in rows])
        bounded = all(0 <= v <= 1 for e in rows for v in (e.mean, e.low, e.high) if v is not None)
        if bounded:
            ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.6, len(rows) - 0.2)
        ax.set_xlabel("mean of per-item means, with its 95% interval over items")
        ax.set_title("Scores per task" + (f" ({rows[0].task})" if one_task else ""))
        return _svg(fig, name)

    return _styled(draw)


def spread_svg(trials: Sequence[TrialMean], name: str = "spread") -> str | None:
    """Per task and metric, the mean of each trial (seed, repeat): the spread over seeds, as points."""
    grouped: dict[tuple[str, str], list[TrialMean]] = defaultdict(list)
    for t in trials:
        grouped[(t.task, t.metric)].append(t)
    if not grouped or max(len(v) for v in grouped.values()) < 2:
        return None
    one_task = len({task for task, _ in grouped}) == 1

    def draw() -> str:
        keys = list(reversed(sorted(grouped)))
        fig = _figure(WIDTH, max(2.4, 0.9 + 0.5 * len(keys)))
        ax = fig.subplots()
        seeds = sorted({t.seed for t in trials})
        colors = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#db2777", "#0891b2", "#ca8a04", "#4b5563"]
        for y, key in enumerate(keys):
            points = grouped[key]
            for index, t in enumerate(points):
                offset = ((index % 5) - 2) * 0.07  # repeatable jitter: points of equal value stay visible
                ax.plot([t.mean], [y + offset], "o", markersize=6, alpha=0.85,
                        color=colors[seeds.index(t.seed) % len(colors)])  # fmt: skip
            means = [t.mean for t in points]
            centre = math.fsum(means) / len(means)
            ax.plot([centre, centre], [y - 0.3, y + 0.3], color=DARK, linewidth=1.5)
            ax.annotate(f"{len(points)} trials, range {max(means) - min(means):.3f}", (1.0, y),
                        xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=8.5, color=DARK)  # fmt: skip
        ax.set_yticks(list(range(len(keys))), [_label(task, metric, one_task) for task, metric in keys])
        ax.set_ylim(-0.6, len(keys) - 0.4)
        ax.set_xlabel("per-trial mean over items (colour: seed of the seed set; bar: mean of the trials)")
        ax.set_title("Spread over seeds and repeats")
        lo, hi = min(t.mean for t in trials), max(t.mean for t in trials)
        span = max(hi - lo, 0.1)
        left, right = lo - span / 2, hi + span / 2
        if lo >= 0 and hi <= 1:  # a metric in [0, 1]: stay on the scale it lives on
            left, right = max(left, -0.02), min(right, 1.02)
        ax.set_xlim(left, right)
        return _svg(fig, name)

    return _styled(draw)


def paired_svg(report: CompareReport, name: str = "paired") -> str | None:
    """B - A per task and metric: the paired 95% interval beside the unpaired one."""
    rows = [r for r in report.rows if r.estimate.n_items > 0]
    if not rows:
        return None

    def draw() -> str:
        ordered = list(reversed(rows))
        fig = _figure(WIDTH, max(2.4, 1.0 + 0.5 * len(ordered)))
        ax = fig.subplots()
        for y, r in enumerate(ordered):
            e = r.estimate
            if e.ci95_unpaired is not None:
                ax.plot(list(e.ci95_unpaired), [y - 0.16] * 2, color=GRAY, linewidth=2, solid_capstyle="butt")
            if e.ci95_paired is not None:
                ax.plot(list(e.ci95_paired), [y + 0.06] * 2, color=ORANGE, linewidth=3, solid_capstyle="butt")
            ax.plot([e.diff], [y + 0.06], "o", color=ORANGE, markersize=7, zorder=3)
            p = "" if e.test.p_value is None else f"  {e.test.name} p={e.test.p_value:.3g}"
            ax.annotate(f"{e.diff:+.3f}{p}", (e.diff, y + 0.06), xytext=(0, 8), textcoords="offset points",
                        ha="center", fontsize=8.5, color=DARK)  # fmt: skip
        ax.axvline(0, color=DARK, linewidth=1)
        ax.set_yticks(list(range(len(ordered))), [_label(r.task, r.metric, False) for r in ordered])
        ax.set_ylim(-0.6, len(ordered) - 0.2)
        ax.set_xlabel("B − A per item (orange: paired 95% interval; grey: unpaired)")
        ax.set_title("Paired comparison")
        return _svg(fig, name)

    return _styled(draw)


def _bars(ax: Any, labels: list[str], counts: list[int], color: str) -> None:
    positions = list(range(len(labels)))
    ax.bar(positions, counts, color=color, width=0.7)
    ax.set_xticks(positions, labels)
    for x, count in zip(positions, counts, strict=True):
        ax.annotate(str(count), (x, count), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, max(counts) * 1.15 + 0.5)


def divergence_svg(report: NondetReport, name: str = "divergence") -> str | None:
    """Histogram of the first token position where an item's runs diverge (items that diverged)."""
    positions = [i.first_divergence for i in report.per_item if i.first_divergence is not None]
    if not positions:
        return None

    def draw() -> str:
        counts = Counter(positions)
        top = max(counts)
        if top <= 40:
            labels = [str(p) for p in range(top + 1)]
            values = [counts.get(p, 0) for p in range(top + 1)]
        else:  # wide: bins of equal width
            width = math.ceil((top + 1) / 30)
            labels = [f"{lo}-{lo + width - 1}" for lo in range(0, top + 1, width)]
            values = [sum(c for p, c in counts.items() if lo <= p < lo + width) for lo in range(0, top + 1, width)]
        fig = _figure(WIDTH, 2.8)
        ax = fig.subplots()
        _bars(ax, labels, values, ORANGE)
        ax.set_xlabel("first divergent token position")
        ax.set_ylabel("items")
        ax.set_title(f"First divergence: {len(positions)} of {report.items} items diverge")
        return _svg(fig, name)

    return _styled(draw)


def drift_svg(report: NondetReport, name: str = "drift") -> str | None:
    """Histogram of the largest |logprob difference| before divergence per item, by decade."""
    gaps = [i.max_abs_logprob_diff for i in report.per_item if i.max_abs_logprob_diff is not None]
    if not gaps:
        return None

    def draw() -> str:
        decades = sorted({math.floor(math.log10(g)) for g in gaps if g > 0})
        labels = ["0"] + [f"1e{d}" for d in decades]
        values = [sum(g == 0 for g in gaps)] + [sum(g > 0 and math.floor(math.log10(g)) == d for g in gaps)
                                                for d in decades]  # fmt: skip
        fig = _figure(WIDTH, 2.8)
        ax = fig.subplots()
        _bars(ax, labels, values, BLUE)
        ax.set_xlabel("max |logprob difference| before divergence (decade: 1eN ≤ x < 1eN+1)")
        ax.set_ylabel("items")
        ax.set_title(f"Logprob drift: max {max(gaps):.3g}")
        return _svg(fig, name)

    return _styled(draw)


def distinct_svg(report: NondetReport, name: str = "distinct") -> str | None:
    """Episodes by the number of distinct completions the runs gave them."""
    if not report.distinct_histogram:
        return None

    def draw() -> str:
        items = sorted(report.distinct_histogram.items(), key=lambda kv: int(kv[0]))
        fig = _figure(WIDTH, 2.6)
        ax = fig.subplots()
        _bars(ax, [k for k, _ in items], [v for _, v in items], GRAY)
        ax.set_xlabel(f"distinct completions over {report.n_runs} runs")
        ax.set_ylabel("episodes")
        ax.set_title(f"Distinct completions: mean {report.distinct_mean:.3f}")
        return _svg(fig, name)

    return _styled(draw)
