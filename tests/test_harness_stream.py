"""The inline stream (docs/design.md "Data flow"): ``harness.run_batches`` on a queueing engine gives the
results of ``run_episodes`` batch by batch, in order, with requests submitted ahead, a refused submission
found again alone after the batches before it, and nothing left queued when the stream stops."""

from __future__ import annotations

from typing import Any

from evalrun.engines import Completion, GenerationRequest, QueueingEngine, RequestRejected, SamplingSpec
from evalrun.episodes.harness import run_batches, run_episodes
from evalrun.episodes.plan import Episode, episode_id

GENERATOR = {"name": "evalrun", "version": "stream-test", "git_commit": None}


class Queueing:
    """Answers depend on the prompt alone; a prompt starting with "long" is refused, as vLLM refuses one."""

    queue_depth = 6

    def __init__(self) -> None:
        self.queued: dict[str, GenerationRequest] = {}
        self.most_queued = 0
        self.calls: list[str] = []
        self._next = 0

    def _answer(self, request: GenerationRequest) -> Completion:
        return Completion(text=f" {len(request.prompt)}", token_ids=(len(request.prompt),), logprobs=(-0.5,),
                          finish_reason="stop", prompt_tokens=len(request.prompt))  # fmt: skip

    def _check(self, requests: list[GenerationRequest]) -> None:
        if any(r.prompt.startswith("long") for r in requests):
            raise RequestRejected("ValueError: the prompt is longer than the maximum model length")

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        assert not self.queued, "generate while requests are queued"
        self.calls.append(f"generate {len(requests)}")
        self._check(requests)
        return [self._answer(r) for r in requests]

    def submit(self, requests: list[GenerationRequest]) -> list[str]:
        self._check(requests)
        ids = [str(self._next + i) for i in range(len(requests))]
        self._next += len(requests)
        self.queued.update(zip(ids, requests, strict=True))
        self.most_queued = max(self.most_queued, len(self.queued))
        self.calls.append(f"submit {len(requests)}")
        return ids

    def collect(self, ids: list[str]) -> list[Completion]:
        self.calls.append(f"collect {len(ids)}")
        return [self._answer(self.queued.pop(i)) for i in ids]

    def cancel(self) -> None:
        self.queued.clear()

    def loglikelihood(self, requests: list[Any]) -> list[Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": "queueing", "version": "1", "settings": {}}


def episodes(prompts: list[str]) -> list[Episode]:
    out = []
    for i, prompt in enumerate(prompts):
        spec = SamplingSpec(0.0, 1.0, 0, 8, (), 1000 + i, True)
        out.append(Episode(episode_id("t", f"i-{i}", 0, 0, {"sampling": str(spec.seed)}), "t", f"i-{i}", 0, 0, prompt,
                           "", spec))  # fmt: skip
    return out


def test_a_queueing_engine_gets_batches_ahead_and_the_results_are_run_episodes_batch_by_batch() -> None:
    engine = Queueing()
    assert isinstance(engine, QueueingEngine)
    plan = episodes([f"{i}+1=" for i in range(10)] + ["long " * 9] + [f"{i}+2=" for i in range(7)])
    batches = [plan[i : i + 3] for i in range(0, len(plan), 3)]  # the refused prompt is in the fourth batch
    streamed = [[r.head for r in results] for results in run_batches(engine, batches, GENERATOR)]
    expected = [[r.head for r in run_episodes(Queueing(), b, GENERATOR)] for b in batches]
    assert streamed == expected
    errors = [r.error for results in run_batches(Queueing(), batches, GENERATOR) for r in results]
    assert [e is not None for e in errors] == [p.prompt.startswith("long") for p in plan]
    # ahead: two batches submitted before the first is collected; the refused batch runs alone (split in
    # halves) once the three before it are collected, then submitting resumes
    assert engine.calls[:3] == ["submit 3", "submit 3", "collect 3"]
    refused_at = engine.calls.index("generate 3")
    after = [c for c in engine.calls[refused_at:] if not c.startswith("generate")]
    assert engine.calls[refused_at - 1] == "collect 3" and after[0].startswith("submit")
    assert engine.most_queued <= engine.queue_depth + 2 and not engine.queued


def test_a_stream_stopped_midway_leaves_nothing_queued() -> None:
    engine = Queueing()
    stream = run_batches(engine, [episodes(["1+1=", "2+2="])] * 5, GENERATOR)
    next(stream)
    assert engine.queued
    stream.close()
    assert not engine.queued
