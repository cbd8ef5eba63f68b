"""The plan: every episode of a run, fixed before anything is dispatched.

Episodes = task items x seed set x repeats. An episode's id and seeds are pure functions of the
config, so the same config gives the same episodes on any machine, in any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalrun.digest import canonical_hash, sha256_hex
from evalrun.engines import SamplingSpec
from evalrun.seeds import derive_seed
from evalrun.tasks import Task, render_prompts


@dataclass(frozen=True)
class Episode:
    episode_id: str
    task: str
    item_id: str
    seed: int  # the member of the seed set this episode belongs to
    repeat: int
    prompt: str
    target: str
    sampling: SamplingSpec

    @property
    def prompt_sha256(self) -> str:
        return sha256_hex(self.prompt)

    def seeds_record(self) -> dict[str, str]:
        return {"sampling": str(self.sampling.seed)}


def episode_id(task: str, item_id: str, seed: int, repeat: int, seeds: dict[str, str]) -> str:
    return canonical_hash({"task": task, "item": item_id, "seed": seed, "repeat": repeat, "seeds": seeds})


def build_plan(task: Task, decoding: dict[str, Any], seeds: dict[str, Any]) -> list[Episode]:
    prompts = render_prompts(task)
    master = seeds["master"]
    episodes = []
    for seed in seeds["set"]:
        for repeat in range(seeds["repeats"]):
            for item in task.items:
                sampling = SamplingSpec(
                    temperature=float(decoding["temperature"]),
                    top_p=float(decoding["top_p"]),
                    top_k=int(decoding["top_k"]),
                    max_tokens=int(decoding["max_tokens"]),
                    stop=tuple(decoding["stop"]),
                    seed=derive_seed(master, "sampling", task.name, item.id, seed, repeat),
                    logprobs=bool(decoding["logprobs"]),
                )
                eid = episode_id(task.name, item.id, seed, repeat, {"sampling": str(sampling.seed)})
                episodes.append(
                    Episode(
                        episode_id=eid,
                        task=task.name,
                        item_id=item.id,
                        seed=seed,
                        repeat=repeat,
                        prompt=prompts[item.id],
                        target=item.target,
                        sampling=sampling,
                    )
                )
    return episodes
