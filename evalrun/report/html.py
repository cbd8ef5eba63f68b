"""The report as one self-contained HTML page (docs/design.md "Report").

A Jinja2 template (``assets/report.html.j2``, autoescaped) with the style sheet, the script and every
plot inlined: nothing is fetched, the file opens from disk. The episode table and the transcripts
travel as JSON in ``<script type="application/json">`` blocks (every ``<`` escaped, so no text of a
run can close the block) and are paged and searched by the page's own script.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from evalrun.analysis.runs import OVERALL
from evalrun.pipeline.manifest import evalrun_version
from evalrun.report import plots
from evalrun.report.data import (
    ROW_FIELDS,
    Comparison,
    Nondeterminism,
    ReportData,
    RunData,
    SummaryLine,
    primary_metric,
    shown,
)

ASSETS = Path(__file__).parent / "assets"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def script_json(value: Any) -> Markup:
    """``value`` as JSON to put inside a ``<script type="application/json">`` element: every ``<`` is
    escaped (``\\u003c``), so no string of the run can end the element or open a comment in it, and
    non-finite numbers (which JSON cannot hold) become null."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c"))  # JSON, escaped for a script element


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _num(value: float | int | None, digits: int = 4, sign: str = "", kind: str = "f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:{sign}.{digits}{kind}}"


def _interval(pair: Sequence[float | None] | None, sign: str = "+") -> str:
    if pair is None or any(v is None for v in pair):
        return "—"
    low, high = pair
    return f"[{_num(low, 4, sign)}, {_num(high, 4, sign)}]"


def _thousands(value: int) -> str:
    return f"{value:,}"


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(ASSETS), autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True,
        trim_blocks=False, lstrip_blocks=False,
    )  # fmt: skip
    env.filters.update(num=_num, interval=_interval, shown=shown, thousands=_thousands)
    return env


@dataclass(frozen=True)
class _RunView:
    letter: str
    data: RunData
    headline: SummaryLine | None
    scores_plot: Markup | None
    spread_plot: Markup | None
    episodes_json: Markup
    transcripts_json: Markup


@dataclass(frozen=True)
class _ComparisonView:
    letter: str
    data: Comparison
    plot: Markup | None


@dataclass(frozen=True)
class _NondetView:
    data: Nondeterminism
    plots: tuple[Markup, ...]


def _markup(svg: str | None) -> Markup | None:
    return None if svg is None else Markup(svg)  # matplotlib's SVG, made here


def headline(estimates: Sequence[SummaryLine]) -> SummaryLine | None:
    """The one figure a run's card shows: its main metric, overall when it has several tasks."""
    if not estimates:
        return None
    metric = primary_metric({e.metric for e in estimates})
    tasks = {e.task for e in estimates}
    task = OVERALL if OVERALL in tasks else sorted(tasks)[0]
    return next((e for e in estimates if e.task == task and e.metric == metric), estimates[0])


def _run_view(index: int, run: RunData) -> _RunView:
    episodes = {"fields": list(ROW_FIELDS), "rows": run.episodes.rows, "total": run.episodes.total,
                "metrics": run.episodes.metrics, "primary": run.episodes.primary}  # fmt: skip
    return _RunView(
        letter=LETTERS[index % len(LETTERS)], data=run, headline=headline(run.estimates),
        scores_plot=_markup(plots.scores_svg(run.estimates, f"scores-{index}")),
        spread_plot=_markup(plots.spread_svg(run.trials, f"spread-{index}")),
        episodes_json=script_json(episodes),
        transcripts_json=script_json([asdict(t) for t in run.transcripts]),
    )  # fmt: skip


def render(data: ReportData) -> str:
    """The page (a str of HTML) for the gathered report."""
    runs = [_run_view(i, run) for i, run in enumerate(data.runs)]
    comparisons = [
        _ComparisonView(LETTERS[(k + 1) % len(LETTERS)], c,
                        _markup(plots.paired_svg(c.report, f"paired-{k}")) if c.report is not None else None)
        for k, c in enumerate(data.comparisons)
    ]  # fmt: skip
    nondet = None
    if data.nondet is not None:
        drawn: list[Markup] = []
        if data.nondet.report is not None:
            report = data.nondet.report
            for svg in (plots.divergence_svg(report), plots.drift_svg(report), plots.distinct_svg(report)):
                if svg is not None:
                    drawn.append(Markup(svg))  # matplotlib's SVG, made here
        nondet = _NondetView(data.nondet, tuple(drawn))
    title = data.runs[0].name if len(data.runs) == 1 else f"{len(data.runs)} runs: " + ", ".join(
        r.name for r in data.runs)  # fmt: skip
    template = _environment().get_template("report.html.j2")
    return template.render(
        title=title, version=evalrun_version(), runs=runs, comparisons=comparisons, nondet=nondet,
        css=Markup((ASSETS / "report.css").read_text(encoding="utf-8")),
        js=Markup((ASSETS / "report.js").read_text(encoding="utf-8")),
    )  # fmt: skip
