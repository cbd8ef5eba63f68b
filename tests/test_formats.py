"""Every record format against its one typed definition (evalrun.records): the fast chain encoder
byte for byte against the generic encoder and the ``rfc8785`` reference, every entry kind through
the writer and the reader, and yesterday's records (tests/golden) parsed and re-encoded unchanged."""

from __future__ import annotations

import json
import string
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from evalrun.engines import Completion, SamplingSpec
from evalrun.episodes.harness import encode_generator, record_episode
from evalrun.episodes.plan import Episode, episode_id
from evalrun.records.canonical import MAX_SAFE_INTEGER, canonical_json, sha256_hex
from evalrun.records.chain import GENESIS, ChainBuilder
from evalrun.records.entries import (
    ENTRY_KINDS,
    ENTRY_TYPES,
    ClockEntry,
    ClockReading,
    ClockRequest,
    CompletionResponse,
    EndEntry,
    EntryError,
    EnvEntry,
    EnvRequest,
    EnvValue,
    EpisodeSeeds,
    FailedCallEntry,
    HeaderEntry,
    JoinEntry,
    JudgeEntry,
    LoglikelihoodEntry,
    LoglikelihoodResponse,
    ModelEntry,
    ObservationEntry,
    RandomDraw,
    RandomEntry,
    RandomRequest,
    ToolEntry,
    ToolRequest,
    UserEntry,
    UuidEntry,
    UuidRequest,
    UuidValue,
    entry_line,
    generation_request,
    loglikelihood_request,
    parse_line,
    request_hash,
)
from evalrun.records.formats import (
    SUMMARY_FORMATS,
    Generator,
    Manifest,
    OptionalFields,
    Proof,
    Record,
    RecordModel,
    Statement,
    Summary,
)
from evalrun.records.outputs import ADDED_COLUMNS, CHAIN_COLUMNS, OUTPUT_SCHEMA, PROVENANCE_COLUMNS, SCORES_SCHEMA
from evalrun.rundir.reader import iter_chains
from evalrun.stats.summary import summarize

GOLDEN = Path(__file__).resolve().parent / "golden"

# --- strategies: awkward floats and Unicode ----------------------------------------------------

AWKWARD_FLOATS = [
    0.0, -0.0, 5e-324, -5e-324, 2.225073858507201e-308, 2.2250738585072014e-308, 1.7976931348623157e308,
    1e21, 1e-21, 9.999999999999999e20, 1e20, 1e16, 1e-6, 1e-7, 1.5e-5, 123456789.0, 0.1, -2.4676019165781327e-05,
    1e300, -1e-300, 4.35e-8, 2.0**53, 2.0**60,
]  # fmt: skip
floats = st.sampled_from(AWKWARD_FLOATS) | st.floats(allow_nan=False, allow_infinity=False)
AWKWARD_TEXTS = ["", "\u2028", "\u2029", "\x00", "\x1f", "\x7f", '"', "\\", "/", "😀", "\U0010ffff", "\ud7ff\ue000",
                 "naïve \u2028 \x00 \x1f \\ \" / 😀", "a\nb\tc\r\x08\x0c", "\ufeff", "é"]  # fmt: skip
