"""What a report shows, gathered from run directories into typed records (docs/design.md "Report").

Everything here is read from the run directories through :mod:`evalrun.rundir.reader` and the
analysis and audit commands; nothing is recomputed differently from how ``verify``, ``compare`` and
``nondet`` compute it. A part that cannot be read is shown as such (a run that fails verify still
gets its report, with the failure at the top); only a directory that is no run at all is refused.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.analysis.compare import CompareReport, compare_runs
from evalrun.analysis.nondet import NondetReport, nondet_runs
from evalrun.analysis.runs import OVERALL, Run, digest_record, load_run
from evalrun.audit.verify import verify_run
from evalrun.episodes import kind_of_manifest
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.canary import failure_lines as canary_failure_lines
from evalrun.records.entries import (
    ClockEntry,
    FailedCallEntry,
    HeaderEntry,
    ModelEntry,
    RandomEntry,
    UserEntry,
    UuidEntry,
)
from evalrun.records.outputs import FINAL_STATE, OUTPUT_SCHEMA, SCORES_SCHEMA, output_warnings
from evalrun.records.view import ChainView, EffectEntry, ToolCallView
from evalrun.rundir import layout
from evalrun.rundir.reader import (
    iter_chains,
    load_record,
    open_run,
    read_manifest,
    read_outputs,
    read_summary,
)
from evalrun.worlds import user_said

TRANSCRIPTS = 200  # agent episodes whose transcript a report holds, by default
ROWS = 50_000  # episodes the table holds, by default
TEXT_LIMIT = 2_000  # characters of one text kept in the page (the run directory has all of it)

TABLE_COLUMNS = (
    "episode_id", "task", "item_id", "seed", "repeat", "prompt", "output", "target", "finish_reason", "output_tokens",
    "head", "fewshot_ids", "shuffle_order",
)  # fmt: skip
"""Output columns the episode table shows (its rows also carry the scores: :data:`ROW_FIELDS`)."""
ROW_FIELDS = (*TABLE_COLUMNS, "scores", "extracted", "error")
"""The fields of each row of :attr:`EpisodeTable.rows`, in order (the page's script reads them by name)."""


@dataclass(frozen=True)
class Field:
    name: str
    value: str


@dataclass(frozen=True)
class FieldGroup:
    """A titled list of recorded fields (the run's identity, shown as a two-column table)."""

    title: str
    fields: tuple[Field, ...]
    note: str | None = None


@dataclass(frozen=True)
class Verification:
    """What ``evalrun verify`` said of the run when the report was built."""

    ok: bool
    message: str  # the first broken thing, or a one-line summary of what was checked
    checks: tuple[Field, ...] = ()


@dataclass(frozen=True)
class SummaryLine:
    """One (task, metric) line of summary.json."""

    task: str
    metric: str
    mean: float
    low: float | None
    high: float | None
    interval: str
    items: int
    trials: int
    spread: float | None
    pass_all_trials: float | None
    perplexity: float | None = None  # a perplexity metric's exp(-mean) (evalrun.summary/4)
    aggregate: float | None = None  # a corpus metric's aggregate, lm-eval's figure (evalrun.summary/5)


@dataclass(frozen=True, order=True)
class TrialMean:
    """The mean over items of one trial (a seed of the seed set and a repeat)."""

    task: str
    metric: str
    seed: int
    repeat: int
    mean: float


@dataclass(frozen=True)
class EpisodeTable:
    rows: tuple[tuple[Any, ...], ...]  # one per episode, fields in ROW_FIELDS order (JSON values)
    total: int  # episodes in the run (the table may hold fewer: see ``rows``)
    metrics: tuple[str, ...]
    primary: str | None  # the metric the table's score column shows


@dataclass(frozen=True)
class TranscriptStep:
    """One line of an agent episode's transcript."""

    # task | reasoning | model | tool | user | observation | clock | random | uuid | env | join | error | end | final
    # | verdict
    kind: str
    title: str
    text: str
    status: str = "ok"  # ok | error


@dataclass(frozen=True)
class EpisodeTranscript:
    episode_id: str
    task: str
    item_id: str
    seed: int
    repeat: int
    steps: tuple[TranscriptStep, ...]


@dataclass(frozen=True)
class RunData:
    path: Path
    name: str
    digest: str | None
    verification: Verification
    identity: tuple[FieldGroup, ...]
    estimates: tuple[SummaryLine, ...]
    trials: tuple[TrialMean, ...]
    episodes: EpisodeTable
    kind: str  # the kind of episode (evalrun.episodes)
    transcribed: bool  # its episodes are shown step by step (the kind says so: a world's are)
    transcripts: tuple[EpisodeTranscript, ...]
    problems: tuple[str, ...]  # parts of the run that could not be read
    warnings: tuple[str, ...] = ()  # what makes the figures meaningless (empty outputs, say), from the record
    # a line per worker whose batch-invariance canary failed, as the manifest (and record.json) recorded it
    canary_failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    baseline: str
    other: str
    report: CompareReport | None
    error: str | None = None


@dataclass(frozen=True)
class Nondeterminism:
    report: NondetReport | None
    note: str


@dataclass(frozen=True)
class ReportData:
    runs: tuple[RunData, ...]
    comparisons: tuple[Comparison, ...]
    nondet: Nondeterminism | None
    transcripts_limit: int
    rows_limit: int


# --- small helpers -----------------------------------------------------------------------------


def _problem(exc: BadInput | CheckFailed) -> str:
    return f"{exc.where}: {exc.message}" if isinstance(exc, BadInput) else str(exc)


def clip(text: str | None, limit: int = TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters in the run directory)"


def shown(value: Any) -> str:
    """A recorded value as one line of text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(shown(v) for v in value) if value else "[]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def flat_fields(value: Any, prefix: str = "") -> list[Field]:
    """A nested record as dotted ``name: value`` fields (lists of scalars kept on one line)."""
    if isinstance(value, Mapping) and value:
        fields: list[Field] = []
        for key in sorted(value):
            fields.extend(flat_fields(value[key], f"{prefix}{key}."))
        return fields
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        fields = []
        for index, sub in enumerate(value):
            fields.extend(flat_fields(sub, f"{prefix}{index}."))
        return fields
    return [Field(prefix.rstrip(".") or "value", shown(value))]


def _get(record: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(record, Mapping):
            return None
        record = record.get(key)
    return record


# --- verify ------------------------------------------------------------------------------------


def verification(path: Path, jobs: int = 0) -> Verification:
    """``evalrun verify`` on the run: its summary, or the first broken thing it names."""
    try:
        report = verify_run(path, jobs=jobs)
    except (CheckFailed, BadInput) as exc:
        return Verification(False, _problem(exc))
    checks = [
        Field("episodes", f"{report.episodes:,}"), Field("log entries", f"{report.log_entries:,}"),
        Field("parts", str(report.parts)), Field("merkle root", report.merkle_root),
        Field("seal", report.seal or "—"), Field("scores", report.scores), Field("attestation", report.attestation),
        Field("rebaseline", report.rebaseline),
        *(Field(f"digest part {part}", how) for part, how in sorted(report.digest_parts.items())),
    ]  # fmt: skip
    message = (f"intact: {report.episodes:,} episodes, {report.log_entries:,} chain entries in {report.parts} "
               f"parts; root, digest, scores and summary recomputed")  # fmt: skip
    return Verification(True, message, tuple(checks))


# --- identity ----------------------------------------------------------------------------------


def _digest_fields(run: Run | None, manifest: Mapping[str, Any]) -> list[Field]:
    if run is not None:
        try:
            return [Field(k, v) for k, v in digest_record(run).items()]
        except (KeyError, TypeError):  # a manifest without the identity a gate reads
            pass
    digest = manifest.get("digest") if isinstance(manifest.get("digest"), Mapping) else {}
    names = ("candidate", "model_checkpoint", "prompt_pack", "seed_set", "scoring", "digest")
    return [Field(name, shown(digest.get(name))) for name in names]


def identity_sections(
    manifest: Mapping[str, Any], record: Mapping[str, Any] | None, run: Run | None
) -> tuple[FieldGroup, ...]:
    """The run's identity as the manifest and record.json state it (verify checks them; see the banner)."""
    record = record or {}
    digest = _digest_fields(run, manifest)
    digest += [Field("merkle_root", shown(record.get("merkle_root"))), Field("seal", shown(record.get("seal")))]
    model = manifest.get("model") if isinstance(manifest.get("model"), Mapping) else {}
    model_fields = [Field(k, shown(model.get(k))) for k in ("id", "revision", "pinned", "path")]
    model_fields += [Field(f"sha256 {name}", digest_) for name, digest_ in sorted((model.get("files") or {}).items())]
    judge = manifest.get("judge_model")
    if isinstance(judge, Mapping):
        model_fields += [Field(f"judge {f.name}", f.value) for f in flat_fields(judge)]
    engine = manifest.get("engine") if isinstance(manifest.get("engine"), Mapping) else {}
    determinism = manifest.get("determinism") if isinstance(manifest.get("determinism"), Mapping) else {}
    determinism_fields = flat_fields(determinism.get("asked"), "asked.")
    honoured = determinism.get("honoured")
    for index, worker in enumerate(honoured if isinstance(honoured, list) else [honoured]):
        determinism_fields += flat_fields(worker, f"honoured.{index}." if isinstance(honoured, list) else "honoured.")
    determinism_fields += [Field(f"note {i + 1}", note) for i, note in enumerate(determinism.get("notes") or [])]
    for worker in manifest.get("workers") or []:  # each worker's batch-invariance canary, where it ran one
        canary = worker.get("canary") if isinstance(worker, Mapping) else None
        if isinstance(canary, Mapping):
            summary = (f"invariant {shown(canary.get('invariant'))}; batches {shown(canary.get('batch_sizes'))}; "
                       f"modes {shown(canary.get('modes'))}; max |logprob diff| "
                       f"{shown(canary.get('max_abs_logprob_diff'))}; first mismatch "
                       f"{shown(canary.get('first_mismatch'))}")  # fmt: skip
            determinism_fields.append(Field(f"canary {worker.get('worker', '?')}", summary))
    hardware = flat_fields(manifest.get("hardware"))
    for worker in manifest.get("workers") or []:
        if isinstance(worker, Mapping):
            hardware.append(Field(f"worker {worker.get('worker', '?')}", shown(worker.get("hardware"))))
    for index, drift in enumerate(manifest.get("drift") or []):  # workers that differ from the first
        hardware.append(Field(f"drift {index + 1}", shown(drift)))
    software = flat_fields({"generator": manifest.get("generator"), "git": manifest.get("git"),
                            "python": manifest.get("python"), "libraries": manifest.get("libraries"),
                            "install": manifest.get("install")})  # fmt: skip
    task = manifest.get("task") if isinstance(manifest.get("task"), Mapping) else {}
    episodes = _get(record, "episodes")
    run_fields = [
        Field("task", shown(task.get("name"))),
        Field("dataset sha256", shown(_get(task, "dataset", "sha256"))),
        Field("limit", shown(manifest.get("limit"))),
        Field("episodes", shown(manifest.get("episodes"))),
        Field("episodes written", shown(_get(episodes, "written"))),
        *flat_fields(manifest.get("seeds"), "seeds."),
        *flat_fields(manifest.get("decoding"), "decoding."),
        *flat_fields(task.get("scorer"), "scorer."),
        *flat_fields(task.get("world"), "world."),
        Field("started_at", shown(manifest.get("started_at"))),
        Field("ended_at", shown(record.get("ended_at"))),
        *(Field(f"dispatch {k}", shown(v)) for k, v in sorted((record.get("dispatch") or {}).items())
          if k in ("retries", "worker_restarts", "resumed", "kept_parts")),
    ]  # fmt: skip
    digest_note = ("the six-field release-gate record, the Merkle root of the episodes' heads, and the seal to "
                   "keep elsewhere (verify --expect-seal)")  # fmt: skip
    engine_fields = [Field("name", shown(engine.get("name"))), Field("version", shown(engine.get("version"))),
                     *flat_fields(engine.get("settings"), "settings.")]  # fmt: skip
    return (
        FieldGroup("Digest", tuple(digest), digest_note),
        FieldGroup("Model pins", tuple(model_fields)),
        FieldGroup("Engine", tuple(engine_fields)),
        FieldGroup("Determinism: asked and honoured", tuple(determinism_fields)),
        FieldGroup("Hardware", tuple(hardware)),
        FieldGroup("Software", tuple(software)),
        FieldGroup("Run", tuple(run_fields)),
    )


def workers_served(manifest: Mapping[str, Any], outputs: pa.Table, scores: pa.Table) -> FieldGroup:
    """Which episodes each worker served, with the instruction set its kernels ran with (``engine.cpu_isa``; a
    mixed cluster's workers differ there) and its episodes' mean of every metric: where the workers drifted,
    what each one's share of the run scored."""
    episodes_of: dict[str, list[str]] = defaultdict(list)
    items_of: dict[str, set[str]] = defaultdict(set)
    for eid, item, worker in zip(*outputs.select(["episode_id", "item_id", "worker"]).to_pydict().values(),
                                 strict=True):  # fmt: skip
        episodes_of[worker].append(eid)
        items_of[worker].add(str(item))
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    worker_of = {eid: worker for worker, eids in episodes_of.items() for eid in eids}
    for eid, metric, value in zip(*scores.select(["episode_id", "metric", "value"]).to_pydict().values(),
                                  strict=True):  # fmt: skip
        if eid in worker_of and value is not None:
            values[(worker_of[eid], metric)].append(value)
    fields = []
    recorded = [w for w in manifest.get("workers") or [] if isinstance(w, Mapping)]
    names = [str(w.get("worker")) for w in recorded]
    names += sorted(set(episodes_of) - set(names))  # a replacement joins after the start: not in the manifest
    for name in names:
        worker = next((w for w in recorded if str(w.get("worker")) == name), {})
        isa = _get(worker, "hardware", "isa") or {}
        kernels = f", vllm kernels {isa['vllm_kernels']}" if isa.get("vllm_kernels") else ""
        isa_text = f"isa {shown(isa.get('asked'))} (aten {shown(isa.get('aten'))}{kernels})" if isa else "isa —"
        served = episodes_of.get(name, [])
        means = "; ".join(f"{metric} {statistics.fmean(v):.4f}" for (w, metric), v in sorted(values.items())
                          if w == name)  # fmt: skip
        items = sorted(items_of.get(name, ()), key=lambda i: (len(i), i))
        first = f" (items {', '.join(items[:5])}{', …' if len(items) > 5 else ''})" if items else ""
        fields.append(Field(f"worker {name}", f"{isa_text}; {len(served)} episodes{first}" + (f"; {means}" if means
                                                                                               else "")))  # fmt: skip
    return FieldGroup("Workers: episodes served", tuple(fields), "each worker's instruction set as it reported it, "
                      "the episodes it served (the outputs' worker column) and their mean scores")  # fmt: skip


# --- scores ------------------------------------------------------------------------------------


def estimates(summary: Mapping[str, Any]) -> tuple[SummaryLine, ...]:
    """Every (task, metric) of summary.json, tasks in name order, then the overall line of each metric."""
    out = []
    tasks = sorted((summary.get("tasks") or {}).items())
    if len(tasks) > 1:
        tasks.append((OVERALL, summary.get("overall") or {}))
    for task, metrics in tasks:
        for metric, entry in sorted(metrics.items()):
            ci = entry.get("ci95") or [None, None]
            out.append(SummaryLine(
                task=task, metric=metric, mean=float(entry["mean"]),
                low=None if ci[0] is None else float(ci[0]), high=None if ci[1] is None else float(ci[1]),
                interval=str(entry.get("interval", "clustered")), items=int(entry.get("n_items", 0)),
                trials=int(entry.get("trials_per_item", 1)), spread=entry.get("spread"),
                pass_all_trials=entry.get("pass_all_trials"), perplexity=entry.get("perplexity"),
                aggregate=entry.get("aggregate"),
            ))  # fmt: skip
    return tuple(out)


def trial_means(scores: pa.Table) -> tuple[TrialMean, ...]:
    """Per task and metric, the mean over items of each trial (seed, repeat): what ``spread`` is the std of."""
    if scores.num_rows == 0:
        return ()
    grouped = scores.group_by(["task", "metric", "seed", "repeat"]).aggregate([("value", "mean")]).to_pydict()
    rows = zip(grouped["task"], grouped["metric"], grouped["seed"], grouped["repeat"], grouped["value_mean"],
               strict=True)  # fmt: skip
    return tuple(sorted(TrialMean(t, m, int(s), int(r), float(v)) for t, m, s, r, v in rows))


def primary_metric(metrics: Iterable[str]) -> str | None:
    """The metric the episode table and the filter by result use: ``pass`` where a verifier gives it,
    else the first in name order."""
    metrics = sorted(metrics)
    return "pass" if "pass" in metrics else (metrics[0] if metrics else None)


def episode_table(outputs: pa.Table, scores: pa.Table, limit: int = ROWS) -> EpisodeTable:
    """The first ``limit`` episodes in run order, each with its scores by metric."""
    metrics = tuple(sorted(set(scores.column("metric").to_pylist()))) if scores.num_rows else ()
    primary = primary_metric(metrics)
    by_episode: dict[str, dict[str, float]] = defaultdict(dict)
    extracted: dict[str, str | None] = {}
    errors: dict[str, str | None] = {}
    cols = scores.select(["episode_id", "metric", "value", "extracted", "error"]).to_pydict()
    for eid, metric, value, answer, error in zip(*cols.values(), strict=True):
        by_episode[eid][metric] = value
        if metric == primary:
            extracted[eid] = answer
        if error:
            errors.setdefault(eid, error)
    head = outputs.slice(0, limit).select(list(TABLE_COLUMNS)).to_pydict()
    for text in ("prompt", "output", "target"):
        head[text] = [clip(t) for t in head[text]]
    eids = head["episode_id"]
    no_scores: dict[str, float] = {}
    rows = list(zip(*head.values(), [by_episode.get(e, no_scores) for e in eids], [extracted.get(e) for e in eids],
                    [errors.get(e) for e in eids], strict=True))  # fmt: skip
    return EpisodeTable(tuple(rows), outputs.num_rows, metrics, primary)


# --- agent transcripts -------------------------------------------------------------------------


def compact_json(value: Any, width: int = 100, indent: int = 0) -> str:
    """JSON for a person: a value whose one-line form fits in ``width`` stays on one line, a larger
    object or list gets one member per line (so an invoice's lines read one per line)."""
    one_line = json.dumps(value, sort_keys=True, ensure_ascii=False)
    scalars = isinstance(value, list) and not any(isinstance(v, dict | list) for v in value)
    if len(one_line) + indent <= width or not isinstance(value, dict | list) or not value or scalars:
        return one_line
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        members = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {compact_json(v, width, indent + 2)}"
                   for k, v in sorted(value.items())]  # fmt: skip
        return "{\n" + ",\n".join(members) + "\n" + " " * indent + "}"
    members = [pad + compact_json(v, width, indent + 2) for v in value]
    return "[\n" + ",\n".join(members) + "\n" + " " * indent + "]"


