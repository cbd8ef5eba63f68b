"""The harness: run episodes against an engine and record each one's hash chain.

This is the code a replay re-executes with the engine replaced by recorded responses, so it must
depend only on the episodes and the engine's completions: no clocks, workers or batch sizes.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Protocol

from evalrun.chat import Conversation
from evalrun.chat.reasoning import ReasoningParser
from evalrun.engines import (
    Completion,
    Engine,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    QueueingEngine,
    RequestRejected,
    SamplingSpec,
)
from evalrun.episodes.plan import Episode, JudgeCall
from evalrun.records.canonical import Canonical, canonical_json
from evalrun.records.chain import ChainBuilder
from evalrun.records.entries import (
    CompletionResponse,
    EndEntry,
    Entry,
    EpisodeSeeds,
    FailedCallEntry,
    HeaderEntry,
    JudgeEntry,
    LoglikelihoodEntry,
    LoglikelihoodResponse,
    ModelEntry,
    generation_request,
    loglikelihood_request,
)
from evalrun.records.formats import Generator
from evalrun.records.outputs import FAILED_FINISH_REASON
from evalrun.records.seeds import derive_seed
from evalrun.records.single_call import single_call_chain
from evalrun.tasks import render_prompt
from evalrun.tasks.selection import LETTERS, option_continuation

_string = encode_basestring  # JCS string escaping (see evalrun.records.canonical)


@dataclass(frozen=True)
class Judgement:
    """One judge's answer on one criterion, as recorded (the scorer turns it into a verdict)."""

    criterion: str
    judge: str
    shuffle_order: tuple[int, ...]
    output: str | None  # letter mode: the judge's text
    option_logprobs: tuple[float, ...] | None  # loglikelihood mode: per original option index


@dataclass(frozen=True)
class EpisodeResult:
    episode: Episode
    completion: Completion  # the policy's generation (empty when the episode only scores options)
    log_lines: tuple[str, ...]
    head: str
    prompt_sha256: str
    option_logprobs: tuple[float, ...] | None = None  # multiple choice, loglikelihood: per original option
    option_greedy: tuple[bool, ...] | None = None  # as option_logprobs: each option's continuation was greedy
    replies: tuple[str, ...] | None = None  # a request sampled several times (Episode.generations): every output
    judgements: tuple[Judgement, ...] = ()
    error: str | None = None  # why the episode failed (its chain ends with status error); None: ok


def completion_record(completion: Completion) -> CompletionResponse:
    optional = {name: value for name, value in (("content", completion.content), ("reasoning", completion.reasoning),
                                                ("server", completion.server)) if value is not None}  # fmt: skip
    return CompletionResponse(finish_reason=completion.finish_reason, logprobs=list(completion.logprobs),
                              text=completion.text, token_ids=list(completion.token_ids), **optional)  # fmt: skip


def split_reasoning(completion: Completion, parser: ReasoningParser | None) -> Completion:
    """``completion`` with its thinking and answer apart, as ``parser`` reads its text (unchanged when there is no
    parser). Applied to what the engine returned, so a replay, served the recorded text, splits it again."""
    if parser is None:
        return completion
    split = parser.split(completion.text)
    return replace(completion, content=split.content, reasoning=split.reasoning)


def loglikelihood_record(score: Loglikelihood) -> LoglikelihoodResponse:
    served = {"server": score.server} if score.server is not None else {}
    return LoglikelihoodResponse(greedy=score.greedy, logprob=score.logprob, prompt_tokens=score.prompt_tokens,
                                 token_ids=list(score.token_ids), **served)  # fmt: skip


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


def record_episode(episode: Episode, completion: Completion, generator: dict[str, Any] | Canonical) -> EpisodeResult:
    """The chain of one single-turn episode: header, one model call, end, assembled directly in canonical form
    by :func:`evalrun.records.single_call.single_call_chain` (several times faster than building and encoding the
    typed entries; a property test, tests/test_formats.py, checks the lines against the generic encoder)."""
    seeds = (
        f'{{"sampling":{_string(str(episode.sampling.seed))}}}'
        if type(episode) is Episode
        else canonical_json(episode.seeds_record())
    )
    completion = split_reasoning(completion, episode.reasoning)
    lines, head, prompt_sha256 = single_call_chain(
        episode.episode_id, episode.task, episode.item_id, episode.seed, episode.repeat, seeds,
        encode_generator(generator), episode.prompt, _sampling_text(episode.sampling), completion.text,
        completion.finish_reason, completion.token_ids, completion.logprobs, completion.content, completion.reasoning,
        None if completion.server is None else canonical_json(dict(completion.server)),
    )  # fmt: skip
    return EpisodeResult(episode, completion, lines, head, prompt_sha256)


