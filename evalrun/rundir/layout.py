"""The run directory's names and paths: the contract every writer and reader of a run shares.

See docs/design.md "The run directory".
"""

from __future__ import annotations

import re
from pathlib import Path

from evalrun.errors import BadInput, write_failed
from evalrun.rundir import store

MANIFEST = "manifest.json"
CONFIG = store.CONFIG_NAME
OUTPUTS = "outputs"
LOG = "log"
SCORES = "scores.parquet"
SUMMARY = "summary.json"
RECORD = "record.json"
ATTESTATION = "attestation.intoto.json"
GROUP = "group.json"  # a group's record over its tasks' runs, GROUP_DIR/TASK (evalrun.pipeline.groups)
REBASELINE = "rebaseline.json"  # written by `evalrun rebaseline` into a sealed run: not in record.json
LOCK = store.LOCK_NAME  # present only while a driver holds it
# A derived view of the run (``evalrun report``), written after the attestation: not hashed, not
# listed in record.json, accepted by verify (docs/design.md "Report").
REPORT = "report.html"
# evalrun rescore writes RESCORE/<16 hex digits of the scoring hash>/{SCORES, SUMMARY, RESCORER}
RESCORE = "rescore"
RESCORER = "scorer.json"
# The engine's and Ray's log lines, LOGS/<name>.log per worker (and "driver"): provenance, written before
# record.json (which lists them in ``logs``), hashed nowhere, accepted by verify (docs/design.md "Logs").
# Not to be confused with LOG, the episodes' chains.
LOGS = "logs"
LOG_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.log$")
# The model files a run's rendering and parsing read (its tokenizer and chat template), copied in when the run
# starts and hashed in record.json: a replay renders prompts, counts tokens and parses tool calls with them
# when the model directory is gone. Only those the model has.
TOKENIZER = "tokenizer"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "config.json", "generation_config.json",
)  # fmt: skip
PART_PATTERN = re.compile(r"^part-(\d{5})\.(parquet|jsonl)$")
# What the run had committed at moments of its generation (records.formats.Checkpoint), written while it runs and
# listed in record.json: CHECKPOINTS/checkpoint-SEQ.json
CHECKPOINTS = "checkpoints"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d{6})\.json$")


def part_names(index: int) -> tuple[str, str]:
    """Part ``index``'s log part and output part, relative to the run directory (a worker that writes its own parts
    names them so too)."""
    return f"{LOG}/part-{index:05d}.jsonl", f"{OUTPUTS}/part-{index:05d}.parquet"


class RunDir:
    """Paths of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    manifest = property(lambda self: self.path / MANIFEST)
    config = property(lambda self: self.path / CONFIG)
    outputs = property(lambda self: self.path / OUTPUTS)
    log = property(lambda self: self.path / LOG)
    scores = property(lambda self: self.path / SCORES)
    summary = property(lambda self: self.path / SUMMARY)
    record = property(lambda self: self.path / RECORD)
    rebaseline = property(lambda self: self.path / REBASELINE)
    report = property(lambda self: self.path / REPORT)
    logs = property(lambda self: self.path / LOGS)
    tokenizer = property(lambda self: self.path / TOKENIZER)
    checkpoints = property(lambda self: self.path / CHECKPOINTS)

    def checkpoint(self, seq: int) -> Path:
        return self.checkpoints / f"checkpoint-{seq:06d}.json"

    def checkpoint_files(self) -> list[Path]:
        """The run's checkpoint files, in order (none when it has no checkpoints folder)."""
        found = self.checkpoints.glob("checkpoint-*.json") if self.checkpoints.is_dir() else ()
        return sorted(p for p in found if CHECKPOINT_PATTERN.match(p.name))

    def log_file(self, name: str) -> Path:
        """LOGS/<name>.log; a name that would not make a log file's name is a ValueError."""
        if not LOG_FILE.match(f"{name}.log"):
            raise ValueError(f"{name!r} cannot name a log file")
        return self.logs / f"{name}.log"

    def output_part(self, index: int) -> Path:
        return self.path / part_names(index)[1]

    def log_part(self, index: int) -> Path:
        return self.path / part_names(index)[0]

    def output_parts(self) -> list[Path]:
        return sorted(p for p in self.outputs.glob("part-*.parquet") if PART_PATTERN.match(p.name))


def check_destination(field: str, where: str | Path, exact: bool) -> None:
    """Before anything loads: a new run directory can be made at ``where`` (``exact``: ``where`` itself,
    which must not hold files; else a directory under it), a path or a store's location
    (:mod:`evalrun.rundir.store`). A BadInput names ``field`` and what to do."""
    location = str(where)
    if store.is_remote(location):
        remote = store.open_store(location, field)
        remote.check_writable(field)
        if exact and remote.exists():
            raise BadInput(field, f"{location} already holds files; choose another run.dir")
        return
    path = Path(location)
    if exact and path.exists():
        if not path.is_dir():
            raise BadInput(field, f"{path} exists and is not a directory; choose another run.dir")
        if any(path.iterdir()):
            raise BadInput(field, f"{path} already exists and is not empty; choose another run.dir "
                                  f"(or `evalrun resume {path}` to finish a run there)")  # fmt: skip
    store.LocalStore(str(path if not exact or path.exists() else path.parent)).check_writable(field)


def free_path(root: Path, name: str) -> Path:
    """``root/name``, or ``root/name-k`` with the first k >= 2 that is not taken: where a new run (or group of
    runs) goes."""
    path, k = root / name, 1
    while path.exists():
        k += 1
        path = root / f"{name}-{k}"
    return path


def create_run_dir(root: str | Path, name: str, exact: str | Path | None = None) -> RunDir:
    """A new, empty run directory: ``exact`` if given (it must not hold a run), else ``root/name[-k]``. On an object
    store, a local working copy staged for it (:func:`evalrun.rundir.store.working_copy`): what is committed
    into the copy is put to the store."""
    if store.is_remote(str(exact if exact is not None else root)):
        path = _remote_copy(str(exact) if exact is not None else None, str(root), name)
    elif exact is not None:
        exact = Path(exact)
        if exact.exists() and any(exact.iterdir()):
            raise BadInput("run.dir", f"{exact} already exists and is not empty")
        path = exact
    else:
        path = free_path(Path(root), name)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / OUTPUTS).mkdir()
        (path / LOG).mkdir()
    except OSError as exc:
        raise write_failed(exc.filename or path, exc) from exc
    return RunDir(path)


def _remote_copy(exact: str | None, root: str, name: str) -> Path:
    """Where a new run on an object store is made: its local working copy (:func:`store.working_copy`)."""
    if exact is not None:
        remote = store.open_store(exact, "run.dir")
        if remote.exists():
            raise BadInput("run.dir", f"{exact} already holds files")
    else:
        remote = free_location(root, name)
    return store.working_copy(remote)


def free_location(root: str, name: str) -> store.Store:
    """``root/name``, or ``root/name-k`` with the first k >= 2 under which the store holds nothing: where a new run
    (or group of runs) on an object store goes."""
    base, k, remote = store.open_store(root), 1, None
    while remote is None or remote.exists():
        remote = base.child(name if k == 1 else f"{name}-{k}")
        k += 1
    return remote
