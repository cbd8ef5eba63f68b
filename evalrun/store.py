"""The run directory: its paths, atomic output/log parts, and the files written at the end.

A part is complete or absent: its bytes go to a temporary name, are fsynced, then renamed. The
log part is renamed before its output part, so an output part on disk always has its log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from evalrun.digest import canonical_json, file_sha256, sha256_hex
from evalrun.episode import EpisodeResult, Judgement
from evalrun.errors import BadInput

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
OUTPUTS = "outputs"
LOG = "log"
SCORES = "scores.parquet"
SUMMARY = "summary.json"
RECORD = "record.json"
LOCK = ".lock"
PART_PATTERN = re.compile(r"^part-(\d{5})\.(parquet|jsonl)$")

JUDGEMENT = pa.struct(
    [
        ("criterion", pa.string()),
        ("judge", pa.string()),
        ("shuffle_order", pa.list_(pa.int32())),
        ("output", pa.string()),
        ("option_logprobs", pa.list_(pa.float64())),
    ]
)

OUTPUT_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("task", pa.string()),
        ("item_id", pa.string()),
        ("seed", pa.int64()),
        ("repeat", pa.int32()),
        ("seeds", pa.struct([("sampling", pa.uint64())])),
        ("prompt", pa.string()),
        ("prompt_sha256", pa.string()),
        ("target", pa.string()),
        ("output", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("token_logprobs", pa.list_(pa.float64())),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("head", pa.string()),
        ("fewshot_ids", pa.list_(pa.string())),
        ("shuffle_order", pa.list_(pa.int32())),  # shown position -> original option index
        ("option_logprobs", pa.list_(pa.float64())),  # per original option; null unless scored so
        ("judgements", pa.list_(JUDGEMENT)),
        # provenance: may differ between identical runs, never part of any chain
        ("worker", pa.string()),
        ("hardware", pa.string()),
        ("batch_size", pa.int32()),
        ("latency_s", pa.float64()),
    ]
)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` via a fsynced temporary file and a rename; returns its sha256."""
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return sha256_hex(data)


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class Provenance:
    worker: str
    hardware: str  # canonical JSON of the worker's hardware fingerprint
    batch_size: int
    latency_s: float


def output_rows(results: list[EpisodeResult], provenance: Provenance) -> pa.Table:
    episodes = [r.episode for r in results]
    completions = [r.completion for r in results]
    n = len(results)
    seeds = pa.array([e.sampling.seed for e in episodes], _SAMPLING_SEED.type)
    columns: dict[str, Any] = {
        "episode_id": [e.episode_id for e in episodes],
        "task": [e.task for e in episodes],
        "item_id": [e.item_id for e in episodes],
        "seed": [e.seed for e in episodes],
        "repeat": [e.repeat for e in episodes],
        "seeds": pa.StructArray.from_arrays([seeds], fields=[_SAMPLING_SEED]),
        "prompt": [e.prompt for e in episodes],
        "prompt_sha256": [r.prompt_sha256 for r in results],
        "target": [e.target for e in episodes],
        "output": [c.text for c in completions],
        "token_ids": [list(c.token_ids) for c in completions],
        "token_logprobs": [list(c.logprobs) for c in completions],
        "finish_reason": [c.finish_reason for c in completions],
        "prompt_tokens": [c.prompt_tokens for c in completions],
        "output_tokens": [len(c.token_ids) for c in completions],
        "head": [r.head for r in results],
        **(_staged_columns(results) if any(not e.single_call for e in episodes) else _no_stages(n)),
        "worker": [provenance.worker] * n,
        "hardware": [provenance.hardware] * n,
        "batch_size": [provenance.batch_size] * n,
        "latency_s": [provenance.latency_s] * n,
    }
    return pa.table(columns, schema=OUTPUT_SCHEMA)


_SAMPLING_SEED = OUTPUT_SCHEMA.field("seeds").type.field("sampling")


