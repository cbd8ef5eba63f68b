"""The harness: run episodes against an engine and record each one's hash chain.

This is the code a replay re-executes with the engine replaced by recorded responses, so it must
depend only on the episodes and the engine's completions: no clocks, workers or batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256 as _sha256
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from evalrun.chain import GENESIS, SCHEDULE_FORMAT
from evalrun.digest import MAX_SAFE_INTEGER, Canonical, _es6_number, canonical_json, sha256_hex
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


def _sampling_text(sampling: SamplingSpec) -> str:
    """Canonical JSON of ``sampling.as_record()``, from a per-settings template (only the seed varies)."""
    if type(sampling) is not SamplingSpec:
        return canonical_json(sampling.as_record())
    t, p, k, m, lp, stop = (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens,
                            sampling.logprobs, sampling.stop)  # fmt: skip
    try:
        # Types are part of the key: 1 == 1.0 == True, but they encode differently.
        key = (type(t), t, type(p), p, type(k), k, type(m), m, type(lp), lp, type(stop), stop, *map(type, stop))
        pre, post = _SAMPLING_TEMPLATES[key]
    except TypeError:  # unhashable settings
        return canonical_json(sampling.as_record())
    except KeyError:
        # A NUL never appears literally in canonical JSON (strings escape it), so it marks the seed.
        record = {**sampling.as_record(), "seed": Canonical("\x00")}
        pre, post = canonical_json(record).split("\x00")
        if len(_SAMPLING_TEMPLATES) < 1024:
            _SAMPLING_TEMPLATES[key] = (pre, post)
    return f"{pre}{_string(str(sampling.seed))}{post}"


_SAMPLING_TEMPLATES: dict[tuple[Any, ...], tuple[str, str]] = {}


def _array(values: tuple[Any, ...] | list[Any]) -> str:
    """Canonical JSON of a list of token ids or logprobs."""
    kinds = set(map(type, values))
    if kinds == _FLOAT:
        return f"[{','.join(map(_es6_number, values))}]"
    if kinds == _INT and min(values) >= -MAX_SAFE_INTEGER and max(values) <= MAX_SAFE_INTEGER:
        return f"[{','.join(map(str, values))}]"
    return canonical_json(list(values))


_FLOAT, _INT = {float}, {int}


def _integer(value: Any) -> str:
    if type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return str(value)
    return canonical_json(value)


def record_episode(episode: Episode, completion: Completion, generator: dict[str, Any] | Canonical) -> EpisodeResult:
    """The chain of one single-turn episode: header, one model call, end.

    The three lines are assembled directly in canonical form (keys in JCS order, every value
    through the canonical encoder), which is several times faster than encoding three dicts; a
    test checks them byte for byte against :class:`evalrun.chain.ChainBuilder`.
    """
    eid = _string(episode.episode_id)
    seeds = (
        f'{{"sampling":{_string(str(episode.sampling.seed))}}}'
        if type(episode) is Episode
        else canonical_json(episode.seeds_record())
    )
    header = (
        f'{{"episode":{eid},"format":{_FORMAT},"generator":{encode_generator(generator)},'
        f'"item":{_string(episode.item_id)},"kind":"header","prev":"{GENESIS}",'
        f'"repeat":{_integer(episode.repeat)},"seed":{_integer(episode.seed)},'
        f'"seeds":{seeds},"seq":0,"task":{_string(episode.task)}}}'
    )
    h0 = _sha256(f"{GENESIS}{header}".encode()).hexdigest()
    prompt = episode.prompt
    request = (
        f'{{"prompt":{_string(prompt)},"prompt_sha256":"{_sha256(prompt.encode()).hexdigest()}",'
        f'"sampling":{_sampling_text(episode.sampling)}}}'
    )
    response = (
        f'{{"finish_reason":{_string(completion.finish_reason)},"logprobs":{_array(completion.logprobs)},'
        f'"text":{_string(completion.text)},"token_ids":{_array(completion.token_ids)}}}'
    )
    model = (
        f'{{"call":0,"episode":{eid},"kind":"model","prev":"{h0}","request":{request},'
        f'"request_hash":"{_sha256(request.encode()).hexdigest()}","response":{response},"seq":1}}'
    )
    h1 = _sha256(f"{h0}{model}".encode()).hexdigest()
    end = f'{{"episode":{eid},"kind":"end","model_calls":1,"prev":"{h1}","seq":2,"status":"ok"}}'
    return EpisodeResult(episode, completion, (header, model, end), _sha256(f"{h1}{end}".encode()).hexdigest())


def run_episodes(engine: Engine, episodes: list[Episode], generator: dict[str, Any] | Canonical) -> list[EpisodeResult]:
    """Run single-turn episodes as one engine batch; results in episode order."""
    requests = [GenerationRequest(prompt=e.prompt, sampling=e.sampling, episode_id=e.episode_id) for e in episodes]
    completions = engine.generate(requests)
    if len(completions) != len(episodes):
        raise RuntimeError(f"engine returned {len(completions)} completions for {len(episodes)} requests")
    encoded = encode_generator(generator)
    return [record_episode(e, c, encoded) for e, c in zip(episodes, completions, strict=True)]
