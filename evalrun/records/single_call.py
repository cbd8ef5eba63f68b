"""Single-call chains, the common case, at speed: the encoder that writes them and the check that verifies a
part of them, side by side (docs/design.md "Record formats": two hot paths keep hand-assembled canonical text).

A single-call episode's chain is three lines (header, one model call, end). :func:`single_call_chain` writes
them as canonical text directly; :func:`check_single_call_part` checks a whole part of such chains against
its output rows by rebuilding that text, without parsing a line. Both are held to the typed entries of
:mod:`evalrun.records.entries`: the encoder by a property test (tests/test_formats.py), the check by
verify's precise path (tests/test_verify_synthetic.py: whatever passes here passes there).
"""

from __future__ import annotations

import hashlib
import json
import json.scanner
import re
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256 as _sha256
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from evalrun.records.canonical import MAX_SAFE_INTEGER, _es6_number, canonical_json
from evalrun.records.chain import GENESIS
from evalrun.records.entries import SamplingRecord
from evalrun.records.formats import SCHEDULE_FORMAT, Generator, RecordModel
from evalrun.records.outputs import (
    ADDED_COLUMNS,
    CHAIN_COLUMNS,
    CHAIN_SCHEMA,
    NULL_UNLESS_STAGED,
    OUTPUT_SCHEMA,
    STAGED_COLUMNS,
)

_string = encode_basestring  # JCS string escaping (see evalrun.records.canonical)
_FORMAT = _string(SCHEDULE_FORMAT)


def _array(values: Sequence[Any]) -> str:
    """Canonical JSON of a list of token ids or logprobs."""
    kinds = set(map(type, values))
    if kinds == _FLOAT:
        return f"[{','.join(map(_es6_number, values))}]"
    if kinds == _INT and min(values) >= -MAX_SAFE_INTEGER and max(values) <= MAX_SAFE_INTEGER:
        return f"[{','.join(map(str, values))}]"
    return canonical_json(list(values))


_FLOAT, _INT = {float}, {int}


def _integer(value: Any) -> str:
    if type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return str(value)
    return canonical_json(value)


def single_call_chain(
    episode_id: str,
    task: str,
    item: str,
    seed: int,
    repeat: int,
    seeds: str,
    generator: str,
    prompt: str,
    sampling: str,
    text: str,
    finish_reason: str,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    content: str | None = None,
    reasoning: str | None = None,
    server: str | None = None,
) -> tuple[tuple[str, str, str], str, str]:
    """The three lines of a single-call episode's chain (header, model, end), its head and its prompt's sha256.

    ``seeds``, ``generator`` and ``sampling`` come as their canonical JSON text (the caller encodes them once
    per batch or per settings). The lines are assembled directly in canonical form (keys in JCS order, every
    value through the canonical encoder), which is several times faster than building and encoding the typed
    entries; a property test (tests/test_formats.py) checks them byte for byte against the generic encoder,
    :class:`evalrun.records.chain.ChainBuilder` over :class:`HeaderEntry`, :class:`ModelEntry` and :class:`EndEntry`.
    """
    eid = _string(episode_id)
    header = (
        f'{{"episode":{eid},"format":{_FORMAT},"generator":{generator},'
        f'"item":{_string(item)},"kind":"header","prev":"{GENESIS}",'
        f'"repeat":{_integer(repeat)},"seed":{_integer(seed)},'
        f'"seeds":{seeds},"seq":0,"task":{_string(task)}}}'
    )
    h0 = _sha256(f"{GENESIS}{header}".encode()).hexdigest()
    prompt_sha256 = _sha256(prompt.encode()).hexdigest()
    request = f'{{"prompt":{_string(prompt)},"prompt_sha256":"{prompt_sha256}","sampling":{sampling}}}'
    # a reply split by a reasoning parser adds content (and reasoning, when found), absent otherwise
    split = f'"content":{_string(content)},' if content is not None else ""
    thought = f'"reasoning":{_string(reasoning)},' if reasoning is not None else ""
    served = f'"server":{server},' if server is not None else ""  # a served model's, as canonical JSON
    response = (
        f'{{{split}"finish_reason":{_string(finish_reason)},"logprobs":{_array(logprobs)},'
        f'{thought}{served}"text":{_string(text)},"token_ids":{_array(token_ids)}}}'
    )
    model = (
        f'{{"call":0,"episode":{eid},"kind":"model","prev":"{h0}","request":{request},'
        f'"request_hash":"{_sha256(request.encode()).hexdigest()}","response":{response},"seq":1}}'
    )
    h1 = _sha256(f"{h0}{model}".encode()).hexdigest()
    end = f'{{"episode":{eid},"kind":"end","model_calls":1,"prev":"{h1}","seq":2,"status":"ok"}}'
    head = _sha256(f"{h1}{end}".encode()).hexdigest()
    return (header, model, end), head, prompt_sha256