texts = st.sampled_from(AWKWARD_TEXTS) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
safe_ints = st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
small_ints = st.integers(0, 2**31 - 1)
hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)
seeds64 = st.integers(0, 2**64 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | safe_ints | floats | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
generators = st.builds(Generator, name=texts, version=texts, git_commit=st.none() | texts)


@st.composite
def samplings(draw: st.DrawFn) -> SamplingSpec:
    return SamplingSpec(
        temperature=draw(floats), top_p=draw(floats), top_k=draw(st.integers(-1, 2**31)),
        max_tokens=draw(small_ints), stop=tuple(draw(st.lists(texts, max_size=3))), seed=draw(seeds64),
        logprobs=draw(st.booleans()),
    )  # fmt: skip


@st.composite
def episodes(draw: st.DrawFn) -> tuple[Episode, Completion]:
    task, item, seed, repeat = draw(texts), draw(texts), draw(safe_ints), draw(safe_ints)
    sampling = draw(samplings())
    eid = episode_id(task, item, seed, repeat, {"sampling": str(sampling.seed)})
    episode = Episode(eid, task, item, seed, repeat, draw(texts), draw(texts), sampling)
    n = draw(st.integers(0, 6))
    completion = Completion(
        text=draw(texts), token_ids=tuple(draw(st.lists(safe_ints, min_size=n, max_size=n))),
        logprobs=tuple(draw(st.lists(st.none() | floats, min_size=n, max_size=n))), finish_reason=draw(texts),
        prompt_tokens=draw(small_ints),
    )  # fmt: skip
    if draw(st.booleans()):  # a reply a reasoning parser split: its answer, and its thinking when it had any
        completion = replace(completion, content=draw(texts), reasoning=draw(st.none() | texts))
    if draw(st.booleans()):  # a served model's: what the server said of itself
        completion = replace(completion, server={"model": draw(texts), "system_fingerprint": draw(texts)})
    return episode, completion


# --- the fast encoder against the one definition -----------------------------------------------


def generic_lines(episode: Episode, completion: Completion, generator: Generator) -> tuple[list[str], str]:
    """The generic path: typed entries through ChainBuilder (canonical JSON of each entry's record)."""
    chain = ChainBuilder(episode.episode_id)
    chain.append(HeaderEntry, generator=generator, task=episode.task, item=episode.item_id, seed=episode.seed,
                 repeat=episode.repeat, seeds=EpisodeSeeds(**episode.seeds_record()))  # fmt: skip
    request = generation_request(episode.prompt, episode.sampling)
    split = {k: v for k, v in (("content", completion.content), ("reasoning", completion.reasoning),
                               ("server", completion.server)) if v is not None}  # fmt: skip
    response = CompletionResponse(finish_reason=completion.finish_reason, logprobs=list(completion.logprobs),
                                  text=completion.text, token_ids=list(completion.token_ids), **split)  # fmt: skip
    chain.append(ModelEntry, call=0, request=request, request_hash=request_hash(request), response=response)
    chain.append(EndEntry, model_calls=1, status="ok")
    return chain.lines, chain.head


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes(), generators)
def test_fast_chain_encoder_equals_the_generic_and_the_reference_encoding(
    case: tuple[Episode, Completion], generator: Generator
) -> None:
    episode, completion = case
    fast = record_episode(episode, completion, generator.as_record())
    lines, head = generic_lines(episode, completion, generator)
    assert list(fast.log_lines) == lines and fast.head == head
    assert record_episode(episode, completion, encode_generator(generator.as_record())).log_lines == fast.log_lines
    for line, expected_type in zip(lines, (HeaderEntry, ModelEntry, EndEntry), strict=True):
        entry = parse_line(line)  # the reader's parse: the typed entry back
        assert type(entry) is expected_type
        assert rfc8785.dumps(entry.as_record()).decode("utf-8") == line == entry_line(entry)


# --- every entry kind: writer, reader, reference -----------------------------------------------


def _request_fields(request: Any) -> dict[str, Any]:
    return {"request": request, "request_hash": request_hash(request)}


