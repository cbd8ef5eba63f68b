"""verify's fast and precise paths on synthetic run directories, no engine.

The runs are written by the real code (harness, encoder, part writer, typed record and
attestation) from hand-made episodes and completions; staged episodes (multiple choice, judges)
go through the real harness with a stub engine. Both paths must accept every intact part alike,
and every tamper must fail naming the file and the line or episode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalrun.audit.claims import implied_identity
from evalrun.audit.verify import verify_run
from evalrun.config.paths import BUILTIN_TASKS
from evalrun.engines import (
    Completion,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    SamplingSpec,
)
from evalrun.episodes import encode, kind_named
from evalrun.episodes.checked import _verify_part_fast, _verify_part_precise, verify_part
from evalrun.episodes.harness import EpisodeResult, encode_generator, record_episode, run_episodes
from evalrun.episodes.plan import Episode, JudgeCall, episode_id
from evalrun.errors import CheckFailed
from evalrun.pipeline.manifest import seed_set_hash
from evalrun.records import heads
from evalrun.records.canonical import MAX_SAFE_INTEGER, combine
from evalrun.records.entries import EndEntry, HeaderEntry, JudgeEntry, LoglikelihoodEntry, ModelEntry, parse_line
from evalrun.records.formats import DigestRecord, EpisodeCounts, Manifest, Record
from evalrun.records.outputs import OUTPUT_SCHEMA, SCORES_SCHEMA
from evalrun.records.seeds import derive_seed
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import read_outputs
from evalrun.stats.summary import summarize
from evalrun.tasks.rubric import load_rubric

GENERATOR = {"name": "evalrun", "version": "synthetic", "git_commit": None}
TEXTS = ["", " 86", 'naïve \u2028 \x00 \x1f \\ " / 😀', "a\nb\tc\r", "\U0010ffff Z ü"]
LOGPROBS = [None, 0.0, -0.0, -1.0, 5e-324, -1e-7, -2.4676019165781327e-05, -1e21, -123.456]
SEEDS = {"master": 7, "set": [0], "repeats": 2}
# What every policy call of these runs samples with (the generated-parts test below varies it freely).
DECODING = {
    "name": "greedy",
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_tokens": 8,
    "stop": ["\n"],
    "logprobs": True,
}


def sampling(seed: int, temperature: float = 0.0) -> SamplingSpec:
    return SamplingSpec(temperature, 1.0, 0, 8, ("\n",), seed, True)


def single_call(rng: random.Random, n: int) -> list[EpisodeResult]:
    """Hand-made single-call episodes with awkward text and numbers, recorded by the fast encoder."""
    results = []
    for i in range(n):
        item = f"item-{rng.getrandbits(32)}-{i}{rng.choice(TEXTS)}"
        spec = sampling(derive_seed(7, "sampling", "synthetic", item, 0, i % 2))
        eid = episode_id("synthetic", item, 0, i % 2, {"sampling": str(spec.seed)})
        episode = Episode(eid, "synthetic", item, 0, i % 2, f"{rng.choice(TEXTS)}Q: {i}+1\nA:", str(i + 1), spec)
        k = rng.randrange(0, 5)
        token_ids = tuple(rng.randrange(2**31) for _ in range(k))
        logprobs = tuple(rng.choice(LOGPROBS) for _ in range(k))
        completion = Completion(rng.choice(TEXTS), token_ids, logprobs, rng.choice(["stop", "length"]), 7)
        results.append(record_episode(episode, completion, GENERATOR))
    return results


class StubEngine:
    """Answers every call from the request alone: a deterministic stand-in for a model."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion(text=f" {r.prompt[-1:]}", token_ids=(1, len(r.prompt)), logprobs=(-0.5, -1e-7),
                           finish_reason="stop", prompt_tokens=len(r.prompt)) for r in requests]  # fmt: skip

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        return [Loglikelihood(logprob=-0.25 - len(r.continuation), token_ids=(3, 4), greedy=len(r.continuation) == 2,
                              prompt_tokens=len(r.context)) for r in requests]  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {"name": "stub", "version": "1", "settings": {}}