@dataclass(frozen=True)
class SingleCallPart:
    """What a part of single-call chains holds, once checked: heads by episode, entries, output tokens, and the
    sampling records its model calls used (seed left out)."""

    heads: dict[str, str]
    entries: int
    output_tokens: int
    samplings: frozenset[str]


_SEED_SLOT = re.compile(r'"seed":"[0-9]+"')
_REQUEST_HASH_KEY = '},"request_hash":"'
_TAIL = len(_REQUEST_HASH_KEY) + 64
_SCALAR_COLUMNS = ["episode_id", "task", "item_id", "seed", "repeat", "prompt", "prompt_sha256", "output",
                   "token_ids", "token_logprobs", "finish_reason", "output_tokens", "head"]  # fmt: skip


def check_single_call_part(log_data: bytes, out_data: bytes) -> SingleCallPart | None:
    """The common case without parsing a line; None sends the part down verify's precise path.

    It accepts a part only when its chains are, in row order, exactly the three lines that
    :func:`single_call_chain` writes, each byte for byte the canonical text rebuilt from its output
    row, apart from four slots checked no less strictly than the precise path checks them: the
    generator (the canonical JSON of a valid :class:`Generator`), the request's sampling record (the
    canonical JSON of a valid :class:`SamplingRecord`; it is hashed into request_hash), request_hash
    (recomputed from the request's text, which is then canonical, as the precise path recomputes it
    from the canonical request) and the response's logprobs (numbers or nulls, no booleans, parsed
    with ``json.loads`` and compared with ``==`` to the row's list, which holds finite numbers or
    nulls, as the precise path compares them). Whatever passes here passes there
    (tests/test_verify_synthetic.py checks both paths agree); anything else, broken or merely
    unusual, goes to the precise path, which names the first broken thing.
    """
    try:
        return _fast_part(log_data, out_data)
    except Exception:  # any surprise (a null, a wrong type, unreadable bytes): the precise path decides
        return None


