"""A Ray actor's batch result crosses to the driver pickled (evalrun.pipeline.worker.BatchOutcome): its log part
travels compressed and arrives byte for byte, and a batch of 64 single-call episodes stays under Ray's 100 KiB
limit for returning a result inline (docs/design.md "Data flow")."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from typing import Any

from evalrun.engines import Completion, GenerationRequest, SamplingSpec
from evalrun.episodes import Provenance
from evalrun.episodes.encode import encode_part
from evalrun.episodes.harness import run_episodes
from evalrun.episodes.plan import Episode, episode_id
from evalrun.pipeline.worker import BatchOutcome, pack_batch

RAY_INLINE_RESULT_LIMIT = 100 * 1024  # Ray's max_direct_call_object_size default


class Answers:
    """Completions that depend on the prompt alone."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion(f" {len(r.prompt)}", (len(r.prompt), 2), (-0.5, -0.015625), "stop", 9) for r in requests]

    def loglikelihood(self, requests: list[Any]) -> list[Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": "answers", "version": "1", "settings": {}}


def outcome_episodes(n: int) -> list[Episode]:
    planned = []
    for i in range(n):
        spec = SamplingSpec(0.0, 1.0, 0, 8, ("\n",), 1000 + i, True)
        planned.append(Episode(episode_id("t", f"i-{i}", 0, 0, {"sampling": str(spec.seed)}), "t", f"i-{i}", 0, 0,
                               f"What is {i} + {i}?", str(2 * i), spec))  # fmt: skip
    return planned


def outcome(n: int) -> BatchOutcome:
    generator = {"name": "evalrun", "version": "outcome-test", "git_commit": None}
    results = run_episodes(Answers(), outcome_episodes(n), generator)
    part = encode_part(results, Provenance("ray-0@host:1", '{"cpu":"test"}', n, 0.1))
    return BatchOutcome(part, n, "ray-0@host:1")


def test_a_pickled_outcome_arrives_byte_for_byte() -> None:
    for n in (0, 1, 64):
        sent = outcome(n)
        arrived = pickle.loads(pickle.dumps(sent))
        assert arrived == sent
        assert arrived.part.log == sent.part.log and arrived.part.table == sent.part.table


def test_a_batch_of_64_is_returned_inline_by_ray() -> None:
    sent = outcome(64)
    size = len(pickle.dumps(sent))
    assert size < RAY_INLINE_RESULT_LIMIT
    assert size < (len(sent.part.log) + len(sent.part.table)) / 2  # the log, most of it, travels compressed


def test_a_packed_batch_unpacks_to_the_same_episodes_even_with_a_class_pickle_cannot_name() -> None:
    batch = outcome_episodes(3)
    assert pickle.loads(pack_batch(batch)) == batch

    @dataclass(frozen=True)
    class Local:  # a class plain pickle cannot find by name: Ray's cloudpickle ships it by value
        n: int

    odd = [replace(batch[0], fields={"local": Local(1)})]
    assert pickle.loads(pack_batch(odd)) == odd
