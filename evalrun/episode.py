"""The harness: run episodes against an engine and record each one's hash chain.

This is the code a replay re-executes with the engine replaced by recorded responses, so it must
depend only on the episodes and the engine's completions: no clocks, workers or batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from evalrun.chain import GENESIS, SCHEDULE_FORMAT, link
from evalrun.digest import Canonical, canonical_json, sha256_hex
from evalrun.engines import Completion, Engine, GenerationRequest, SamplingSpec
from evalrun.plan import Episode

_string = encode_basestring  # JCS string escaping (see evalrun.digest)
_FORMAT = _string(SCHEDULE_FORMAT)


@dataclass(frozen=True)
class EpisodeResult:
    episode: Episode
    completion: Completion
    log_lines: tuple[str, ...]
    head: str


def request_fields(prompt: str, sampling: SamplingSpec) -> dict[str, Any]:
    """What a model entry records of a request; its canonical JSON is hashed into ``request_hash``."""
    return {"prompt": prompt, "prompt_sha256": sha256_hex(prompt), "sampling": sampling.as_record()}


def request_record(episode: Episode) -> dict[str, Any]:
    return request_fields(episode.prompt, episode.sampling)


def encode_generator(generator: dict[str, Any] | Canonical) -> Canonical:
    """The header's generator, encoded once per batch rather than once per episode."""
    return generator if isinstance(generator, Canonical) else Canonical(canonical_json(generator))


def record_episode(episode: Episode, completion: Completion, generator: dict[str, Any] | Canonical) -> EpisodeResult:
    """The chain of one single-turn episode: header, one model call, end.

    The three lines are assembled directly in canonical form (keys in JCS order, every value
    through the canonical encoder), which is several times faster than encoding three dicts; a
    test checks them byte for byte against :class:`evalrun.chain.ChainBuilder`.
    """
    eid = _string(episode.episode_id)
    header = (
        f'{{"episode":{eid},"format":{_FORMAT},"generator":{encode_generator(generator)},'
        f'"item":{_string(episode.item_id)},"kind":"header","prev":"{GENESIS}",'
        f'"repeat":{canonical_json(episode.repeat)},"seed":{canonical_json(episode.seed)},'
        f'"seeds":{canonical_json(episode.seeds_record())},"seq":0,"task":{_string(episode.task)}}}'
    )
    h0 = link(GENESIS, header)
    request = canonical_json(request_record(episode))
    response = (
        f'{{"finish_reason":{_string(completion.finish_reason)},"logprobs":{canonical_json(list(completion.logprobs))},'
        f'"text":{_string(completion.text)},"token_ids":{canonical_json(list(completion.token_ids))}}}'
    )
    model = (
        f'{{"call":0,"episode":{eid},"kind":"model","prev":"{h0}","request":{request},'
        f'"request_hash":"{sha256_hex(request)}","response":{response},"seq":1}}'
    )
    h1 = link(h0, model)
    end = f'{{"episode":{eid},"kind":"end","model_calls":1,"prev":"{h1}","seq":2,"status":"ok"}}'
    return EpisodeResult(episode=episode, completion=completion, log_lines=(header, model, end), head=link(h1, end))


def run_episodes(engine: Engine, episodes: list[Episode], generator: dict[str, Any] | Canonical) -> list[EpisodeResult]:
    """Run single-turn episodes as one engine batch; results in episode order."""
    requests = [GenerationRequest(prompt=e.prompt, sampling=e.sampling, episode_id=e.episode_id) for e in episodes]
    completions = engine.generate(requests)
    if len(completions) != len(episodes):
        raise RuntimeError(f"engine returned {len(completions)} completions for {len(episodes)} requests")
    encoded = encode_generator(generator)
    return [record_episode(e, c, encoded) for e, c in zip(episodes, completions, strict=True)]