def _request(episode: Episode) -> GenerationRequest:
    """The policy's generation request of a dataset episode (its first model call)."""
    return GenerationRequest(episode.prompt, episode.sampling, episode.episode_id, 0, episode.add_special_tokens,
                             episode.conversation)  # fmt: skip


GENERATION_SEED = "generation"  # the purpose of the seed of a request's sample after the first


def sampled_request(episode: Episode, call: int) -> GenerationRequest:
    """The policy's request sampled for the ``call``-th time (``Episode.generations``): the first is
    :func:`_request`'s, each later one with the seed derived from the episode's for its call."""
    if call == 0:
        return _request(episode)
    sampling = replace(episode.sampling, seed=derive_seed(str(episode.sampling.seed), GENERATION_SEED, call))
    return replace(_request(episode), sampling=sampling, call=call)


def run_episodes(engine: Engine, episodes: list[Episode], generator: dict[str, Any] | Canonical,
                 judge_engine: Engine | None = None) -> list[EpisodeResult]:  # fmt: skip
    """Run a batch of episodes; results in episode order.

    Each stage is one engine batch over all the batch's episodes: policy generations, policy
    option scores (multiple choice by loglikelihood), then the judges' calls (on ``judge_engine``,
    by default ``engine``), which need the policy's outputs.
    """
    encoded = encode_generator(generator)
    if all(e.single_call for e in episodes):
        live = [e for e in episodes if e.rejection is None]
        requests = [_request(e) for e in live]
        return _record_single_calls(episodes, live, generate_each(engine, requests), encoded)
    return _run_staged_each(engine, episodes, encoded, judge_engine or engine)


def run_batches(engine: Engine, batches: Iterable[list[Episode]], generator: dict[str, Any] | Canonical,
                judge_engine: Engine | None = None) -> Iterator[list[EpisodeResult]]:  # fmt: skip
    """:func:`run_episodes` over each batch, in batch order, with the same results.

    A :class:`QueueingEngine` gets the generations of the next batches submitted before a batch's
    completions are collected (up to its ``queue_depth`` requests), so that it never drains between
    batches; what it computes for a request does not depend on its batch (docs/design.md
    "Determinism layer"). A batch that is not single-call, or whose submission is refused, runs
    through :func:`run_episodes` once every batch before it is collected (the engine idle).
    """
    if not isinstance(engine, QueueingEngine):
        for batch in batches:
            yield run_episodes(engine, batch, generator, judge_engine)
        return
    encoded = encode_generator(generator)
    source = iter(batches)
    queued: deque[tuple[list[Episode], list[Episode], list[str] | None]] = deque()  # batch, live, request ids
    depth = 0  # requests submitted, not collected
    engine.cancel()  # what a stream abandoned without being closed left queued
    try:
        while True:
            while depth < engine.queue_depth and (not queued or queued[-1][2] is not None):
                batch = next(source, None)
                if batch is None:
                    break
                live = [e for e in batch if e.rejection is None]
                ids = None
                if all(e.single_call for e in batch):
                    with contextlib.suppress(RequestRejected):  # found again, request by request, alone
                        ids = engine.submit([_request(e) for e in live])
                queued.append((batch, live, ids))
                depth += len(ids or ())
            if not queued:
                return
            batch, live, ids = queued.popleft()
            if ids is None:
                yield run_episodes(engine, batch, encoded, judge_engine)
                continue
            depth -= len(ids)
            yield _record_single_calls(batch, live, engine.collect(ids), encoded)
    finally:
        engine.cancel()


