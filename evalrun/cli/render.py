"""What the commands print: rich tables on stdout, and the JSON records behind ``--json``.

Tables go to stdout. Off a terminal (a pipe, a file, a test) the page is wide and colourless, so
that no table line is wrapped and scripts can grep them; the lines scripts rely on most ("ok: ...",
"PASS: ...", "BLOCKED: ...", "WARNING: ...") are plain lines printed beside the tables, never cells.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from evalrun.analysis.compare import CompareReport
from evalrun.analysis.gate import GateDecision
from evalrun.analysis.nondet import NondetReport
from evalrun.analysis.runs import OVERALL
from evalrun.analysis.sides import SideAgreement
from evalrun.audit.check import CheckReport
from evalrun.audit.groups import GroupVerifyReport
from evalrun.audit.held import HeldReport
from evalrun.audit.replay import ReplayReport
from evalrun.audit.rescore import RescoreReport
from evalrun.audit.verify import VerifyReport
from evalrun.pipeline.canary import CanaryResult, describe
from evalrun.pipeline.canary import failure_lines as canary_failure_lines
from evalrun.records.formats import REPLAY_FORMAT, RESCORE_FORMAT, VERIFY_FORMAT
from evalrun.tasks.lm_eval_catalog import Catalog, Checked, counts

OFF_TERMINAL_WIDTH = 200
MAX_DIVERGENCES = 10
MAX_UNSTABLE_ITEMS = 10
MAX_CHANGES = 20


def stdout_console() -> Console:
    """A console on the current sys.stdout: the terminal's width there, a wide page anywhere else."""
    width = None if sys.stdout.isatty() else OFF_TERMINAL_WIDTH
    return Console(file=sys.stdout, width=width, markup=False, emoji=False, highlight=False)


def _table(*columns: str, title: str | None = None, header: bool = True) -> Table:
    """Columns named with a trailing ``>`` are right-aligned (numbers)."""
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD if header else None, show_header=header, show_edge=False,
        pad_edge=False,
    )  # fmt: skip
    for column in columns:
        right = column.endswith(">")
        table.add_column(column.rstrip(">"), justify="right" if right else "left")
    return table


def _emit(console: Console, table: Table) -> None:
    """Print a table without the spaces rich pads its last column with (lines compare and grep cleanly)."""
    with console.capture() as captured:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    console.file.flush()


def _line(console: Console, text: str) -> None:
    console.print(text, soft_wrap=True)  # never wrapped, whatever the width


