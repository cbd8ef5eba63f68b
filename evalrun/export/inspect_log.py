"""``evalrun export RUN_DIR --format inspect -o FILE.eval``: a finished run as an Inspect AI eval log.

People who read evaluations in ``inspect view`` or Inspect's log dataframes can open evalrun runs
there. The mapping (docs/design.md "Export"):

* one Inspect sample per episode: ``id`` the item id, ``epoch`` the episode's trial of that item
  (1 + index of its seed in the seed set x repeats + repeat), so Inspect groups the trials of an
  item as it groups epochs; evalrun's ids, head, seeds and few-shot/shuffle choices in ``metadata``;
* ``input`` the prompt (an agent episode: the task as a user message); ``messages`` the user
  prompt and the model's reply, or an agent episode's turns from its chain (assistant replies with
  their tool calls, tool results, each tool call's clock/random/uuid/env reads in its metadata);
* ``scores`` one Inspect score per evalrun metric (value, ``answer`` the extracted answer,
  ``explanation`` why an episode scored 0 unread); ``results`` each metric's mean and standard
  error from summary.json;
* the eval spec: task, model (engine/model id), dataset, decoding, seeds; the run's six-field
  digest record, Merkle root and seal in its metadata.

The file is Inspect's ``.eval`` format (a zip of ``header.json``, ``summaries.json`` and one
``samples/ID_epoch_N.json`` per sample), not the single ``.json`` log: ``inspect view`` lists a
``.eval`` file whatever its name (a ``.json`` log only when its name starts with a timestamp), and
loads the sample list and each sample on demand, so a run of many episodes opens quickly. The
members are compact JSON in a fixed key order (not canonical JSON, which would write a float 1.0
as 1, and Inspect reads numbers' types from the text), and the zip's timestamps are fixed: the
same run exports to the same bytes.
Nothing of inspect-ai is imported here (the tests read the file back with it).

Before writing, the run is checked to be complete (exit 2 otherwise) and verified with
``evalrun verify``'s checks (exit 1 if it fails; ``--no-verify`` exports an unverified run and
says so in the log's metadata).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.analysis.runs import digest_record, load_run
from evalrun.audit.verify import verify_run
from evalrun.errors import BadInput, CheckFailed
from evalrun.export.inspect_schema import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatMessage,
    ContentReasoning,
    ContentText,
    EvalConfig,
    EvalDataset,
    EvalError,
    EvalLogHeader,
    EvalMetric,
    EvalPlan,
    EvalPlanStep,
    EvalResults,
    EvalRevision,
    EvalSample,
    EvalSampleSummary,
    EvalScore,
    EvalSpec,
    EvalStats,
    GenerateConfig,
    ModelOutput,
    ModelUsage,
    Score,
    StopReason,
    ToolCall,
    ToolCallError,
    ToolMessage,
    UserMessage,
)
from evalrun.records.canonical import canonical_hash, canonical_json
from evalrun.records.entries import (
    EndEntry,
    Entry,
    HeaderEntry,
    ModelEntry,
    ObservationEntry,
    UserEntry,
)
from evalrun.records.formats import Record, seal_of
from evalrun.records.view import ChainView, EffectEntry, ToolCallView
from evalrun.rundir import layout, store
from evalrun.rundir.reader import iter_chains, load_record, open_run, part_pairs, read_outputs, read_summary
from evalrun.rundir.writer import write_atomic
from evalrun.worlds import user_said

FORMATS = ("inspect",)
SUFFIX = ".eval"
SUMMARY_TEXT = 1024  # characters of a string a sample summary keeps (Inspect's viewer lists samples by them)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest time: no clock in the file
_STOP_REASONS: dict[str, StopReason] = {
    "stop": "stop",
    "done": "stop",
    "length": "max_tokens",
    "max_tokens": "max_tokens",
}


@dataclass(frozen=True)
class ExportReport:
    run: Path
    output: Path
    samples: int
    verified: bool
    sha256: str  # of the file written


@dataclass(frozen=True)
class RunContents:
    """What the export reads of a run, typed where evalrun's formats type it."""

    path: Path
    manifest: dict[str, Any]
    record: Record
    summary: dict[str, Any]
    digest: dict[str, str]  # the six-field record of `evalrun digest`
    rows: list[dict[str, Any]]  # output rows, in sample order
    scores: dict[str, list[dict[str, Any]]]  # episode id -> its score rows
    chains: dict[str, list[Entry]]  # episode id -> its chain's typed entries


