"""The harness: run episodes against an engine and record each one's hash chain.

This is the code a replay re-executes with the engine replaced by recorded responses, so it must
depend only on the episodes and the engine's completions: no clocks, workers or batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalrun.chain import SCHEDULE_FORMAT, ChainBuilder
from evalrun.digest import Canonical, canonical_json, sha256_hex
from evalrun.engines import Completion, Engine, GenerationRequest
from evalrun.plan import Episode


@dataclass(frozen=True)
class EpisodeResult:
    episode: Episode
    completion: Completion
    log_lines: tuple[str, ...]
    head: str


def request_record(episode: Episode) -> dict[str, Any]:
    return {
        "prompt": episode.prompt,
        "prompt_sha256": episode.prompt_sha256,
        "sampling": episode.sampling.as_record(),
    }


def record_episode(episode: Episode, completion: Completion, generator: dict[str, Any]) -> EpisodeResult:
    """The chain of one single-turn episode: header, one model call, end."""
    chain = ChainBuilder(episode.episode_id)
    chain.append(
        "header",
        format=SCHEDULE_FORMAT,
        generator=generator,
        task=episode.task,
        item=episode.item_id,
        seed=episode.seed,
        repeat=episode.repeat,
        seeds=episode.seeds_record(),
    )
    request = Canonical(canonical_json(request_record(episode)))  # encoded once: hashed and embedded
    chain.append(
        "model",
        call=0,
        request=request,
        request_hash=sha256_hex(request),
        response={
            "text": completion.text,
            "token_ids": list(completion.token_ids),
            "logprobs": list(completion.logprobs),
            "finish_reason": completion.finish_reason,
        },
    )
    chain.append("end", status="ok", model_calls=1)
    return EpisodeResult(episode=episode, completion=completion, log_lines=tuple(chain.lines), head=chain.head)


def run_episodes(engine: Engine, episodes: list[Episode], generator: dict[str, Any]) -> list[EpisodeResult]:
    """Run single-turn episodes as one engine batch; results in episode order."""
    requests = [GenerationRequest(prompt=e.prompt, sampling=e.sampling) for e in episodes]
    completions = engine.generate(requests)
    if len(completions) != len(episodes):
        raise RuntimeError(f"engine returned {len(completions)} completions for {len(episodes)} requests")
    return [record_episode(e, c, generator) for e, c in zip(episodes, completions, strict=True)]
