"""Start-up: whole processes, side by side in one command, against a raw vLLM script doing the same work.

Modes (each a fresh process, timed from spawn to exit):
  raw        a minimal script: import vLLM, build ``LLM`` with evalrun's engine settings, generate the
             default task's prompts with their sampling parameters, exit. vLLM's defaults otherwise
             (its engine core in a child process, its default compile path).
  raw-tuned  the same script with what evalrun sets for vLLM: the engine in-process
             (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the compile path that reuses its cache
             (VLLM_USE_AOT_COMPILE=0). evalrun / raw-tuned is evalrun's own cost.
  inline     ``evalrun run cluster=inline`` (the engine in the driver), everything else default: chains,
             parts, scores, record, attestation, report.html.
  local      ``evalrun run``, the default: a local Ray started by the run, one engine worker.

With warm caches: one untimed run of each mode first (``--no-warmup`` skips it), then ``--rounds`` rounds
with the modes interleaved; prints the median wall per mode and each evalrun mode's ratio to raw.

    .venv/bin/python scripts/bench_startup.py [--rounds 3] [--modes raw,raw-tuned,inline,local] [--limit N]

The raw script is this file run with ``--raw PLAN.json`` (it imports nothing of evalrun's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("raw", "raw-tuned", "inline", "local")
# Whatever the calling shell set for these, each mode runs with its own defaults.
CLEARED = ("VLLM_USE_AOT_COMPILE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_ATTN_SPLIT_KV")


def raw(plan_path: str) -> None:
    """The raw script: what a vLLM user writes for the same prompts."""
    started = time.perf_counter()
    from vllm import LLM, SamplingParams

    imported = time.perf_counter()
    plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
    llm = LLM(**plan["llm"])
    loaded = time.perf_counter()
    params = [SamplingParams(**p) for p in plan["sampling"]]
    outputs = llm.generate(plan["prompts"], params, use_tqdm=False)
    done = time.perf_counter()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"raw: {len(outputs)} prompts, {tokens} tokens; import {imported - started:.2f} s, "
          f"engine {loaded - imported:.2f} s, generate {done - loaded:.2f} s", file=sys.stderr)  # fmt: skip


def write_plan(path: Path, overrides: list[str]) -> int:
    """The default run's prompts, sampling parameters and engine settings, as evalrun would pass them."""
    from evalrun.config import load
    from evalrun.pipeline.runner import prepare

    prepared = prepare(load(overrides))
    engine = prepared.config.engine
    llm = {
        "model": prepared.worker_spec.model_path,
        "dtype": engine.dtype or prepared.worker_spec.model_dtype,
        "seed": engine.seed,
        "max_num_seqs": engine.max_num_seqs,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "enforce_eager": engine.enforce_eager,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        **({"max_model_len": engine.max_model_len} if engine.max_model_len else {}),
    }
    sampling = [
        {
            "temperature": e.sampling.temperature,
            "top_p": e.sampling.top_p,
            "top_k": e.sampling.top_k if e.sampling.top_k > 0 else -1,
            "max_tokens": e.sampling.max_tokens,
            "stop": list(e.sampling.stop),
            "seed": e.sampling.seed,
            "logprobs": 0 if e.sampling.logprobs else None,
        }
        for e in prepared.episodes
    ]
    plan = {"llm": llm, "sampling": sampling, "prompts": [e.prompt for e in prepared.episodes],
            "kv_cache_gib": engine.cpu_kvcache_gib}  # fmt: skip
    path.write_text(json.dumps(plan), encoding="utf-8")
    return len(sampling)


def command(mode: str, plan: Path, runs: Path, limit: list[str]) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["HF_HUB_OFFLINE"] = "1"
    if mode.startswith("raw"):
        kv = json.loads(plan.read_text(encoding="utf-8"))["kv_cache_gib"]
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv))  # as evalrun's engine sets it
        if mode == "raw-tuned":
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_AOT_COMPILE="0")
        return [sys.executable, __file__, "--raw", str(plan)], env
    cluster = ["cluster=inline"] if mode == "inline" else []
    return [str(Path(sys.executable).parent / "evalrun"), "run", *cluster, f"run.root={runs}", *limit], env


def timed(mode: str, plan: Path, runs: Path, limit: list[str]) -> tuple[float, str]:
    argv, env = command(mode, plan, runs, limit)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_startup: {mode} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    found = re.search(r"^(raw: .*|timings: .*)$", done.stderr, re.MULTILINE)
    return wall, found.group(1) if found else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--limit", type=int, default=None, help="the first N items (default: all 200)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed first run of each mode")
    parser.add_argument("--raw", metavar="PLAN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw:
        raw(args.raw)
        return
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: expected some of {','.join(MODES)}, got {args.modes!r}")
    limit = [f"limit={args.limit}"] if args.limit else []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        plan, runs = Path(tmp) / "plan.json", Path(tmp) / "runs"
        n = write_plan(plan, ["cluster=inline", *limit])
        print(f"start-up, whole processes: {n} episodes of the default task; modes {', '.join(modes)}; "
              f"{args.rounds} rounds{'' if args.no_warmup else ' after one untimed run of each'}")  # fmt: skip
        if not args.no_warmup:
            for mode in modes:
                timed(mode, plan, runs, limit)
        walls: dict[str, list[float]] = {m: [] for m in modes}
        for number in range(args.rounds):
            for mode in modes:
                wall, detail = timed(mode, plan, runs, limit)
                walls[mode].append(wall)
                print(f"  round {number + 1} {mode:9s} {wall:6.2f} s  {detail}")
        medians = {m: statistics.median(w) for m, w in walls.items()}
        print("median wall: " + "; ".join(f"{m} {medians[m]:.2f} s" for m in modes))
        for base in ("raw", "raw-tuned"):
            for mode in ("inline", "local"):
                if base in medians and mode in medians:
                    print(f"ratio {mode}/{base}: {medians[mode] / medians[base]:.3f}")


if __name__ == "__main__":
    main()
