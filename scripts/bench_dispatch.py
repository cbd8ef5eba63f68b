"""Dispatch overhead and scaling, each figure a ratio against a baseline measured in this command.

(a) The default model, 1,000 episodes: Ray dispatch with one engine worker vs the inline
    dispatcher (engine in the driver), alternating rounds; prints the throughput ratio ray/inline.
(b) A fixed-latency stand-in engine (sleeps LATENCY per batch, returns canned completions) on 1, 2,
    4 and 8 Ray workers: parallel efficiency = throughput(N) / (N x throughput(1)), and the driver's
    CPU time per episode (plan excluded; dispatch, chains arriving, parts, scoring, record included).

    .venv/bin/python scripts/bench_dispatch.py [--rounds 3] [--latency 0.1] [--batch-size 64] [--seeds 20] [--skip-a]
"""

from __future__ import annotations

import argparse
import statistics
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


def part_b(latency: float, batch_size: int, seeds: int, tmp: Path) -> None:
    import ray

    common = [f"cluster.batch_size={batch_size}", "cluster.cpus_per_worker=0.01", "run.progress=false",
              f"run.root={tmp}"]  # fmt: skip
    print(f"(b) stand-in engine, {latency * 1000:.0f} ms per batch of {batch_size}")
    base = None
    for workers in (1, 2, 4, 8):

        def stand_in(*overrides: str, workers: int = workers) -> Any:
            prepared = prepare(load([f"cluster.num_workers={workers}", *common, *overrides]))
            spec = WorkerSpec(**{**prepared.worker_spec.__dict__, "engine_factory": stand_in_factory(latency)})
            return type(prepared)(**{**prepared.__dict__, "worker_spec": spec})

        prepared = stand_in(f"seeds.set=[{','.join(map(str, range(seeds)))}]")
        dispatcher = RayDispatcher(prepared.worker_spec, prepared.config.cluster)
        execute(stand_in("limit=32"), dispatcher)  # warm-up: first calls, imports, part writer
        cpu, started = time.process_time(), time.perf_counter()
        execute(prepared, dispatcher)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        dispatcher.close()
        n = len(prepared.episodes)
        throughput = n / wall
        base = base or throughput
        print(
            f"    {workers} workers: {throughput:7.1f} episodes/s, parallel efficiency "
            f"{throughput / (workers * base):.3f}, driver CPU {cpu / n * 1e6:4.0f} us/episode ({n} episodes)"
        )
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64, help="(b) episodes per stand-in batch")
    parser.add_argument("--seeds", type=int, default=20, help="(b) seed-set size: episodes = 200 x seeds")
    parser.add_argument("--skip-a", action="store_true")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_a:
            part_a(args.rounds, Path(tmp))
        part_b(args.latency, args.batch_size, args.seeds, Path(tmp))


if __name__ == "__main__":
    main()
