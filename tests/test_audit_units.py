"""Audit building blocks without an engine: the fast chain encoder, inclusion proofs."""

from __future__ import annotations

import random

import pytest

from evalrun.audit.proofs import check_proof
from evalrun.engines import Completion, SamplingSpec
from evalrun.episodes.harness import record_episode
from evalrun.episodes.plan import Episode, episode_id
from evalrun.errors import CheckFailed
from evalrun.records.canonical import Canonical, canonical_json, sha256_hex
from evalrun.records.chain import ChainBuilder
from evalrun.records.entries import (
    CompletionResponse,
    EndEntry,
    EpisodeSeeds,
    HeaderEntry,
    ModelEntry,
    generation_request,
    request_hash,
)
from evalrun.records.formats import Generator, Proof
from evalrun.records.merkle import audit_path, leaf, leaf_hash, merkle_root, root_from_path

GENERATOR = {"name": "evalrun", "version": "0.1.0", "git_commit": "b71fef766ef34b5bab2f1f70cff2107470327a8b"}
TEXTS = ["", " 86", 'naïve \u2028 \x00 \x1f \\ " / 😀', "a\nb\tc\r", "\ud7ff\ue000 Z ü"]


def generic_record(episode: Episode, completion: Completion, generator: dict) -> tuple[tuple[str, ...], str]:
    """The chain built the slow, obviously right way: typed entries through the generic encoder."""
    chain = ChainBuilder(episode.episode_id)
    chain.append(HeaderEntry, generator=Generator(**generator), task=episode.task, item=episode.item_id,
                 seed=episode.seed, repeat=episode.repeat, seeds=EpisodeSeeds(**episode.seeds_record()))  # fmt: skip
    request = generation_request(episode.prompt, episode.sampling)
    response = CompletionResponse(text=completion.text, token_ids=list(completion.token_ids),
                                  logprobs=list(completion.logprobs),
                                  finish_reason=completion.finish_reason)  # fmt: skip
    chain.append(ModelEntry, call=0, request=request, request_hash=request_hash(request), response=response)
    chain.append(EndEntry, status="ok", model_calls=1)
    return tuple(chain.lines), chain.head


def random_case(rng: random.Random) -> tuple[Episode, Completion]:
    sampling = SamplingSpec(
        temperature=rng.choice([0.0, 0.7, 1.0, 2.0]), top_p=rng.choice([1.0, 0.95]), top_k=rng.choice([0, 40]),
        max_tokens=rng.randrange(1, 64), stop=tuple(rng.sample(["\n", "</s>", "Q:"], rng.randrange(0, 3))),
        seed=rng.getrandbits(64), logprobs=rng.random() < 0.8,
    )  # fmt: skip
    task, item = rng.choice(["addition", "t\u00e9st"]), rng.choice(TEXTS) + str(rng.randrange(1000))
    seed, repeat = rng.randrange(10), rng.randrange(3)
    eid = episode_id(task, item, seed, repeat, {"sampling": str(sampling.seed)})
    episode = Episode(eid, task, item, seed, repeat, rng.choice(TEXTS) + "Q: 1+2\nA:", "3", sampling)
    n = rng.randrange(0, 6)
    logprobs = tuple(rng.choice([None, 0.0, -0.0, -1.0, -rng.random() * 10 ** -rng.randrange(0, 12)]) for _ in range(n))
    completion = Completion(rng.choice(TEXTS), tuple(rng.randrange(50000) for _ in range(n)), logprobs,
                            rng.choice(["stop", "length"]), rng.randrange(100))  # fmt: skip
    return episode, completion


def test_fast_record_episode_is_byte_identical_to_the_generic_encoding() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        episode, completion = random_case(rng)
        result = record_episode(episode, completion, GENERATOR)
        assert (result.log_lines, result.head) == generic_record(episode, completion, GENERATOR)
        assert record_episode(episode, completion, Canonical(canonical_json(GENERATOR))).head == result.head


@pytest.mark.parametrize("size", [*range(1, 18), 31, 32, 33, 100])
def test_every_audit_path_leads_to_the_merkle_root(size: int) -> None:
    pairs = sorted((sha256_hex(f"e{i}"), sha256_hex(f"h{i}")) for i in range(size))
    root = merkle_root(pairs)
    hashes = [leaf_hash(e, h) for e, h in pairs]
    for index, (eid, head) in enumerate(pairs):
        path = audit_path(index, hashes)
        assert root_from_path(leaf(eid, head), index, size, path).hex() == root
        proof = Proof(episode_id=eid, head=head, leaf_index=index, tree_size=size, path=[p.hex() for p in path],
                      root=root)  # fmt: skip
        check_proof(proof, root)
        if size > 1:  # the same path does not prove another leaf, another position or another root
            assert root_from_path(leaf(eid, pairs[index - 1][1]), index, size, path).hex() != root
            assert root_from_path(leaf(eid, head), (index + 1) % size, size, path) != bytes.fromhex(root)
            with pytest.raises(CheckFailed):
                check_proof(proof, sha256_hex(root))
