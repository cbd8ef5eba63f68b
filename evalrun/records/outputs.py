"""The output row (``outputs/part-NNNNN.parquet``, one row per episode) and the score row
(``scores.parquet``, one row per episode and metric), defined once.

Each row is a typed model whose fields carry their Arrow types; the Parquet schemas
(:data:`OUTPUT_SCHEMA`, :data:`SCORES_SCHEMA`) and the columns ``evalrun verify`` checks against the
chain (:data:`CHAIN_COLUMNS`) are derived from them. Writers build columns in bulk from the same
schemas (no model per row on the hot path).

Where an output column comes from:

* ``chain``: a copy of something the episode's chain records; verify checks each against it.
* ``plan``: from the plan, not recorded in the chain (the target).
* ``engine``: reported by the engine, not recorded in the chain (prompt tokens).
* ``provenance``: may differ between identical runs (worker, hardware, batch size, latency).
* ``world``: an agent episode's final world state (canonical JSON; null for other episodes); the
  chain's end entry records its sha256, which verify checks.
* ``added``: a copy of something the chain records, in a column added after runs were first written: parts
  written before it lack it (read as nulls), and verify checks it against the chain where a part has it.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from evalrun.records.formats import RecordModel

Source = Literal["chain", "plan", "engine", "provenance", "world", "added"]


class Column:
    """Where an output column comes from (see the module docstring)."""

    def __init__(self, source: Source) -> None:
        self.source = source


CHAIN, PLAN, ENGINE, PROVENANCE = Column("chain"), Column("plan"), Column("engine"), Column("provenance")
WORLD, ADDED = Column("world"), Column("added")

Int32 = Annotated[int, pa.int32()]
Int64 = Annotated[int, pa.int64()]
UInt64 = Annotated[int, pa.uint64()]


FAILED_FINISH_REASON = "failed"
"""The ``finish_reason`` of a failed episode's row (its chain ends with status error; docs/design.md
"Failed episodes"). No engine reports it: vLLM's reasons are stop, length, abort, error, repetition."""


class SamplingSeedColumn(RecordModel):
    sampling: UInt64


class JudgementRow(RecordModel):
    """One judge's answer on one criterion, as recorded (the scorer turns it into a verdict)."""

    criterion: str
    judge: str
    shuffle_order: list[Int32]
    output: str | None  # letter judging: the judge's text
    option_logprobs: list[float] | None  # loglikelihood judging: per original option index


class OutputRow(RecordModel):
    episode_id: Annotated[str, CHAIN]
    task: Annotated[str, CHAIN]
    item_id: Annotated[str, CHAIN]
    seed: Annotated[Int64, CHAIN]
    repeat: Annotated[Int32, CHAIN]
    seeds: Annotated[SamplingSeedColumn, CHAIN]
    prompt: Annotated[str, CHAIN]
    prompt_sha256: Annotated[str, CHAIN]
    target: Annotated[str, PLAN]
    output: Annotated[str, CHAIN]
    token_ids: Annotated[list[Int32], CHAIN]
    token_logprobs: Annotated[list[float | None], CHAIN]
    finish_reason: Annotated[str, CHAIN]
    prompt_tokens: Annotated[Int32, ENGINE]
    output_tokens: Annotated[Int32, CHAIN]
    head: Annotated[str, CHAIN]
    fewshot_ids: Annotated[list[str], CHAIN]
    shuffle_order: Annotated[list[Int32], CHAIN]  # shown position -> original option index
    option_logprobs: Annotated[list[float] | None, CHAIN]  # per original option; null unless scored so
    # per original option: every token of its continuation was the model's argmax (lm-eval's is_greedy); null as
    # option_logprobs is
    option_greedy: Annotated[list[bool] | None, ADDED]
    # every reply of a request sampled several times (Episode.generations), in call order; null for one
    replies: Annotated[list[str] | None, ADDED]
    judgements: Annotated[list[JudgementRow], CHAIN]
    final_state: Annotated[str | None, WORLD]
    worker: Annotated[str, PROVENANCE]
    hardware: Annotated[str, PROVENANCE]  # canonical JSON of the worker's hardware fingerprint
    batch_size: Annotated[Int32, PROVENANCE]
    latency_s: Annotated[float, PROVENANCE]


class ScoreRow(RecordModel):
    episode_id: str
    task: str
    item_id: str
    seed: Int64
    repeat: Int32
    metric: str
    value: float
    extracted: str | None
    scorer: str
    scorer_version: str
    error: str | None  # why the episode scores 0 unread: it failed, or its scorer raised (null otherwise)


_SCALARS: dict[Any, pa.DataType] = {str: pa.string(), float: pa.float64(), bool: pa.bool_()}


def arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a field annotation: ``Annotated[int, pa.int32()]``, str, float, bool, lists,
    optional types (Arrow columns are nullable) and nested record models (structs)."""
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        explicit = [m for m in metadata if isinstance(m, pa.DataType)]
        return explicit[0] if explicit else arrow_type(base)
    if get_origin(annotation) in (Union, types.UnionType):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return arrow_type(inner)
    if get_origin(annotation) is list:
        return pa.list_(arrow_type(get_args(annotation)[0]))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct([(name, _field_type(f)) for name, f in annotation.model_fields.items()])
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"no Arrow type for {annotation!r}: annotate integers with their width")


def _field_type(field: Any) -> pa.DataType:
    explicit = [m for m in field.metadata if isinstance(m, pa.DataType)]
    return explicit[0] if explicit else arrow_type(field.annotation)


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    return pa.schema([(name, _field_type(f)) for name, f in model.model_fields.items()])


def columns_from(model: type[BaseModel], source: Source) -> tuple[str, ...]:
    return tuple(
        name for name, f in model.model_fields.items() if any(getattr(m, "source", None) == source for m in f.metadata)
    )


OUTPUT_SCHEMA = arrow_schema(OutputRow)
SCORES_SCHEMA = arrow_schema(ScoreRow)
SCORE_ERROR_COLUMN = "error"


def with_error_column(scores: pa.Table) -> pa.Table:
    """A scores table with every column of :data:`SCORES_SCHEMA`: the ``error`` column is written only
    when some episode has an error (runs without errors keep the bytes they had before the column
    existed); a table without it gets one of nulls, so any two tables compare value for value."""
    if SCORE_ERROR_COLUMN in scores.column_names:
        return scores
    return scores.append_column(SCORES_SCHEMA.field(SCORE_ERROR_COLUMN), pa.nulls(scores.num_rows, pa.string()))


def same_scores(a: pa.Table, b: pa.Table) -> bool:
    """Two scores tables hold the same rows, value for value, in the same order."""
    a, b = with_error_column(a), with_error_column(b)
    return a.schema.equals(b.schema) and a.equals(b)


JUDGEMENT = OUTPUT_SCHEMA.field("judgements").type.value_type

CHAIN_COLUMNS = columns_from(OutputRow, "chain")  # what verify checks against the chain, in schema order
CHAIN_SCHEMA = pa.schema([OUTPUT_SCHEMA.field(c) for c in CHAIN_COLUMNS])
PROVENANCE_COLUMNS = columns_from(OutputRow, "provenance")
(FINAL_STATE,) = columns_from(OutputRow, "world")
ADDED_COLUMNS = columns_from(OutputRow, "added")  # verify checks them where a part has them


def first_mismatch(row: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The first column of ``expected`` whose value ``row`` does not hold, or None: verify's row check. An added
    column (:data:`ADDED_COLUMNS`) is checked where the row has it (its part was written after it was added)."""
    for column, value in expected.items():
        if column in row:
            if row[column] != value:
                return column
        elif column not in ADDED_COLUMNS:
            return column
    return None


# empty for single-call episodes
STAGED_COLUMNS = ("fewshot_ids", "shuffle_order", "option_logprobs", "option_greedy", "replies", "judgements")
NULL_UNLESS_STAGED = ("option_logprobs", "option_greedy", "replies")  # of STAGED_COLUMNS: null, not empty


GENERATION_FINISH_REASONS = ("stop", "length")  # how an engine generation ends (a failed episode: "failed")
MOSTLY_EMPTY = 0.9  # the share of empty generations from which a run's outputs are called empty
AGENT_BUDGET_STOPS = ("max_steps", "max_tokens")  # how an agent episode that did not end by itself stops


def every_episode_failed(outputs: pa.Table) -> bool:
    """Whether a run's every episode failed (its output rows' ``finish_reason``): a run that measured nothing, which
    ``evalrun run`` and ``resume`` exit 1 for, its records written and sealed all the same (docs/design.md "Exit
    codes"). A run with no episodes did not fail."""
    reasons = outputs.column("finish_reason")
    return len(reasons) > 0 and pc.all(pc.equal(reasons, FAILED_FINISH_REASON)).as_py() is True


def output_warnings(outputs: pa.Table) -> list[str]:
    """What says a run's generations are nonsense, from its output rows (``output`` and ``finish_reason``):
    nearly all of them empty (the model's first token ended its turn: a prompt the model does not expect,
    e.g. a chat model given plain text; or a stop string such as ``"\\n"`` cut every answer, e.g. a reasoning
    model's after ``</think>``), every one cut at the token limit, every episode failed (a server that renders
    chats otherwise, say), or every agent episode ran out of its budget (none finished its task or conversation).
    Empty when none; rows that are not generations (failed episodes, agent episodes, options scored by likelihood)
    are not counted as generations."""
    reasons = outputs.column("finish_reason").to_pylist()
    if every_episode_failed(outputs):
        return [f"all {len(reasons)} episodes failed, none was scored: each chain's end entry gives its reason "
                "(evalrun report shows them)"]  # fmt: skip
    budget = [reason for reason in reasons if reason in AGENT_BUDGET_STOPS]
    if reasons and len(budget) == len(reasons):
        return [f"all {len(reasons)} agent episodes ran out of their budget ({', '.join(sorted(set(budget)))}): none "
                "ended by itself (its transcripts in the report show what the agent did; task.world.max_steps and "
                "max_tokens set the budget)"]  # fmt: skip
    texts = outputs.column("output").to_pylist()
    generations = [(text, reason) for text, reason in zip(texts, reasons, strict=True)
                   if reason in GENERATION_FINISH_REASONS]  # fmt: skip
    if not generations:
        return []
    warnings = []
    empty = sum(1 for text, _ in generations if not (text or "").strip())
    if empty >= MOSTLY_EMPTY * len(generations):
        warnings.append(f"{empty} of {len(generations)} outputs are empty: the model ended its turn at once, or "
                        "a stop string cut its answer (after its thinking, for a reasoning model) before any text "
                        "(is the prompt in the format the model expects? see task.chat_format and "
                        "decoding.stop)")  # fmt: skip
    cut = sum(1 for _, reason in generations if reason == "length")
    if cut == len(generations):
        warnings.append(f"all {cut} outputs were cut at the token limit (decoding.max_tokens): none ended by "
                        "itself or at a stop string")  # fmt: skip
    return warnings