def _num(value: float | int | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _interval(ci: Iterable[float] | None, spec: str = "+.4f") -> str:
    if ci is None:
        return "-"
    low, high = ci
    return f"[{low:{spec}}, {high:{spec}}]"


def _short(value: Any, width: int = 40) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def jsonable(value: Any) -> Any:
    """Dataclasses, paths and tuples as plain JSON values (canonical_json takes the result)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):  # a pydantic record
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


# --- run and resume: the results -------------------------------------------------------------------


def render_summary(console: Console, summary: Mapping[str, Any], title: str, warnings: Sequence[str] = ()) -> None:
    """One row per task and metric of summary.json (and the overall rows when there are several tasks);
    a column naming each interval's method when the summary records it (evalrun.summary/2); ``warnings``
    (what makes the numbers meaningless: empty outputs, say) under the table."""
    tasks: Mapping[str, Mapping[str, Any]] = summary.get("tasks", {})
    groups = list(tasks.items())
    if len(tasks) > 1:
        groups.append((OVERALL, summary.get("overall", {})))
    rows = [(task, metric, est) for task, metrics in groups for metric, est in metrics.items()]
    named = any("interval" in est for _, _, est in rows)
    failed = any(est.get("errors") for _, _, est in rows)  # episodes that failed (scored as failures)
    all_trials = any("pass_all_trials" in est for _, _, est in rows)  # pass^k over repeats
    perplexity = any("perplexity" in est for _, _, est in rows)  # exp(-mean) of a perplexity metric
    corpus = any("aggregation" in est for _, _, est in rows)  # a corpus metric's aggregate (corpus BLEU, F1)
    columns = ["task", "metric", "mean>", "95% interval>", *(["method"] if named else []), "items>", "trials>"]
    table = _table(*columns, "spread>", *(["pass^k>"] if all_trials else []),
                   *(["perplexity>"] if perplexity else []), *(["aggregate>"] if corpus else []),
                   *(["errors>"] if failed else []))  # fmt: skip
    for task, metric, est in rows:
        method = [str(est.get("interval") or "-")] if named else []
        errors = [str(est.get("errors") or 0)] if failed else []
        pass_k = [_num(est.get("pass_all_trials"))] if all_trials else []
        exp_mean = [_num(est.get("perplexity"))] if perplexity else []
        aggregate = [_num(est.get("aggregate"))] if corpus else []
        table.add_row(
            task, metric, _num(est.get("mean")), _interval(est.get("ci95"), ".4f"), *method,
            _num(est.get("n_items"), "d"), _num(est.get("trials_per_item"), "g"), _num(est.get("spread")), *pass_k,
            *exp_mean, *aggregate, *errors,
        )  # fmt: skip
    console.print(title, soft_wrap=True, highlight=False, markup=False)  # a path stays on one line
    _emit(console, table)
    for warning in warnings:
        _line(console, f"warning: {warning}")


def render_group(console: Console, record: Mapping[str, Any], title: str) -> None:
    """A group record's results (group.json): one row per group and aggregate metric, lm-eval's group table (the
    weighted or plain mean of its tasks' means, the pooled standard error, its items); a group without
    aggregate metrics (a tag, a list of tasks) as its tasks."""
    table = _table("group", "metric", "mean>", "stderr>", "items>", "weighted", "tasks")
    for name, result in record.get("results", {}).items():
        metrics = result.get("metrics", {})
        if not metrics:
            table.add_row(name, "-", "-", "-", "-", "-", ", ".join(result.get("tasks", [])))
        for metric, est in metrics.items():
            missing = f" (without: {', '.join(est['missing'])})" if est.get("missing") else ""
            table.add_row(name, metric, _num(est.get("mean")), _num(est.get("stderr")), _num(est.get("n_items"), "d"),
                          "-" if "weight_by_size" not in est else "yes" if est["weight_by_size"] else "no",
                          f"{len(est.get('tasks', []))}{missing}")  # fmt: skip
    console.print(title, soft_wrap=True, highlight=False, markup=False)
    _emit(console, table)


def render_canary_failures(console: Console, manifest: Mapping[str, Any], record: Mapping[str, Any] | None) -> None:
    """Under the results table, a line per worker whose batch-invariance canary failed, as the run's
    manifest (and record.json, for workers that replaced others) recorded it: a run read again later
    (``evalrun resume`` of a finished run) says the same."""
    for line in canary_failure_lines(manifest, record):
        _line(console, f"warning: {line}; the results may depend on the batch they ran in")


# --- audit -----------------------------------------------------------------------------------------


def verify_record(report: VerifyReport) -> dict[str, Any]:
    return {"format": VERIFY_FORMAT, "ok": True, **jsonable(report)}


def render_verify(console: Console, report: VerifyReport) -> None:
    """What the verifier reported, field by field, then the one-line verdict."""
    table = _table("", "", header=False)
    for name, value in jsonable(report).items():
        label = name.replace("_", " ")
        if isinstance(value, Mapping):  # e.g. one line per part of the digest
            for key, sub in value.items():
                table.add_row(f"{label}: {key}", str(sub))
        else:
            table.add_row(label, str(value))
    _emit(console, table)
    anchored = f"; {report.ledger}" if report.ledger != "not given" else ""
    _line(console, f"ok: {report.episodes} episodes, {report.log_entries} log entries, {report.parts} parts; "
                   f"merkle root {report.merkle_root}; seal {report.seal}; "
                   f"attestation {report.attestation}{anchored}")  # fmt: skip


def group_verify_record(report: GroupVerifyReport) -> dict[str, Any]:
    return {"format": VERIFY_FORMAT, "ok": True, "group": str(report.group), "name": report.name,
            "seal": report.seal, "tasks": {name: jsonable(task) for name, task in report.tasks.items()}}  # fmt: skip


def render_group_verify(console: Console, report: GroupVerifyReport) -> None:
    """A line per task's verified run, then the group's verdict."""
    for name, task in report.tasks.items():
        _line(console, f"ok: task {name}: {task.episodes} episodes, {task.parts} parts; merkle root "
                       f"{task.merkle_root}; seal {task.seal}; attestation {task.attestation}")  # fmt: skip
    _line(console, f"ok: group {report.name}: {len(report.tasks)} tasks verified; the group's results recomputed "
                   f"from them; seal {report.seal}")  # fmt: skip


def replay_record(report: ReplayReport) -> dict[str, Any]:
    return {"format": REPLAY_FORMAT, **report.as_record()}


def render_replay(console: Console, report: ReplayReport) -> None:
    """The first divergences, the verdict (which says whether this was a reproduction), then "ok:" on a match."""
    for d in report.divergences[:MAX_DIVERGENCES]:
        _line(console, f"divergence: episode {d.episode} seq {d.seq}\n  expected: {d.expected}\n  got:      {d.got}")
    if len(report.divergences) > MAX_DIVERGENCES:
        more = len(report.divergences) - MAX_DIVERGENCES
        _line(console, f"... and {more} more diverging episodes (--json lists them all)")
    _line(console, f"verdict: {report.verdict}")
    if report.matches:
        _line(console, f"ok: {report.reproduced} episodes replayed; every head, the Merkle root and the scores "
                       "came out as recorded")  # fmt: skip


def render_held(console: Console, report: HeldReport) -> None:
    """Each repeat against the original, then both sides over every run, then the metric's means and spread."""
    _line(console, f"held repeats of {report.original}: the {report.live} live, the {report.held} held fixed "
                   f"(its recorded replies served in order); metric {report.metric}")  # fmt: skip
    table = _table(
        "repeat",
        "master>",
        "episodes>",
        f"{report.live} identical>",
        "unexpected held turns>",
        "failed>",
        f"{report.metric} flipped>",
        "mean>",
        title="each repeat against the original",
    )
    for r in report.repeats:
        unexpected = f"{r.unexpected_turns} in {r.episodes_with_unexpected} episodes"
        table.add_row(Path(r.run_dir).name, str(r.master), str(r.episodes), str(r.live_identical), unexpected,
                      str(r.failed), str(r.flipped), _num(r.mean))  # fmt: skip
    _emit(console, table)
    render_sides(console, report.sides, f"the conversation's sides over the original and {len(report.repeats)} "
                                        "repeats")  # fmt: skip
    means = [report.original_mean, *(r.mean for r in report.repeats)]
    _line(console, f"{report.metric}: original {_num(report.original_mean)}, repeats "
                   f"{', '.join(_num(m) for m in means[1:])}; spread (best - worst) {_num(report.spread)}")  # fmt: skip
    for r in report.repeats:
        diverged = [e for e in r.per_episode if e.first_divergence is not None]
        for e in diverged[:MAX_DIVERGENCES]:
            assert e.first_divergence is not None
            _line(console, f"first divergence: item {e.item_id} seed {e.seed} repeat {e.repeat}: "
                           f"{e.first_divergence.describe()}{f'; failed: {e.failed}' if e.failed else ''}")  # fmt: skip
    for r in report.repeats:
        _line(console, r.run_dir)


def rescore_record(report: RescoreReport) -> dict[str, Any]:
    return {"format": RESCORE_FORMAT, **jsonable(report)}


def render_rescore(console: Console, report: RescoreReport) -> None:
    if report.identical:
        kind = "bit-identical" if report.bytes_identical else "identical values (Parquet bytes differ)"
        _line(console, f"rescored {report.rows} rows: {kind} to scores.parquet")
        return
    _line(console, f"rescored {report.rows} rows with a changed scorer; new scores in {report.written}")
    if report.changed:
        _line(console, f"changed: {', '.join(report.changed)}")
    table = _table("task", "metric", "before>", "after>", "delta>", "changed episodes>")
    for d in report.diffs:
        delta = None if d.old_mean is None or d.new_mean is None else d.new_mean - d.old_mean
        before, after = _num(d.old_mean), _num(d.new_mean)
        table.add_row(d.task, d.metric, before, after, _num(delta, "+.4f"), str(d.changed_episodes))
    _emit(console, table)


def render_check(console: Console, report: CheckReport) -> None:
    """The verdict table (one row per check), the repeat's agreement, means and settings, then "ok:" on a pass."""
    verdicts = _table("check", "result", "what", "first divergence", title=f"check: {report.run}")
    for v in report.verdicts:
        verdicts.add_row(v.check, "PASS" if v.passed else "FAIL", v.summary, v.first_divergence or "-")
    _emit(console, verdicts)
    if report.replay is not None:
        _line(console, f"replay: {report.replay.verdict}")
    r = report.repeat
    if r is not None:
        _line(console, f"repeated items ({len(r.items)} of {r.items_in_run}, drawn by {r.seed['purpose']} from master "
                       f"seed {r.seed['master']}): {' '.join(r.items)}")  # fmt: skip
        drift = _num(r.max_abs_logprob_diff, ".3e")
        _line(console, f"repeat: {r.identical_tokens} of {r.episodes} episodes identical in tokens, {r.same_heads} "
                       f"with identical chains; TARr {r.tarr:.4f}, TARa {r.tara:.4f}; max |logprob diff| before "
                       f"divergence {drift}; first divergence: {r.first_divergence or 'none'}")  # fmt: skip
        means = _table("task", "metric", "items>", "original>", "original 95% interval>", "repeat>", "inside",
                       title="repeat mean against the original's 95% interval over the same items")  # fmt: skip
        for m in r.means:
            means.add_row(m.task, m.metric, str(m.items), _num(m.original_mean), _interval(m.original_ci95, ".4f"),
                          _num(m.repeat_mean), "yes" if m.inside else "NO")  # fmt: skip
        _emit(console, means)
        if r.sides is not None:
            render_sides(console, r.sides, "the conversation's sides, original against repeat (from the chains)")
        if r.settings:
            settings = _table("thing", "field", "original", "repeat", title="settings that differ from the original")
            for d in r.settings:
                settings.add_row(d.category, d.field, *(_short(v, 50) for v in d.values))
            _emit(console, settings)
        else:
            _line(console, "settings that differ from the original: none recorded")
        _line(console, f"repeat run directory: {r.run_dir or 'removed (--keep DIR keeps it)'}")
    if report.passed:
        _line(console, "ok: replay, rescore and repeat reproduced the run on this machine")


# --- analysis --------------------------------------------------------------------------------------


def render_compare(console: Console, report: CompareReport, interval: str = "clustered") -> None:
    _line(console, f"A: {report.run_a}")
    _line(console, f"B: {report.run_b}")
    changed = ", ".join(report.changed) or "none"
    _line(console, f"manifest diff (A -> B): {len(report.diffs)} fields differ; things changed: {changed}")
    if report.diffs:
        diff = _table("thing", "field", "A", "B")
        for d in report.diffs:
            diff.add_row(d.category, d.field, _short(d.a), _short(d.b))
        _emit(console, diff)
    if report.warning:
        bar = "!" * 100
        for text in (bar, f"!!! {report.warning}", bar):
            _line(console, text)
    paired_label = "paired 95% CI (bootstrap)>" if interval == "bootstrap" else "paired 95% CI>"
    table = _table(
        "task", "metric", "items>", "A>", "B>", "B - A>", paired_label, "unpaired 95% CI>", "width>", "test", "p>",
        title="B - A per task and overall (per-item means, paired over the items both runs have)",
    )  # fmt: skip
    left_out = []
    for row in report.rows:
        e = row.estimate
        ci_p = e.ci95_paired_bootstrap if interval == "bootstrap" else e.ci95_paired
        ratio = None
        if ci_p is not None and e.ci95_unpaired is not None and e.ci95_unpaired[1] > e.ci95_unpaired[0]:
            ratio = (ci_p[1] - ci_p[0]) / (e.ci95_unpaired[1] - e.ci95_unpaired[0])
        table.add_row(
            row.task, row.metric, str(e.n_items), _num(e.mean_a), _num(e.mean_b), _num(e.diff, "+.4f"), _interval(ci_p),
            _interval(e.ci95_unpaired), _num(ratio, ".2f"), e.test.name, _num(e.test.p_value, ".4g"),
        )  # fmt: skip
        if row.items_only_a or row.items_only_b:
            left_out.append(f"{row.task} {row.metric}: {row.items_only_a} items only in A, {row.items_only_b} only "
                            "in B: left out of the pairing")  # fmt: skip
    _emit(console, table)
    for text in left_out:
        _line(console, text)
    _line(console, "width = paired / unpaired interval width (below 1: pairing narrows the interval)")


def render_digest(console: Console, record: Mapping[str, str]) -> None:
    table = _table("", "", header=False)
    for key, value in record.items():
        table.add_row(key, value)
    _emit(console, table)


def render_gate(console: Console, d: GateDecision) -> None:
    digests = _table("", "candidate", "baseline")
    for key in d.candidate:
        digests.add_row(key, d.candidate[key], d.baseline.get(key, "-"))
    digests.add_row(f"mean {d.metric}", _num(d.candidate_mean), _num(d.baseline_mean))
    _emit(console, digests)
    decision = _table("", "", header=False)
    decision.add_row("delta", f"{_num(d.delta, '+.4f')} (candidate - baseline)")
    decision.add_row("margin", _num(d.margin))
    decision.add_row("rule", d.margin_rule)
    _emit(console, decision)
    if d.rebaseline is not None:
        render_rebaseline(console, d.rebaseline)
    _line(console, f"{'PASS' if d.passed else 'BLOCKED'}: {d.reason}")


def render_rebaseline(console: Console, record: Mapping[str, Any]) -> None:
    """A rebaseline.json (evalrun.rebaseline/1): both runs, the reason, what changed."""
    old, new = record["old"], record["new"]
    _line(console, f"re-baseline: the baseline re-ran {old['run']} under a new digest ({record['created_at']}): "
                   f"{record['reason']}")  # fmt: skip
    runs = _table("", "old", "new")
    runs.add_row("run", old["run"], new["run"])
    for part in ("digest", "prompt_pack", "seed_set", "scoring"):
        runs.add_row(part, old["digest"][part], new["digest"][part])
    runs.add_row("merkle root", old["merkle_root"], new["merkle_root"])
    runs.add_row("seal", old["seal"], new["seal"])
    _emit(console, runs)
    changes = record["changes"]
    _line(console, f"changed digest parts: {', '.join(record['changed_parts'])}; {len(changes)} recorded fields differ")
    if changes:
        title = f"fields that differ (first {MAX_CHANGES} of {len(changes)})" if len(changes) > MAX_CHANGES else None
        table = _table("field", "old", "new", title=title)
        for change in changes[:MAX_CHANGES]:
            table.add_row(change["field"], _short(change["old"], 50), _short(change["new"], 50))
        _emit(console, table)


def render_nondet(console: Console, r: NondetReport) -> None:
    n = r.n_runs
    digests = "equal digests" if r.held is None else "equal digests but for a side held fixed"
    _line(console, f"nondet over {n} runs with {digests}; metric {r.metric}; {r.items} items, {r.episodes} "
                   f"episodes matched ({r.unmatched_episodes} unmatched, left out)")  # fmt: skip
    for path, held in (r.held or {}).items():
        _line(console, f"held fixed in {Path(path).name}: the {held['side']} side, served from the run of digest "
                       f"{held['from_digest'][:12]}")  # fmt: skip
    runs = _table("#>", "run", "accuracy>", "dispatch batch sizes")
    for k, run in enumerate(r.runs):
        sizes = ",".join(map(str, r.batch_sizes[k])) if r.batch_sizes else "-"
        runs.add_row(str(k), Path(run).name, _num(r.accuracy[k]), sizes)
    _emit(console, runs)
    if r.settings:
        title = "settings that differ between the runs"
        settings = _table("thing", "field", *(f"run {k}" for k in range(n)), title=title)
        for s in r.settings:
            settings.add_row(s.category, s.field, *(_short(v, 30) for v in s.values))
        _emit(console, settings)
    else:
        _line(console, "settings that differ: none recorded")
    first_div = f"min {_num(r.first_divergence_min, 'd')}, median {_num(r.first_divergence_median, '.1f')}"
    drift = _num(r.max_abs_logprob_diff, ".3e")
    drift_median = _num(r.median_max_abs_logprob_diff, ".3e")
    rows = [
        (f"TARr@{n} (raw outputs identical)", _num(r.tarr)),
        (f"TARa@{n} (parsed answers identical)", _num(r.tara)),
        ("distinct completions per episode",
         f"mean {r.distinct_mean:.3f}, max {r.distinct_max}, histogram {r.distinct_histogram}"),
        ("episodes with a divergent token", f"{r.diverged_episodes}; first position {first_div}"),
        ("max |logprob diff| before divergence", f"{drift} (median over episodes {drift_median})"),
        ("accuracy over runs",
         f"best {r.accuracy_best:.4f}, worst {r.accuracy_worst:.4f}, spread {r.accuracy_spread:.4f}"),
        ("accuracy per episode",
         f"best possible {r.accuracy_best_possible:.4f}, worst possible {r.accuracy_worst_possible:.4f}"),
    ]  # fmt: skip
    measures = _table("measure", "value")
    for row in rows:
        measures.add_row(*row)
    _emit(console, measures)
    if r.sides is not None:
        render_sides(console, r.sides, f"the conversation's sides over the {n} runs (from the chains)")
    if r.canaries:
        title = "batch-invariance canary per worker (at worker start)"
        canaries = _table("#>", "worker", "canary", "max |dlogprob|>", "batch sizes", "first mismatch", title=title)
        for c in r.canaries:
            m = c.first_mismatch
            where = "-" if m is None else (f"{m['mode']}, batch {m['batch_size']}, needle at {m['position']}, "
                                           f"token {m['token_index']} ({m['differs_in']})")  # fmt: skip
            canaries.add_row(str(c.run), c.worker, c.status, _num(c.max_abs_logprob_diff, ".3e"),
                             ",".join(map(str, c.batch_sizes)) or "-", where)  # fmt: skip
        _emit(console, canaries)
    unstable = [i for i in r.per_item if not i.identical_raw]
    if unstable:
        title = f"items whose outputs differ (first {min(MAX_UNSTABLE_ITEMS, len(unstable))} of {len(unstable)})"
        items = _table("task", "item", "distinct>", "first div>", "max |dlp|>", "answers same>", title=title)
        for i in unstable[:MAX_UNSTABLE_ITEMS]:
            items.add_row(i.task, i.item_id, str(i.distinct), _num(i.first_divergence, "d"),
                          _num(i.max_abs_logprob_diff, ".2e"), str(i.identical_answer))  # fmt: skip
        _emit(console, items)


def render_sides(console: Console, sides: Mapping[str, SideAgreement], title: str) -> None:
    """Per side of a conversation: episodes in which it spoke, those whose replies are identical, TARr over items,
    the episodes whose first divergence is its, and its calls."""
    table = _table("side", "episodes>", "identical>", "TARr>", "diverged first>", "calls>", title=title)
    for s in sides.values():
        table.add_row(s.side, str(s.episodes), str(s.identical), _num(s.tarr), str(s.first_diverged), str(s.calls))
    _emit(console, table)


# --- canary ----------------------------------------------------------------------------------------


def render_canary(console: Console, result: CanaryResult, worker: Mapping[str, Any]) -> None:
    """Which engine on which hardware, one row per check (the needle in a batch against the needle alone),
    then the verdict line ("ok: ..." or "NOT batch-invariant: ...")."""
    engine = worker.get("engine") or {}
    honoured = (worker.get("determinism") or {}).get("honoured", {})
    _line(console, f"engine {engine.get('name')} {engine.get('version')}; hardware {worker.get('hardware')}")
    _line(console, f"determinism honoured: {honoured}")
    table = _table("mode", "batch size>", "needle at>", "tokens and logprobs", "first difference", "max |dlogprob|>")
    for c in result.checks:
        where = "-" if c.first_difference is None else f"token {c.first_difference} ({c.differs_in})"
        table.add_row(c.mode, str(c.batch_size), str(c.position), "bitwise equal" if c.equal else "DIFFER", where,
                      _num(c.max_abs_logprob_diff, ".3e"))  # fmt: skip
    _emit(console, table)
    tokens = ", ".join(f"{mode} {n}" for mode, n in result.needle_tokens.items())
    _line(console, f"needle tokens compared per check: {tokens} (max_tokens {result.max_tokens}); "
                   f"{result.engine_calls} engine calls, {result.seconds:.2f} s")  # fmt: skip
    _line(console, f"{'ok: ' if result.invariant else ''}{describe(result)}")


def timings_line(timings: dict[str, Any]) -> str:
    """record.json's ``timings`` in one line: each phase, then every worker's engine load (with the part of it vLLM
    spent warming up, where it said) and its batch-invariance canary (runs made before either have none)."""
    order = ("start-up", "generation", "writing", "scoring", "records")
    per_worker = ("engine_load", "warmup", "canary")
    names = [n for n in order if n in timings] + sorted(n for n in timings if n not in order and n not in per_worker)
    phases = [f"{name} {timings[name]:.2f} s" for name in names]
    labels = {"engine_load": "engine load", "warmup": "of which warm-up", "canary": "canary"}
    for key in per_worker:
        seconds_by_worker = timings.get(key) or {}
        if seconds_by_worker:
            each = ", ".join(f"{seconds:.1f} s ({worker})" for worker, seconds in seconds_by_worker.items())
            phases.append(f"{labels[key]} {each}")
    return "; ".join(phases)


def render_task_list(console: Console, found: Catalog) -> None:
    """Each kind's names with the YAML that defines it (a group's and a tag's members), then the counts."""
    for kind, title in (("task", "tasks"), ("python", "python tasks"), ("group", "groups"), ("tag", "tags")):
        defined = found.of_kind(kind)
        if not defined:
            continue
        table = _table("name", "members>" if kind in ("group", "tag") else "defined in", title=title)
        for d in defined:
            where = str(len(d.members)) if kind in ("group", "tag") else str(d.path)
            table.add_row(d.name, where)
        _emit(console, table)
    for path, reason in found.unreadable.items():
        _line(console, f"UNREADABLE {path}: {reason}")
    numbers = {kind: len(found.of_kind(kind)) for kind in ("task", "python", "group", "tag")}
    _line(console, f"{found.root}: {numbers['task'] + numbers['python']} tasks, {numbers['group']} groups, "
                   f"{numbers['tag']} tags")  # fmt: skip


def render_task_check(console: Console, found: Catalog, checked: Sequence[Checked]) -> None:
    """Each task or group that does not load with every reason, then the counts: by kind, and by reason."""
    for c in checked:
        if not c.loads:
            _line(console, f"REFUSED {c.kind} {c.name} ({c.path})")
            for reason in c.reasons:
                _line(console, f"  - {reason}")
    for path, reason in found.unreadable.items():
        _line(console, f"UNREADABLE {path}: {reason}")
    numbers = counts(checked)
    for kind, (loading, total) in numbers["loads"].items():
        share = f" ({100 * loading / total:.1f}%)" if total else ""
        _line(console, f"{kind}: {loading} of {total} load{share}")
    if numbers["reasons"]:
        table = _table("refused>", "reason", title="reasons, by the tasks and groups they refuse")
        for reason, n in numbers["reasons"].items():
            table.add_row(str(n), reason)
        _emit(console, table)