def export_inspect(run_dir: Path, output: Path, verify: bool = True) -> ExportReport:
    """Write the run in ``run_dir`` to ``output`` (a ``.eval`` file) as an Inspect eval log."""
    _check_output(run_dir, output)
    check_complete(run_dir)
    if verify:
        try:
            verify_run(run_dir)
        except CheckFailed as exc:
            raise CheckFailed(f"{exc} (export refuses a run that fails verify; --no-verify exports it anyway)") from exc
    contents = read_run(run_dir)
    try:
        header, samples, summaries = inspect_log(contents, verified=verify)
    except (KeyError, TypeError, ValueError) as exc:  # an unverified run whose manifest lacks what a run records
        raise BadInput(str(run_dir), f"cannot be exported ({type(exc).__name__}: {exc})") from exc
    digest = write_atomic(output, eval_file(header, samples, summaries))
    return ExportReport(run=run_dir, output=output, samples=len(samples), verified=verify, sha256=digest)


def _check_output(run_dir: Path, output: Path) -> None:
    if output.suffix != SUFFIX:
        raise BadInput("-o", f"expected a {SUFFIX} file (Inspect's eval log format), got {str(output)!r}")
    if output.is_dir():
        raise BadInput("-o", f"{output} is a directory; expected a {SUFFIX} file")
    if not output.parent.is_dir():
        raise BadInput("-o", f"{output.parent}: no such directory")
    if output.absolute().resolve().is_relative_to(run_dir.absolute().resolve()):
        raise BadInput(
            "-o",
            f"{output} is inside the run directory, which holds only the files a run writes "
            f"(verify fails on any other); write it beside the run",
        )


def check_complete(run_dir: Path) -> None:
    """A run directory with every file the export reads; BadInput (exit 2) naming the first missing."""
    run = open_run(run_dir)
    for name in (layout.RECORD, layout.ATTESTATION, layout.MANIFEST, layout.SCORES, layout.SUMMARY):
        if not (run.path / name).is_file():
            raise BadInput(
                str(run.path / name),
                f"missing: the run is incomplete, and only a finished run is exported; "
                f"`evalrun resume {run_dir}` completes an interrupted run",
            )


def read_run(run_dir: Path) -> RunContents:
    """Read every record of a finished run through the run reader; BadInput (exit 2) for one that
    does not parse (an unverified run may be damaged)."""
    try:
        return _read(run_dir)
    except CheckFailed as exc:
        raise BadInput(str(run_dir), f"cannot be read: {exc}") from exc


def _read(run_dir: Path) -> RunContents:
    run = open_run(run_dir)
    loaded = load_run(run_dir)
    record = load_record(run)
    chains: dict[str, list[Entry]] = {}
    for log_rel, _out_rel in part_pairs(run, record):
        for chain in iter_chains(run.path / log_rel, log_rel):
            chains[chain.episode] = chain.entries
    scores: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for score in loaded.scores.to_pylist():
        scores[score["episode_id"]].append(score)
    rows = read_outputs(run).to_pylist()
    for row in rows:
        if row["episode_id"] not in chains:
            raise BadInput(layout.OUTPUTS, f"episode {row['episode_id']}: no chain in the log parts")
    trial = _trial_numbers(loaded.manifest)
    rows.sort(key=lambda r: (r["item_id"], trial(r)))
    return RunContents(
        path=run_dir,
        manifest=loaded.manifest,
        record=record,
        summary=read_summary(run),
        digest=digest_record(loaded),
        rows=rows,
        scores=dict(scores),
        chains=chains,
    )


