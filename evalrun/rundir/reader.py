"""Reading a run directory: the one reader every command that opens a run goes through.

It checks what reading needs (a run directory, a canonical record.json of a known format, the
parts it lists, chains that link, output parts of evalrun's schema) and raises
:class:`~evalrun.errors.CheckFailed` naming the file and line, or :class:`~evalrun.errors.BadInput`
for something that is not a run at all. What it reads comes back typed, as the formats of
:mod:`evalrun.records` define them: a :class:`~evalrun.records.formats.Record`, chains of
:mod:`evalrun.records.entries` entries. What a result *means* is checked by :mod:`evalrun.audit.verify`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import ValidationError

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json, json_number, sha256_hex
from evalrun.records.chain import GENESIS, link
from evalrun.records.entries import (
    Entry,
    EntryError,
    GenerationRequestRecord,
    LoglikelihoodRequestRecord,
    parse_entry,
    request_hash,
)
from evalrun.records.formats import (
    REBASELINE_FORMAT,
    RECORD_FORMAT,
    SCHEDULE_FORMAT,
    Manifest,
    Rebaseline,
    Record,
    RecordModel,
    Summary,
    first_error,
)
from evalrun.records.outputs import (
    ADDED_COLUMNS,
    CHAIN_COLUMNS,
    CHAIN_SCHEMA,
    FINAL_STATE,
    OUTPUT_SCHEMA,
    SCORE_ERROR_COLUMN,
    with_error_column,
)
from evalrun.rundir import layout, store

RecordT = TypeVar("RecordT", bound=RecordModel)


def _fail(where: str, message: str) -> CheckFailed:
    return CheckFailed(f"{where}: {message}")


def open_run(path: Path) -> layout.RunDir:
    """The run directory at ``path``; BadInput if it is not one."""
    if not path.is_dir():
        raise BadInput(str(path), "no such run directory")
    run = layout.RunDir(path)
    if not run.record.exists() and not run.manifest.exists():
        if (path / layout.GROUP).is_file() or (path / layout.CONFIG).is_file():
            tasks = sorted(p.name for p in path.iterdir() if (p / layout.MANIFEST).is_file())
            if tasks:  # a group's directory: its tasks' runs are the runs
                raise BadInput(str(path), f"a group of runs, not a run: give one of its tasks' runs, "
                                          f"{path}/TASK ({', '.join(tasks)})")  # fmt: skip
        raise BadInput(str(path), "not a run directory (expected manifest.json and record.json)")
    return run


def open_finished(path: Path) -> layout.RunDir:
    """The finished run at ``path``: record.json and its attestation written; a BadInput naming the missing one and
    the command that finishes the run otherwise."""
    run = open_run(path)
    for name in (layout.RECORD, layout.ATTESTATION):
        if not (run.path / name).is_file():
            raise BadInput(str(path), f"an incomplete run ({name} is missing): `evalrun resume {path}` finishes it")
    return run


def _json_file(run: layout.RunDir, name: str) -> Any:
    try:
        return json.loads((run.path / name).read_text(encoding="utf-8"), parse_int=json_number)
    except FileNotFoundError:
        raise _fail(name, "missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(name, f"unreadable ({exc})") from exc


def _typed(name: str, model: type[Any], value: Any) -> None:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        field, message = first_error(exc)
        raise _fail(name, f"field {field!r}: {message}") from None


def read_manifest(run: layout.RunDir) -> dict[str, Any]:
    """manifest.json, checked against :class:`~evalrun.records.formats.Manifest`, as the JSON object it is
    (its config sections are read by key: they are the config of the code that wrote them)."""
    manifest = _json_file(run, layout.MANIFEST)
    _typed(layout.MANIFEST, Manifest, manifest)
    return manifest


def read_summary(run: layout.RunDir) -> dict[str, Any]:
    """summary.json, checked against :class:`~evalrun.records.formats.Summary`."""
    summary = _json_file(run, layout.SUMMARY)
    _typed(layout.SUMMARY, Summary, summary)
    return summary


def read_config(run: layout.RunDir) -> dict[str, Any]:
    """config.yaml, the fully resolved config the run was made with, as plain data."""
    try:
        config = yaml.safe_load(run.config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(layout.CONFIG, "missing") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _fail(layout.CONFIG, f"unreadable ({exc})") from exc
    if not isinstance(config, dict):
        raise _fail(layout.CONFIG, "expected a mapping of config groups")
    return config


def read_outputs(run: layout.RunDir, columns: list[str] | None = None) -> pa.Table:
    """Every output part as one table (the columns asked for, in evalrun's schema)."""
    parts = run.output_parts()
    if not parts:
        empty = OUTPUT_SCHEMA.empty_table()
        return empty if columns is None else empty.select(columns)
    try:
        # a group of parts at a time, each group made one chunk: a chunk per part keeps (in the allocator)
        # several times the memory of its rows when a run has thousands of small parts
        groups = [parts[start : start + READ_GROUP_PARTS] for start in range(0, len(parts), READ_GROUP_PARTS)]
        # pre_buffer=False: the files are local; coalescing reads is for object stores
        return pa.concat_tables([
            pq.read_table([str(p) for p in group], columns=columns, schema=OUTPUT_SCHEMA,
                          pre_buffer=False).combine_chunks()
            for group in groups
        ])  # fmt: skip
    except (pa.ArrowException, OSError) as exc:
        raise _fail(layout.OUTPUTS, f"unreadable output parts ({exc})") from exc


READ_GROUP_PARTS = 64


def part_bytes(run: layout.RunDir, rel: str) -> bytes:
    """A file of the run directory, ``rel`` relative to it: from the directory, or, for a local working copy of a run
    on an object store, from the store (where the workers wrote their parts)."""
    path = run.path / rel
    if path.is_file():
        return path.read_bytes()
    remote = store.remote_of(run.path)
    if remote is None:
        raise _fail(rel, "missing")
    return remote.read(rel)


def decode_output_part(data: bytes, where: str, columns: list[str] | None = None) -> pa.Table:
    """An output part's bytes (as its writer has them) as a table, as :func:`read_outputs` reads the file
    ``where`` names. One small file read on its own: Parquet's dataset layer would double the cost."""
    try:
        table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise _fail(where, f"unreadable output part ({exc})") from exc
    if table.schema.names != (columns or OUTPUT_SCHEMA.names) or any(
        field.type != OUTPUT_SCHEMA.field(field.name).type for field in table.schema
    ):
        raise _fail(where, "an output part not of evalrun's schema")
    return table


REPEATED_SCORE_COLUMNS = ("task", "item_id", "metric")  # a few distinct values over many rows


def scores_columns(run: layout.RunDir) -> list[str]:
    """The columns scores.parquet holds."""
    try:
        return pq.read_schema(run.scores).names
    except FileNotFoundError:
        raise _fail(layout.SCORES, "missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise _fail(layout.SCORES, f"unreadable ({exc})") from exc


def read_scores(run: layout.RunDir, columns: list[str] | None = None, compact: bool = False) -> pa.Table:
    """scores.parquet (``columns``, or all of them in today's schema: see :func:`with_error_column`);
    ``compact``: the columns of few distinct values as dictionary arrays (the same values, a few bytes a row)."""
    dictionary = list(REPEATED_SCORE_COLUMNS) if compact else None
    try:
        if columns is None:
            return with_error_column(pq.read_table(run.scores, read_dictionary=dictionary))
        wanted = [c for c in columns if c != SCORE_ERROR_COLUMN or c in pq.read_schema(run.scores).names]
        table = pq.read_table(run.scores, columns=wanted, read_dictionary=dictionary)
        return table if wanted == columns else with_error_column(table).select(columns)
    except FileNotFoundError:
        raise _fail(layout.SCORES, "missing") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _fail(layout.SCORES, f"unreadable ({exc})") from exc


def load_record(run: layout.RunDir) -> Record:
    """record.json, typed; CheckFailed naming the field for anything :class:`Record` does not allow."""
    if not run.record.is_file():
        raise _fail(layout.RECORD, f"missing: the run is incomplete (interrupted before its end, or the file was "
                                   f"removed); `evalrun resume {run.path}` completes an interrupted run")  # fmt: skip
    return _canonical_record(run, layout.RECORD, "record", RECORD_FORMAT, Record)


def read_rebaseline(run: layout.RunDir) -> Rebaseline | None:
    """rebaseline.json, typed, or None when the run has none (docs/design.md "Re-baseline"); what it
    claims of the run (its ``new`` side) is checked by ``evalrun verify``."""
    if not run.rebaseline.is_file():
        return None
    return _canonical_record(run, layout.REBASELINE, "re-baseline", REBASELINE_FORMAT, Rebaseline)


def _canonical_record(run: layout.RunDir, name: str, kind: str, expected: str, model: type[RecordT]) -> RecordT:
    """A file holding one canonical JSON record of format ``expected``, typed by ``model``: CheckFailed
    naming the field for anything the model does not allow, BadInput for a format this code does not know."""
    text = (run.path / name).read_text(encoding="utf-8", errors="replace")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(name, f"not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(value, dict) or text != canonical_json(value) + "\n":
        raise _fail(name, "not a canonical JSON object")
    if value.get("format") != expected:
        raise BadInput(name, f"unknown {kind} format {value.get('format')!r}; expected {expected!r}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        field, message = first_error(exc)
        problem = f"missing field {field!r}" if message == "missing" else f"field {field!r}: {message}"
        raise _fail(name, problem) from None


def part_pairs(run: layout.RunDir, record: Record) -> list[tuple[str, str]]:
    """(log part, output part) relative paths; every part on disk must be listed and vice versa."""
    listed = set(record.files)
    on_disk = {f"{d}/{p.name}" for d in (layout.LOG, layout.OUTPUTS) for p in (run.path / d).glob("*") if p.is_file()}
    for rel in sorted(on_disk - listed):
        raise _fail(rel, "present in the run directory but not listed in record.json")
    for rel in sorted(r for r in listed if r.startswith((f"{layout.LOG}/", f"{layout.OUTPUTS}/")) and r not in on_disk):
        raise _fail(rel, "listed in record.json but missing")
    logs = sorted(r for r in listed if r.startswith(f"{layout.LOG}/"))
    outs = sorted(r for r in listed if r.startswith(f"{layout.OUTPUTS}/"))
    for rel in logs + outs:
        if not layout.PART_PATTERN.match(rel.split("/", 1)[1]):
            raise _fail(rel, "not a part name (part-NNNNN.jsonl / part-NNNNN.parquet)")
    pairs = []
    for log_rel in logs:
        out_rel = f"{layout.OUTPUTS}/{Path(log_rel).stem}.parquet"
        if out_rel not in listed:
            raise _fail(out_rel, f"missing: {log_rel} has no output part")
        pairs.append((log_rel, out_rel))
    if len(outs) != len(pairs) or record.parts != len(pairs):
        raise _fail(
            layout.RECORD, f"parts is {record.parts}, the run lists {len(logs)} log and {len(outs)} output parts"
        )
    return pairs


class Chain(NamedTuple):
    """One episode's chain as read: typed entries, their lines, its head, the line number it starts at."""

    episode: str
    entries: list[Entry]
    lines: list[str]
    head: str
    start: int


def iter_chains(path: Path, rel: str, known_format_only: bool = False) -> Iterator[Chain]:
    """Yield each chain of a log part, checking each link and parsing each line into its typed entry.

    A header of another schedule format fails the check; with ``known_format_only`` (replay, which
    must not interpret a schedule it does not know) it is a BadInput instead. Every failure names
    the file and line, and the episode and seq where the line has them.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if data and not data.endswith(b"\n"):
        last = data.count(b"\n") + 1
        raise _fail(f"{rel}:{last}", "truncated: the last line has no newline")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = data[: exc.start].count(b"\n") + 1
        raise _fail(f"{rel}:{line_no}", "not valid UTF-8") from exc
    episode: str | None = None
    entries: list[Entry] = []
    lines: list[str] = []
    head = GENESIS
    start = 0
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        where = f"{rel}:{number}"
        try:
            value = json.loads(line)
            eid, seq, kind, prev = value["episode"], value["seq"], value["kind"], value["prev"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise _fail(where, f"not a chain entry ({exc})") from exc
        if episode is None:
            if seq != 0 or kind != "header":
                raise _fail(where, f"episode {eid} seq {seq}: a chain must start with a header at seq 0")
            if value.get("format") != SCHEDULE_FORMAT:
                error = BadInput if known_format_only else _fail
                raise error(where, f"unknown schedule format {value.get('format')!r}; expected {SCHEDULE_FORMAT!r}")
            episode, start = eid, number
        elif eid != episode:
            raise _fail(where, f"episode {eid} seq {seq}: inside the chain of episode {episode}, which has not ended")
        elif kind == "header":
            raise _fail(where, f"episode {eid} seq {seq}: a header inside the chain")
        if seq != len(entries):
            raise _fail(where, f"episode {eid} seq {seq}: expected seq {len(entries)}")
        if prev != head:
            raise _fail(where, f"episode {eid} seq {seq}: prev does not match the hash of the entry before it")
        try:
            entry = parse_entry(value)
        except EntryError as exc:
            raise _fail(where, f"episode {eid} seq {seq}: not a valid {kind!r} entry (field {exc.field}: "
                               f"{exc.message})") from None  # fmt: skip
        _check_request(entry, line, where)
        head = link(head, line)
        entries.append(entry)
        lines.append(line)
        if kind == "end":
            yield Chain(episode, entries, lines, head, start)
            episode, entries, lines, head = None, [], [], GENESIS
    if episode is not None:
        raise _fail(f"{rel}:{start}", f"episode {episode}: chain has no end entry (truncated?)")


def _check_request(entry: Entry, line: str, where: str) -> None:
    """An effect entry's request_hash and a model call's prompt_sha256.

    ``request_hash`` is the sha256 of the request's canonical JSON, which a canonical line holds
    verbatim: the request's text in the line is hashed first (cheap), and only when that differs
    is the canonical JSON of the typed request made and hashed (a line that is not canonical, or a
    request with a nested ``request_hash`` key that hides where its text ends).
    """
    request = getattr(entry, "request", None)
    if request is None:
        return
    expected = getattr(entry, "request_hash", None)
    start = line.find('"request":') + len('"request":')
    stop = line.find(',"request_hash":"', start)
    try:
        if (stop < 0 or sha256_hex(line[start:stop]) != expected) and request_hash(request) != expected:
            raise _fail(where, f"episode {entry.episode} seq {entry.seq}: request_hash does not match the request")
        prompted = isinstance(request, GenerationRequestRecord | LoglikelihoodRequestRecord)
        if prompted and sha256_hex(request.prompt) != request.prompt_sha256:
            raise _fail(where, f"episode {entry.episode} seq {entry.seq}: prompt_sha256 does not match the prompt")
    except ValueError as exc:  # e.g. a lone surrogate escaped in a string: no UTF-8 text holds it
        problem = f"the request has no canonical JSON ({exc})"
        raise _fail(where, f"episode {entry.episode} seq {entry.seq}: {problem}") from None


def read_output_part(path: Path, rel: str) -> list[dict[str, Any]]:
    """The columns verify checks against the chain (:data:`CHAIN_COLUMNS`, and ``final_state``, whose
    hash an agent episode's chain records; null where a part predates it; and :data:`ADDED_COLUMNS`, each in the
    rows only where the part has it), checked to be of evalrun's types."""
    try:
        whole = pq.read_table(path)
        missing = [c for c in CHAIN_COLUMNS if c not in whole.column_names]
        if missing:
            raise _fail(rel, f"missing output columns {missing}")
        table = whole.select(list(CHAIN_COLUMNS))
        if not table.schema.equals(CHAIN_SCHEMA):
            wrong = next(f.name for f in table.schema if f != CHAIN_SCHEMA.field(f.name))
            raise _fail(rel, f"column {wrong!r} is not of evalrun's type {CHAIN_SCHEMA.field(wrong).type}")
        rows = table.to_pylist()
        finals = [None] * len(rows)
        if FINAL_STATE in whole.column_names:
            if whole.schema.field(FINAL_STATE).type != pa.string():
                raise _fail(rel, f"column {FINAL_STATE!r} is not of evalrun's type string")
            finals = whole.column(FINAL_STATE).to_pylist()
        for row, final in zip(rows, finals, strict=True):
            row[FINAL_STATE] = final
        for column in ADDED_COLUMNS:  # in a row only where its part has the column (verify checks it there)
            if column not in whole.column_names:
                continue
            if whole.schema.field(column).type != OUTPUT_SCHEMA.field(column).type:
                raise _fail(rel, f"column {column!r} is not of evalrun's type {OUTPUT_SCHEMA.field(column).type}")
            for row, value in zip(rows, whole.column(column).to_pylist(), strict=True):
                row[column] = value
        return rows
    except (pa.ArrowException, OSError, ValueError, IndexError, KeyError) as exc:
        raise _fail(rel, f"unreadable Parquet part ({type(exc).__name__}: {exc})") from exc