def _pretty(value: Any) -> str:
    return clip(value if isinstance(value, str) else compact_json(value))


def _clock_text(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return f"{moment} ({seconds} s)"


def _during(tool: int | None) -> str:
    return f" during tool call {tool}" if tool is not None else ""


def _header_steps(header: HeaderEntry) -> list[TranscriptStep]:
    """The task a header records, when it records one as text of its own (a world's)."""
    w = header.world
    if w is None:
        return []
    return [TranscriptStep("task", f"task · {w.name} v{w.world} · family {w.family} · world seed {w.world_seed} "
                                   f"· agent {w.agent} · clock starts {w.start}", w.task_text)]  # fmt: skip


def transcript_steps(entries: Iterable[Any]) -> list[TranscriptStep]:
    """A readable step per chain entry of an agent episode (docs/design.md "Agent episodes"); a conversation's user
    turns as steps of their own, before the result they are part of."""
    chain = ChainView.of(list(entries))
    steps = _header_steps(chain.header)
    steps.extend(_read_step(r) for r in chain.setup_reads)
    for turn in chain.turns:
        e = turn.reply
        if isinstance(e, ModelEntry):
            r = e.response
            if r.reasoning is not None:  # a reasoning model's thinking, split from its answer
                steps.append(TranscriptStep("reasoning", f"model turn {e.call} · thinking", clip(r.reasoning)))
            steps.append(TranscriptStep("model", f"model turn {e.call} · {len(r.token_ids)} tokens · {r.finish_reason}",
                                        clip(r.output)))  # fmt: skip
        elif isinstance(e, FailedCallEntry):
            steps.append(TranscriptStep("error", f"model call {e.call} refused", clip(e.error), "error"))
        for call in turn.calls:
            request = call.request
            steps.append(TranscriptStep("tool", f"tool call {request.call} · {request.request.name}",
                                        _pretty(request.request.arguments)))  # fmt: skip
        for call in turn.calls:
            steps.extend(_read_step(r) for r in call.reads)
            if (said := _user_step(chain.header, call)) is not None:
                steps.append(said)
            if call.result is not None:
                title = f"result of tool call {call.request.call} ({call.request.request.name}) · {call.result.status}"
                steps.append(TranscriptStep("observation", title, _pretty(call.result.content), call.result.status))
        if turn.unread is not None:
            title = f"reply of model call {turn.unread.reply} not understood · {turn.unread.status}"
            steps.append(TranscriptStep("observation", title, _pretty(turn.unread.content), turn.unread.status))
        if turn.join is not None:
            calls = ", ".join(map(str, turn.join.calls))
            steps.append(TranscriptStep("join", f"waited for tool calls {calls} (results in this order)", ""))
    end = chain.end
    if end is not None:
        why = f"stopped: {end.stop}" if end.stop else "ended"
        count = end.steps if end.steps is not None else "?"
        steps.append(TranscriptStep("end", f"{why} · {count} steps · {end.model_calls} model calls · status "
                                           f"{end.status}", end.error or "", end.status))  # fmt: skip
    return steps


def _user_step(header: HeaderEntry, call: ToolCallView) -> TranscriptStep | None:
    """What the simulated user said in answer to a tool call that spoke to it: a model's turn (its raw reply), its
    refused request, or the world's own user's reply read from the result; None for any other call."""
    user = call.user
    if isinstance(user, UserEntry):
        r = user.response
        return TranscriptStep("user", f"simulated user (model) · model call {user.call} · {len(r.token_ids)} tokens · "
                                      f"{r.finish_reason}", clip(r.output))  # fmt: skip
    if isinstance(user, FailedCallEntry):
        return TranscriptStep("error", f"simulated user's model call {user.call} refused", clip(user.error), "error")
    said = user_said(header, call)
    return None if said is None else TranscriptStep("user", "simulated user (the world's own)", clip(said))


def _read_step(e: EffectEntry) -> TranscriptStep:
    """One effect a world read, as a transcript shows it."""
    if isinstance(e, ClockEntry):
        return TranscriptStep("clock", f"clock read {e.call} ({e.request.clock}){_during(e.tool)}",
                              _clock_text(e.response.seconds))  # fmt: skip
    if isinstance(e, RandomEntry):
        return TranscriptStep("random", f"random draw {e.call} · {e.request.purpose}, {e.request.bits} bits"
                                        f"{_during(e.tool)}", e.response.value)  # fmt: skip
    if isinstance(e, UuidEntry):
        return TranscriptStep("uuid", f"generated id {e.call}{_during(e.tool)}", e.response.uuid)
    return TranscriptStep("env", f"environment read {e.call} · {e.request.name}{_during(e.tool)}",
                          shown(e.response.value))  # fmt: skip


Verdicts = Mapping[str, Mapping[str, tuple[float, str | None]]]  # episode -> metric -> (value, extracted)


def transcripts(
    run: layout.RunDir, final_states: Mapping[str, str | None], verdicts: Verdicts, limit: int
) -> tuple[EpisodeTranscript, ...]:
    """The first ``limit`` agent episodes in run order, from their chains, final states and scores."""
    out: list[EpisodeTranscript] = []
    for log_part in sorted(run.log.glob("part-*.jsonl")):
        if len(out) >= limit:
            break
        rel = f"{layout.LOG}/{log_part.name}"
        for chain in iter_chains(log_part, rel):
            header = chain.entries[0]
            assert isinstance(header, HeaderEntry)  # the reader starts every chain with a header
            steps = transcript_steps(chain.entries)
            final = final_states.get(chain.episode)
            if final is not None:
                try:
                    steps.append(TranscriptStep("final", "final state", _pretty(json.loads(final))))
                except json.JSONDecodeError:
                    steps.append(TranscriptStep("final", "final state", clip(final)))
            verdict = verdicts.get(chain.episode, {})
            if verdict:
                lines = [f"{metric}: {value:g}" + (f" (extracted {answer})" if answer else "")
                         for metric, (value, answer) in sorted(verdict.items())]  # fmt: skip
                passed = verdict.get("pass", (1.0, None))[0] >= 1.0
                status = "ok" if passed else "error"
                steps.append(TranscriptStep("verdict", "the verifier's verdict", "\n".join(lines), status))
            out.append(EpisodeTranscript(chain.episode, header.task, header.item, header.seed, header.repeat,
                                         tuple(steps)))  # fmt: skip
            if len(out) >= limit:
                break
    return tuple(out)


# --- one run, several runs ---------------------------------------------------------------------


def gather_run(path: Path, rows: int = ROWS, transcript_limit: int = TRANSCRIPTS, jobs: int = 0) -> RunData:
    """Everything a report shows of one run; BadInput only when ``path`` is not a run directory."""
    run_dir = open_run(path)
    manifest = read_manifest(run_dir)  # a run without a readable manifest has nothing to show
    problems: list[str] = []
    checked = verification(path, jobs)
    record: dict[str, Any] | None = None
    try:
        record = load_record(run_dir).as_record()
    except (CheckFailed, BadInput) as exc:
        problems.append(_problem(exc))
    run: Run | None = None
    scores = None
    try:
        run = load_run(path)
        scores = run.scores
    except (CheckFailed, BadInput) as exc:
        problems.append(_problem(exc))
    summary: dict[str, Any] = {}
    if run_dir.summary.is_file():
        try:
            summary = read_summary(run_dir)
        except CheckFailed as exc:
            problems.append(_problem(exc))
    kind = kind_of_manifest(manifest)
    try:
        outputs = read_outputs(run_dir, [*TABLE_COLUMNS, FINAL_STATE, "worker"])
    except CheckFailed as exc:
        problems.append(_problem(exc))
        outputs = OUTPUT_SCHEMA.empty_table().select([*TABLE_COLUMNS, FINAL_STATE, "worker"])
    scores = scores if scores is not None else SCORES_SCHEMA.empty_table()
    warnings = output_warnings(outputs)
    table = episode_table(outputs, scores, rows)
    found: tuple[EpisodeTranscript, ...] = ()
    if kind.transcribed and transcript_limit > 0:
        finals = dict(zip(outputs.column("episode_id").to_pylist(), outputs.column(FINAL_STATE).to_pylist(),
                          strict=True))  # fmt: skip
        verdicts: dict[str, dict[str, tuple[float, str | None]]] = defaultdict(dict)
        cols = scores.select(["episode_id", "metric", "value", "extracted"]).to_pydict()
        for eid, metric, value, answer in zip(*cols.values(), strict=True):
            verdicts[eid][metric] = (value, answer)
        try:
            found = transcripts(run_dir, finals, verdicts, transcript_limit)
        except CheckFailed as exc:
            problems.append(f"transcripts: {exc}")
    return RunData(
        path=path, name=path.name, digest=_get(manifest, "digest", "digest"), verification=checked,
        identity=(*identity_sections(manifest, record, run), workers_served(manifest, outputs, scores)),
        estimates=estimates(summary),
        trials=trial_means(scores), episodes=table, kind=kind.name, transcribed=kind.transcribed, transcripts=found,
        problems=tuple(problems), warnings=tuple(warnings),
        canary_failures=tuple(canary_failure_lines(manifest, record)),
    )  # fmt: skip


def _pairs(paths: list[Path]) -> list[Comparison]:
    """Every run after the first against the first (the baseline)."""
    out = []
    try:
        baseline = load_run(paths[0])
    except (CheckFailed, BadInput) as exc:
        return [Comparison(str(paths[0]), str(p), None, _problem(exc)) for p in paths[1:]]
    for path in paths[1:]:
        try:
            out.append(Comparison(str(paths[0]), str(path), compare_runs(baseline, load_run(path))))
        except (CheckFailed, BadInput) as exc:
            out.append(Comparison(str(paths[0]), str(path), None, _problem(exc)))
    return out


def _nondet(paths: list[Path], data: list[RunData]) -> Nondeterminism:
    digests = {d.digest for d in data}
    if len(digests) != 1:
        return Nondeterminism(None, "the runs' digests differ (prompt pack, seed set or scoring): nondeterminism is "
                                    "measured over runs that asked the same questions with the same seeds")  # fmt: skip
    try:
        runs = [load_run(p) for p in paths]
        shared = set.intersection(*(set(r.metrics) for r in runs))
        report = nondet_runs(runs, primary_metric(shared))
    except (CheckFailed, BadInput, ValueError) as exc:
        return Nondeterminism(None, _problem(exc) if isinstance(exc, BadInput | CheckFailed) else str(exc))
    return Nondeterminism(report, f"over {report.n_runs} runs with equal digests, matched by episode; "
                                  f"metric {report.metric}")  # fmt: skip


def gather(paths: list[Path], rows: int = ROWS, transcript_limit: int = TRANSCRIPTS, jobs: int = 0) -> ReportData:
    """The report of one run, or of several (then also compared: each against the first, and nondet)."""
    if not paths:
        raise BadInput("RUN_DIR", "expected one or more run directories")
    runs = [gather_run(p, rows, transcript_limit, jobs) for p in paths]
    comparisons = tuple(_pairs(paths)) if len(paths) > 1 else ()
    nondet = _nondet(paths, runs) if len(paths) > 1 else None
    return ReportData(tuple(runs), comparisons, nondet, transcript_limit, rows)
