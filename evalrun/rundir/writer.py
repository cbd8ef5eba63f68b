"""Writing a run directory: atomic files, numbered output/log parts, the driver lock.

A part is complete or absent: its bytes go to a temporary name, are fsynced, then renamed. The
log part is renamed before its output part, so an output part on disk always has its log.
A run's parts are committed by a background thread, several at a time when they queue up
(docs/design.md "The run directory"), so the driver never waits on the disk between batches.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Generic, Protocol, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from evalrun.errors import BadInput, write_failed
from evalrun.records.canonical import canonical_json, file_sha256, sha256_hex
from evalrun.records.formats import RecordModel
from evalrun.records.heads import DIGEST_BYTES, Heads, PackedHeads
from evalrun.rundir import store
from evalrun.rundir.layout import (
    ATTESTATION,
    LOG,
    OUTPUTS,
    PART_PATTERN,
    RECORD,
    SCORES,
    SUMMARY,
    TOKENIZER,
    TOKENIZER_FILES,
    RunDir,
    part_names,
)

T = TypeVar("T")


def write_atomic(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` via a fsynced temporary file and a rename; returns its sha256.

    A failed write (WriteFailed, naming ``path``) leaves no temporary file behind and ``path`` as it was.
    """
    return _commit_group([(path, data)])[0]


def copy_tokenizer(run: RunDir, model_dir: Path) -> None:
    """The model's tokenizer files (:data:`evalrun.rundir.layout.TOKENIZER_FILES`, those it has) into the run's
    ``tokenizer`` folder, atomically; a folder already there (a resumed run's) is kept as it is."""
    if run.tokenizer.is_dir():
        return
    present = [(run.tokenizer / name, (model_dir / name).read_bytes()) for name in TOKENIZER_FILES
               if (model_dir / name).is_file()]  # fmt: skip
    if present:
        run.tokenizer.mkdir()
        _commit_group(present)


def tokenizer_hashes(run: RunDir) -> dict[str, str]:
    """record.json's entries of the run's tokenizer files (none for a run made before they were kept)."""
    if not run.tokenizer.is_dir():
        return {}
    return {f"{TOKENIZER}/{p.name}": file_sha256(p) for p in sorted(run.tokenizer.iterdir()) if p.is_file()}


def write_atomic_streamed(path: Path, write: Callable[[BinaryIO], None]) -> str:
    """:func:`write_atomic` for a file written piece by piece by ``write(file)``, never whole in memory.
    Whatever ``write`` raises leaves no temporary file behind."""
    return _commit_group([(path, write)])[0]


def _commit_group(paths: list[tuple[Path, store.Data]]) -> list[str]:
    """Commit files into one directory (:func:`evalrun.rundir.store.commit_files`); in a local working copy of a
    run on an object store, put them to the store too, in the same order (docs/design.md "Run directories on shared
    storage")."""
    digests = store.commit_files(paths)
    published = store.published_to(paths[0][0])
    if published is not None:
        remote, first = published
        folder = first.rpartition("/")[0]
        names = [f"{folder}/{path.name}" if folder else path.name for path, _ in paths]
        bodies = [path.read_bytes() if callable(data) else data for path, data in paths]  # a streamed file: as written
        remote.commit(list(zip(names, bodies, strict=True)))
    return digests


def write_parquet(sink: Any, schema: pa.Schema, tables: Iterable[pa.Table]) -> None:
    """Parquet (zstd) of ``tables`` in order, one row group per record batch (a run's scores are written
    a chunk at a time: docs/design.md "Start-up and exit", driver memory); a table of one batch, or
    none, is what ``pyarrow.parquet.write_table`` writes."""
    with pq.ParquetWriter(sink, schema, compression="zstd") as out:
        written = False
        for table in tables:
            for batch in table.to_batches():
                if batch.num_rows:
                    out.write_batch(batch)
                    written = True
        if not written:
            out.write_table(schema.empty_table())


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    write_parquet(sink, table.schema, [table])
    return sink.getvalue().to_pybytes()