def _trial_numbers(manifest: dict[str, Any]) -> Callable[[dict[str, Any]], int]:
    """An episode's Inspect epoch: 1 + (index of its seed in the seed set) x repeats + its repeat."""
    seed_set = list(manifest["seeds"]["set"])
    repeats = int(manifest["seeds"]["repeats"])

    def epoch(row: dict[str, Any]) -> int:
        if row["seed"] not in seed_set or not 0 <= row["repeat"] < repeats:
            raise BadInput(
                layout.OUTPUTS,
                f"episode {row['episode_id']}: seed {row['seed']} repeat {row['repeat']} is not a trial of the "
                f"manifest's seed set {seed_set} x {repeats} repeats",
            )
        return 1 + seed_set.index(row["seed"]) * repeats + row["repeat"]

    return epoch


# --- the log -----------------------------------------------------------------------------------


def inspect_log(run: RunContents, verified: bool) -> tuple[EvalLogHeader, list[EvalSample], list[EvalSampleSummary]]:
    """The run as Inspect's log header, samples and sample summaries."""
    manifest = run.manifest
    model = f"{manifest['engine']['name']}/{manifest['model']['id']}"
    epoch = _trial_numbers(manifest)
    samples = [_sample(row, epoch(row), run, model) for row in run.rows]
    seen: set[tuple[str, int]] = set()
    for sample in samples:
        if (sample.id, sample.epoch) in seen:
            raise BadInput(layout.OUTPUTS, f"two episodes of item {sample.id!r} are trial {sample.epoch}")
        seen.add((sample.id, sample.epoch))
    usage = _usage(sum(r["prompt_tokens"] for r in run.rows), sum(r["output_tokens"] for r in run.rows))
    generate = _generate_config(manifest)
    header = EvalLogHeader(
        eval=_spec(run, model, generate, verified),
        plan=EvalPlan(steps=[_plan_step(manifest)], config=generate),
        results=EvalResults(
            total_samples=run.record.episodes.planned, completed_samples=len(samples), scores=_results(run)
        ),
        stats=EvalStats(
            started_at=manifest["started_at"], completed_at=run.record.ended_at or "", model_usage={model: usage}
        ),
    )
    return header, samples, [_summary(s) for s in samples]


def _usage(prompt_tokens: int, output_tokens: int) -> ModelUsage:
    return ModelUsage(
        input_tokens=prompt_tokens, output_tokens=output_tokens, total_tokens=prompt_tokens + output_tokens
    )


def _generate_config(manifest: dict[str, Any]) -> GenerateConfig:
    decoding = manifest["decoding"]
    return GenerateConfig(
        max_tokens=decoding.get("max_tokens"),
        temperature=decoding.get("temperature"),
        top_p=decoding.get("top_p"),
        top_k=decoding.get("top_k"),
        stop_seqs=decoding.get("stop"),
        seed=manifest["seeds"]["master"],
        logprobs=decoding.get("logprobs"),
    )


def _plan_step(manifest: dict[str, Any]) -> EvalPlanStep:
    world = manifest["task"].get("world")
    if world:
        return EvalPlanStep(solver="evalrun/agent", params={"agent": world.get("agent"), "world": world})
    return EvalPlanStep(solver="evalrun/generate", params={})