def staged() -> list[EpisodeResult]:
    """Multiple choice (letter, loglikelihood, both; with and without few-shot) and judged episodes
    (loglikelihood and letter judging), through the real harness."""
    episodes = []
    for i, scoring in enumerate(["letter", "loglikelihood", "both"]):
        spec = sampling(derive_seed(7, "sampling", "mc", f"mc-{i}", 0, 0))
        eid = episode_id("mc", f"mc-{i}", 0, 0, {"sampling": str(spec.seed)})
        episodes.append(Episode(eid, "mc", f"mc-{i}", 0, 0, f"Q: {i}\nA) 1\nB) 2\nC) 3\nA:", "2", spec,
                                fewshot_ids=("ex-1", "ex-2") if i else (), options=("1", "2", "3"),
                                shuffle_order=(2, 0, 1), choice_scoring=scoring))  # fmt: skip
    rubric = load_rubric(BUILTIN_TASKS / "report_rubric" / "rubric.yaml")
    for i, judging in enumerate([rubric, dataclasses.replace(rubric, scoring="letter")]):
        spec = sampling(derive_seed(7, "sampling", "judged", f"r-{i}", 0, 0))
        calls = tuple(
            JudgeCall(c.id, judge, tuple(reversed(range(len(c.labels)))), sampling(3000 + 10 * i + j))
            for c in judging.criteria
            for j, judge in enumerate(judging.judges[:2])
        )
        eid = episode_id("judged", f"r-{i}", 0, 0, {"sampling": str(spec.seed)})
        episodes.append(Episode(eid, "judged", f"r-{i}", 0, 0, f"Add {i} and 4:", str(i + 4), spec, judging=judging,
                                judge_calls=calls, fields={"text": f"{i}+4"}))  # fmt: skip
    return run_episodes(StubEngine(), episodes, GENERATOR)


