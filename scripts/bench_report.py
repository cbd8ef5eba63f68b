"""How long `evalrun report` takes on a large run, against verify and a plain read of the run's tables.

A synthetic run of single-call episodes is written through evalrun's own record path, exactly as
scripts/bench_records.py writes it (the engine left out: completions are made up before any clock
starts; chains, output parts, scores, summary, record.json and the attestation are the real code's).
Then, in this one process:

* baseline 1: reading the tables the report shows (every output part and scores.parquet);
* baseline 2: ``evalrun verify`` on the run (the report runs it too);
* the report: ``evalrun.report.build_report`` (verify, gather, plots, render, write), timed end to end,
  best of ``--repeat``; the page is checked to hold every episode, and two builds to be byte-identical.

    .venv/bin/python scripts/bench_report.py [--episodes 10000] [--repeat 3] [--jobs N] [--keep DIR]

Target (issue 15): the report of 10,000 episodes builds in under 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_records  # the synthetic run writer, shared with the records benchmark

from evalrun.audit.verify import verify_run
from evalrun.report import ROWS, build_report
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs, read_scores

TARGET_S = 10.0
EPISODES_BLOB = re.compile(r'<script type="application/json" id="episodes-data-0">(.*?)</script>', re.S)


def write_synthetic_run(path: Path, episodes: int, part_size: int) -> None:
    """A finished run directory of ``episodes`` single-call episodes (see the module docstring)."""
    planned, completions = bench_records.synthetic(episodes)
    bench_records._EPISODES[:] = planned
    bench_records._COMPLETIONS[:] = completions
    try:
        bench_records.write_run(path, planned, part_size, None)
    finally:
        bench_records._EPISODES.clear()
        bench_records._COMPLETIONS.clear()


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--part-size", type=int, default=1_000, help="episodes per part of the synthetic run")
    parser.add_argument("--repeat", type=int, default=3, help="builds of the report timed (the best is reported)")
    parser.add_argument("--jobs", type=int, default=0, help="processes verify uses (0: one per CPU)")
    parser.add_argument("--keep", type=Path, default=None, help="write the run and the report under this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        run = root / f"synthetic-{args.episodes}"
        started = time.perf_counter()
        write_synthetic_run(run, args.episodes, args.part_size)
        print(f"wrote a synthetic run of {args.episodes:,} episodes in {time.perf_counter() - started:.1f} s "
              f"(not timed); {os.cpu_count()} CPUs, load average {_load()}")  # fmt: skip

        def read_tables() -> None:
            read_outputs(RunDir(run))
            read_scores(RunDir(run))

        read_s = min(timed(read_tables) for _ in range(args.repeat))
        verify_s = min(timed(lambda: verify_run(run, jobs=args.jobs)) for _ in range(args.repeat))
        output = root / "report.html"
        builds = []
        pages = []
        for _ in range(max(args.repeat, 2)):
            builds.append(timed(lambda: build_report([run], output, jobs=args.jobs)))
            pages.append(output.read_bytes())
        best, median = min(builds), statistics.median(builds)
        blob = EPISODES_BLOB.search(pages[-1].decode("utf-8"))
        rows = len(json.loads(blob.group(1))["rows"]) if blob else 0
        expected = min(args.episodes, ROWS)  # the table holds the first ROWS episodes of a larger run
        assert rows == expected, f"the page holds {rows} episodes, expected {expected}"
        identical = all(page == pages[0] for page in pages)
        print(f"read the tables (outputs, scores) : {read_s:.2f} s")
        print(f"verify                            : {verify_s:.2f} s (--jobs {args.jobs or os.cpu_count()})")
        print(f"report                            : {best:.2f} s best of {len(builds)}, median {median:.2f} s = "
              f"{best / verify_s:.2f}x verify, {best / read_s:.1f}x reading the tables  [target < {TARGET_S:.0f} s "
              f"for 10,000 episodes]")  # fmt: skip
        print(f"page                              : {len(pages[-1]) / 1e6:.2f} MB, {rows:,} episodes in its table; "
              f"builds byte-identical: {'yes' if identical else 'NO'}")  # fmt: skip
        print(f"load average after: {_load()}")
        if not identical:
            return 1
    return 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
