"""Hashing primitives against their written definitions (docs/design.md), computed independently here."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from evalrun.records.canonical import (
    SLOT,
    CanonicalJSONError,
    canonical_hash,
    canonical_integer,
    canonical_json,
    canonical_template,
    combine,
)
from evalrun.records.chain import GENESIS, ChainBuilder, chain_head
from evalrun.records.entries import EndEntry, EpisodeSeeds, HeaderEntry
from evalrun.records.formats import Generator
from evalrun.records.heads import Heads, digest_hex, digest_order, digest_sum
from evalrun.records.merkle import EMPTY_ROOT, merkle_root
from evalrun.records.seeds import derive_seed


def test_canonical_json_is_rfc8785() -> None:
    # Key order by UTF-16 code units, no whitespace, ES6 number forms (RFC 8785 section 3.2).
    assert canonical_json({"b": 1, "a": [1.0, 2.5, 1e21, -0.0], "\u00e9": "x"}) == '{"a":[1,2.5,1e+21,0],"b":1,"é":"x"}'
    assert canonical_hash({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()


def test_combine_is_sha256_of_concatenated_hex() -> None:
    parts = ["ab" * 32, "cd" * 32, "ef" * 32]
    assert combine(parts) == hashlib.sha256("".join(parts).encode()).hexdigest()


def test_derive_seed_follows_the_design_formula() -> None:
    expected = int.from_bytes(hashlib.sha256(b'[7,"sampling","addition","add-001",0,2]').digest()[:8], "big")
    assert derive_seed(7, "sampling", "addition", "add-001", 0, 2) == expected
    seeds = {derive_seed(7, p, "x", k) for p in ("sampling", "shuffle") for k in range(50)}
    assert len(seeds) == 100  # purpose and keys both separate the streams


def test_chain_links_each_line_to_the_previous_hash() -> None:
    chain = ChainBuilder("ep")
    generator = Generator(name="evalrun", version="0", git_commit=None)
    first = chain.append(HeaderEntry, generator=generator, task="t", item="i", seed=0, repeat=0,
                         seeds=EpisodeSeeds(sampling="1"))  # fmt: skip
    second = chain.append(EndEntry, model_calls=0, status="ok")
    assert json.loads(first)["prev"] == GENESIS and json.loads(first)["seq"] == 0
    h1 = hashlib.sha256((GENESIS + first).encode()).hexdigest()
    assert json.loads(second)["prev"] == h1
    assert chain.head == hashlib.sha256((h1 + second).encode()).hexdigest() == chain_head([first, second])
    with pytest.raises(ValueError):
        chain.append(EndEntry, model_calls=0, status="ok", nonsense=1)


def _reference_root(leaves: list[bytes]) -> bytes:
    # RFC 6962 section 2.1, written from the text.
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + _reference_root(leaves[:k]) + _reference_root(leaves[k:])).digest()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 13, 16, 31, 33, 64, 100, 257])
def test_merkle_root_is_rfc6962_over_sorted_leaves(n: int) -> None:
    pairs = [(hashlib.sha256(f"episode {i}".encode()).hexdigest(), hashlib.sha256(str(i).encode()).hexdigest())
             for i in range(n)]  # fmt: skip
    expected = _reference_root([f"{e}:{h}".encode() for e, h in sorted(pairs)]).hex()
    shuffled = pairs[:]
    random.Random(n).shuffle(shuffled)
    heads = Heads()
    for start in range(0, n, 7):  # parts arrive in any order, the root is the same
        heads.add(shuffled[start : start + 7])
    assert merkle_root(pairs) == merkle_root(shuffled) == heads.merkle_root() == expected
    assert len(heads) == n and heads == Heads(pairs) and heads != Heads(pairs[1:])
    assert heads.id_sum == sum(int(e, 16) for e, _ in pairs) % 2**256
    changed = [*pairs[:-1], (pairs[-1][0], "0" * 64)]
    assert merkle_root(changed) != expected and Heads(changed).merkle_root() != expected


def test_digest_sum_is_the_sum_of_the_digests_as_integers_mod_2_256() -> None:
    random_digests = [hashlib.sha256(str(i).encode()).digest() for i in range(1000)]
    largest = [b"\xff" * 32] * 70_000  # every column's carries, and a sum past 2**256
    for digests in (random_digests, largest, [bytes(32)], []):
        expected = sum(int.from_bytes(d, "big") for d in digests) % 2**256
        assert digest_sum(b"".join(digests)) == expected


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_digests_sort_and_print_as_their_hex_strings_do(shared_prefix: bool) -> None:
    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(3000)]
    if shared_prefix:  # the first 64-bit word alike: the order falls to the later words
        digests += [digests[7][:8] + hashlib.sha256(f"twin {i}".encode()).digest()[8:] for i in range(5)]
    array = np.frombuffer(b"".join(digests), np.uint8).reshape(-1, 32)
    texts = [d.hex() for d in digests]
    assert [texts[i] for i in digest_order(array)] == sorted(texts)
    assert digest_hex(array).to_pylist() == texts


def test_heads_refuse_a_repeated_episode_and_anything_but_sha256_hex() -> None:
    pairs = [(hashlib.sha256(str(i).encode()).hexdigest(), "ab" * 32) for i in range(5)]
    heads = Heads(pairs)
    heads.add(pairs[3:4])
    with pytest.raises(ValueError, match=f"episode {pairs[3][0]} was written more than once"):
        heads.merkle_root()
    for episode, head in (("AB" * 32, "0" * 64), ("ab" * 31, "0" * 64), ("e1", "0" * 64), ("ab" * 32, "xyz")):
        with pytest.raises(ValueError, match="is not a sha256 hex digest"):
            Heads([(episode, head)])


def test_empty_merkle_root() -> None:
    assert merkle_root([]) == EMPTY_ROOT == hashlib.sha256(b"").hexdigest()


json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
json_scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=3000, deadline=None)
@given(json_values)
def test_canonical_json_matches_the_reference_implementation(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("utf-8")


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_canonical_numbers_match_ecmascript(value: float) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("ascii")


def test_canonical_json_refuses_what_jcs_cannot_represent() -> None:
    for bad in (float("nan"), float("inf"), 2**53, {1: "x"}, object()):
        with pytest.raises(CanonicalJSONError):
            canonical_json(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(json_scalars, max_size=4), st.dictionaries(st.text(), json_scalars, max_size=3),
       st.integers(-(2**53) + 1, 2**53 - 1), st.text())  # fmt: skip
def test_canonical_template_gives_the_canonical_json_of_the_filled_value(
    items: list[object], fields: dict[str, object], number: int, text: str
) -> None:
    value = {**fields, "~a": [*items, SLOT], "~b": {"x": SLOT}}  # slots in key order: ~a's, then ~b's
    pieces = canonical_template(value, 2)
    filled = f"{pieces[0]}{canonical_integer(number)}{pieces[1]}{canonical_json(text)}{pieces[2]}"
    assert filled == canonical_json({**fields, "~a": [*items, number], "~b": {"x": text}})
    with pytest.raises(ValueError, match="expected 3 slots"):
        canonical_template(value, 3)


def test_output_warnings_name_empty_and_cut_off_generations() -> None:
    """A run whose generations are nearly all empty, or all cut at the token limit, says so; a healthy run,
    failed episodes and agent episodes do not count as either."""
    import pyarrow as pa

    from evalrun.records.outputs import output_warnings

    def table(rows: list[tuple[str, str]]) -> pa.Table:
        return pa.table({"output": [r[0] for r in rows], "finish_reason": [r[1] for r in rows]})

    assert output_warnings(table([("86", "stop"), ("", "stop"), ("130", "length")])) == []
    empty = output_warnings(table([("", "stop")] * 9 + [(" 4", "stop"), ("", "failed")]))
    assert len(empty) == 1 and empty[0].startswith("9 of 10 outputs are empty")
    cut = output_warnings(table([("1111", "length"), ("2222", "length")]))
    assert cut == ["all 2 outputs were cut at the token limit (decoding.max_tokens): none ended by itself or at a "
                   "stop string"]  # fmt: skip
    assert output_warnings(table([("", "done"), ("", "max_steps"), ("", "failed")])) == []
    budget = output_warnings(table([("", "max_steps"), ("", "max_tokens"), ("", "max_steps")]))
    assert budget == ["all 3 agent episodes ran out of their budget (max_steps, max_tokens): none ended by itself (its "
                      "transcripts in the report show what the agent did; task.world.max_steps and max_tokens set "
                      "the budget)"]  # fmt: skip
