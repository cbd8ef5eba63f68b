"""A Markdown table of `evalrun nondet --json` reports, one row each (docs/nondeterminism.md's tables).

    .venv/bin/python scripts/nondet_table.py "native vs avx2=out/native-avx2.json" "native vs default=out/..."

Columns: episodes compared, TARr and TARa (share of items whose raw outputs / parsed answers agree in every run),
distinct completions (mean, max), episodes that diverged, the first divergent token (earliest, median), the
largest |logprob difference| before divergence, accuracy per run and its spread.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = ("| runs | episodes | TARr | TARa | distinct (mean / max) | diverged | first divergent token (min / median) "
          "| max \\|dlogprob\\| before divergence | accuracy per run | spread |")  # fmt: skip


def number(value: Any, digits: int = 4) -> str:
    """A rate or difference (canonical JSON writes 1.0 as 1: read back as an int) to ``digits`` places; one
    too small for them in scientific notation."""
    if value is None:
        return "—"
    value = float(value)
    if value != 0 and abs(value) < 10**-digits:
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


def count(value: Any) -> str:
    return "—" if value is None else f"{value:g}"


def row(label: str, report: dict[str, Any]) -> str:
    first = f"{count(report['first_divergence_min'])} / {count(report['first_divergence_median'])}"
    accuracy = ", ".join(number(a, 3) for a in report["accuracy"])
    cells = (label, str(report["episodes"]), number(report["tarr"], 3), number(report["tara"], 3),
             f"{report['distinct_mean']:.3f} / {report['distinct_max']}", str(report["diverged_episodes"]), first,
             number(report["max_abs_logprob_diff"]), accuracy, number(report["accuracy_spread"], 3))  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def main(args: list[str]) -> int:
    if not args or any("=" not in a for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for arg in args:
        label, path = arg.rsplit("=", 1)
        print(row(label, json.loads(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
