"""Overhead of evalrun's run path over raw ``vllm.LLM.generate``, measured in one process.

The same prompts (the 200 built-in items x a seed set of ``--seeds``: 10,000 episodes by default),
the same per-request sampling parameters and the same engine instance go through
(a) one raw ``LLM.generate`` call, as a vLLM user writes it;
(b) evalrun's engine adapter alone (``VLLMEngine.generate``: the same requests, no records), which spares
    vLLM work whose results evalrun never reads (see evalrun.engines.vllm);
(c) ``evalrun.pipeline.runner.execute`` with the inline dispatcher (plan, chains, Parquet parts, scoring,
    summary, record).
The three alternate ``--rounds`` times after one untimed round of each. Printed: each one's median
episodes/s (wall clock, and per CPU second of this process, which the engine runs in: less moved by other
load), the run path against raw vLLM (the target), and against the adapter alone (what evalrun's records
cost).

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
from evalrun.engines import GenerationRequest
from evalrun.pipeline.dispatch import InlineDispatcher
from evalrun.pipeline.runner import Prepared, execute, open_for, prepare


def overrides_for(seeds: int, root: Path, extra: list[str]) -> list[str]:
    return ["cluster=inline", f"seeds.set=[{','.join(map(str, range(seeds)))}]", "run.progress=false",
            f"run.root={root}", *extra]  # fmt: skip


def measure(prepared: Prepared, dispatcher: InlineDispatcher, rounds: int) -> list[str]:
    """Raw generate, the engine adapter and the run path, alternating; the lines to print."""
    engine = dispatcher.worker.engine
    from vllm import SamplingParams

    # The raw side starts from its prompts in a list; the run path makes its episodes from the plan as it
    # dispatches them (episodes.plan.Plan), and that counts.
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

    def adapter_generate() -> None:
        engine.generate([GenerationRequest(prompt=e.prompt, sampling=e.sampling, episode_id=e.episode_id)
                         for e in episodes])  # fmt: skip

    def run_path() -> None:
        execute(prepared, dispatcher)

    n = len(prepared.episodes)
    sides = {"raw": raw_generate, "adapter": adapter_generate, "evalrun": run_path}
    timed: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
    for step in sides.values():  # warm-up
        step()
    for _ in range(rounds):
        for name, step in sides.items():
            started, cpu = time.perf_counter(), time.process_time()
            step()
            timed[name][0].append(n / (time.perf_counter() - started))
            timed[name][1].append(n / (time.process_time() - cpu))
    lines = [f"episodes per round: {n}, rounds: {rounds}"]
    labels = {"raw": "raw vllm.LLM.generate", "adapter": "evalrun engine adapter", "evalrun": "evalrun run path"}
    for name, (wall, cpu) in timed.items():
        lines.append(f"{labels[name]:22s}: {statistics.median(wall):8.1f} episodes/s, {statistics.median(cpu):8.1f} "
                     f"per CPU s  (rounds: {', '.join(f'{x:.1f}' for x in wall)})")  # fmt: skip

    def ratio(name: str, base: str, clock: int) -> float:
        return statistics.median(timed[name][clock]) / statistics.median(timed[base][clock])

    lines.append(f"ratio evalrun/raw     : {ratio('evalrun', 'raw', 0):.3f}  "
                 f"(per CPU second: {ratio('evalrun', 'raw', 1):.3f})")  # fmt: skip
    lines.append(f"ratio evalrun/adapter : {ratio('evalrun', 'adapter', 0):.3f}  "
                 f"(per CPU second: {ratio('evalrun', 'adapter', 1):.3f}; the records' cost)")  # fmt: skip
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
