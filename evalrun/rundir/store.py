"""Where a run directory lives: a path on a local or shared file system, or an S3-compatible object store.

A :class:`Store` holds a run directory's files under names relative to its root (``outputs/part-00001.parquet``)
and commits each file whole or not at all: on a file system a temporary name, fsync, rename and a directory
fsync; on an object store one PUT, which the store makes visible whole. A backend is one class registered by
the scheme of the locations it serves (``@store("s3")``); a plain path is ``file``. Engine workers that write
their own parts open the run's store from its location (:func:`open_store`), so a location is plain text that
crosses to any node.

A run on an object store is made and read through a local working copy (docs/design.md "Run directories on
shared storage"): the driver's files are committed into a local directory registered with :func:`stage`, and
every file committed there is put to the store as well (:func:`published_to`); the workers put their parts
straight into the store. The read commands copy the run into a fresh local directory first
(:func:`snapshot`): every one of them reads every byte it checks anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from evalrun.config.registry import Registry
from evalrun.errors import BadInput, WriteFailed, write_failed
from evalrun.records.canonical import canonical_json, file_sha256, sha256_hex

Data = bytes | Callable[[BinaryIO], None]  # a file's bytes, or what a function writes into the open file
LOCK_NAME = ".lock"  # the run's lock (evalrun.rundir.layout.LOCK is this name)
CONFIG_NAME = "config.yaml"  # a run's or group's config (evalrun.rundir.layout.CONFIG is this name)


class Store(Protocol):
    """A run directory's files, by name relative to its root."""

    location: str  # what a user gives to name it (a path, or a URI such as s3://bucket/prefix/run)

    def commit(self, files: list[tuple[str, Data]]) -> list[str]:
        """Commit ``files`` in order, each whole or not at all; their sha256s. A failure raises WriteFailed."""
        ...

    def read(self, rel: str) -> bytes: ...

    def names(self) -> list[str]:
        """Every file under the root, as relative names in sorted order."""
        ...

    def exists(self) -> bool:
        """Whether anything is under the root."""
        ...

    def remove(self, rel: str) -> None: ...

    def child(self, name: str) -> Store: ...

    def acquire(self, holder: str) -> None:
        """Take the run's lock (:data:`LOCK_NAME`) for ``holder``; BadInput naming who holds it otherwise."""
        ...

    def release(self) -> None: ...

    def unlock(self) -> str | None:
        """Remove the lock a driver that died left (``evalrun unlock``): who held it, or None when none was held; a
        BadInput naming a holder still at work."""
        ...

    def check_writable(self, field: str) -> None:
        """BadInput naming ``field`` unless a run directory can be made under the root (before engines load)."""
        ...


S = TypeVar("S", bound=type)
STORES: Registry[Callable[[str, dict[str, str]], Store]] = Registry("store", field="run.root")


def store(scheme: str) -> Callable[[S], S]:
    """Register a store class for locations ``SCHEME://...``: ``cls(rest, options)`` opens one, ``rest`` being the
    location without its scheme and query, ``options`` the query's parameters."""

    def register(cls: S) -> S:
        STORES.add(scheme, cls)
        return cls

    return register


def scheme_of(location: str) -> str:
    """``s3`` for ``s3://...``; ``file`` for a plain path (or ``file://``)."""
    head, sep, _ = location.partition("://")
    return head.lower() if sep and head.isalnum() else "file"


def is_remote(location: str) -> bool:
    """Whether ``location`` names an object store rather than a path."""
    return scheme_of(location) != "file"


_OPENED: dict[str, Store] = {}
_OPENED_LOCK = threading.Lock()


def open_store(location: str, field: str = "run.root") -> Store:
    """The store at ``location`` (one object per location and process: a worker opens its run's store once)."""
    with _OPENED_LOCK:
        if location not in _OPENED:
            scheme = scheme_of(location)
            parts = urlsplit(location) if scheme != "file" else None
            if parts is None:
                rest, options = location.removeprefix("file://"), {}
            else:
                rest, options = f"{parts.netloc}{parts.path}", dict(parse_qsl(parts.query))
            _OPENED[location] = STORES.get(scheme, field)(rest, options)
        return _OPENED[location]