_STAGED = ("fewshot_ids", "shuffle_order", "option_logprobs", "judgements")


def _staged_columns(results: list[EpisodeResult]) -> dict[str, list[Any]]:
    return {
        "fewshot_ids": [list(r.episode.fewshot_ids) for r in results],
        "shuffle_order": [list(r.episode.shuffle_order) for r in results],
        "option_logprobs": [None if r.option_logprobs is None else list(r.option_logprobs) for r in results],
        "judgements": [[_judgement(j) for j in r.judgements] for r in results],
    }


def _no_stages(n: int) -> dict[str, pa.Array]:
    """The staged columns of single-call episodes, built whole: empty lists, no option scores."""
    offsets = pa.array([0] * (n + 1), pa.int32())
    columns = {name: pa.ListArray.from_arrays(offsets, pa.array([], OUTPUT_SCHEMA.field(name).type.value_type))
               for name in ("fewshot_ids", "shuffle_order", "judgements")}  # fmt: skip
    columns["option_logprobs"] = pa.nulls(n, OUTPUT_SCHEMA.field("option_logprobs").type)
    return {name: columns[name] for name in _STAGED}


def _judgement(j: Judgement) -> dict[str, Any]:
    return {"criterion": j.criterion, "judge": j.judge, "shuffle_order": list(j.shuffle_order), "output": j.output,
            "option_logprobs": None if j.option_logprobs is None else list(j.option_logprobs)}  # fmt: skip


@dataclass(frozen=True)
class EncodedPart:
    """A batch's results as the bytes of its log part and output part.

    Encoded where the results are (a worker), so the driver only commits bytes to disk and never
    does per-episode work.
    """

    log: bytes
    table: bytes
    heads: tuple[tuple[str, str], ...]  # (episode_id, head)
    output_tokens: int


def encode_part(results: list[EpisodeResult], provenance: Provenance) -> EncodedPart:
    return EncodedPart(
        log=("\n".join(chain.from_iterable(r.log_lines for r in results)) + "\n").encode("utf-8"),
        table=table_bytes(output_rows(results, provenance)),
        heads=tuple((r.episode.episode_id, r.head) for r in results),
        output_tokens=sum(len(r.completion.token_ids) for r in results),
    )


class RunDir:
    """Paths of one run directory; the names are the contract of DESIGN.md."""

    def __init__(self, path: Path) -> None:
        self.path = path

    manifest = property(lambda self: self.path / MANIFEST)
    config = property(lambda self: self.path / CONFIG)
    outputs = property(lambda self: self.path / OUTPUTS)
    log = property(lambda self: self.path / LOG)
    scores = property(lambda self: self.path / SCORES)
    summary = property(lambda self: self.path / SUMMARY)
    record = property(lambda self: self.path / RECORD)

    def output_part(self, index: int) -> Path:
        return self.outputs / f"part-{index:05d}.parquet"

    def log_part(self, index: int) -> Path:
        return self.log / f"part-{index:05d}.jsonl"

    def output_parts(self) -> list[Path]:
        return sorted(p for p in self.outputs.glob("part-*.parquet") if PART_PATTERN.match(p.name))

    def read_outputs(self, columns: list[str] | None = None) -> pa.Table:
        parts = self.output_parts()
        if not parts:
            return OUTPUT_SCHEMA.empty_table() if columns is None else OUTPUT_SCHEMA.empty_table().select(columns)
        return pq.read_table([str(p) for p in parts], columns=columns, schema=OUTPUT_SCHEMA)

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text(encoding="utf-8"))


def create_run_dir(root: Path, name: str, exact: Path | None = None) -> RunDir:
    """A new, empty run directory: ``exact`` if given (it must not hold a run), else ``root/name[-k]``."""
    if exact is not None:
        if exact.exists() and any(exact.iterdir()):
            raise BadInput("run.dir", f"{exact} already exists and is not empty")
        path = exact
    else:
        path = root / name
        k = 1
        while path.exists():
            k += 1
            path = root / f"{name}-{k}"
    path.mkdir(parents=True, exist_ok=True)
    (path / OUTPUTS).mkdir()
    (path / LOG).mkdir()
    return RunDir(path)