def _spec(run: RunContents, model: str, generate: GenerateConfig, verified: bool) -> EvalSpec:
    manifest, record = run.manifest, run.record
    task = manifest["task"]
    dataset = task.get("dataset") or {}
    item_ids = list(dict.fromkeys(r["item_id"] for r in run.rows))
    git = manifest.get("git") or {}
    model_args = {k: v for k, v in manifest["model"].items() if k != "id"}
    return EvalSpec(
        eval_id=record.merkle_root,
        run_id=record.merkle_root,
        created=manifest["started_at"],
        task=task["name"],
        task_id=record.digest,
        dataset=EvalDataset(
            name=task["name"], location=dataset.get("path"), samples=len(item_ids), sample_ids=item_ids, shuffled=False
        ),
        model=model,
        model_generate_config=generate,
        model_args=model_args,
        config=EvalConfig(limit=manifest.get("limit"), epochs=_trials_per_item(manifest), log_samples=True),
        revision=EvalRevision(origin="", commit=git["commit"], dirty=git.get("dirty")) if git.get("commit") else None,
        packages={name: str(version) for name, version in manifest["libraries"].items() if version is not None},
        metadata={
            "digest": run.digest,
            "merkle_root": record.merkle_root,
            "seal": record.seal or seal_of(record),
            "manifest_sha256": record.manifest_sha256,
            "verified": verified,
            "run_dir": store.location_of(run.path),  # a run on an object store: its location, not the copy read
            "episodes": record.episodes.as_record(),
            "generator": manifest["generator"],
            "seeds": manifest["seeds"],
            "engine": manifest["engine"],
            "determinism": manifest["determinism"],
            "hardware": manifest["hardware"],
            "summary_format": run.summary["format"],
            "summary_method": run.summary["method"],
        },
    )


def _trials_per_item(manifest: dict[str, Any]) -> int:
    return len(manifest["seeds"]["set"]) * int(manifest["seeds"]["repeats"])


def _results(run: RunContents) -> list[EvalScore]:
    """Each metric's mean (and standard error, where the summary has one) of the run's task."""
    task = run.manifest["task"]["name"]
    estimates = run.summary["tasks"].get(task) or run.summary["overall"]
    scorers = {s["metric"]: s["scorer"] for rows in run.scores.values() for s in rows}
    results = []
    for metric, estimate in estimates.items():
        metrics = {"mean": EvalMetric(name="mean", value=estimate["mean"])}
        if estimate.get("se") is not None:
            metrics["stderr"] = EvalMetric(name="stderr", value=estimate["se"])
        results.append(
            EvalScore(
                name=metric,
                scorer=scorers.get(metric, metric),
                scored_samples=estimate["n_observations"],
                unscored_samples=0,
                params={},
                metrics=metrics,
                metadata={"estimate": estimate},
            )
        )
    return results


# --- samples -----------------------------------------------------------------------------------


def _sample(row: dict[str, Any], epoch: int, run: RunContents, model: str) -> EvalSample:
    episode = row["episode_id"]
    entries = run.chains[episode]
    header, end = entries[0], entries[-1]
    assert isinstance(header, HeaderEntry) and isinstance(end, EndEntry)  # the reader's chains start and end so
    uuid = canonical_hash([run.record.manifest_sha256, episode])  # unique to this run's episode (dataframes key on it)
    ids = (f"{uuid[:16]}-{n}" for n in range(len(entries) + 2))
    error = end.error if end.status != "ok" else None
    messages, reads = _messages(row["prompt"], ChainView.of(entries), model, ids)
    prompt = row["prompt"]
    replies = [m for m in messages if isinstance(m, AssistantMessage)]
    stop_reason = _STOP_REASONS.get(row["finish_reason"], "unknown")
    usage = _usage(row["prompt_tokens"], row["output_tokens"])
    tokens = {"token_ids": row["token_ids"], "token_logprobs": row["token_logprobs"]}
    output = ModelOutput(
        model=model,
        choices=[ChatCompletionChoice(message=replies[-1], stop_reason=stop_reason)] if replies else [],
        completion=_answer(replies[-1].content) if replies else "",
        usage=usage,
        metadata=tokens if row["token_ids"] else None,
        error=error,
    )
    return EvalSample(
        id=row["item_id"],
        epoch=epoch,
        input=prompt,
        target=row["target"],
        messages=messages,
        output=output,
        scores={s["metric"]: _score(s, error) for s in run.scores.get(episode, [])},
        metadata=_sample_metadata(row, header, end, reads),
        model_usage={model: usage},
        uuid=uuid,
        error=EvalError(message=error, traceback="", traceback_ansi="") if error else None,
    )


