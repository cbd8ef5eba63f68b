"""A Ray actor's batch result crosses to the driver pickled (evalrun.pipeline.worker.BatchOutcome): its log part
travels compressed and arrives byte for byte, and a batch of 64 single-call episodes stays under Ray's 100 KiB
limit for returning a result inline (docs/design.md "Data flow")."""

from __future__ import annotations

import pickle

from evalrun.pipeline.encode import Provenance, encode_part
from evalrun.pipeline.harness import run_episodes
from evalrun.pipeline.worker import BatchOutcome
from tests.test_harness_stream import GENERATOR, Queueing, episodes

RAY_INLINE_RESULT_LIMIT = 100 * 1024  # Ray's max_direct_call_object_size default


def outcome(n: int) -> BatchOutcome:
    results = run_episodes(Queueing(), episodes([f"What is {i} + {i}?" for i in range(n)]), GENERATOR)
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