@st.composite
def entry_bodies(draw: st.DrawFn, tag: str) -> tuple[type, dict[str, Any]]:
    """An entry of the typed form ``tag``, all but its link fields."""
    call = draw(small_ints)
    completion = st.builds(CompletionResponse, finish_reason=texts, logprobs=st.lists(st.none() | floats, max_size=4),
                           text=texts, token_ids=st.lists(safe_ints, max_size=4))  # fmt: skip
    scored = st.builds(LoglikelihoodResponse, greedy=st.booleans(), logprob=floats, prompt_tokens=small_ints,
                       token_ids=st.lists(safe_ints, max_size=4))  # fmt: skip
    if tag == "header":
        fields = {"generator": draw(generators), "task": draw(texts), "item": draw(texts), "seed": draw(safe_ints),
                  "repeat": draw(safe_ints), "seeds": EpisodeSeeds(sampling=str(draw(seeds64)))}  # fmt: skip
        if draw(st.booleans()):
            fields["fewshot"] = draw(st.lists(texts, max_size=3))
        if draw(st.booleans()):
            fields["shuffle_order"] = draw(st.lists(small_ints, max_size=4))
        return HeaderEntry, fields
    if tag == "model":
        request = generation_request(draw(texts), draw(samplings()))
        return ModelEntry, {"call": call, **_request_fields(request), "response": draw(completion)}
    if tag == "loglikelihood":
        request = loglikelihood_request(draw(texts), draw(texts))
        return LoglikelihoodEntry, {"call": call, "option": draw(small_ints), **_request_fields(request),
                                    "response": draw(scored)}  # fmt: skip
    if tag == "judge":
        fields = {"call": call, "criterion": draw(texts), "judge": draw(texts),
                  "shuffle_order": draw(st.lists(small_ints, max_size=4))}  # fmt: skip
        if draw(st.booleans()):
            request = loglikelihood_request(draw(texts), draw(texts))
            return JudgeEntry, {**fields, "option": draw(small_ints), "position": draw(small_ints),
                                **_request_fields(request), "response": draw(scored)}  # fmt: skip
        request = generation_request(draw(texts), draw(samplings()))
        return JudgeEntry, {**fields, **_request_fields(request), "response": draw(completion)}
    if tag == "user":
        request = generation_request(draw(texts), draw(samplings()))
        return UserEntry, {"call": call, "tool": draw(small_ints), **_request_fields(request),
                           "response": draw(completion)}  # fmt: skip
    if tag == "failed":
        if draw(st.booleans()):
            request = loglikelihood_request(draw(texts), draw(texts))
        else:
            request = generation_request(draw(texts), draw(samplings()))
        user = {"role": "user", "tool": draw(small_ints)} if draw(st.booleans()) else {}  # a simulated user's refusal
        return FailedCallEntry, {"call": call, **_request_fields(request), "error": draw(texts), **user}
    if tag == "tool":
        arguments = draw(st.dictionaries(texts, json_values, max_size=4))
        return ToolEntry, {"call": call, **_request_fields(ToolRequest(name=draw(texts), arguments=arguments))}
    if tag == "observation":
        return ObservationEntry, {"call": call, "status": draw(st.sampled_from(["ok", "error"])),
                                  "content": draw(json_values)}  # fmt: skip
    if tag == "clock":
        request = ClockRequest(clock=draw(st.sampled_from(["wall", "monotonic"])))
        return ClockEntry, {"call": call, **_request_fields(request), "response": ClockReading(seconds=draw(floats))}
    if tag == "random":
        request = RandomRequest(purpose=draw(texts), bits=draw(st.integers(1, 64)))
        return RandomEntry, {"call": call, **_request_fields(request),
                             "response": RandomDraw(value=str(draw(seeds64)))}  # fmt: skip
    if tag == "uuid":
        value = UuidValue(uuid=str(draw(st.uuids())))
        return UuidEntry, {"call": call, **_request_fields(UuidRequest(version=4)), "response": value}
    if tag == "env":
        value = EnvValue(value=draw(st.none() | texts))
        return EnvEntry, {"call": call, **_request_fields(EnvRequest(name=draw(texts))), "response": value}
    if tag == "join":
        return JoinEntry, {"calls": draw(st.lists(small_ints, min_size=1, max_size=4))}
    assert tag == "end"
    fields = {"model_calls": draw(small_ints), "status": draw(texts)}
    if draw(st.booleans()):
        fields["error"] = draw(texts)
    return EndEntry, fields


any_body = st.sampled_from(sorted(ENTRY_TYPES)).flatmap(entry_bodies)