@contextlib.contextmanager
def locked(run: RunDir) -> Iterator[None]:
    """Hold the run directory's driver lock; a second driver gets BadInput (exit 2).

    ``flock`` is released by the kernel when the holder dies, so a crashed driver never leaves a
    stale lock behind.
    """
    path = run.path / LOCK
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            message = f"another evalrun driver (pid {holder}) is using this run directory"
            raise BadInput(str(run.path), message) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


class PartWriter:
    """Writes result batches as numbered parts and keeps what record.json needs."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.next_index = 0
        self.heads: dict[str, str] = {}
        self.file_hashes: dict[str, str] = {}
        self.output_tokens = 0
        self.kept_parts = 0

    @classmethod
    def recover(cls, run: RunDir) -> PartWriter:
        """Keep every complete part of an interrupted run and discard everything else.

        A part is complete when its output part exists (it is renamed into place after its log
        part). Temporary files, log parts without an output part, and the end-of-run files
        (scores, summary, record) are removed; they are all written again.
        """
        for stray in [*run.path.glob(".tmp-*"), *run.outputs.glob(".tmp-*"), *run.log.glob(".tmp-*")]:
            stray.unlink()
        for name in (SCORES, SUMMARY, RECORD):
            (run.path / name).unlink(missing_ok=True)
        writer = cls(run)
        indices = []
        for log_part in sorted(run.log.glob("part-*.jsonl")):
            index = int(PART_PATTERN.match(log_part.name).group(1))  # type: ignore[union-attr]
            if not run.output_part(index).exists():
                log_part.unlink()
        for out_part in run.output_parts():
            index = int(PART_PATTERN.match(out_part.name).group(1))  # type: ignore[union-attr]
            log_part = run.log_part(index)
            if not log_part.exists():
                raise BadInput(str(log_part), "output part has no log part; the run directory was altered")
            try:
                cols = pq.read_table(out_part, columns=["episode_id", "head", "output_tokens"]).to_pydict()
            except (pa.ArrowException, OSError) as exc:
                raise BadInput(str(out_part), f"unreadable output part ({exc})") from exc
            for episode, head in zip(cols["episode_id"], cols["head"], strict=True):
                if episode in writer.heads:
                    raise BadInput(str(out_part), f"episode {episode} appears in more than one part")
                writer.heads[episode] = head
            writer.output_tokens += sum(cols["output_tokens"])
            writer.file_hashes[f"{LOG}/{log_part.name}"] = file_sha256(log_part)
            writer.file_hashes[f"{OUTPUTS}/{out_part.name}"] = file_sha256(out_part)
            indices.append(index)
        writer.kept_parts = len(indices)
        writer.next_index = max(indices, default=-1) + 1
        return writer

    def write(self, part: EncodedPart) -> bool:
        """Commit one part: log part first, then output part. False for a batch already written."""
        written = sum(episode in self.heads for episode, _ in part.heads)
        if written == len(part.heads):
            return False  # never written twice
        if written:
            raise RuntimeError(f"a batch overlaps {written} episodes that are already written")
        index = self.next_index
        log_path, out_path = self.run.log_part(index), self.run.output_part(index)
        self.file_hashes[f"{LOG}/{log_path.name}"] = write_atomic(log_path, part.log)
        self.file_hashes[f"{OUTPUTS}/{out_path.name}"] = write_atomic(out_path, part.table)
        self.heads.update(part.heads)
        self.output_tokens += part.output_tokens
        self.next_index += 1
        return True


def write_json(path: Path, value: Any) -> str:
    return write_atomic(path, (canonical_json(value) + "\n").encode("utf-8"))
