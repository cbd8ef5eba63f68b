"""Agent episodes on the real engine: lockstep turns against one episode at a time, same process.

N live episodes of ``task=invoice_desk`` (the held-out split, both families) with ``agent=model``
on the shipped agent model: the lockstep driver generates every waiting episode in one engine
call per turn (``evalrun.episodes.agent.ModelAgent``); the baseline runs the first M of them one
episode at a time (one engine call per model call). Prints model calls per engine call, episodes/s
of each and their ratio, and how many of the M episodes have the same replies and the same chain
head both ways (batch invariance of the engine on this hardware: counts, not assertions). N beyond
the held-out split's 200 tasks takes repeats of it (seeds.repeats).

    .venv/bin/python scripts/bench_agents.py [--episodes 256] [--baseline 16] \
        [--model evalrun/models/tiny-invoice-agent]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from evalrun.chat import ModelChat, chat_format
from evalrun.config import MODELS_DIR, EngineConfig, load
from evalrun.engines import Engine, build_engine
from evalrun.episodes.agent import (
    AgentResult,
    ModelAgent,
    agent_decoding,
    load_agent_task,
    plan_agent_episodes,
    run_agent_episodes,
)
from evalrun.pipeline.manifest import generator_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--baseline", type=int, default=16)
    parser.add_argument("--model", type=Path, default=MODELS_DIR / "tiny-invoice-agent")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    settings = EngineConfig(max_model_len=args.max_model_len, max_num_seqs=max(256, args.episodes)).as_record()
    engine = build_engine("vllm", args.model, "float32", settings)
    print("\n".join(measure(engine, args.model, args.episodes, args.baseline)))


def measure(engine: Engine, model: Path, episodes_live: int, baseline: int) -> list[str]:
    """Lockstep against one at a time on ``engine`` (serving ``model``, with room for ``episodes_live``
    sequences at once); the lines to print."""
    config = agent_decoding(load(["task=invoice_desk", "task.world.agent=model"]))
    chat = chat_format(None, ModelChat.of_directory(model), None, None, str(model))
    task = load_agent_task(config.task, None, chat)
    repeats = -(-episodes_live // len(task.tasks))  # enough repeats of the held-out split for N live episodes
    seeds = replace(config.seeds, repeats=repeats)
    episodes = plan_agent_episodes(task.name, task.tasks, config.decoding, seeds, "model", task.budget,
                                   task.chat)[:episodes_live]  # fmt: skip
    generator = generator_info()

    run_agent_episodes(episodes[:2], ModelAgent(engine), generator)  # warm-up
    lockstep = ModelAgent(engine)
    started = time.perf_counter()
    together = run_agent_episodes(episodes, lockstep, generator)
    lockstep_s = time.perf_counter() - started

    alone_agent = ModelAgent(engine)
    started = time.perf_counter()
    alone = [run_agent_episodes([e], alone_agent, generator)[0] for e in episodes[:baseline]]
    alone_s = time.perf_counter() - started

    same = sum(a.head == b.head for a, b in zip(alone, together, strict=False))
    same_replies = sum(replies(a) == replies(b) for a, b in zip(alone, together, strict=False))
    passed = sum(r.scores.get("pass", 0.0) for r in together)
    lockstep_rate, alone_rate = len(together) / lockstep_s, len(alone) / alone_s
    return [
        f"episodes: {len(episodes)} live, lockstep; baseline: first {len(alone)} one at a time",
        f"model calls per engine call: {lockstep.model_calls / lockstep.engine_calls:.1f} ({lockstep.model_calls} "
        f"model calls in {lockstep.engine_calls} engine calls; first turn: {len(episodes)})",
        f"baseline model calls per engine call: {alone_agent.model_calls / alone_agent.engine_calls:.1f}",
        f"episodes/s: lockstep {lockstep_rate:.2f}, one at a time {alone_rate:.2f}, "
        f"ratio {lockstep_rate / alone_rate:.1f}x",
        f"same replies both ways: {same_replies}/{len(alone)}; same head (replies, tokens and logprobs): "
        f"{same}/{len(alone)}; pass rate (lockstep): {passed / len(together):.3f}",
    ]


def replies(result: AgentResult) -> list[str]:
    """The text of every model reply of an episode, in order."""
    return [json.loads(line)["response"]["text"] for line in result.log_lines if '"kind":"model"' in line]


if __name__ == "__main__":
    main()