def write_run(root: Path, parts: list[list[EpisodeResult]], decoding: dict[str, Any] = DECODING) -> Path:
    """A finished run directory as evalrun.pipeline.runner writes one (scores made by hand)."""
    run = layout.create_run_dir(root, "run", exact=root / "run")
    files = {layout.CONFIG: writer.write_atomic(run.config, b"synthetic: true\n")}
    results = [r for part in parts for r in part]
    # Prompt pack and scoring parts stand in (no digest_inputs: verify recomputes only the seed set).
    parts_of_digest = ["a" * 64, seed_set_hash(SEEDS), "c" * 64]
    digest = DigestRecord(prompt_pack=parts_of_digest[0], seed_set=parts_of_digest[1], scoring=parts_of_digest[2],
                          digest=combine(parts_of_digest))  # fmt: skip
    sections = {
        "task": {"name": "synthetic"},
        "limit": None,
        "episodes": len(results),
        "model": {},
        "judge_model": None,
        "decoding": decoding,
        "seeds": SEEDS,
        "generator": GENERATOR,
    }
    manifest = Manifest(
        identity=implied_identity(sections), digest=digest, **sections, engine={}, determinism={}, cluster={},
        workers=[], libraries={}, python="3", git={}, hardware={}, started_at="synthetic",
    )  # fmt: skip
    files[layout.MANIFEST] = writer.write_json(run.manifest, manifest)
    part_writer = writer.PartWriter(run)
    for part in parts:
        provenance = encode.Provenance(worker="synthetic", hardware="{}", batch_size=len(part), latency_s=0.0)
        assert part_writer.write(encode.encode_part(part, provenance))
    rows = read_outputs(run, ["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]).to_pylist()
    scores = pa.Table.from_pylist(
        [{**{k: r[k] for k in ("episode_id", "task", "item_id", "seed", "repeat")}, "metric": "exact_match",
          "value": float(r["output"].strip() == r["target"]), "extracted": r["output"].strip(),
          "scorer": "exact_match", "scorer_version": "1"} for r in rows],
        schema=SCORES_SCHEMA,
    )  # fmt: skip
    files[layout.SCORES] = writer.write_atomic(run.scores, writer.table_bytes(scores))
    files[layout.SUMMARY] = writer.write_json(run.summary, summarize(scores))
    files.update(part_writer.file_hashes)
    record = Record(
        episodes=EpisodeCounts(planned=len(results), written=len(part_writer.heads)), parts=len(parts),
        output_tokens=part_writer.output_tokens, merkle_root=part_writer.heads.merkle_root(),
        digest=digest.digest, manifest_sha256=files[layout.MANIFEST], files=dict(sorted(files.items())),
        ended_at="synthetic",
    )  # fmt: skip
    writer.write_json(run.record, record)
    write_attestation(run, record)
    return run.path


def both_paths(run: Path, index: int = 0) -> tuple[Any, Any]:
    log_rel, out_rel = f"log/part-{index:05d}.jsonl", f"outputs/part-{index:05d}.parquet"
    fast = _verify_part_fast((run / log_rel).read_bytes(), (run / out_rel).read_bytes())
    precise = _verify_part_precise(run, log_rel, out_rel, kind_named("dataset"))
    return fast, precise


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(3)
    return write_run(tmp_path_factory.mktemp("single"), [single_call(rng, 6), single_call(rng, 5)])


@pytest.fixture
def run_copy(single_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(single_run, tmp_path / "run"))


def test_an_intact_single_call_run_verifies_by_the_fast_path(single_run: Path) -> None:
    for index in (0, 1):
        fast, precise = both_paths(single_run, index)
        assert fast is not None, "the fast path accepts what record_episode writes"
        assert (fast.heads, fast.entries, fast.output_tokens, fast.samplings) == (
            precise.heads,
            precise.entries,
            precise.output_tokens,
            precise.samplings,
        )
    report = verify_run(single_run, jobs=1)
    assert report.episodes == 11 and report.log_entries == 33 and report.parts == 2
    assert report.attestation == "checked"
    assert verify_run(single_run, jobs=2).merkle_root == report.merkle_root


def test_staged_and_mixed_parts_take_the_precise_path_and_verify(tmp_path: Path) -> None:
    rng = random.Random(5)
    results = staged()
    kinds = {type(parse_line(line)) for r in results for line in r.log_lines}
    assert kinds == {HeaderEntry, ModelEntry, LoglikelihoodEntry, JudgeEntry, EndEntry}
    judged = [parse_line(line) for line in results[-1].log_lines]
    assert any(isinstance(e, JudgeEntry) and e.option is None for e in judged)  # letter judging
    judged = [parse_line(line) for line in results[-2].log_lines]
    assert any(isinstance(e, JudgeEntry) and e.option is not None for e in judged)  # loglikelihood judging
    run = write_run(tmp_path, [results[:3], [*single_call(rng, 2), *results[3:]]])  # the second part mixes both
    for index in (0, 1):
        fast, precise = both_paths(run, index)
        assert fast is None and precise.entries > 0
    report = verify_run(run, jobs=1)
    assert report.episodes == len(results) + 2


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.data())
def test_fast_and_precise_paths_agree_on_generated_parts(tmp_path: Path, data: st.DataObject) -> None:
    texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8) | st.sampled_from(TEXTS)
    floats = st.none() | st.sampled_from(LOGPROBS) | st.floats(allow_nan=False, allow_infinity=False)
    results = []
    for i in range(data.draw(st.integers(1, 4))):
        spec = SamplingSpec(data.draw(st.floats(0, 2)), 1.0, data.draw(st.integers(0, 50)), 8,
                            tuple(data.draw(st.lists(texts, max_size=2))), data.draw(st.integers(0, 2**64 - 1)),
                            data.draw(st.booleans()))  # fmt: skip
        task, item = data.draw(texts), f"{i}{data.draw(texts)}"
        seed = data.draw(st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER))
        repeat = data.draw(st.integers(0, 2**31 - 1))
        eid = episode_id(task, item, seed, repeat, {"sampling": str(spec.seed)})
        episode = Episode(eid, task, item, seed, repeat, data.draw(texts), data.draw(texts), spec)
        k = data.draw(st.integers(0, 4))
        token_ids = tuple(data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=k, max_size=k)))
        logprobs = tuple(data.draw(st.lists(floats, min_size=k, max_size=k)))
        completion = Completion(data.draw(texts), token_ids, logprobs, data.draw(texts), 0)
        generator = encode_generator(data.draw(st.sampled_from([GENERATOR, {**GENERATOR, "git_commit": "a\u2028b"}])))
        results.append(record_episode(episode, completion, generator))
    part = encode.encode_part(results, encode.Provenance("w", "{}", len(results), 0.0))
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "log").mkdir()
    (root / "outputs").mkdir()
    (root / "log/part-00000.jsonl").write_bytes(part.log)
    (root / "outputs/part-00000.parquet").write_bytes(part.table)
    fast, precise = both_paths(root)
    assert fast is not None
    assert (fast.heads, fast.entries, fast.output_tokens) == (precise.heads, precise.entries, precise.output_tokens)


# --- tampering: the first broken thing is named ------------------------------------------------


def _lines(run: Path) -> list[bytes]:
    return (run / "log/part-00000.jsonl").read_bytes().splitlines(keepends=True)


def _write_lines(run: Path, lines: list[bytes]) -> None:
    (run / "log/part-00000.jsonl").write_bytes(b"".join(lines))


def _episode_of(line: bytes) -> str:
    return json.loads(line)["episode"]


def _caught(run: Path) -> str:
    log, out = (run / "log/part-00000.jsonl").read_bytes(), (run / "outputs/part-00000.parquet").read_bytes()
    assert _verify_part_fast(log, out) is None, "the fast path never accepts a tampered part"
    with pytest.raises(CheckFailed) as info:
        verify_run(run, jobs=1)
    with pytest.raises(CheckFailed) as again:
        verify_part(str(run), "log/part-00000.jsonl", "outputs/part-00000.parquet", "dataset")
    assert str(again.value) in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("change", [(b"{", b"["), (b'"kind":"model"', b'"kind":"modem"'), (b'"call":0', b'"call":0.')])
