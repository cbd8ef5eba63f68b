"""Overhead of evalrun's run path over raw ``vllm.LLM.generate``, measured in one process.

The same 1,000 prompts (200 built-in items x a seed set of 5), the same per-request sampling
parameters and the same engine instance go through (a) one raw ``LLM.generate`` call and (b)
``evalrun.pipeline.runner.execute`` with the inline dispatcher (plan, chains, Parquet parts, scoring,
summary, record). The two alternate ``--rounds`` times; the ratio of the medians is printed.

    .venv/bin/python scripts/bench_overhead.py [--rounds 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from evalrun.config import load
from evalrun.pipeline.runner import execute, open_for, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["cluster=inline", "seeds.set=[0,1,2,3,4]", "run.progress=false", f"run.root={tmp}",
                     *args.overrides]  # fmt: skip
        prepared = prepare(load(overrides))
        dispatcher = open_for(prepared)
        engine = dispatcher.worker.engine  # type: ignore[attr-defined]
        from vllm import SamplingParams

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
                for e in prepared.episodes
            ]
            engine.llm.generate([e.prompt for e in prepared.episodes], params, use_tqdm=False)

        n = len(prepared.episodes)
        raw_generate()  # warm-up
        execute(prepared, dispatcher)

        raw, ours = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            raw_generate()
            raw.append(n / (time.perf_counter() - started))
            started = time.perf_counter()
            execute(prepared, dispatcher)
            ours.append(n / (time.perf_counter() - started))
        dispatcher.close()

    raw_eps, our_eps = statistics.median(raw), statistics.median(ours)
    print(f"episodes per round: {n}, rounds: {args.rounds}")
    print(f"raw vllm.LLM.generate : {raw_eps:8.1f} episodes/s  (rounds: {', '.join(f'{x:.1f}' for x in raw)})")
    print(f"evalrun run path      : {our_eps:8.1f} episodes/s  (rounds: {', '.join(f'{x:.1f}' for x in ours)})")
    print(f"ratio evalrun/raw     : {our_eps / raw_eps:.3f}")


if __name__ == "__main__":
    main()
