"""Dispatch overhead and scaling, each figure a ratio against a baseline measured in this command.

(a) The default model, 1,000 episodes: Ray dispatch with one engine worker vs the inline
    dispatcher (engine in the driver), alternating rounds; prints the throughput ratio ray/inline.
(b) A fixed-latency stand-in engine (sleeps LATENCY per batch, returns canned completions) on 1, 2,
    4 and 8 Ray workers (each warmed with a batch first; medians of --rounds interleaved runs, the range
    of whole-run times in brackets): parallel efficiency = throughput(N) / (N x throughput(1)) over the
    whole run (the plan made before, as `evalrun run` makes it: items and templates; then dispatch, the driver's
    pass over the plan's episode ids, chains arriving, parts, scoring, record included: the issue's figure), the
    driver's CPU time per episode, and on a second line the
    same efficiency of the dispatch loop alone (record.json's timings generation + writing: batches
    sent, answered and committed; the serial scoring and records phases left out) with every phase.

    ``--part-writes driver,workers`` runs every worker count through both write paths (docs/design.md "Workers
    write, the driver commits"), interleaved, each against its own 1-worker baseline, and prints the workers
    path against the driver path at each count: the driver's CPU per episode and the throughput. Stand-ins
    sleep, so 32 workers fit on 2 cores (``--workers 1,8,32``).

(c) ``--scale N,N,...``: the driver's memory and cost against the episode count. Each size runs in
    its own process (the default task's 200 items x ceil(N / 200) seeds, inline dispatcher, the
    stand-in engine with no latency: its harness and part encoding run in the driver and count);
    prints the process's peak RSS (ru_maxrss) and its CPU time per episode, plan included, and without the
    config and plan (their CPU time printed too). The
    driver's memory must stay flat: peak RSS at 1M within 1.5x of the peak at 100k.
    ``--scale-part-writes workers``: the same sizes on local Ray workers that write their own parts
    (``--scale-workers`` of them, the stand-in with no latency in their processes): the driver holds
    only what the commit needs (heads, scored rows) and its RSS is its own process's.

    .venv/bin/python scripts/bench_dispatch.py [--rounds 3] [--latency 0.1] [--batch-size 64] [--seeds 20]
        [--workers 1,2,4,8] [--part-writes driver] [--skip-a] [--skip-b] [--scale 10000,100000,1000000]
        [--scale-part-writes driver] [--scale-workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evalrun.config import load
from evalrun.engines import Completion, GenerationRequest
from evalrun.pipeline.dispatch import RayDispatcher
from evalrun.pipeline.runner import execute, open_for, prepare
from evalrun.pipeline.worker import WorkerSpec


class StandInEngine:
    """Fixed latency per batch, whatever its size: isolates the dispatcher from engine speed."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def describe(self) -> dict[str, Any]:
        return {"name": "stand-in", "version": "0", "settings": {"latency_s": self.latency_s}}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        time.sleep(self.latency_s)
        return [Completion(" 0", (97, 3, 2), (-0.5, -0.25, -0.125), "stop", 8) for _ in requests]


def stand_in_factory(latency_s: float) -> Any:
    def build(spec: WorkerSpec) -> StandInEngine:
        return StandInEngine(latency_s)

    return build


def part_a(rounds: int, tmp: Path) -> None:
    common = ["seeds.set=[0,1,2,3,4]", "run.progress=false", f"run.root={tmp}"]
    inline = prepare(load(["cluster=inline", *common]))
    ray_run = prepare(load(["cluster=local", "cluster.cpus_per_worker=2", *common]))
    dispatchers = {"inline": open_for(inline), "ray": open_for(ray_run)}
    prepared = {"inline": inline, "ray": ray_run}
    times: dict[str, list[float]] = {"inline": [], "ray": []}
    for name in times:
        execute(prepared[name], dispatchers[name])  # warm-up
    for _ in range(rounds):
        for name in times:
            started = time.perf_counter()
            execute(prepared[name], dispatchers[name])
            times[name].append(time.perf_counter() - started)
    n = len(inline.episodes)
    eps = {name: n / statistics.median(t) for name, t in times.items()}
    print(f"(a) default model, {n} episodes, {rounds} rounds")
    print(f"    inline: {eps['inline']:8.1f} episodes/s   ray, 1 worker: {eps['ray']:8.1f} episodes/s")
    print(f"    ratio ray/inline: {eps['ray'] / eps['inline']:.3f}")
    for d in dispatchers.values():
        d.close()