def _fast_part(log_data: bytes, out_data: bytes) -> SingleCallPart | None:
    if not log_data.endswith(b"\n"):
        return None
    lines = log_data.decode("utf-8").split("\n")
    lines.pop()  # after the last newline
    # the added columns a part has (one written before a column was added lacks it: it holds nothing to check)
    parquet = pq.ParquetFile(pa.BufferReader(out_data))
    added = [c for c in ADDED_COLUMNS if c in parquet.schema_arrow.names]
    table = parquet.read(columns=[*CHAIN_COLUMNS, *added])
    expected = pa.schema([*CHAIN_SCHEMA, *(OUTPUT_SCHEMA.field(c) for c in added)])
    if not table.schema.equals(expected):  # so a column holds its type's values or nulls, never another type's
        return None
    if pc.any(pc.invert(pc.is_finite(pc.list_flatten(table.column("token_logprobs"))))).as_py():
        return None  # a logprob no canonical line can hold
    low, high = pc.min_max(table.column("seed")).as_py().values()
    if low is not None and not -MAX_SAFE_INTEGER <= low <= high <= MAX_SAFE_INTEGER:
        return None  # nor a seed beyond JSON's exact integers
    n = table.num_rows
    if len(lines) != 3 * n:
        return None
    for column in STAGED_COLUMNS:  # a single-call episode has none of these; any content goes the precise way
        if column not in table.column_names:
            continue  # an added column the part predates
        values = table.column(column)
        if column in NULL_UNLESS_STAGED:
            if values.null_count != n:
                return None
        elif values.null_count or pc.sum(pc.list_value_length(values)).as_py() not in (0, None):
            return None
    # Columns in bulk, each as one Python list; the struct column ``seeds`` only by its field, so
    # no dict is made per row (a null struct sends the part to the precise path).
    seeds = table.column("seeds")
    if seeds.null_count:
        return None
    sampling_seeds = [s for c in seeds.chunks for s in c.field("sampling").to_pylist()]
    eids, tasks, items, seed_col, repeats, prompts, prompt_shas, texts, token_ids_col, logprobs_col, finishes, \
        n_outs, row_heads = (table.column(c).to_pylist() for c in _SCALAR_COLUMNS)  # fmt: skip
    if len(set(eids)) != n:
        return None
    # Integer columns hold ints or nulls (the schema is checked); a null encodes as "None", which no
    # canonical line holds where a number or a string is expected.
    texts_by_row = zip(
        map(_string, eids), map(_string, tasks), map(_string, items), map(str, seed_col), map(str, repeats),
        map(_string, map(str, sampling_seeds)), prompts, map(_string, prompts), prompt_shas, map(_string, texts),
        token_ids_col, logprobs_col, map(_string, finishes), n_outs, row_heads, strict=True,
    )  # fmt: skip
    sha256 = hashlib.sha256
    loads = _json_value
    generators: set[str] = set()  # generator texts found to be canonical records
    samplings: set[tuple[str, ...]] = set()  # sampling records, seed left out, found to be canonical records
    heads: list[str] = []
    tokens = 0
    triples = iter(lines)
    for (episode, task, item, seed, repeat, sampling_seed, prompt, prompt_text, prompt_sha, text, token_ids, logprobs,
         finish, n_out, row_head), header, model, end in zip(texts_by_row, triples, triples, triples,
                                                             strict=True):  # fmt: skip
        pre = f'{{"episode":{episode},"format":{_FORMAT},"generator":'
        post = (
            f',"item":{item},"kind":"header","prev":"{GENESIS}","repeat":{repeat},'
            f'"seed":{seed},"seeds":{{"sampling":{sampling_seed}}},"seq":0,"task":{task}}}'
        )
        if len(header) <= len(pre) + len(post) or not (header.startswith(pre) and header.endswith(post)):
            return None
        generator = header[len(pre) : len(header) - len(post)]
        if generator not in generators:
            _check_canonical(Generator, generator)
            generators.add(generator)
        h0 = sha256(f"{GENESIS}{header}".encode()).hexdigest()

        if n_out != len(token_ids) or sha256(prompt.encode()).hexdigest() != prompt_sha:
            return None
        # prompt_sha is now 64 lowercase hex digits: its JSON string needs no escaping
        pre = (
            f'{{"call":0,"episode":{episode},"kind":"model","prev":"{h0}","request":{{"prompt":{prompt_text},'
            f'"prompt_sha256":"{prompt_sha}","sampling":'
        )
        # token ids are int32 (within JSON's safe integers); a null gives "None" and no match
        post = f',"text":{text},"token_ids":[{",".join(map(str, token_ids))}]}},"seq":1}}'
        response = f'","response":{{"finish_reason":{finish},"logprobs":'
        stop = len(model) - len(post)
        if not (model.startswith(pre) and model.endswith(post)):
            return None
        # The logprobs slot ends where ``post`` begins. If it parses to the row's list (numbers or
        # nulls), it holds no '"', so the last ``response`` before it is the one that precedes it.
        at = model.rfind(response, len(pre) + _TAIL, stop)
        logprobs_text = model[at + len(response) : stop]
        if at < 0 or "t" in logprobs_text or "f" in logprobs_text or loads(logprobs_text) != logprobs:
            return None  # ("t" or "f": a boolean, which equals a number but is not one)
        middle = model[len(pre) : at]  # sampling record, request_hash key, request_hash
        request_hash = middle[-64:]
        if middle[-_TAIL:-64] != _REQUEST_HASH_KEY:
            return None
        marker = model.find('"request":')  # as _check_model_entry finds the request
        request_end = model.find(',"request_hash":"', marker)
        if marker < 0 or request_end < 0:
            return None
        if sha256(model[marker + len('"request":') : request_end].encode()).hexdigest() != request_hash:
            return None
        sampling = middle[:-_TAIL]
        # The record with any digits as its seed is a canonical record if it is with "0".
        slot = _SEED_SLOT.search(sampling)
        key = (sampling[: slot.start()], sampling[slot.end() :]) if slot else (sampling,)
        if key not in samplings:
            _check_canonical(SamplingRecord, '"seed":"0"'.join(key) if slot else sampling)
            samplings.add(key)
        h1 = sha256(f"{h0}{model}".encode()).hexdigest()

        if end != f'{{"episode":{episode},"kind":"end","model_calls":1,"prev":"{h1}","seq":2,"status":"ok"}}':
            return None
        if sha256(f"{h1}{end}".encode()).hexdigest() != row_head:
            return None
        heads.append(row_head)
        tokens += n_out
    return SingleCallPart(heads=dict(zip(eids, heads, strict=True)), entries=3 * n, output_tokens=tokens,
                          samplings=frozenset('"seed":"0"'.join(key) for key in samplings))  # fmt: skip


def _check_canonical(model: type[RecordModel], text: str) -> None:
    """Raise unless ``text`` is the canonical JSON of a valid ``model`` record."""
    if canonical_json(model.model_validate_json(text).as_record()) != text:
        raise ValueError(f"not the canonical JSON of a {model.__name__}")


# Integers read as doubles, as RFC 8785 reads every number (canonical JSON writes 2.5e16 as 25000000000000000).
_scan_once = json.scanner.make_scanner(json.JSONDecoder(parse_int=float))  # type: ignore[attr-defined]


def _json_value(text: str) -> Any:
    """``json.loads(text)``, integers as floats, for text that is exactly one JSON value (no surrounding whitespace).

    Stricter than ``json.loads`` (whitespace raises), which is fine here: a raise sends the part to
    the precise path.
    """
    try:
        value, end = _scan_once(text, 0)
    except StopIteration as exc:  # the scanner's way of saying "no JSON value here"
        raise ValueError("not a JSON value") from exc
    if end != len(text):
        raise ValueError("not one JSON value")
    return value
