"""A served model: evalrun's engine=openai against a minimal asyncio client, the same server, prompts and concurrency.

Starts one vLLM server of the default model (evalrun.engines.server, as engine=vllm_server does), then, in
alternating rounds, (a) a whole evalrun run of N episodes of the built-in addition task through it (``execute``:
plan, requests, chains, parts, scores, seal; the engine already connected, as a warm worker is) and (b) a minimal
client: the same rendered prompts and request bodies sent with httpx at the same concurrency, answers parsed and
dropped. Prints each side's median seconds and requests/s, and the ratio baseline/evalrun (1.0: evalrun costs
nothing beyond the requests; the issue's target is at least 0.95), with the load average.

    .venv/bin/python scripts/bench_served.py [--episodes 600] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from evalrun.config import MODELS_DIR, load
from evalrun.engines.openai import signed_seed
from evalrun.engines.server import VLLMServer
from evalrun.pipeline.runner import execute, open_for, prepare


def overrides(url: str, episodes: int, concurrency: int, root: Path) -> list[str]:
    repeats = -(-episodes // 200)  # the addition task has 200 items
    return ["engine=openai", f"engine.base_url={url}", "engine.served_model=tiny-adder",
            f"engine.max_concurrency={concurrency}", "cluster=inline", f"cluster.batch_size={concurrency}",
            "run.progress=false", "determinism.canary=false", f"seeds.repeats={repeats}",
            f"run.root={root}"]  # fmt: skip


async def baseline(url: str, bodies: list[dict[str, Any]], concurrency: int) -> float:
    """The minimal client: every body POSTed, at most ``concurrency`` in flight; its seconds."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency)) as c:

        async def one(body: dict[str, Any]) -> None:
            async with limit:
                try:
                    answer = await c.post("/completions", json=body)
                except httpx.TransportError:  # a kept-alive connection the server closed: sent again, as evalrun does
                    answer = await c.post("/completions", json=body)
                answer.raise_for_status()
                answer.json()

        await asyncio.gather(*(one(b) for b in bodies))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = {"seed": 0, "max_num_seqs": 256, "dtype": "float32", "enable_prefix_caching": False,
                "cpu_kvcache_gib": 1}  # fmt: skip
    started = time.perf_counter()
    server = VLLMServer.start(MODELS_DIR / "tiny-adder", "tiny-adder", settings)
    print(f"server healthy in {time.perf_counter() - started:.0f} s at {server.base_url}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prepared = prepare(load(overrides(server.base_url, args.episodes, args.concurrency, Path(tmp))))
            episodes = list(prepared.episodes)
            bodies = [{"model": "tiny-adder", "prompt": e.prompt, "max_tokens": e.sampling.max_tokens,
                       "temperature": e.sampling.temperature, "top_p": e.sampling.top_p,
                       "seed": signed_seed(e.sampling.seed), "stop": list(e.sampling.stop), "return_token_ids": True,
                       "add_special_tokens": True, "logprobs": 0} for e in episodes]  # fmt: skip
            dispatcher = open_for(prepared)
            ours: list[float] = []
            theirs: list[float] = []
            try:
                asyncio.run(baseline(server.base_url, bodies[: args.concurrency], args.concurrency))  # warm-up
                for i in range(args.rounds):
                    root = Path(tmp) / f"round-{i}"
                    t = time.perf_counter()
                    execute(prepare(load(overrides(server.base_url, args.episodes, args.concurrency, root))),
                            dispatcher)  # fmt: skip
                    ours.append(time.perf_counter() - t)
                    theirs.append(asyncio.run(baseline(server.base_url, bodies, args.concurrency)))
            finally:
                dispatcher.close()
    finally:
        server.stop()
    a, b = statistics.median(ours), statistics.median(theirs)
    n = len(bodies)
    print(f"{n} requests at concurrency {args.concurrency}, {args.rounds} rounds, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"evalrun run (whole, execute): {a:.2f} s median, {n / a:.1f} requests/s")
    print(f"minimal asyncio client:       {b:.2f} s median, {n / b:.1f} requests/s")
    print(f"ratio client/evalrun: {b / a:.3f}")


if __name__ == "__main__":
    main()