def join(location: str, name: str) -> str:
    """The location of ``name`` under ``location`` (a URI keeps its query, which says how to reach the store)."""
    if not is_remote(location):
        return str(Path(location) / name)
    parts = urlsplit(location)
    path = f"{parts.path.rstrip('/')}/{name}"
    return parts._replace(path=path).geturl()


# --- files on a (local or shared) file system ----------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: Data) -> None:
    """``data``, or what ``data(file)`` writes, in ``path``, fsynced."""
    with open(path, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def commit_files(paths: list[tuple[Path, Data]]) -> list[str]:
    """Commit files into one directory: every temporary written and fsynced, then renamed, then the
    directory fsynced once; returns their sha256s. A failure removes the temporaries not yet renamed.
    A file already there under the name is replaced whole (os.replace): a part a killed worker left is."""
    temporaries = [(path.with_name(f".tmp-{path.name}"), path) for path, _ in paths]
    at = paths[0][0]
    try:
        for (tmp, path), (_, data) in zip(temporaries, paths, strict=True):
            at = path
            _write_synced(tmp, data)
        for tmp, path in temporaries:
            at = path
            os.replace(tmp, path)
        fsync_dir(at.parent)  # ``at``: the last file renamed, which this makes durable
    except BaseException as exc:
        for tmp, _ in temporaries:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_failed(at, exc) from exc
        raise
    return [file_sha256(path) if callable(data) else sha256_hex(data) for path, data in paths]


@store("file")
class LocalStore:
    """A directory on a file system this process sees: local, or shared by every node (NFS, Lustre, a cloud file
    store), where a rename within a directory is atomic and fsync makes a file durable."""

    def __init__(self, rest: str, options: dict[str, str] | None = None) -> None:
        if options:
            raise BadInput("run.root", f"a path takes no ?{urlencode(options)}")
        self.root = Path(rest)
        self.location = str(self.root)
        self._lock: Any = None

    def commit(self, files: list[tuple[str, Data]]) -> list[str]:
        if not self.root.is_dir():  # never made here: a worker on a node that does not see the run's file system
            raise WriteFailed(str(self.root), "the run directory is not there on this node: with run.part_writes="
                                              "workers, run.root must be a file system every node sees (or run."
                                              "part_writes=driver)")  # fmt: skip
        by_folder: dict[Path, list[int]] = {}
        for i, (rel, _) in enumerate(files):
            by_folder.setdefault((self.root / rel).parent, []).append(i)
        digests = [""] * len(files)
        for folder, indices in by_folder.items():  # in order of first appearance: a log part before its output
            folder.mkdir(parents=True, exist_ok=True)
            for i, digest in zip(indices, commit_files([(self.root / files[i][0], files[i][1]) for i in indices]),
                                 strict=True):  # fmt: skip
                digests[i] = digest
        return digests

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def names(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def exists(self) -> bool:
        return self.root.exists()

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    def child(self, name: str) -> LocalStore:
        return LocalStore(str(self.root / name))

    def acquire(self, holder: str) -> None:
        import fcntl

        path = self.root / LOCK_NAME
        try:
            fh = open(path, "a+")  # noqa: SIM115 - closed by release()
        except OSError as exc:
            raise write_failed(path, exc) from exc
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            held_by = fh.read().strip() or "unknown"
            fh.close()
            message = f"another evalrun driver (pid {held_by}) is using this run directory"
            raise BadInput(str(self.root), message) from None
        fh.seek(0)
        fh.truncate()
        fh.write(holder)
        fh.flush()
        self._lock = fh

    def release(self) -> None:
        """The lock file removed, then closed: ``flock`` is released by the kernel when its holder dies, so a crashed
        driver never leaves a held lock behind."""
        if self._lock is not None:
            (self.root / LOCK_NAME).unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def unlock(self) -> str | None:
        """Nothing to remove: a dead driver's ``flock`` went with it. A held one is a driver at work (BadInput)."""
        if not self.root.is_dir():
            raise BadInput(str(self.root), "no such run directory")
        self.acquire(holder())
        self.release()
        return None

    def check_writable(self, field: str) -> None:
        base = self.root.absolute()
        while not base.exists() and base != base.parent:
            base = base.parent
        if not base.is_dir():
            raise BadInput(field, f"{base} is not a directory; choose another {field}")
        read_only = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
        if read_only or not os.access(base, os.W_OK | os.X_OK):
            why = "is on a read-only file system" if read_only else "is not writable"
            raise BadInput(field, f"{base} {why}; choose another {field} or make it writable")


# --- S3-compatible object stores ------------------------------------------------------------------------------------


@store("s3")
class S3Store:
    """``s3://BUCKET/PREFIX[?endpoint_url=URL]``, through fsspec's s3fs (imported here only). Credentials come from
    the usual AWS chain on each node (environment, ``~/.aws``, an instance role), never from the location, which
    config.yaml records; ``endpoint_url`` names an S3-compatible server other than AWS's (MinIO, Ceph, moto).

    A PUT is atomic: a reader sees the whole object or none, and a second PUT under a name replaces it whole. The
    lock is an exclusive PUT (``If-None-Match: *``) of ``.lock``: the store refuses it while the object exists. A
    driver that dies leaves it, which no store can release on its own: the error names it and how to remove it.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = ("endpoint_url",)

    def __init__(self, rest: str, options: dict[str, str]) -> None:
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise BadInput("run.root", f"s3:// takes only ?{'&'.join(f'{o}=...' for o in self.OPTIONS)}, got "
                                       f"{unknown[0]!r}")  # fmt: skip
        self.root = rest.strip("/")
        if not self.root or self.root.startswith("/"):
            raise BadInput("run.root", "expected s3://BUCKET[/PREFIX]")
        self.options = dict(options)
        query = f"?{urlencode(options, safe=':/')}" if options else ""
        self.location = f"s3://{self.root}{query}"
        self._fs: Any = None
        self._held = False

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import s3fs

            client: dict[str, Any] = {}
            if "endpoint_url" in self.options:
                client["endpoint_url"] = self.options["endpoint_url"]
            # a store that does not answer is an error within seconds, not after botocore's long default retries
            config = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}
            self._fs = s3fs.S3FileSystem(client_kwargs=client, config_kwargs=config, use_listings_cache=False,
                                         skip_instance_cache=True)  # fmt: skip
        return self._fs

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def commit(self, files: list[tuple[str, Data]]) -> list[str]:
        digests = []
        for rel, data in files:
            if callable(data):  # written piece by piece: spooled to a local temporary file, then one PUT
                with tempfile.TemporaryFile() as spool:
                    data(spool)
                    spool.seek(0)
                    body = spool.read()
            else:
                body = data
            try:
                self.fs.pipe_file(self._key(rel), body)
            except Exception as exc:  # botocore's, aiohttp's or s3fs's: named with the object it was putting
                raise write_failed(self.describe(rel), OSError(0, _first_line(exc))) from exc
            digests.append(sha256_hex(body))
        return digests

    def describe(self, rel: str) -> str:
        return join(self.location, rel)

    def read(self, rel: str) -> bytes:
        return bytes(self.fs.cat_file(self._key(rel)))

    def names(self) -> list[str]:
        prefix = f"{self.root}/"
        try:
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        return sorted(key[len(prefix) :] for key in found if key.startswith(prefix))

    def exists(self) -> bool:
        return bool(self.names())

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(rel))

    def child(self, name: str) -> S3Store:
        return S3Store(f"{self.root}/{name}", self.options)

    def acquire(self, holder: str) -> None:
        try:
            self.fs.pipe_file(self._key(LOCK_NAME), holder.encode("utf-8"), mode="create")
        except (FileExistsError, OSError) as exc:
            if not _precondition_failed(exc):
                raise write_failed(self.describe(LOCK_NAME), OSError(0, _first_line(exc))) from exc
            try:
                held_by = self.read(LOCK_NAME).decode("utf-8", "replace").strip() or "unknown"
            except Exception:
                held_by = "unknown"
            message = (f"another evalrun driver ({held_by}) is using this run directory; if it died, "
                       f"`evalrun unlock {self.location}` removes its lock ({self.describe(LOCK_NAME)}); then run "
                       "again")  # fmt: skip
            raise BadInput(self.location, message) from None
        self._held = True

    def release(self) -> None:
        if self._held:
            self.remove(LOCK_NAME)
            self._held = False

    def unlock(self) -> str | None:
        """The lock removed, unless it names a process of this host that is running (no store can tell whether a
        driver on another node is: the user who runs this says it died)."""
        try:
            held_by = self.read(LOCK_NAME).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        if _running_here(held_by):
            raise BadInput(self.location, f"its lock is held by a driver that is running on this host ({held_by}); "
                                          "stop it first, or let it finish")  # fmt: skip
        self.remove(LOCK_NAME)
        return held_by or "unknown"

    def check_writable(self, field: str) -> None:
        """The bucket answers and these credentials may list and write under the root: a probe object is put and
        removed (an endpoint that does not answer, a bucket that does not exist or credentials it refuses are one
        line naming ``field``)."""
        probe = f".evalrun-probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            self.fs.ls(self.root.split("/", 1)[0], detail=False)
            self.fs.pipe_file(self._key(probe), b"")
            self.fs.rm_file(self._key(probe))
        except Exception as exc:
            raise BadInput(
                field,
                f"{self.location}: the object store cannot be written there ({_first_line(exc)}); "
                "check the bucket, endpoint_url and the AWS credentials of this machine",
            ) from None


def _running_here(held_by: str) -> bool:
    """Whether a lock's holder (:func:`holder`'s text) is a process of this host that is running."""
    try:
        named = json.loads(held_by)
        pid = int(named["pid"]) if named.get("host") == socket.gethostname() else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # running, as another user
    return True


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (from an exclusive PUT) says the object exists: s3fs raises FileExistsError, or an OSError
    holding the store's 412 PreconditionFailed."""
    text = f"{type(exc).__name__} {exc}"
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in text or "412" in text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --- local working copies of runs on an object store -------------------------------------------------------------

_STAGED: dict[Path, Store] = {}  # a local working copy's root -> the store whose run it holds
_STAGED_LOCK = threading.Lock()


def stage(local: Path, remote: Store) -> None:
    """From now on in this process, a file committed under ``local`` is put to ``remote`` under the same name."""
    with _STAGED_LOCK:
        _STAGED[local.resolve()] = remote


def published_to(path: Path) -> tuple[Store, str] | None:
    """The store a file committed at ``path`` is put to, and its name there; None for a file of no staged run."""
    if not _STAGED:
        return None
    resolved = path.resolve()
    for parent in resolved.parents:
        remote = _STAGED.get(parent)
        if remote is not None:
            return remote, resolved.relative_to(parent).as_posix()
    return None


def remove_committed(path: Path) -> None:
    """Remove a committed file; from a working copy of a run on an object store, from the store as well (a resumed
    run drops what it will write again, and a worker's log part whose output part never came)."""
    path.unlink(missing_ok=True)
    published = published_to(path)
    if published is not None:
        remote, rel = published
        remote.remove(rel)


def remote_of(local: Path) -> Store | None:
    """The store whose run ``local`` is a working copy of, or None. A directory within a working copy (a task's run
    in a group's directory) is the store's directory of the same name: its workers put their parts there, and its
    lock is taken there."""
    if not _STAGED:
        return None
    own = _STAGED.get(local.resolve())
    if own is not None:
        return own
    published = published_to(local)
    if published is None:
        return None
    remote, rel = published
    return open_store(join(remote.location, rel))


def staged_copy(location: str) -> Path | None:
    """Where ``location`` is in this process's working copies: the copy staged for it, or the directory of its name
    within a copy staged for a location above it (a task's run within its group's); None if neither."""
    if not _STAGED or not is_remote(location):
        return None
    path, _, query = open_store(location).location.partition("?")
    with _STAGED_LOCK:
        staged = sorted(((remote.location.partition("?"), local) for local, remote in _STAGED.items()), reverse=True)
    for (base, _, base_query), local in staged:  # the nearest first: a longer location sorts after its prefix
        if base_query != query:
            continue
        if path == base:
            return local
        if path.startswith(f"{base}/"):
            return local.joinpath(*path[len(base) + 1 :].split("/"))
    return None


def location_of(path: Path) -> str:
    """What to show a user for a run directory: its store's location for a working copy, else the path."""
    remote = remote_of(path)
    return str(path) if remote is None else remote.location


def in_locations(text: str) -> str:
    """``text`` (a message for the user) with each path within a working copy written as its store's location: the
    copy is this process's, and is gone when it ends."""
    if not _STAGED:
        return text
    with _STAGED_LOCK:
        staged = sorted(_STAGED.items(), key=lambda item: len(str(item[0])), reverse=True)
    for local, remote in staged:

        def location(found: re.Match[str], remote: Store = remote) -> str:
            rel = found.group(1).strip("/")
            stop = rel.rstrip(".")  # a sentence's full stop is not the file's
            return (join(remote.location, stop) if stop else remote.location) + rel[len(stop) :]

        text = re.sub(rf"{re.escape(str(local))}((?:/[^\s:;,'\"`()]+)*)/?", location, text)
    return text


def staging_root() -> Path:
    """Where working copies of runs on object stores are made: ``$EVALRUN_STAGING`` or the system's temporary
    directory."""
    return Path(os.environ.get("EVALRUN_STAGING") or tempfile.gettempdir())


def new_working_copy(remote: Store, name: str) -> Path:
    """An empty local directory staged for ``remote`` (the run ``name`` on it)."""
    staging_root().mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="evalrun-", dir=staging_root())) / name
    local.mkdir()
    stage(local, remote)
    return local