def _record_single_calls(episodes: list[Episode], live: list[Episode], outcomes: Sequence[Completion | str],
                         generator: Canonical) -> list[EpisodeResult]:  # fmt: skip
    """The chains of single-call episodes from the outcomes of the live ones' calls (in their order)."""
    by_episode = dict(zip((e.episode_id for e in live), outcomes, strict=True))
    results = []
    for e in episodes:
        outcome = by_episode.get(e.episode_id, e.rejection)
        if isinstance(outcome, Completion):
            results.append(record_episode(e, outcome, generator))
        else:
            assert outcome is not None
            results.append(record_failed_call(e, outcome, generator))
    return results


def generate_each(engine: Engine, requests: list[GenerationRequest]) -> list[Completion | str]:
    """Each request's completion, or the reason the engine refused it.

    A refused batch is split in halves until the refused requests stand alone, so the others still
    run (the engine aborts a whole batch when one request is refused; with batch-invariant
    kernels a request's result does not depend on its batch).
    """
    if not requests:
        return []
    try:
        return list(_generate(engine, requests))
    except RequestRejected as exc:
        if len(requests) == 1:
            return [str(exc)]
        half = len(requests) // 2
        return generate_each(engine, requests[:half]) + generate_each(engine, requests[half:])


FAILED = Completion(text="", token_ids=(), logprobs=(), finish_reason=FAILED_FINISH_REASON, prompt_tokens=0)
"""What a failed episode's output row shows: no text, no tokens, finish_reason ``failed``."""