def _score(row: dict[str, Any], failure: str | None) -> Score:
    """A metric's score; ``explanation`` why it is 0 unread: the episode's failure (its chain's reason), or
    the scorer's error."""
    return Score(
        value=row["value"],
        answer=row["extracted"],
        explanation=f"episode failed: {failure}" if failure and row.get("error") else row.get("error"),
        metadata={"scorer": row["scorer"], "scorer_version": row["scorer_version"]},
    )


def _sample_metadata(
    row: dict[str, Any], header: HeaderEntry, end: EndEntry, reads: list[dict[str, Any]]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "episode_id": row["episode_id"],
        "task": row["task"],
        "item_id": row["item_id"],
        "seed": row["seed"],
        "repeat": row["repeat"],
        "sampling_seed": str(row["seeds"]["sampling"]),  # 64-bit: JSON numbers stop at 2**53
        "head": row["head"],
        "prompt_sha256": row["prompt_sha256"],
        "finish_reason": row["finish_reason"],
        "fewshot_ids": row["fewshot_ids"],
        "shuffle_order": row["shuffle_order"],
        "worker": row["worker"],
    }
    if row["option_logprobs"] is not None:
        metadata["option_logprobs"] = row["option_logprobs"]
    for added in ("option_greedy", "replies"):  # null where not recorded, and in parts written before the column
        if row[added] is not None:
            metadata[added] = row[added]
    if row["judgements"]:
        metadata["judgements"] = row["judgements"]
    # what the header and end record beyond every episode's fields (a world's, its stop and final state)
    metadata.update(header.model_dump(by_alias=True, include={"world"}, exclude={"world": {"task_text"}}))
    metadata.update(stop=end.stop, steps=end.steps, final_state_sha256=end.final_state_sha256)
    if row["final_state"] is not None:
        metadata["final_state"] = json.loads(row["final_state"])
    if reads:
        metadata["world_reads"] = reads  # effects read while the world was made (outside any tool call)
    if end.error is not None:
        metadata["error"] = end.error
    return {k: v for k, v in metadata.items() if v is not None}


def _call_id(number: int) -> str:
    return f"call-{number}"


def _observation_text(entry: ObservationEntry) -> str:
    return entry.content if isinstance(entry.content, str) else canonical_json(entry.content)


def _read_record(entry: EffectEntry) -> dict[str, Any]:
    return {
        "kind": entry.kind,
        "call": entry.call,
        "request": entry.request.as_record(),
        "response": entry.response.as_record(),
    }


def _answer(content: str | list[ContentReasoning | ContentText]) -> str:
    """A reply's text without its thinking (Inspect's ``ModelOutput.completion``)."""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, ContentText))


