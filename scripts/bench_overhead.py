"""Overhead of evalrun's run path over raw ``vllm.LLM.generate``, measured in one process.

The same prompts (the 200 built-in items x a seed set of ``--seeds``: 10,000 episodes by default),
the same per-request sampling parameters and the same engine instance go through (a) one raw
``LLM.generate`` call and (b) ``evalrun.pipeline.runner.execute`` with the inline dispatcher (plan,
chains, Parquet parts, scoring, summary, record). The two alternate ``--rounds`` times after one
untimed round of each; the ratio of the medians is printed, with each round's episodes/s (wall
clock, and per CPU second of this process, which the engine runs in: less moved by other load).

    .venv/bin/python scripts/bench_overhead.py [--seeds 50] [--rounds 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from evalrun.config import load
from evalrun.pipeline.dispatch import InlineDispatcher
from evalrun.pipeline.runner import Prepared, execute, open_for, prepare


def overrides_for(seeds: int, root: Path, extra: list[str]) -> list[str]:
    return ["cluster=inline", f"seeds.set=[{','.join(map(str, range(seeds)))}]", "run.progress=false",
            f"run.root={root}", *extra]  # fmt: skip


def measure(prepared: Prepared, dispatcher: InlineDispatcher, rounds: int) -> list[str]:
    """Raw generate and the run path, alternating; the lines to print."""
    engine = dispatcher.worker.engine
    from vllm import SamplingParams

    # The raw side starts from its prompts in a list; the run path makes its episodes from the plan as it
    # dispatches them (pipeline.plan.Plan), and that counts.
    episodes = list(prepared.episodes)

    def raw_generate() -> None:
        # What a raw vLLM user writes for the same work: per-request seeded params, one call.
        params = [
            SamplingParams(
                temperature=e.sampling.temperature,
                top_p=e.sampling.top_p,
                max_tokens=e.sampling.max_tokens,
                stop=list(e.sampling.stop),
                seed=e.sampling.seed,
                logprobs=0,
            )
            for e in episodes
        ]
        engine.llm.generate([e.prompt for e in episodes], params, use_tqdm=False)

    def run_path() -> None:
        execute(prepared, dispatcher)

    n = len(prepared.episodes)
    timed: dict[str, tuple[list[float], list[float]]] = {"raw": ([], []), "evalrun": ([], [])}
    raw_generate(), run_path()  # warm-up
    for _ in range(rounds):
        for name, step in (("raw", raw_generate), ("evalrun", run_path)):
            started, cpu = time.perf_counter(), time.process_time()
            step()
            timed[name][0].append(n / (time.perf_counter() - started))
            timed[name][1].append(n / (time.process_time() - cpu))
    lines = [f"episodes per round: {n}, rounds: {rounds}"]
    labels = {"raw": "raw vllm.LLM.generate", "evalrun": "evalrun run path"}
    for name, (wall, cpu) in timed.items():
        lines.append(f"{labels[name]:22s}: {statistics.median(wall):8.1f} episodes/s, {statistics.median(cpu):8.1f} "
                     f"per CPU s  (rounds: {', '.join(f'{x:.1f}' for x in wall)})")  # fmt: skip
    ratio = statistics.median(timed["evalrun"][0]) / statistics.median(timed["raw"][0])
    cpu_ratio = statistics.median(timed["evalrun"][1]) / statistics.median(timed["raw"][1])
    lines.append(f"ratio evalrun/raw     : {ratio:.3f}  (per CPU second: {cpu_ratio:.3f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50, help="seed set 0..N-1: N x 200 episodes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        prepared = prepare(load(overrides_for(args.seeds, Path(tmp), args.overrides)))
        dispatcher = open_for(prepared)
        assert isinstance(dispatcher, InlineDispatcher), "the raw engine is reachable with cluster=inline only"
        lines = measure(prepared, dispatcher, args.rounds)
        dispatcher.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
