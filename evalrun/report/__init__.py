"""``evalrun report``: one self-contained HTML page of one or several runs (docs/design.md "Report").

:mod:`evalrun.report.data` gathers what the page shows (verify's verdict, the identity, scores,
episodes, agent transcripts; for several runs the comparison and nondeterminism), :mod:`.plots`
draws with matplotlib, :mod:`.html` renders. A layer above audit and analysis: it calls both.
"""

from __future__ import annotations

from pathlib import Path

from evalrun.report.data import ROWS, TRANSCRIPTS, ReportData, gather
from evalrun.report.html import render
from evalrun.rundir.writer import write_atomic

__all__ = ["ROWS", "TRANSCRIPTS", "ReportData", "build_report"]


def build_report(paths: list[Path], output: Path, rows: int = ROWS, transcripts: int = TRANSCRIPTS,
                 jobs: int = 0) -> ReportData:  # fmt: skip
    """Gather, render and write the report of ``paths`` to ``output`` (atomically: a failed write leaves
    no partial file). Returns what it showed, verify's verdicts included."""
    data = gather(paths, rows=rows, transcript_limit=transcripts, jobs=jobs)
    write_atomic(output, render(data).encode("utf-8"))
    return data
