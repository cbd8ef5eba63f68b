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
from pathlib import Path
from typing import Any, BinaryIO, Generic, Protocol, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from evalrun.errors import BadInput, write_failed
from evalrun.records.canonical import canonical_json, file_sha256, sha256_hex
from evalrun.records.formats import RecordModel
from evalrun.records.heads import Heads
from evalrun.rundir.layout import (
    ATTESTATION,
    LOCK,
    LOG,
    OUTPUTS,
    PART_PATTERN,
    RECORD,
    SCORES,
    SUMMARY,
    TOKENIZER,
    TOKENIZER_FILES,
    RunDir,
)

T = TypeVar("T")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes | Callable[[BinaryIO], None]) -> None:
    """``data``, or what ``data(file)`` writes, in ``path``, fsynced."""
    with open(path, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


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


def _commit_group(paths: list[tuple[Path, bytes | Callable[[BinaryIO], None]]]) -> list[str]:
    """Commit files into one directory: every temporary written and fsynced, then renamed, then the
    directory fsynced once; returns their sha256s. A failure removes the temporaries not yet renamed."""
    temporaries = [(path.with_name(f".tmp-{path.name}"), path) for path, _ in paths]
    at = paths[0][0]
    try:
        for (tmp, path), (_, data) in zip(temporaries, paths, strict=True):
            at = path
            _write_synced(tmp, data)
        for tmp, path in temporaries:
            at = path
            os.replace(tmp, path)
        _fsync_dir(at.parent)  # ``at``: the last file renamed, which this makes durable
    except BaseException as exc:
        for tmp, _ in temporaries:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_failed(at, exc) from exc
        raise
    return [file_sha256(path) if callable(data) else sha256_hex(data) for path, data in paths]


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
    episodes (episode id, head) and its output tokens. The message a worker sends with them is the
    pipeline's (:class:`evalrun.episodes.encode.EncodedPart`); the writer hands it back to ``on_durable``."""

    @property
    def log(self) -> bytes: ...

    @property
    def table(self) -> bytes: ...

    @property
    def heads(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def output_tokens(self) -> int: ...


P = TypeVar("P", bound=PartBytes)


@contextlib.contextmanager
def locked(run: RunDir) -> Iterator[None]:
    """Hold the run directory's driver lock; a second driver gets BadInput (exit 2).

    ``flock`` is released by the kernel when the holder dies, so a crashed driver never leaves a
    stale lock behind.
    """
    path = run.path / LOCK
    try:
        fh = open(path, "a+")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise write_failed(path, exc) from exc
    with fh:
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
        for name in (SCORES, SUMMARY, RECORD, ATTESTATION):
            (run.path / name).unlink(missing_ok=True)
        writer = cls(run, background=background, on_durable=on_durable)
        indices, kept = [], set()
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

    def write(self, part: P) -> bool:
        """Commit one part (or queue it, in the background): log part first, then output part.
        False for a batch already written."""
        self._raise_failure()
        if not part.heads:
            return False
        ids = sha256_hex("\n".join(episode for episode, _ in part.heads))
        first = part.heads[0][0]
        if first in self.kept_ids or first in self._parts:
            if self._parts.get(first) == ids:
                return False  # never written twice
            raise RuntimeError(f"a batch overlaps episodes that are already written (episode {first})")
        self._parts[first] = ids  # other overlaps show as a repeated episode id in heads.merkle_root()
        index = self.next_index
        self.heads.add(part.heads)
        self.output_tokens += part.output_tokens
        self.next_index += 1
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
        logs = [(self.run.log_part(index), part.log) for index, part in parts]
        tables = [(self.run.output_part(index), part.table) for index, part in parts]
        for (path, _), digest in zip(logs, _commit_group(logs), strict=True):
            self.file_hashes[f"{LOG}/{path.name}"] = digest
        for (path, _), digest in zip(tables, _commit_group(tables), strict=True):
            self.file_hashes[f"{OUTPUTS}/{path.name}"] = digest
        if self._on_durable is not None:
            for index, part in parts:
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
            _fsync_dir(path.parent)
        return result
    finally:
        os.close(fd)
