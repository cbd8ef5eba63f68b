"""A batch's results as the bytes of its log part and output part, made where the results are.

Workers encode; the driver only commits bytes (:mod:`evalrun.rundir.writer`). Output rows are built
column by column in the storage schema derived from :class:`evalrun.records.outputs.OutputRow`
(no row model per episode: this is the write path's hot loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import pyarrow as pa

from evalrun.episodes import EncodedPart, Provenance, Result
from evalrun.episodes.agent import AgentEpisode, AgentResult
from evalrun.episodes.harness import EpisodeResult, Judgement
from evalrun.episodes.plan import Episode
from evalrun.records.canonical import canonical_json, sha256_hex
from evalrun.records.heads import pack_heads
from evalrun.records.outputs import FAILED_FINISH_REASON, NULL_UNLESS_STAGED, OUTPUT_SCHEMA, STAGED_COLUMNS
from evalrun.rundir.writer import table_bytes
from evalrun.scoring.parts import PartScorer


def output_rows(results: list[EpisodeResult], provenance: Provenance) -> pa.Table:
    episodes = [r.episode for r in results]
    completions = [r.completion for r in results]
    n = len(results)
    columns: dict[str, Any] = {
        **_identity_columns(episodes),
        "prompt": [e.prompt for e in episodes],
        "prompt_sha256": [r.prompt_sha256 for r in results],
        "target": [e.target for e in episodes],
        "output": [c.output for c in completions],  # the answer after any thinking (the chain has both)
        "token_ids": [list(c.token_ids) for c in completions],
        "token_logprobs": [list(c.logprobs) for c in completions],
        "finish_reason": [c.finish_reason for c in completions],
        "prompt_tokens": [c.prompt_tokens for c in completions],
        "output_tokens": [len(c.token_ids) for c in completions],
        "head": [r.head for r in results],
        **(_staged_columns(results) if any(not e.single_call for e in episodes) else _no_stages(n)),
        "final_state": pa.nulls(n, pa.string()),
        "worker": [provenance.worker] * n,
        "hardware": [provenance.hardware] * n,
        "batch_size": [provenance.batch_size] * n,
        "latency_s": [provenance.latency_s] * n,
    }
    return pa.table(columns, schema=OUTPUT_SCHEMA)


_SAMPLING_SEED = OUTPUT_SCHEMA.field("seeds").type.field("sampling")


def _identity_columns(episodes: Sequence[Episode | AgentEpisode]) -> dict[str, Any]:
    """Who each row is: episode id, task, item, seed, repeat and the derived sampling seed."""
    seeds = pa.array([e.sampling.seed for e in episodes], _SAMPLING_SEED.type)
    return {
        "episode_id": [e.episode_id for e in episodes],
        "task": [e.task for e in episodes],
        "item_id": [e.item_id for e in episodes],
        "seed": [e.seed for e in episodes],
        "repeat": [e.repeat for e in episodes],
        "seeds": pa.StructArray.from_arrays([seeds], fields=[_SAMPLING_SEED]),
    }


def _staged_columns(results: list[EpisodeResult]) -> dict[str, list[Any]]:
    return {
        "fewshot_ids": [list(r.episode.fewshot_ids) for r in results],
        "shuffle_order": [list(r.episode.shuffle_order) for r in results],
        "option_logprobs": [None if r.option_logprobs is None else list(r.option_logprobs) for r in results],
        "option_greedy": [None if r.option_greedy is None else list(r.option_greedy) for r in results],
        "replies": [None if r.replies is None else list(r.replies) for r in results],
        "judgements": [[_judgement(j) for j in r.judgements] for r in results],
    }


def _no_stages(n: int) -> dict[str, pa.Array]:
    """The staged columns of single-call episodes, built whole: empty lists, no option scores."""
    offsets = pa.array([0] * (n + 1), pa.int32())
    columns = {name: pa.ListArray.from_arrays(offsets, pa.array([], OUTPUT_SCHEMA.field(name).type.value_type))
               for name in ("fewshot_ids", "shuffle_order", "judgements")}  # fmt: skip
    for name in NULL_UNLESS_STAGED:
        columns[name] = pa.nulls(n, OUTPUT_SCHEMA.field(name).type)
    return {name: columns[name] for name in STAGED_COLUMNS}


def _judgement(j: Judgement) -> dict[str, Any]:
    return {"criterion": j.criterion, "judge": j.judge, "shuffle_order": list(j.shuffle_order), "output": j.output,
            "option_logprobs": None if j.option_logprobs is None else list(j.option_logprobs)}  # fmt: skip


def agent_output_rows(results: list[AgentResult], provenance: Provenance) -> pa.Table:
    """An agent episode's row: its task text as the prompt, no single output (the chain holds every
    reply), why it stopped as the finish reason, the model's tokens over the episode, its final state."""
    episodes = [r.episode for r in results]
    n = len(results)
    columns: dict[str, Any] = {
        **_identity_columns(episodes),
        "prompt": [r.task_text for r in results],
        "prompt_sha256": [sha256_hex(r.task_text) for r in results],
        "target": [""] * n,
        "output": [""] * n,
        "token_ids": [[] for _ in results],
        "token_logprobs": [[] for _ in results],
        "finish_reason": [agent_finish_reason(r.stop) for r in results],
        "prompt_tokens": [0] * n,
        "output_tokens": [r.output_tokens for r in results],
        "head": [r.head for r in results],
        **_no_stages(n),
        "final_state": [None if r.final_state is None else canonical_json(r.final_state) for r in results],
        "worker": [provenance.worker] * n,
        "hardware": [provenance.hardware] * n,
        "batch_size": [provenance.batch_size] * n,
        "latency_s": [provenance.latency_s] * n,
    }
    return pa.table(columns, schema=OUTPUT_SCHEMA)


def agent_finish_reason(stop: str | None) -> str:
    """done | max_steps | max_tokens, or ``failed`` for an episode that ended in an error."""
    return FAILED_FINISH_REASON if stop is None else stop


def encode_agent_part(results: list[AgentResult], provenance: Provenance,
                      scorer: PartScorer | None = None) -> EncodedPart:  # fmt: skip
    return _encoded(results, agent_output_rows(results, provenance), sum(r.output_tokens for r in results), scorer)


def encode_part(results: list[EpisodeResult], provenance: Provenance, scorer: PartScorer | None = None) -> EncodedPart:
    tokens = sum(len(r.completion.token_ids) for r in results)
    return _encoded(results, output_rows(results, provenance), tokens, scorer)


def _encoded(results: Sequence[Result], rows: pa.Table, output_tokens: int,
                 scorer: PartScorer | None) -> EncodedPart:  # fmt: skip
    """A part's bytes, and its rows: scored by ``scorer`` when given (a Ray worker's part), else as they
    are, for the driver to score (an inline worker's part, which is never pickled)."""
    return EncodedPart(
        log=("\n".join(chain.from_iterable(r.log_lines for r in results)) + "\n").encode("utf-8"),
        table=table_bytes(rows),
        heads=pack_heads((r.episode.episode_id, r.head) for r in results),
        output_tokens=output_tokens,
        scored=None if scorer is None else scorer(rows),
        rows=rows if scorer is None else None,
    )