class Identified(Protocol):
    """What every episode's header records of it, whatever its kind."""

    @property
    def task(self) -> str: ...

    @property
    def item_id(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def repeat(self) -> int: ...

    @property
    def sampling(self) -> SamplingSpec: ...


def header_fields(episode: Identified, generator: Generator) -> dict[str, Any]:
    """The fields of an episode's header that every kind records (a kind adds its own: few-shot ids, a world)."""
    return {"generator": generator, "item": episode.item_id, "repeat": episode.repeat, "seed": episode.seed,
            "seeds": EpisodeSeeds(sampling=str(episode.sampling.seed)), "task": episode.task}  # fmt: skip


def failed_call(chain: ChainBuilder, call: int, request: GenerationRequest, reason: str) -> None:
    """Append a model call the engine refused: the request, and the reason instead of a response."""
    chain.append(FailedCallEntry, call=call, request=generation_request(request.prompt, request.sampling),
                 error=reason)  # fmt: skip


def _header_fields(episode: Episode, generator: Generator) -> dict[str, Any]:
    header = header_fields(episode, generator)
    if episode.fewshot_ids:
        header["fewshot"] = list(episode.fewshot_ids)
    if episode.options:
        header["shuffle_order"] = list(episode.shuffle_order)
    return header


def record_failed_call(episode: Episode, reason: str, generator: dict[str, Any] | Canonical) -> EpisodeResult:
    """The chain of a single-turn episode whose call was refused: header, the request with the reason
    instead of a response, end with status error."""
    chain = ChainBuilder(episode.episode_id)
    chain.append(HeaderEntry, **_header_fields(episode, Generator.model_validate_json(encode_generator(generator))))
    failed_call(chain, 0, GenerationRequest(episode.prompt, episode.sampling), reason)
    chain.append(EndEntry, model_calls=1, status="error", error=reason)
    return EpisodeResult(episode, FAILED, tuple(chain.lines), chain.head, episode.prompt_sha256, error=reason)


def _run_staged_each(engine: Engine, episodes: list[Episode], generator: Canonical,
                     judge_engine: Engine) -> list[EpisodeResult]:  # fmt: skip
    """Staged episodes; a refused batch is split in halves, and an episode refused on its own (or
    before: ``Episode.rejection``) is recorded as failed: header, end with status error."""
    failed = {e.episode_id: e.rejection for e in episodes if e.rejection is not None}
    live = [e for e in episodes if e.rejection is None]
    results: dict[str, EpisodeResult] = {}
    pending = [live] if live else []
    while pending:
        batch = pending.pop()
        try:
            results.update((r.episode.episode_id, r) for r in _run_staged(engine, batch, generator, judge_engine))
        except RequestRejected as exc:
            if len(batch) == 1:
                failed[batch[0].episode_id] = str(exc)
            else:
                pending += [batch[len(batch) // 2 :], batch[: len(batch) // 2]]
    typed_generator = Generator.model_validate_json(generator) if failed else None
    out = []
    for e in episodes:
        if e.episode_id in results:
            out.append(results[e.episode_id])
            continue
        assert typed_generator is not None
        reason = failed[e.episode_id]
        chain = ChainBuilder(e.episode_id)
        chain.append(HeaderEntry, **_header_fields(e, typed_generator))
        chain.append(EndEntry, model_calls=0, status="error", error=reason)
        out.append(EpisodeResult(e, FAILED, tuple(chain.lines), chain.head, e.prompt_sha256, error=reason))
    return out


def _generate(engine: Engine, requests: list[GenerationRequest]) -> list[Completion]:
    completions = engine.generate(requests) if requests else []
    if len(completions) != len(requests):
        raise RuntimeError(f"engine returned {len(completions)} completions for {len(requests)} requests")
    return completions


def _score(engine: Engine, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
    scores = engine.loglikelihood(requests) if requests else []
    if len(scores) != len(requests):
        raise RuntimeError(f"engine returned {len(scores)} scores for {len(requests)} requests")
    return scores


_NOT_GENERATED = Completion(text="", token_ids=(), logprobs=(), finish_reason="not_generated", prompt_tokens=0)


_Call = tuple[type[Entry], dict[str, Any]]  # an entry type and its fields but the call number and the request hash


@dataclass
class _Calls:
    """An episode's model calls in call order."""

    entries: list[_Call]
    completion: Completion = _NOT_GENERATED
    option_logprobs: tuple[float, ...] | None = None
    option_greedy: tuple[bool, ...] | None = None
    replies: list[str] = field(default_factory=list)  # every generation's output, in call order


def _run_staged(engine: Engine, episodes: list[Episode], generator: Canonical,
                judge_engine: Engine) -> list[EpisodeResult]:  # fmt: skip
    calls = [_Calls([]) for _ in episodes]
    generating = [(i, call) for i, e in enumerate(episodes) if e.choice_scoring in ("", "letter", "both")
                  for call in range(e.generations)]  # fmt: skip
    requests = [sampled_request(episodes[i], call) for i, call in generating]
    for (i, call), request, generated in zip(generating, requests, _generate(engine, requests), strict=True):
        completion = split_reasoning(generated, episodes[i].reasoning)
        if call == 0:
            calls[i].completion = completion
        calls[i].replies.append(completion.output)
        calls[i].entries.append((ModelEntry, {"request": generation_request(request.prompt, request.sampling),
                                              "response": completion_record(completion)}))  # fmt: skip

    scored: list[tuple[int, int]] = []  # (episode index, option)
    ll_requests: list[LoglikelihoodRequest] = []
    for i, e in enumerate(episodes):
        if e.choice_scoring in ("loglikelihood", "both", "loglikelihood_rolling"):
            for option, label in enumerate(e.options):
                continuation = option_continuation(label, e.option_delimiter)
                context = e.option_contexts[option] if e.option_contexts else e.prompt
                ll_requests.append(LoglikelihoodRequest(context, continuation, e.episode_id,
                                                        len(calls[i].entries) + option, e.add_special_tokens,
                                                        e.choice_scoring == "loglikelihood_rolling"))  # fmt: skip
                scored.append((i, option))
            calls[i].option_logprobs, calls[i].option_greedy = (), ()
    for (i, option), request, score in zip(scored, ll_requests, _score(engine, ll_requests), strict=True):
        request_rec = loglikelihood_request(request.context, request.continuation, request.rolling)
        calls[i].entries.append((LoglikelihoodEntry, {"option": option, "request": request_rec,
                                                      "response": loglikelihood_record(score)}))  # fmt: skip
        calls[i].option_logprobs = (*(calls[i].option_logprobs or ()), score.logprob)
        calls[i].option_greedy = (*(calls[i].option_greedy or ()), score.greedy)

    judgements = _judge(judge_engine, episodes, calls)
    typed_generator = Generator.model_validate_json(generator)  # once per batch
    results = []
    for e, c, judged in zip(episodes, calls, judgements, strict=True):
        results.append(_record_staged(e, c, judged, typed_generator))
    return results


def judge_prompt(episode: Episode, call: JudgeCall, output: str) -> tuple[str, Conversation | None]:
    rubric = episode.judging
    assert rubric is not None
    criterion = rubric.criterion(call.criterion)
    shown = [criterion.labels[i] for i in call.order]
    variables = {**(episode.fields or {}), "prompt": episode.prompt, "output": output, "target": episode.target,
                 "criterion": criterion.id, "question": criterion.question, "choices": shown,
                 "letters": list(LETTERS[: len(shown)])}  # fmt: skip
    return render_prompt(rubric.judge_pack, episode.item_id, variables, episode.judge_chat)


def _judge(engine: Engine, episodes: list[Episode], calls: list[_Calls]) -> list[tuple[Judgement, ...]]:
    """The judges' calls for every episode with a rubric, as two engine batches at most."""
    generate: list[tuple[int, JudgeCall, dict[str, Any], GenerationRequest]] = []
    score: list[tuple[int, JudgeCall, dict[str, Any], LoglikelihoodRequest]] = []
    for i, e in enumerate(episodes):
        if e.judging is None:
            continue
        call_number = len(calls[i].entries)
        for jc in e.judge_calls:
            prompt, conversation = judge_prompt(e, jc, calls[i].completion.output)  # the answer, not the thinking
            fields = {"criterion": jc.criterion, "judge": jc.judge, "shuffle_order": list(jc.order)}
            if e.judging.scoring == "letter":
                request = GenerationRequest(prompt, jc.sampling, e.episode_id, call_number, e.judge_chat is None,
                                            conversation)  # fmt: skip
                generate.append((i, jc, fields, request))
                call_number += 1
                continue
            criterion = e.judging.criterion(jc.criterion)
            for position, original in enumerate(jc.order):
                continuation = option_continuation(criterion.labels[original])
                request = LoglikelihoodRequest(prompt, continuation, e.episode_id, call_number, e.judge_chat is None)
                score.append((i, jc, {**fields, "option": original, "position": position}, request))
                call_number += 1
    # Entries go in call order; both stages' results are put back where their calls were numbered.
    staged: list[dict[int, _Call]] = [{} for _ in episodes]
    texts: dict[tuple[int, str, str], str] = {}
    logprobs: dict[tuple[int, str, str], dict[int, float]] = {}
    completions = _generate(engine, [r for *_, r in generate])
    for (i, jc, fields, request), completion in zip(generate, completions, strict=True):
        request_rec, response_rec = generation_request(request.prompt, request.sampling), completion_record(completion)
        staged[i][request.call] = (JudgeEntry, {**fields, "request": request_rec, "response": response_rec})
        texts[(i, jc.criterion, jc.judge)] = completion.text
    scores = _score(engine, [r for *_, r in score])
    for (i, jc, fields, request), result in zip(score, scores, strict=True):
        request_rec = loglikelihood_request(request.context, request.continuation)
        response = loglikelihood_record(result)
        staged[i][request.call] = (JudgeEntry, {**fields, "request": request_rec, "response": response})
        logprobs.setdefault((i, jc.criterion, jc.judge), {})[fields["option"]] = result.logprob
    judged = []
    for i, e in enumerate(episodes):
        calls[i].entries.extend(staged[i][n] for n in sorted(staged[i]))
        judgements = []
        for jc in e.judge_calls:
            key = (i, jc.criterion, jc.judge)
            by_option = logprobs.get(key)
            judgements.append(Judgement(
                jc.criterion, jc.judge, jc.order, texts.get(key),
                tuple(by_option[k] for k in range(len(jc.order))) if by_option is not None else None,
            ))  # fmt: skip
        judged.append(tuple(judgements))
    return judged


def _record_staged(episode: Episode, calls: _Calls, judgements: tuple[Judgement, ...],
                   generator: Generator) -> EpisodeResult:  # fmt: skip
    """The chain of a staged episode: header, every model call in call order, end."""
    chain = ChainBuilder(episode.episode_id)
    chain.append(HeaderEntry, **_header_fields(episode, generator))
    for call, (entry_type, fields) in enumerate(calls.entries):
        chain.append(entry_type, **fields, call=call)  # the builder fills in request_hash
    chain.append(EndEntry, model_calls=len(calls.entries), status="ok")
    return EpisodeResult(
        episode, calls.completion, tuple(chain.lines), chain.head, episode.prompt_sha256, calls.option_logprobs,
        calls.option_greedy, tuple(calls.replies) if episode.generations > 1 else None, judgements,
    )  # fmt: skip