def part_b(latency: float, batch_size: int, seeds: int, worker_counts: list[int], rounds: int, tmp: Path,
           paths: list[str]) -> None:  # fmt: skip
    common = [f"cluster.batch_size={batch_size}", "cluster.cpus_per_worker=0.01", "run.progress=false",
              f"run.root={tmp}", "report=false"]  # fmt: skip
    print(f"(b) stand-in engine, {latency * 1000:.0f} ms per batch of {batch_size}; medians of {rounds} interleaved "
          f"rounds; parts written by: {', '.join(paths)}")  # fmt: skip
    runs: dict[tuple[int, str], tuple[Any, RayDispatcher]] = {}
    for workers in worker_counts:

        def stand_in(*overrides: str, workers: int = workers) -> Any:
            prepared = prepare(load([f"cluster.num_workers={workers}", *common, *overrides]))
            spec = WorkerSpec(**{**prepared.worker_spec.__dict__, "engine_factory": stand_in_factory(latency)})
            return type(prepared)(**{**prepared.__dict__, "worker_spec": spec})

        dispatcher = None
        for path in paths:
            writes = [f"run.part_writes={path}"] if path != "default" else []
            prepared = stand_in(f"seeds.set=[{','.join(map(str, range(seeds)))}]", *writes)
            dispatcher = dispatcher or RayDispatcher(prepared.worker_spec, prepared.config.cluster)
            # Warm-up: first calls, imports (a worker's first part imports pandas through pyarrow: about 0.5 s of
            # CPU), part writer. Every worker gets a batch: the dispatcher hands max_in_flight to each in turn.
            warm_up = workers * prepared.config.cluster.max_in_flight * batch_size
            execute(stand_in(f"seeds.set=[{','.join(map(str, range(math.ceil(warm_up / 200))))}]", *writes),
                    dispatcher)  # fmt: skip
            runs[workers, path] = prepared, dispatcher
    measured: dict[tuple[int, str], list[tuple[float, float, float, dict[str, Any]]]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, (prepared, dispatcher) in runs.items():
            cpu, started = time.process_time(), time.perf_counter()
            run = execute(prepared, dispatcher)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            timings = json.loads((run / "record.json").read_text())["timings"]
            # the dispatch loop alone: batches sent, answered and committed (timings generation + writing)
            measured[key].append((wall, timings.get("generation", 0) + timings.get("writing", 0), cpu, timings))
            shutil.rmtree(run)  # 32 workers' runs add up
    for path in paths:
        _report_b(path, {w: (runs[w, path][0], measured[w, path]) for w in worker_counts})
    for dispatcher in {id(d): d for _, d in runs.values()}.values():
        dispatcher.close()
    if len(paths) == 2:
        first, second = paths
        print(f"    {second} against {first}, same worker count:")
        for workers in worker_counts:
            n = len(runs[workers, first][0].episodes)
            medians = {p: [statistics.median(m[i] for m in measured[workers, p]) for i in (0, 2)] for p in paths}
            (wall_a, cpu_a), (wall_b, cpu_b) = medians[first], medians[second]
            print(f"      {workers:3d} workers: throughput {wall_a / wall_b:.3f}x, driver CPU {cpu_b / n * 1e6:.1f} vs "
                  f"{cpu_a / n * 1e6:.1f} us/episode ({cpu_b / cpu_a:.3f}x)")  # fmt: skip


def _report_b(path: str, runs: dict[int, tuple[Any, list[tuple[float, float, float, dict[str, Any]]]]]) -> None:
    print(f"  parts written by the {path}:")
    base = loop_base = None
    for workers, (prepared, measured_runs) in runs.items():
        measured = {workers: measured_runs}
        n = len(prepared.episodes)
        walls = sorted(m[0] for m in measured[workers])
        wall, dispatching = statistics.median(walls), statistics.median(m[1] for m in measured[workers])
        cpu = statistics.median(m[2] for m in measured[workers])
        throughput, loop_throughput = n / wall, n / dispatching
        base, loop_base = base or throughput, loop_base or loop_throughput
        phases = ", ".join(f"{k} {statistics.median(m[3].get(k, 0) for m in measured[workers]):.2f}"
                           for k in measured[workers][0][3] if k != "engine_load")  # fmt: skip
        print(
            f"    {workers} workers: {throughput:7.1f} episodes/s, parallel efficiency "
            f"{throughput / (workers * base):.3f} (whole run, {wall:.2f} s; {walls[0]:.2f} to {walls[-1]:.2f}), "
            f"driver CPU {cpu / n * 1e6:5.1f} us/episode ({n} episodes)\n"
            f"               dispatch loop alone (generation + writing, {dispatching:.2f} s): {loop_throughput:7.1f} "
            f"episodes/s, parallel efficiency {loop_throughput / (workers * loop_base):.3f}; phases: {phases} s"
        )


def scale_child(episodes: int, batch_size: int, tmp: Path, writes: str = "driver", workers: int = 2) -> None:
    """One size of (c), in this process: prints one JSON line (peak RSS, CPU and wall time, phases)."""
    seeds = math.ceil(episodes / 200)
    limit = [f"limit={episodes}"] if episodes < 200 else []
    if writes == "workers":  # local Ray workers that write their parts; Ray's own processes are not the driver's
        import ray

        ray.init(num_cpus=max(2, workers), include_dashboard=False, log_to_driver=False)
        cluster = ["cluster=local", f"cluster.num_workers={workers}", "cluster.cpus_per_worker=1",
                   "run.part_writes=workers"]  # fmt: skip
    else:
        cluster = ["cluster=inline"]
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu, started = time.process_time(), time.perf_counter()
    prepared = prepare(load([
        *cluster, f"cluster.batch_size={batch_size}", "run.progress=false", f"run.root={tmp}", *limit,
        f"seeds.set=[{','.join(map(str, range(seeds)))}]", "report=false",
    ]))  # fmt: skip
    spec = WorkerSpec(**{**prepared.worker_spec.__dict__, "engine_factory": stand_in_factory(0.0)})
    prepared = type(prepared)(**{**prepared.__dict__, "worker_spec": spec})
    planned, planned_cpu = time.perf_counter() - started, time.process_time() - cpu
    dispatcher = open_for(prepared)
    run = execute(prepared, dispatcher)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    record = json.loads((run / "record.json").read_text())
    print(json.dumps({
        "episodes": record["episodes"]["written"], "wall_s": wall, "cpu_s": cpu, "plan_s": planned,
        "plan_cpu_s": planned_cpu,
        "rss_start_kib": rss_start, "rss_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "timings": {k: v for k, v in record["timings"].items() if k != "engine_load"},
    }))  # fmt: skip


def part_c(sizes: list[int], batch_size: int, writes: str = "driver", workers: int = 2) -> None:
    where = "inline" if writes == "driver" else f"on {workers} local Ray workers writing their own parts"
    print(f"(c) driver memory and cost by episode count: stand-in engine {where}, no latency, batches of {batch_size}")
    peaks: dict[int, float] = {}
    for size in sizes:
        done = subprocess.run(
            [sys.executable, __file__, "--scale-child", str(size), "--batch-size", str(batch_size),
             "--scale-part-writes", writes, "--scale-workers", str(workers)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"(c) {size} episodes failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        n = result["episodes"]
        peaks[size] = result["rss_peak_kib"] / 1024
        phases = ", ".join(f"{k} {v:.1f}" for k, v in result["timings"].items())
        print(
            f"    {n:>9,} episodes: peak RSS {peaks[size]:6.0f} MiB (at start {result['rss_start_kib'] / 1024:.0f}), "
            f"driver CPU {result['cpu_s'] / n * 1e6:5.1f} us/episode, {n / result['wall_s']:7.0f} episodes/s "
            f"(plan {result['plan_s']:.1f} s, CPU {result['plan_cpu_s']:.1f} s: the run alone "
            f"{(result['cpu_s'] - result['plan_cpu_s']) / n * 1e6:.1f} us/episode; {phases} s)"
        )
    sizes = sorted(peaks)
    for smaller, larger in itertools.pairwise(sizes):
        print(f"    peak RSS {larger:,} / {smaller:,} episodes: {peaks[larger] / peaks[smaller]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64, help="(b) episodes per stand-in batch")
    parser.add_argument("--seeds", type=int, default=20, help="(b) seed-set size: episodes = 200 x seeds")
    parser.add_argument("--workers", default="1,2,4,8", help="(b) worker counts, the first is the baseline")
    parser.add_argument("--part-writes", default="default", help="(b) driver, workers, or both (driver,workers)")
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--skip-b", action="store_true")
    parser.add_argument("--scale", default="", help="(c) episode counts, e.g. 10000,100000,1000000")
    parser.add_argument("--scale-batch-size", type=int, default=256, help="(c) episodes per batch")
    parser.add_argument("--scale-part-writes", default="driver", choices=("driver", "workers"))
    parser.add_argument("--scale-workers", type=int, default=2, help="(c) Ray workers with --scale-part-writes workers")
    parser.add_argument("--scale-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_child is not None:
        with tempfile.TemporaryDirectory() as tmp:
            scale_child(args.scale_child, args.batch_size, Path(tmp), args.scale_part_writes, args.scale_workers)
        return
    if not (args.skip_a and args.skip_b):
        import ray

        ray.init(num_cpus=max(8, *(int(w) for w in args.workers.split(","))), include_dashboard=False,
                 log_to_driver=False)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            if not args.skip_a:
                part_a(args.rounds, Path(tmp))
            if not args.skip_b:
                workers = [int(w) for w in args.workers.split(",")]
                part_b(args.latency, args.batch_size, args.seeds, workers, args.rounds, Path(tmp),
                       args.part_writes.split(","))  # fmt: skip
        ray.shutdown()
    if args.scale:
        part_c([int(size) for size in args.scale.split(",")], args.scale_batch_size, args.scale_part_writes,
               args.scale_workers)  # fmt: skip


if __name__ == "__main__":
    main()
