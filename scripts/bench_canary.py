"""What the batch-invariance canary costs a worker: engine start without it, then the canary ROUNDS times.

Builds one engine worker in this process as ``evalrun canary`` does (the default model unless
overridden), with ``determinism.canary=false`` so that its start is timed alone, then runs the
canary ROUNDS times on its engine and prints the start time, each canary's seconds (wall clock, and
the CPU time of this process, which the engine runs in: less moved by other load on a shared
machine) and verdict, and the median canary time as a share of the start.

    .venv/bin/python scripts/bench_canary.py [--rounds 5] [OVERRIDES...]      # e.g. engine=hf

With ``--compare``, each of the named ways to run a worker, one after another in this one command,
each in a fresh process of its own (its own torch and engine); the first is the baseline, and every
line gives the ratio of its median canary (wall and CPU) to the baseline's, with the 1-minute load
average before and after it (``os.getloadavg``, what ``uptime`` prints):

    .venv/bin/python scripts/bench_canary.py --compare all-cores,inline,ray --busy 1 --rounds 3 [OVERRIDES...]

``inline``     the worker as ``cluster=inline`` builds it in the driver: torch's threads set to
               ``cluster.cpus_per_worker`` (1 by default), as a Ray actor of that many CPUs gets them
``all-cores``  the same worker with torch's default threads, one per core (the inline worker before
               it honoured ``cluster.cpus_per_worker``)
``passive``    ``all-cores`` with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads that wait sleep, not spin)
``ray``        a Ray actor of ``cluster.cpus_per_worker`` CPUs (``cluster=local``), the canary run in it

``--busy N`` keeps N busy-loop processes (a core each) running beside every variant: what other jobs
on a shared machine do to it, made repeatable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from evalrun.config import load
from evalrun.pipeline.canary import describe, failure_line, run_canary
from evalrun.pipeline.runner import prepare
from evalrun.pipeline.worker import EngineWorker, WorkerSpec

VARIANTS = ("inline", "all-cores", "passive", "ray")
RESULT = "RESULT "  # a child's last stdout line: its measurements as JSON


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", metavar="A,B,...", help=f"variants, one after another: {', '.join(VARIANTS)}")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="busy-loop processes beside each variant")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        print(RESULT + json.dumps(child(args.child, args.rounds, args.overrides)), flush=True)
        return
    if args.compare is not None:
        variants = [v.strip() for v in args.compare.split(",") if v.strip()]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            parser.error(f"--compare: unknown variant(s) {unknown}; expected some of {', '.join(VARIANTS)}")
        print("\n".join(compare(variants, args.rounds, args.busy, args.overrides)))
        return
    spec = _spec(args.overrides)
    started, cpu = time.perf_counter(), time.process_time()
    worker = EngineWorker(spec, "bench-0")
    start_s, start_cpu = time.perf_counter() - started, time.process_time() - cpu
    print("\n".join(measure(worker, start_s, start_cpu, args.rounds, " ".join(args.overrides) or "defaults")))


def _spec(overrides: list[str]) -> WorkerSpec:
    return prepare(load(["limit=1", *overrides, "determinism.canary=false"])).worker_spec


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


# --- --compare: each variant in a process of its own ---------------------------------------------------


class CanaryRounds:
    """One worker and its canary rounds, timed where the worker runs (this process, or a Ray actor's)."""

    def __init__(self, spec: WorkerSpec) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        self.worker = EngineWorker(spec, "bench-0")
        self.start = (time.perf_counter() - started, time.process_time() - cpu)

    def rounds(self, n: int) -> dict[str, Any]:
        walls, cpus, verdicts = [], [], []
        for _ in range(n):
            started, cpu = time.perf_counter(), time.process_time()
            result = run_canary(self.worker.engine)
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            verdicts.append("batch-invariant" if result.invariant else failure_line(result.as_record()))
        return {"start_s": self.start[0], "start_cpu_s": self.start[1], "canary_s": walls, "canary_cpu_s": cpus,
                "verdicts": verdicts, "torch_threads": self.worker.determinism["honoured"]["torch_threads"],
                "pid": os.getpid()}  # fmt: skip


def child(variant: str, rounds: int, overrides: list[str]) -> dict[str, Any]:
    """One variant's measurements, in this (fresh) process."""
    spec = _spec(overrides)
    if variant in ("all-cores", "passive"):
        spec = replace(spec, threads=None)
    if variant != "ray":
        return CanaryRounds(spec).rounds(rounds)
    import ray

    from evalrun.pipeline.raylocal import start_local

    cpus = prepare(load(["limit=1", *overrides])).config.cluster.cpus_per_worker
    start_local(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(CanaryRounds).options(num_cpus=cpus).remote(spec)
        return ray.get(actor.rounds.remote(rounds))
    finally:
        ray.shutdown()


def compare(variants: list[str], rounds: int, busy: int, overrides: list[str]) -> list[str]:
    """Each variant in a child process, one after another, with ``busy`` busy-loop processes beside them; the
    lines: one per variant, with its ratios to the first (the baseline)."""
    label = " ".join(overrides) or "defaults"
    lines = [f"canary, {rounds} rounds per variant ({label}); {busy} busy-loop process(es) beside each; "
             f"{os.cpu_count()} CPUs"]  # fmt: skip
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    baseline: dict[str, Any] | None = None
    try:
        for variant in variants:
            load_before = os.getloadavg()[0]
            env = dict(os.environ)
            if variant == "passive":
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            done = subprocess.run([sys.executable, __file__, "--child", variant, "--rounds", str(rounds), *overrides],
                                  capture_output=True, text=True, env=env, check=False)  # fmt: skip
            load_after = os.getloadavg()[0]
            found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
            if done.returncode != 0 or not found:
                lines.append(f"{variant}: failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
                continue
            r = json.loads(found[-1][len(RESULT) :])
            wall, cpu = statistics.median(r["canary_s"]), statistics.median(r["canary_cpu_s"])
            baseline = baseline or {"variant": variant, "wall": wall, "cpu": cpu}
            verdicts = sorted(set(r["verdicts"]))
            lines.append(
                f"{variant:9s} torch threads {r['torch_threads']}; start {r['start_s']:.1f} s; canary min/median/max "
                f"{min(r['canary_s']):.2f} / {wall:.2f} / {max(r['canary_s']):.2f} s, CPU median {cpu:.2f} s; "
                f"x{wall / baseline['wall']:.2f} wall, x{cpu / baseline['cpu']:.2f} CPU against {baseline['variant']}; "
                f"load average {load_before:.2f} -> {load_after:.2f}; {' | '.join(verdicts)}"
            )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    return lines


if __name__ == "__main__":
    main()