def _messages(
    prompt: str, chain: ChainView, model: str, ids: Iterator[str]
) -> tuple[list[ChatMessage], list[dict[str, Any]]]:
    """An episode's chain as chat messages, whatever its kind: what the model was first shown (``prompt``, the
    output row's: the item's prompt, or the world's task text), then per turn the reply (assistant, with its
    tool calls; a scripted agent's turn has no text; a judge's or an option score's call is no turn) and one
    tool message per result in the order the chain recorded them, each holding the reads its call made. Also
    the reads made outside any tool call (while a world was generated). A conversation's simulated user speaks in
    user messages: after the result of each tool call that spoke to it, what it said (a model's turn: its reply,
    ``source: generate``; the world's own user: the reply its result carries)."""
    messages: list[ChatMessage] = [UserMessage(id=next(ids), content=prompt, source="input")]
    for turn in chain.turns:
        reply: dict[str, Any] = {"content": ""}  # a scripted agent's turn: tool calls with no model call
        if isinstance(turn.reply, ModelEntry):
            response = turn.reply.response
            content: str | list[ContentReasoning | ContentText] = response.output  # the answer after any thinking
            if response.reasoning is not None:
                content = [ContentReasoning(reasoning=response.reasoning), ContentText(text=response.output)]
            reply = {"content": content, "source": "generate",
                     "metadata": {"call": turn.reply.call, "finish_reason": response.finish_reason}}  # fmt: skip
        if turn.calls:
            reply["tool_calls"] = [
                ToolCall(id=_call_id(c.request.call), function=c.request.request.name,
                         arguments=dict(c.request.request.arguments))
                for c in turn.calls
            ]  # fmt: skip
        if isinstance(turn.reply, ModelEntry) or turn.calls:
            messages.append(AssistantMessage(id=next(ids), model=model, **reply))
        for call in turn.calls:
            if call.result is None:
                continue
            text = _observation_text(call.result)
            reads = [_read_record(r) for r in call.reads]
            messages.append(
                ToolMessage(
                    id=next(ids),
                    content=text,
                    tool_call_id=_call_id(call.request.call),
                    function=call.request.request.name,
                    error=ToolCallError(type="unknown", message=text) if call.result.status == "error" else None,
                    metadata={"reads": reads} if reads else None,
                )
            )
            if (said := _user_message(chain.header, call, ids)) is not None:
                messages.append(said)
        if turn.unread is not None:  # the reply could not be read as tool calls: what the agent was shown
            text = _observation_text(turn.unread)
            messages.append(
                ToolMessage(
                    id=next(ids),
                    content=text,
                    error=ToolCallError(type="parsing", message=text),
                    metadata={"reply": turn.unread.reply},
                )
            )
    return messages, [_read_record(r) for r in chain.setup_reads]


def _user_message(header: HeaderEntry, call: ToolCallView, ids: Iterator[str]) -> UserMessage | None:
    """The simulated user's message answering a tool call that spoke to it, or None."""
    said = user_said(header, call)
    if said is None:
        return None
    model = isinstance(call.user, UserEntry)
    metadata: dict[str, Any] = {
        "simulated_user": "model" if model else "world",
        "tool_call_id": _call_id(call.request.call),
    }
    if isinstance(call.user, UserEntry):
        metadata.update(call=call.user.call, finish_reason=call.user.response.finish_reason)
    return UserMessage(id=next(ids), content=said, source="generate" if model else None, metadata=metadata)


def _summary(sample: EvalSample) -> EvalSampleSummary:
    """What Inspect's viewer lists a sample by: scalar metadata and short texts (the full sample has the rest)."""
    return EvalSampleSummary(
        id=sample.id,
        epoch=sample.epoch,
        input=_short(sample.input) if isinstance(sample.input, str) else sample.input,
        target=_short(sample.target),
        metadata={k: _short(v) if isinstance(v, str) else v for k, v in sample.metadata.items() if _small(v)},
        scores={
            name: score.model_copy(update={"answer": _short(score.answer), "explanation": _short(score.explanation)})
            for name, score in sample.scores.items()
        },
        model_usage=sample.model_usage,
        uuid=sample.uuid,
        error=_short(sample.error.message) if sample.error else None,
        completed=True,
        message_count=len(sample.messages),
    )


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= SUMMARY_TEXT:
        return text
    return text[:SUMMARY_TEXT] + "..."


def _small(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or len(canonical_json(value)) <= SUMMARY_TEXT


# --- the file ----------------------------------------------------------------------------------


def eval_file(header: EvalLogHeader, samples: list[EvalSample], summaries: list[EvalSampleSummary]) -> bytes:
    """Inspect's ``.eval`` file: a zip of the header, the sample summaries and one member per sample."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _member(archive, "header.json", header.as_record())
        _member(archive, "summaries.json", [s.as_record() for s in summaries])
        for sample in samples:
            _member(archive, f"samples/{sample.id}_epoch_{sample.epoch}.json", sample.as_record())
    return buffer.getvalue()


def _member(archive: zipfile.ZipFile, name: str, value: Any) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(
        info, json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    )
