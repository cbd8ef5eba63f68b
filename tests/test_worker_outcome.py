"""A Ray actor's batch result crosses to the driver pickled (evalrun.pipeline.worker.BatchOutcome): its log part
travels compressed and arrives byte for byte, and a batch of 64 single-call episodes stays under Ray's 100 KiB
limit for returning a result inline (docs/design.md "Data flow"). A batch crosses to a worker as bounds in the
run's plan, which gives the driver its episodes' ids without making them."""

from __future__ import annotations

import pickle
from typing import Any

from evalrun.config import load
from evalrun.engines import Completion, GenerationRequest, SamplingSpec
from evalrun.episodes import PlanSlice, Provenance, planned_digests
from evalrun.episodes.encode import encode_part
from evalrun.episodes.harness import run_episodes
from evalrun.episodes.plan import Episode, Plan, episode_id
from evalrun.pipeline import runner
from evalrun.pipeline.runner import prepare
from evalrun.pipeline.worker import BatchOutcome

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


def test_a_plan_gives_its_episodes_ids_without_making_them_and_its_slices_make_its_episodes() -> None:
    plan = prepare(load(["cluster=inline", "seeds.set=[0,1,2]", "seeds.repeats=2", "limit=7"])).episodes
    assert isinstance(plan, Plan) and len(plan) == 42
    for start, stop in ((0, 42), (5, 19), (13, 14), (40, 42), (20, 20)):
        assert plan.episode_digests(start, stop) == b"".join(bytes.fromhex(e.episode_id) for e in plan[start:stop])
        batch = PlanSlice(plan, start, stop)
        assert len(batch) == stop - start and list(batch) == plan[start:stop]
    assert PlanSlice(plan, 5, 19)[-1] == plan[18] and PlanSlice(plan, 5, 19)[2:4] == plan[7:9]
    # a list of episodes (a world's plan) gives its ids through its episodes
    assert planned_digests(list(plan), 3, 9) == plan.episode_digests(3, 9)


def test_a_resumed_run_s_batches_are_the_runs_of_episodes_it_does_not_keep() -> None:
    plan = prepare(load(["cluster=inline", "seeds.set=[0,1]", "limit=10"])).episodes
    kept = frozenset(e.episode_id for e in plan[4:8]) | {plan[15].episode_id}
    plan_pass = runner._PlanPass(kept)
    batches = [(batch.start, batch.stop) for batch in plan_pass.slices(plan, 8)]
    assert batches == [(0, 4), (8, 15), (16, 20)]
    assert plan_pass.kept_seen == 5
    assert plan_pass.id_sum == sum(int(e.episode_id, 16) for e in plan) % (1 << 256)