class PartBytes(Protocol):
    """What the part writer commits of a batch: the bytes of its log part and output part, the heads of its
    episodes (episode id, head; packed) and its output tokens. The message a worker sends with them is the
    pipeline's (:class:`evalrun.episodes.encode.EncodedPart`); the writer hands it back to ``on_durable``."""

    @property
    def log(self) -> bytes: ...

    @property
    def table(self) -> bytes: ...

    @property
    def heads(self) -> PackedHeads: ...

    @property
    def output_tokens(self) -> int: ...


@dataclass(frozen=True)
class PartFiles:
    """A part a worker committed into the run directory itself (``run.part_writes=workers``): each file's name
    relative to the run, sha256 and size, the log part first. The driver records them without reading a byte."""

    log: tuple[str, str, int]
    output: tuple[str, str, int]

    def hashes(self) -> dict[str, str]:
        return {self.log[0]: self.log[1], self.output[0]: self.output[1]}


@dataclass(frozen=True)
class PartSink:
    """Where an engine worker writes its batches' parts (``run.part_writes=workers``; docs/design.md "Workers write,
    the driver commits"): the run directory's location, as every node sees it (an absolute path on a shared file
    system, or a store's URI), and the index of batch 0 of this dispatch (a resumed run's parts go on after the
    ones it kept). Batch N is always part ``first_index + N``: a batch that runs again after its worker died writes
    the same names, replacing whatever the dead worker left there whole, so a run never holds two parts of one
    batch."""

    location: str
    first_index: int

    def write(self, number: int, log: bytes, table: bytes) -> PartFiles:
        """Batch ``number``'s part committed: the log part, then the output part (so an output part in the run
        always has its log), each whole or not at all."""
        log_rel, out_rel = part_names(self.first_index + number)
        log_sha, out_sha = store.open_store(self.location).commit([(log_rel, log), (out_rel, table)])
        return PartFiles((log_rel, log_sha, len(log)), (out_rel, out_sha, len(table)))


P = TypeVar("P", bound=PartBytes)


@contextlib.contextmanager
def locked(run: RunDir) -> Iterator[None]:
    """Hold the run directory's driver lock; a second driver gets BadInput (exit 2). A local working copy of a run on
    an object store holds the store's lock too (an exclusive put: docs/design.md "Run directories on shared
    storage").

    ``flock`` is released by the kernel when the holder dies, so a crashed driver never leaves a
    stale lock behind on a file system.
    """
    here = store.LocalStore(str(run.path))
    here.acquire(str(os.getpid()))
    try:
        remote = store.remote_of(run.path)
        if remote is not None:
            remote.acquire(store.holder())
        try:
            yield
        finally:
            if remote is not None:
                remote.release()
    finally:
        here.release()


def remove_temporaries(run: RunDir) -> None:
    """Remove the temporary files a killed driver left (a failed write removes its own)."""
    for folder in (run.path, run.outputs, run.log, run.logs, run.checkpoints):
        for stray in list(folder.glob(".tmp-*")):
            stray.unlink()