def test_every_kind_is_defined() -> None:
    assert set(ENTRY_TYPES) == {"header", "model", "loglikelihood", "judge", "user", "failed", "tool", "observation",
                                "clock", "random", "uuid", "env", "join", "end"}  # fmt: skip
    # all four are written as "model"
    assert set(ENTRY_TYPES) - {"loglikelihood", "judge", "user", "failed"} == ENTRY_KINDS


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_body, texts, small_ints, hex64)
def test_every_entry_kind_encodes_canonically_and_parses_back(body: tuple[type, dict[str, Any]], episode: str,
                                                              seq: int, prev: str) -> None:  # fmt: skip
    entry_type, fields = body
    entry = entry_type(**fields, episode=episode, seq=seq, prev=prev)
    line = entry_line(entry)
    assert line == rfc8785.dumps(entry.as_record()).decode("utf-8")
    parsed = parse_line(line)
    assert type(parsed) is entry_type and parsed == entry and entry_line(parsed) == line
    written = json.loads(line)
    for name in entry_type.absent_when_none:  # optional fields are absent, never null
        assert written.get(name, "absent") is not None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_reader_reads_back_chains_of_every_kind(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    chains, expected = [], []
    for _ in range(data.draw(st.integers(1, 3))):
        chain = ChainBuilder(sha256_hex(data.draw(texts)))
        typed = [data.draw(entry_bodies("header"))]
        middle = data.draw(st.lists(any_body.filter(lambda b: b[0] not in (HeaderEntry, EndEntry)), max_size=6))
        typed += [*middle, data.draw(entry_bodies("end"))]
        for entry_type, fields in typed:
            if data.draw(st.booleans()):  # the builder fills request_hash in, the request encoded once
                fields = {k: v for k, v in fields.items() if k != "request_hash"}
            chain.append(entry_type, **fields)
        chains.append(chain)
        expected.append([t for t, _ in typed])
    path = tmp_path_factory.mktemp("log") / "part-00000.jsonl"
    path.write_text("".join(line + "\n" for c in chains for line in c.lines), encoding="utf-8")
    read = list(iter_chains(path, "log/part-00000.jsonl"))
    assert [c.episode for c in read] == [c.episode for c in chains]
    for got, chain, types in zip(read, chains, expected, strict=True):
        assert got.lines == chain.lines and got.head == chain.head
        assert [type(e) for e in got.entries] == types
        assert [entry_line(e) for e in got.entries] == chain.lines  # the generic encoder, the request encoded again


def test_a_record_with_optional_fields_must_say_so() -> None:
    with pytest.raises(TypeError, match="OptionalFields"):

        class Careless(RecordModel):
            note: str | None = None

    class Careful(OptionalFields):
        note: str | None = None

    assert Careful().as_record() == {} and Careful(note="x").as_record() == {"note": "x"}


def test_absent_fields_stay_absent_and_nulls_are_refused() -> None:
    generator = Generator(name="evalrun", version="0.1.0", git_commit=None)
    header = HeaderEntry(episode="e", seq=0, prev=GENESIS, generator=generator, task="t", item="i", seed=0, repeat=0,
                         seeds=EpisodeSeeds(sampling="1"))  # fmt: skip
    line = entry_line(header)
    assert '"fewshot"' not in line and '"shuffle_order"' not in line
    assert '"git_commit":null' in line  # a required field that may be null is written as null
    with pytest.raises(EntryError, match="fewshot"):
        parse_line(line.replace('"format"', '"fewshot":null,"format"'))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (('"seq":1', '"seq":"1"'), "seq"),
        (('"greedy":false', '"greedy":0'), "greedy"),
        (('"logprob":-1.5', '"logprob":NaN'), "logprob"),
        (('"option":0', '"option":0,"extra":1'), "extra"),
        (('"op":"loglikelihood"', '"op":"generate"'), "op"),
        (('"kind":"model"', '"kind":"nonsense"'), "(top level)"),
        (('"call":0', '"call":-1'), "call"),
    ],
)
def test_the_reader_is_strict(change: tuple[str, str], field: str) -> None:
    request = loglikelihood_request("Q", " A")
    response = LoglikelihoodResponse(greedy=False, logprob=-1.5, prompt_tokens=3, token_ids=[1])
    line = entry_line(LoglikelihoodEntry(episode="e", seq=1, prev=GENESIS, call=0, option=0, request=request,
                                         request_hash=request_hash(request), response=response))  # fmt: skip
    assert type(parse_line(line)) is LoglikelihoodEntry
    old, new = change
    assert old in line
    with pytest.raises(EntryError) as info:
        parse_line(line.replace(old, new, 1))
    assert field in info.value.field


def test_a_judge_entry_records_one_call_type() -> None:
    request = loglikelihood_request("Q", " yes")
    response = LoglikelihoodResponse(greedy=True, logprob=-0.5, prompt_tokens=3, token_ids=[1])
    fields = {"episode": "e", "seq": 1, "prev": GENESIS, "call": 0, "criterion": "c", "judge": "j",
              "shuffle_order": [1, 0], "request": request, "request_hash": request_hash(request)}  # fmt: skip
    JudgeEntry(**fields, option=1, position=0, response=response)
    with pytest.raises(ValidationError, match="option and position"):
        JudgeEntry(**fields, response=response)
    with pytest.raises(ValidationError, match="different call types"):
        JudgeEntry(**fields, option=1, position=0, response=CompletionResponse(finish_reason="stop", logprobs=[],
                                                                              text="A", token_ids=[]))  # fmt: skip


# --- yesterday's records -----------------------------------------------------------------------


@pytest.mark.parametrize("run", sorted(p.name for p in GOLDEN.iterdir()))
def test_golden_records_parse_and_encode_to_the_same_bytes(run: str) -> None:
    path = GOLDEN / run
    for log in sorted((path / "log").glob("*.jsonl")):
        for line in log.read_text(encoding="utf-8").splitlines():
            assert entry_line(parse_line(line)) == line
    for name, model in (("record.json", Record), ("manifest.json", Manifest), ("summary.json", Summary),
                        ("attestation.intoto.json", Statement)):  # fmt: skip
        text = (path / name).read_text(encoding="utf-8")
        assert canonical_json(model.model_validate_json(text).as_record()) + "\n" == text, name


