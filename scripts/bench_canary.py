"""What the batch-invariance canary costs a worker: engine start without it, then the canary ROUNDS times.

Builds one engine worker in this process as ``evalrun canary`` does (the default model unless
overridden), with ``determinism.canary=false`` so that its start is timed alone, then runs the
canary ROUNDS times on its engine and prints the start time, each canary's seconds (wall clock, and
the CPU time of this process, which the engine runs in: less moved by other load on a shared
machine) and verdict, and the median canary time as a share of the start.

    .venv/bin/python scripts/bench_canary.py [--rounds 5] [OVERRIDES...]      # e.g. engine=hf
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from evalrun.config import load
from evalrun.pipeline.canary import describe, run_canary
from evalrun.pipeline.runner import prepare
from evalrun.pipeline.worker import EngineWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    spec = prepare(load(["limit=1", *args.overrides, "determinism.canary=false"])).worker_spec
    started, cpu = time.perf_counter(), time.process_time()
    worker = EngineWorker(spec, "bench-0")
    start_s, start_cpu = time.perf_counter() - started, time.process_time() - cpu
    print("\n".join(measure(worker, start_s, start_cpu, args.rounds, " ".join(args.overrides) or "defaults")))


def measure(worker: EngineWorker, start_s: float, start_cpu: float, rounds: int, label: str) -> list[str]:
    """The canary ``rounds`` times on the worker's engine, against its start (wall and CPU seconds); the lines."""
    engine = worker.engine.describe()
    lines = [f"engine {engine['name']} {engine['version']} ({label}); "
             f"worker start without the canary: {start_s:.2f} s ({start_cpu:.2f} s CPU)"]  # fmt: skip
    seconds, cpu_seconds = [], []
    for k in range(rounds):
        started, cpu = time.perf_counter(), time.process_time()
        result = run_canary(worker.engine)
        seconds.append(time.perf_counter() - started)
        cpu_seconds.append(time.process_time() - cpu)
        lines.append(f"  canary {k}: {seconds[-1]:.3f} s ({cpu_seconds[-1]:.3f} s CPU), {result.engine_calls} engine "
                     f"calls; {describe(result)}")  # fmt: skip
    wall, cpu_median = statistics.median(seconds), statistics.median(cpu_seconds)
    lines.append(
        f"median canary over {rounds} rounds: {wall:.3f} s ({100 * wall / start_s:.1f}% of the worker start), "
        f"{cpu_median:.3f} s CPU ({100 * cpu_median / start_cpu:.1f}% of the start's CPU time)"
    )
    return lines


if __name__ == "__main__":
    main()