def test_a_changed_byte_that_breaks_the_entry_names_the_line(run_copy: Path, change: tuple[bytes, bytes]) -> None:
    lines = _lines(run_copy)
    lines[4] = lines[4].replace(*change, 1)
    _write_lines(run_copy, lines)
    assert "log/part-00000.jsonl:5" in _caught(run_copy)


def test_a_flipped_byte_in_a_recorded_text_names_the_episode(run_copy: Path) -> None:
    lines = _lines(run_copy)
    lines[4] = lines[4].replace(b"Q: ", b"#: ", 1)
    _write_lines(run_copy, lines)
    message = _caught(run_copy)
    assert "log/part-00000.jsonl:5" in message and _episode_of(lines[4]) in message  # prompt_sha256 no longer matches


def test_a_flipped_byte_in_a_response_names_the_next_line(run_copy: Path) -> None:
    lines = _lines(run_copy)
    at = lines[4].index(b'"finish_reason":"') + len(b'"finish_reason":"')
    lines[4] = lines[4][:at] + bytes([lines[4][at] ^ 1]) + lines[4][at + 1 :]
    _write_lines(run_copy, lines)
    message = _caught(run_copy)
    assert "log/part-00000.jsonl:6" in message and "prev does not match" in message
    assert _episode_of(lines[4]) in message


def test_a_changed_output_cell_names_the_row_and_column(run_copy: Path) -> None:
    path = run_copy / "outputs/part-00000.parquet"
    table = pq.read_table(path)
    outputs = table.column("output").to_pylist()
    outputs[2] = outputs[2] + "!"
    table = table.set_column(table.schema.get_field_index("output"), "output", pa.array(outputs, pa.string()))
    assert table.schema.equals(OUTPUT_SCHEMA)
    writer.write_atomic(path, writer.table_bytes(table))
    message = _caught(run_copy)
    assert "outputs/part-00000.parquet row 2" in message and "'output'" in message
    assert table.column("episode_id")[2].as_py() in message


def test_two_swapped_chains_fail_on_the_file_hash(run_copy: Path) -> None:
    lines = _lines(run_copy)
    _write_lines(run_copy, lines[3:6] + lines[0:3] + lines[6:])
    assert "log/part-00000.jsonl: sha256 differs from record.json" in _caught_whole_run(run_copy)


def test_a_consistent_run_under_an_episode_id_no_run_writes_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chains, rows, file hashes, root and attestation all agree, but the episode id is not a sha256 hex
    digest: the runner refuses to write one (records.heads), and scoring holds ids as their bytes."""
    rng = random.Random(5)
    (result,) = single_call(rng, 1)
    forged = record_episode(dataclasses.replace(result.episode, episode_id="not-an-id"), result.completion, GENERATOR)
    monkeypatch.setattr(heads, "digest_bytes", lambda text, what: hashlib.sha256(text.encode()).digest())
    run = write_run(tmp_path, [[forged]])
    monkeypatch.undo()
    with pytest.raises(CheckFailed, match=r"log/part-00000.jsonl: episode id 'not-an-id' is not a sha256 hex digest"):
        verify_run(run)


def _caught_whole_run(run: Path) -> str:
    """A change the chain structure allows: the part checks pass (on the precise path), the file hash fails."""
    log, out = (run / "log/part-00000.jsonl").read_bytes(), (run / "outputs/part-00000.parquet").read_bytes()
    assert _verify_part_fast(log, out) is None
    with pytest.raises(CheckFailed) as info:
        verify_run(run, jobs=1)
    return str(info.value)


def test_two_swapped_lines_name_the_line(run_copy: Path) -> None:
    lines = _lines(run_copy)
    lines[1], lines[2] = lines[2], lines[1]
    _write_lines(run_copy, lines)
    message = _caught(run_copy)
    assert "log/part-00000.jsonl:2" in message and _episode_of(lines[1]) in message


@pytest.mark.parametrize(("key", "value"), [("temperature", 0.7), ("max_tokens", 16), ("stop", [])])
def test_a_manifest_claiming_other_sampling_settings_than_the_chains_fails(
    tmp_path: Path, key: str, value: Any
) -> None:
    run = write_run(tmp_path, [single_call(random.Random(5), 3)], {**DECODING, key: value})
    with pytest.raises(CheckFailed, match=rf"manifest.json: decoding.{key} is {re.escape(repr(value))}, the chains'"):
        verify_run(run)