def working_copy(remote: Store) -> Path:
    """The local directory that is ``remote``'s in this process: where :func:`staged_copy` finds it (a task's run
    within its group's copy), else a new working copy staged for it."""
    found = staged_copy(remote.location)
    return found if found is not None else new_working_copy(remote, Path(remote.location.split("?")[0]).name)


def snapshot(location: str, field: str = "RUN_DIR") -> Path:
    """A run on an object store copied into a new local working copy (staged: what a command then commits into it,
    a rescore's results or a report, is put back to the store). Every file under the run's root is copied, so
    verify still finds a file no run writes; the lock of a driver at work is not (the run is then incomplete)."""
    remote = open_store(location, field)
    try:
        names = remote.names()
    except Exception as exc:
        raise BadInput(field, f"{location}: the object store cannot be read ({_first_line(exc)})") from None
    if not names:
        raise BadInput(field, f"{location}: no such run directory (nothing is stored under it)")
    local = new_working_copy(remote, Path(remote.location.split("?")[0].rstrip("/")).name or "run")
    _copy_missing(remote, names, local)
    return local


def fetch_missing(local: Path) -> None:
    """Copy into a working copy what its store holds and it does not: the parts the workers put straight into the
    store, before a command on the driver reads the whole run (the report that `evalrun run` writes verifies it)."""
    remote = remote_of(local)
    if remote is not None:
        _copy_missing(remote, remote.names(), local)


def _copy_missing(remote: Store, names: list[str], local: Path) -> None:
    """The store's files ``names`` that ``local`` lacks, copied into it (the locks of runs, the run's and those of a
    group's tasks, and any name that would land outside it, left out: any other file, a stray ``.lock`` too, is
    copied for verify to refuse)."""
    present = set(names)
    for rel in names:
        folder, _, name = rel.rpartition("/")
        run_lock = name == LOCK_NAME and (not folder or f"{folder}/{CONFIG_NAME}" in present)
        target = (local / rel).resolve()
        if run_lock or local.resolve() not in target.parents or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(remote.read(rel))


def discard(local: Path) -> None:
    """Remove a working copy (its store keeps the run)."""
    with _STAGED_LOCK:
        _STAGED.pop(local.resolve(), None)
    shutil.rmtree(local.parent if local.parent.name.startswith("evalrun-") else local, ignore_errors=True)


def holder() -> str:
    """Who takes a lock: this process, for the error a second driver gets."""
    return canonical_json({"host": socket.gethostname(), "pid": os.getpid()})