class PartWriter(Generic[P]):
    """Writes result batches as numbered parts and keeps what record.json needs.

    ``background=True``: :meth:`write` numbers the part and queues its bytes; a committer thread
    makes queued parts durable in arrival order, a group at a time (all log parts of the group
    renamed and their directory fsynced before any of its output parts), and calls ``on_durable``
    with each part's index and bytes once it is (in the committer's thread: a run scores the part
    there). :meth:`flush` waits for every queued part; :meth:`close` drops what is queued (an
    interrupted run's resume writes it again) and stops the thread.
    A failed write is raised by the next :meth:`write` or :meth:`flush`.
    """

    MAX_QUEUED = 64  # parts waiting for the committer before write() waits too: bounds the driver's memory
    MAX_GROUP = 16  # parts committed with one directory fsync each for log/ and outputs/

    def __init__(
        self, run: RunDir, *, background: bool = False, on_durable: Callable[[int, P], None] | None = None
    ) -> None:
        self.run = run
        self.next_index = 0
        # the episodes of the durable parts (added as each is committed): one copy a run, which its checkpoints
        # share (64 bytes an episode)
        self.heads = Heads()
        self.kept_ids: frozenset[str] = frozenset()  # the episodes of the parts recover() kept
        self._parts: dict[str, str] = {}  # a part's first episode id -> the digest of all its ids
        self.file_hashes: dict[str, str] = {}
        self.output_tokens = 0
        self.kept_parts = 0
        self._background = background
        self._on_durable = on_durable
        self._queue: queue.Queue[tuple[int, P] | None] = queue.Queue(self.MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stopping = False

    @classmethod
    def recover(
        cls, run: RunDir, *, background: bool = False, on_durable: Callable[[int, P], None] | None = None
    ) -> PartWriter[P]:
        """Keep every complete part of an interrupted run and discard everything else.

        A part is complete when its output part exists (it is renamed into place after its log
        part). Temporary files, log parts without an output part, and the end-of-run files
        (scores, summary, record, attestation) are removed; they are all written again.
        """
        remove_temporaries(run)
        # the reverse of their commits: a store never holds one of them without those committed before it
        for name in (ATTESTATION, RECORD, SUMMARY, SCORES):
            store.remove_committed(run.path / name)
        writer = cls(run, background=background, on_durable=on_durable)
        indices, kept = [], set()
        for log_part in sorted(run.log.glob("part-*.jsonl")):
            index = int(PART_PATTERN.match(log_part.name).group(1))  # type: ignore[union-attr]
            if not run.output_part(index).exists():
                store.remove_committed(log_part)
        for out_part in run.output_parts():
            index = int(PART_PATTERN.match(out_part.name).group(1))  # type: ignore[union-attr]
            log_part = run.log_part(index)
            if not log_part.exists():
                raise BadInput(str(log_part), "output part has no log part; the run directory was altered")
            try:
                cols = pq.read_table(out_part, columns=["episode_id", "head", "output_tokens"]).to_pydict()
            except (pa.ArrowException, OSError) as exc:
                raise BadInput(str(out_part), f"unreadable output part ({exc})") from exc
            for episode in cols["episode_id"]:
                if episode in kept:
                    raise BadInput(str(out_part), f"episode {episode} appears in more than one part")
                kept.add(episode)
            try:
                writer.heads.add(zip(cols["episode_id"], cols["head"], strict=True))
            except ValueError as exc:
                raise BadInput(str(out_part), str(exc)) from None
            writer.output_tokens += sum(cols["output_tokens"])
            writer.file_hashes[f"{LOG}/{log_part.name}"] = file_sha256(log_part)
            writer.file_hashes[f"{OUTPUTS}/{out_part.name}"] = file_sha256(out_part)
            indices.append(index)
        writer.kept_parts = len(indices)
        writer.kept_ids = frozenset(kept)
        writer.next_index = max(indices, default=-1) + 1
        return writer

    def write(self, part: P | Any, index: int | None = None) -> bool:
        """Commit one part (or queue it, in the background) as part ``index`` (None: the next number): log part
        first, then output part; a part its worker committed itself (``part.files``, :class:`PartFiles`) is only
        recorded. False for a batch already written."""
        self._raise_failure()
        packed: PackedHeads = part.heads
        if not len(packed):
            return False
        ids = sha256_hex(packed.ids)
        first = packed.ids[:DIGEST_BYTES].hex()
        if first in self.kept_ids or first in self._parts:
            if self._parts.get(first) == ids:
                return False  # never written twice
            raise RuntimeError(f"a batch overlaps episodes that are already written (episode {first})")
        self._parts[first] = ids  # other overlaps show as a repeated episode id in heads.merkle_root()
        index = self.next_index if index is None else index
        self.output_tokens += part.output_tokens
        self.next_index = max(self.next_index, index + 1)
        if not self._background:
            self._commit([(index, part)])
            return True
        if self._thread is None:
            self._thread = threading.Thread(target=self._committer, name="evalrun-part-committer", daemon=True)
            self._thread.start()
        while True:  # waits while the queue is full, but not on a committer that has failed
            try:
                self._queue.put((index, part), timeout=0.5)
                return True
            except queue.Full:
                self._raise_failure()

    def flush(self) -> None:
        """Wait until every part written so far is durable (raises a failed write)."""
        if self._thread is not None:
            self._stop(drop_queued=False)
        self._raise_failure()

    def close(self) -> None:
        """Stop the committer: the part being committed is finished, queued ones are dropped."""
        if self._thread is not None:
            self._stop(drop_queued=True)

    def _stop(self, drop_queued: bool) -> None:
        assert self._thread is not None
        self._stopping = drop_queued
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._thread = None
        self._stopping = False
        self._queue = queue.Queue(self.MAX_QUEUED)

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _committer(self) -> None:
        while True:
            first = self._queue.get()
            group = [first]
            while first is not None and group[-1] is not None and len(group) < self.MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            parts = [item for item in group if item is not None]
            if parts and not self._stopping and self._error is None:
                try:
                    self._commit(parts)
                except BaseException as exc:  # raised in the driver's thread by its next write() or flush()
                    self._error = exc
            if group[-1] is None:
                return

    def _commit(self, parts: list[tuple[int, P]]) -> None:
        written = [(index, part) for index, part in parts if getattr(part, "files", None) is not None]
        for index, part in written:  # committed by its worker: the driver records what it reported
            files: PartFiles = part.files  # type: ignore[attr-defined]
            if files.log[0] != part_names(index)[0]:
                raise RuntimeError(f"a worker wrote batch {index} as {files.log[0]}")
            self.file_hashes.update(files.hashes())
        to_write = [(index, part) for index, part in parts if getattr(part, "files", None) is None]
        logs = [(self.run.log_part(index), part.log) for index, part in to_write]
        tables = [(self.run.output_part(index), part.table) for index, part in to_write]
        if to_write:
            for (path, _), digest in zip(logs, _commit_group(logs), strict=True):
                self.file_hashes[f"{LOG}/{path.name}"] = digest
            for (path, _), digest in zip(tables, _commit_group(tables), strict=True):
                self.file_hashes[f"{OUTPUTS}/{path.name}"] = digest
        for index, part in parts:  # each part's heads, then what follows its being durable (a checkpoint reads them)
            self.heads.add_packed(part.heads)
            if self._on_durable is not None:
                self._on_durable(index, part)


def write_json(path: Path, value: RecordModel | Any) -> str:
    """Write a record (or any JSON value) as canonical JSON and a newline; returns its sha256."""
    data = value.as_record() if isinstance(value, RecordModel) else value
    return write_atomic(path, (canonical_json(data) + "\n").encode("utf-8"))


def append_locked(path: Path, decide: Callable[[bytes], tuple[T, bytes | None]]) -> T:
    """Append to an append-only file (a ledger): under an exclusive ``flock``, ``decide`` reads the
    whole file and returns (its result, the bytes to append or None); they are appended in one write
    and fsynced. Creates the file when absent; never rewrites what is there. A failed write
    (WriteFailed, naming ``path``) is cut off again, so the file keeps only whole lines.
    """
    created = not path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise write_failed(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for another appender; released when fd closes
        with open(fd, "rb", closefd=False) as fh:
            existing = fh.read()
        result, data = decide(existing)
        if data is not None:
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(0, f"wrote {written} of {len(data)} bytes")
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, len(existing))
                raise write_failed(path, exc) from exc
        if created:
            store.fsync_dir(path.parent)
        return result
    finally:
        os.close(fd)