@pytest.mark.parametrize("summary_format", SUMMARY_FORMATS)
def test_summaries_of_every_format_are_summary_records(summary_format: str) -> None:
    rows = [{"episode_id": f"e{i}", "task": "t", "item_id": f"i{i % 3}", "seed": 0, "repeat": i // 3,
             "metric": "exact_match", "value": float(i % 2), "extracted": None, "scorer": "exact_match",
             "scorer_version": "1"} for i in range(6)]  # fmt: skip
    summary = summarize(pa.Table.from_pylist(rows, schema=SCORES_SCHEMA), summary_format)
    record = Summary.model_validate(summary)
    assert record.format == summary_format and canonical_json(record.as_record()) == canonical_json(summary)


def test_proof_round_trip() -> None:
    proof = Proof(episode_id="e", head="a" * 64, leaf_index=0, tree_size=1, path=[], root="b" * 64, lines=["{}"])
    record = proof.as_record()
    assert record["format"] == "evalrun.proof/1" and Proof.model_validate_json(canonical_json(record)) == proof
    with pytest.raises(ValidationError, match="head"):
        Proof.model_validate({**record, "head": "A" * 64})


# --- rows: the storage schemas stay what they were ---------------------------------------------


def test_output_and_score_schemas_derive_from_the_row_models_unchanged() -> None:
    judgement = pa.struct([("criterion", pa.string()), ("judge", pa.string()), ("shuffle_order", pa.list_(pa.int32())),
                           ("output", pa.string()), ("option_logprobs", pa.list_(pa.float64()))])  # fmt: skip
    assert OUTPUT_SCHEMA.equals(pa.schema([
        ("episode_id", pa.string()), ("task", pa.string()), ("item_id", pa.string()), ("seed", pa.int64()),
        ("repeat", pa.int32()), ("seeds", pa.struct([("sampling", pa.uint64())])), ("prompt", pa.string()),
        ("prompt_sha256", pa.string()), ("target", pa.string()), ("output", pa.string()),
        ("token_ids", pa.list_(pa.int32())), ("token_logprobs", pa.list_(pa.float64())),
        ("finish_reason", pa.string()), ("prompt_tokens", pa.int32()), ("output_tokens", pa.int32()),
        ("head", pa.string()), ("fewshot_ids", pa.list_(pa.string())), ("shuffle_order", pa.list_(pa.int32())),
        ("option_logprobs", pa.list_(pa.float64())),
        ("option_greedy", pa.list_(pa.bool_())), ("replies", pa.list_(pa.string())),  # added: older parts lack them
        ("judgements", pa.list_(judgement)), ("final_state", pa.string()), ("worker", pa.string()),
        ("hardware", pa.string()), ("batch_size", pa.int32()), ("latency_s", pa.float64()),
    ]), check_metadata=True)  # fmt: skip
    assert SCORES_SCHEMA.equals(pa.schema([
        ("episode_id", pa.string()), ("task", pa.string()), ("item_id", pa.string()), ("seed", pa.int64()),
        ("repeat", pa.int32()), ("metric", pa.string()), ("value", pa.float64()), ("extracted", pa.string()),
        ("scorer", pa.string()), ("scorer_version", pa.string()), ("error", pa.string()),
    ]), check_metadata=True)  # fmt: skip
    not_chained = {"target", "prompt_tokens", "final_state", *ADDED_COLUMNS, *PROVENANCE_COLUMNS}
    assert set(CHAIN_COLUMNS) == set(OUTPUT_SCHEMA.names) - not_chained
    assert ADDED_COLUMNS == ("option_greedy", "replies")  # checked against the chain where a part has them
    assert PROVENANCE_COLUMNS == ("worker", "hardware", "batch_size", "latency_s")


def test_hex_fields_are_lowercase_sha256() -> None:
    for bad in ("A" * 64, "a" * 63, "a" * 64 + "\n", string.hexdigits[:64]):
        with pytest.raises(ValidationError):
            Record(episodes={"planned": 0, "written": 0}, parts=0, merkle_root=bad, digest="a" * 64,
                   manifest_sha256="a" * 64, files={})  # fmt: skip
