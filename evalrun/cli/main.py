"""The ``evalrun`` command: one click command per verb, ``main(argv) -> int`` for the console script and tests.

Exit codes (docs/design.md "Exit codes"): 0 success, 1 a check failed (CheckFailed), 2 bad input or
usage (BadInput and click's usage errors; the message names the file, field, line or option). An
error is one line on stderr, ``evalrun <command>: error: <where>: <message>`` or ``evalrun <command>:
check failed: <message>``, never a traceback. The last line on stdout of ``run`` and ``resume`` is the
run directory (with -m, the last lines are the run directories, one per job, in job order).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from evalrun import config
from evalrun.analysis.compare import compare_paths
from evalrun.analysis.gate import RULES, gate_paths
from evalrun.analysis.nondet import nondet_paths
from evalrun.analysis.runs import digest_record, load_run
from evalrun.audit.check import DEFAULT_REPEAT_ITEMS, check_run
from evalrun.audit.groups import verify_group
from evalrun.audit.held import held_repeats
from evalrun.audit.ledger import anchor_run, verify_anchored
from evalrun.audit.proofs import check_proof, load_proof, prove
from evalrun.audit.rebaseline import rebaseline_runs
from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.cli import render
from evalrun.config.paths import checkout
from evalrun.config.search import CONFIG_DIR_OPTION, CONFIG_PATH_VARIABLE, config_dirs
from evalrun.engines import logs
from evalrun.engines.pins import model_config_yaml
from evalrun.episodes import FreezeOptions, kind_of
from evalrun.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInput,
    CheckFailed,
    Interrupted,
    write_failed,
)
from evalrun.export.inspect_log import FORMATS, export_inspect
from evalrun.pipeline import dispatch, groups, runner
from evalrun.pipeline.canary import describe as describe_canary
from evalrun.pipeline.worker import canary_on_demand
from evalrun.records.canonical import canonical_json
from evalrun.records.outputs import every_episode_failed, output_warnings
from evalrun.report import ROWS, TRANSCRIPTS, build_report
from evalrun.rundir import layout, store
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record, open_run, read_config, read_manifest, read_outputs, read_summary
from evalrun.rundir.references import load_answers, load_index, parse_set_name
from evalrun.tasks import lm_eval_catalog
from evalrun.worlds.reference_sets import check_reference_set, raise_problems

PROG = "evalrun"
T = TypeVar("T")
DEBUG = "evalrun.debug"  # ctx.meta key: --debug was given
HEX64 = re.compile(r"[0-9a-fA-F]{64}")
INTERVALS = ("clustered", "bootstrap")
RUN_PATH = click.Path(path_type=Path)


class RemoteRun(str):
    """A run directory named by an object store's location (``s3://BUCKET/PREFIX/RUN``): the command reads a local
    working copy made when it starts (:func:`evalrun.rundir.store.snapshot`), and what it writes into it (a
    rescore's results, a report) goes back to the store."""


class RunLocation(click.ParamType):
    """A run directory: a path, or an object store's location (docs/design.md "Run directories on shared storage")."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | RemoteRun:
        text = str(value)
        return RemoteRun(text) if store.is_remote(text) else Path(text)


RUN_DIR = RunLocation()
JSON_HELP = "Print the result as canonical JSON (RFC 8785) instead of tables."


class Failure(click.ClickException):
    """A BadInput or CheckFailed raised by a command, as one stderr line and its exit code."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(store.in_locations(line))  # a run on an object store named by its location, not the copy
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        click.echo(self.message, file=file or sys.stderr)


class EvalrunCommand(click.Command):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            _copy_remote_runs(ctx)
            return super().invoke(ctx)
        except (BadInput, CheckFailed, Interrupted, OSError) as exc:
            if ctx.meta.get(DEBUG):
                traceback.print_exc()
                remote = getattr(exc, "remote_traceback", None)  # raised in a worker's process: its traceback there
                if remote:
                    click.echo(f"raised in the worker's process:\n{remote}", err=True)
            raise _failure(ctx.command_path, exc) from exc


def _copy_remote_runs(ctx: click.Context) -> None:
    """Each run argument on an object store replaced by a local working copy, removed when the command ends."""

    def local(value: Any) -> Any:
        if isinstance(value, RemoteRun):
            copy = store.snapshot(str(value))
            ctx.call_on_close(lambda: store.discard(copy))
            return copy
        if isinstance(value, tuple):
            return tuple(local(v) for v in value)
        return value

    for key, value in list(ctx.params.items()):
        ctx.params[key] = local(value)


def _failure(command: str, exc: BadInput | CheckFailed | Interrupted | OSError) -> Failure:
    """The one stderr line (and exit code) for an error a command raised."""
    if isinstance(exc, Interrupted):
        return Failure(f"{command}: interrupted: the run in {exc.run} is incomplete; `{PROG} resume {exc.run}` "
                       f"finishes it", EXIT_INTERRUPTED)  # fmt: skip
    if isinstance(exc, OSError):  # a file evalrun reads or writes outside the run writer (e.g. an -o path)
        exc = write_failed(exc.filename or "?", exc)
    if isinstance(exc, BadInput):
        return Failure(f"{command}: error: {exc.where}: {exc.message}", EXIT_BAD_INPUT)
    return Failure(f"{command}: check failed: {exc}", EXIT_CHECK_FAILED)


class EvalrunGroup(click.Group):
    command_class = EvalrunCommand


HELP_OPTIONS = ["-h", "--help"]


@click.group(cls=EvalrunGroup, context_settings={"help_option_names": HELP_OPTIONS})
@click.option("--debug", is_flag=True, help="On an error, print its Python traceback before the message.")
@click.option("-v", "--verbose", is_flag=True,
              help="Every engine and Ray log line on stderr, not only warnings (RUN_DIR/logs/ has all).")  # fmt: skip
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """Run evaluations that can be repeated and audited, and read their run directories.

    Exit codes: 0 success, 1 a check failed (or a run whose every episode failed), 2 bad input or usage, 130
    interrupted (Ctrl-C).
    `evalrun COMMAND --help` for each command.
    """
    ctx.meta[DEBUG] = debug
    # Engine and Ray log lines: never on stdout; on stderr from WARNING up (-v: all); all in RUN_DIR/logs/
    logs.route(verbose=verbose)


def _hex64(option: str, value: str | None) -> None:
    if value is not None and not HEX64.fullmatch(value):
        raise BadInput(option, f"expected 64 hexadecimal digits (a sha256), got {value!r}")


def _print_json(record: object) -> None:
    click.echo(canonical_json(record))


def _print_results(console: Any, run_dir: Path, timings: bool = True) -> bool:
    """The run's summary.json as a table (nothing when the run wrote none), and the timings of the invocation that
    finished it (unless ``timings`` is false: this one did not); whether every episode of it failed (the run
    measured nothing: its command exits 1)."""
    run = layout.RunDir(run_dir)
    failed = False
    if run.summary.is_file():
        outputs = read_outputs(run, ["output", "finish_reason"])
        failed = every_episode_failed(outputs)
        warnings = output_warnings(outputs)
        title = f"results: {store.location_of(run_dir)}"
        render.render_summary(console, read_summary(run), title=title, warnings=warnings)
        for warning in warnings:
            click.echo(f"{PROG}: warning: {warning}", err=True)
    if run.summary.is_file() and run.manifest.is_file():
        record = load_record(run).as_record() if run.record.is_file() else None
        render.render_canary_failures(console, read_manifest(run), record)
    phases = load_record(run).timings if timings and run.record.is_file() else None
    if phases:
        click.echo(f"timings: {render.timings_line(phases)}", err=True)
    return failed


def _write_run_report(command: str, run_dir: Path) -> None:
    """RUN_DIR/report.html after a run, its path printed as ``report: PATH``.

    The report is a view of a finished run, not part of it (written after record.json and the
    attestation, listed and hashed nowhere): a failure to build or write it leaves the run complete
    and valid, so it is a warning on stderr naming the command that builds it, and the exit code
    stays 0 (docs/design.md "Report").
    """
    path = layout.RunDir(run_dir).report
    try:
        store.fetch_missing(run_dir)  # a run on an object store: the parts its workers put there, to verify
        data = build_report([run_dir], path)
    except Exception as exc:  # a view must never fail a finished run: any error is reported, not raised
        remote = store.remote_of(run_dir) is not None  # then a local file: the working copy is gone when this ends
        click.echo(f"{command}: warning: {store.in_locations(str(path))}: the report was not written "
                   f"({type(exc).__name__}: {exc}); the run is complete and valid; `{PROG} report "
                   f"{store.location_of(run_dir)} -o {path.name if remote else path}` builds it", err=True)  # fmt: skip
        return
    click.echo(f"report: {store.join(store.location_of(path.parent), path.name)}")
    verdict = data.runs[0].verification
    if not verdict.ok:
        click.echo(f"{command}: warning: verify failed on the finished run: {verdict.message}", err=True)


def _report_wanted(run_dir: Path) -> bool:
    """The run's ``report`` setting, as its config.yaml records it (true for runs made before the setting)."""
    try:
        return read_config(layout.RunDir(run_dir)).get("report", True) is not False
    except CheckFailed:
        return True


def takes_config_dirs(command: Callable[..., T]) -> Callable[..., T]:
    """The ``--config-dir``/``-cd DIR`` option (Hydra's name, repeatable) of every command that composes a config or
    reads a config group: DIR is searched before the built-in configs (evalrun.config.search), as
    ``EVALRUN_CONFIG_PATH``'s directories are after it; a DIR that is not a directory is refused (exit 2)."""

    @click.option("-cd", CONFIG_DIR_OPTION, "config_dir", multiple=True, metavar="DIR",
                  help=f"A directory of your own configs (DIR/model/NAME.yaml, DIR/task/NAME.yaml, ...), searched "
                       f"before evalrun's built-in ones; repeatable; {CONFIG_PATH_VARIABLE}=DIR1:DIR2 adds more "
                       "after them.")  # fmt: skip
    @functools.wraps(command)
    def with_config_dirs(*args: Any, config_dir: tuple[str, ...], **kwargs: Any) -> T:
        with config_dirs(config_dir):
            return command(*args, **kwargs)

    return with_config_dirs


# --- run and resume --------------------------------------------------------------------------------


@cli.command(
    context_settings={"ignore_unknown_options": True},
    short_help="Run an evaluation (Hydra KEY=VALUE overrides; -m sweeps).",
)
@click.option("-m", "--multirun", is_flag=True,
              help="Sweep: every KEY=A,B override runs once per value; one job per combination, in order.")  # fmt: skip
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@takes_config_dirs
def run(multirun: bool, overrides: tuple[str, ...]) -> int:
    """Run an evaluation configured by Hydra OVERRIDES (KEY=VALUE, e.g. task=addition limit=20 cluster=inline).

    Every job's config is composed and checked before anything starts; on Ray the first job's workers start
    loading while the pins, datasets and plans are checked, and stop at once if one fails. Prints a results table per
    task and metric and the path of the run's HTML report (RUN_DIR/report.html; report=false skips it),
    then the run directory as the last line of stdout (with -m: one line per job).

    An lm-eval ``task.name`` that names a group, a tag or several tasks (``'task.name="a,b"'``) runs each task as
    a run of its own in the group's directory (GROUP_DIR/TASK), on one engine, then writes GROUP_DIR/group.json
    (the group's metrics, as lm-eval aggregates them) and prints the group's table; its line is GROUP_DIR.
    """
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise BadInput(flags[0], "unknown option (overrides are KEY=VALUE; -m for a multirun)")
    jobs = config.expand_multirun(list(overrides)) if multirun else [list(overrides)]
    loaded = [_in_job(job, multirun, lambda job=job: _load_job(job, multirun)) for job in jobs]
    # A job naming several lm-eval tasks (a group, a tag, a,b) runs each task as a run of its own in the group's
    # directory, then writes the group's record (evalrun.pipeline.groups)
    plans = [_in_job(job, multirun, lambda c=c: groups.plan_group(c)) for job, c in zip(jobs, loaded, strict=True)]
    units = [(job, list(plan.members) if plan is not None else [c]) for job, c, plan in zip(jobs, loaded, plans,
                                                                                            strict=True)]  # fmt: skip
    spec = _in_job(jobs[0], multirun, lambda: runner.worker_spec(units[0][1][0]))
    console = render.stdout_console()
    finished: list[Path] = []
    measured_nothing: list[Path] = []  # runs whose every episode failed

    def shown(run_dir: Path, report: bool) -> None:
        if _print_results(console, run_dir):
            measured_nothing.append(run_dir)
        if report:
            _write_run_report("evalrun run", run_dir)

    # The first job's workers start now, while every job's pins, dataset and plan are checked (on Ray they
    # load in their own processes meanwhile). Consecutive jobs with the same model, engine and workers share
    # one dispatcher.
    current: tuple[str, dispatch.Dispatcher] | None = None
    try:
        early = dispatch.start_early(spec, loaded[0].cluster)
        if early is not None:
            current = (dispatch.dispatcher_key(spec, loaded[0].cluster), early)
        prepared = [[_in_job(job, multirun, lambda c=c: runner.prepare(c)) for c in configs] for job, configs in units]
        for plan, jobs_prepared in zip(plans, prepared, strict=True):
            first = jobs_prepared[0]
            key = dispatch.dispatcher_key(first.worker_spec, first.config.cluster)
            if current is None or current[0] != key:
                if current is not None:
                    current[1].close()
                current = (key, runner.open_for(first))
            if plan is None:
                finished.append(runner.execute(first, current[1]))
                shown(finished[-1], first.config.report)
                continue
            # a group (a tag, a,b): its tasks, each a run of its own in the group's directory, then its record
            record = groups.run_group(plan, jobs_prepared, current[1], lambda d, r=plan.config.report: shown(d, r))
            render.render_group(console, record, title=f"group results: {store.join(plan.location, layout.GROUP)}")
            finished.append(plan.directory)
    finally:
        if current is not None:
            current[1].close()
    for run_dir in finished:
        click.echo(store.location_of(run_dir))
    for run_dir in finished:  # a run on an object store: its driver's working copy is no longer needed
        if store.remote_of(run_dir) is not None:
            store.discard(run_dir)
    return EXIT_CHECK_FAILED if measured_nothing else EXIT_OK


def _resume_group(directory: Path, overrides: list[str]) -> int:
    """``evalrun resume GROUP_DIR``: the group's unfinished tasks, then its record and table; the exit code (1 when
    every episode of a task it ran failed)."""
    console = render.stdout_console()
    measured_nothing = False

    def shown(run_dir: Path) -> None:
        nonlocal measured_nothing
        measured_nothing |= _print_results(console, run_dir)
        if _report_wanted(run_dir):
            _write_run_report("evalrun resume", run_dir)

    record = groups.resume_group(directory, overrides, on_task=shown)
    where = store.location_of(directory)  # a group on an object store: its location, not the working copy
    render.render_group(console, record, title=f"group results: {store.join(where, layout.GROUP)}")
    click.echo(where)
    return EXIT_CHECK_FAILED if measured_nothing else EXIT_OK


def _in_job(job: list[str], multirun: bool, step: Callable[[], T]) -> T:
    """``step()``; a BadInput it raises names the job (a multirun's) it was raised for."""
    try:
        return step()
    except BadInput as exc:
        if multirun:
            raise BadInput(exc.where, f"{exc.message} (in job {' '.join(job) or '<defaults>'})") from exc
        raise


def _load_job(job: list[str], multirun: bool) -> config.EvalConfig:
    """A job's config, composed and checked with what needs no file read beyond it: plug-in names, the
    destination, the install record and image."""
    loaded = config.load(job)
    if loaded.seeds.master_generated:  # seeds.master=auto: which seed, before anything runs
        where = f" (job {' '.join(job)})" if multirun else ""
        click.echo(f"evalrun run: seeds.master=auto: generated master seed {loaded.seeds.master}{where}", err=True)
    runner.check_plugins(loaded)
    runner.check_before_engine(loaded)
    return loaded


@cli.command(short_help="Finish an interrupted run, keeping its complete parts.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("overrides", nargs=-1)
@takes_config_dirs
def resume(run_dir: Path, overrides: tuple[str, ...]) -> int:
    """Finish the interrupted run in RUN_DIR, keeping its complete parts.

    OVERRIDES may change only how it runs: cluster=NAME, cluster.KEY=VALUE, run.progress=BOOL, run.on_drift and a
    served engine's transport (engine.base_url=URL for a server that moved, engine.max_concurrency, ...). Prints
    the results table and the report's path (as `evalrun run` does), then the run directory as the last line of
    stdout. A run that is complete already (its record and attestation written) is left as it is: nothing runs,
    and stderr says so; if a file it lists no longer has its recorded sha256, exit 1 naming it.
    """
    if "=" in str(run_dir):
        raise BadInput("RUN_DIR", "usage: evalrun resume RUN_DIR [cluster.KEY=VALUE ...]")
    if not run_dir.is_dir():
        raise BadInput(str(run_dir), "no such run directory")
    if groups.is_group_dir(run_dir):
        return _resume_group(run_dir, list(overrides))
    if (run_dir / layout.RECORD).is_file() and (run_dir / layout.ATTESTATION).is_file():
        runner.check_finished(layout.RunDir(run_dir))  # an altered finished run is refused, not passed as complete
        where = store.location_of(run_dir)
        click.echo(f"evalrun resume: {where} is complete already (record.json and its attestation are written): "
                   "nothing to resume; `evalrun verify` checks it", err=True)  # fmt: skip
        click.echo(where)
        return EXIT_OK
    only_attested = (run_dir / layout.RECORD).is_file()  # stopped between its record and its attestation
    finished = runner.resume(run_dir, list(overrides))
    if only_attested:  # its timings are the invocation's that made it, not this one's: not printed as this one's
        click.echo(f"evalrun resume: {store.location_of(finished)}: its records were complete; its attestation, "
                   "the one thing missing, is written now (nothing ran)", err=True)  # fmt: skip
    measured_nothing = _print_results(render.stdout_console(), finished, timings=not only_attested)
    if _report_wanted(finished):
        _write_run_report("evalrun resume", finished)
    click.echo(store.location_of(finished))  # a run on an object store: its location, not the working copy
    return EXIT_CHECK_FAILED if measured_nothing else EXIT_OK


# --- audit -----------------------------------------------------------------------------------------


@cli.command(short_help="Recompute and check everything in a run directory.")
@click.argument("run_dir", type=RUN_DIR)
@click.option("--expect-root", metavar="HEX", help="A Merkle root kept elsewhere: the run's root must equal it.")
@click.option(
    "--expect-seal",
    metavar="HEX",
    help="A seal kept elsewhere (record.json's seal when the run ended): "
    "the run's recomputed seal must equal it, so that no claimed figure changed.",
)
@click.option("--ledger", type=RUN_PATH, metavar="LEDGER",
              help="An anchor ledger (`evalrun anchor`): its chain must hold, and the run must be anchored there "
                   "with its seal, digest and Merkle root.")  # fmt: skip
@click.option("--ledger-head", metavar="HEX",
              help="A head of LEDGER published after the run was anchored: the ledger's chain must pass through "
                   "it at or after the run's line.")  # fmt: skip
@click.option("--public-key", type=RUN_PATH, metavar="PEM",
              help="Ed25519 public key (PEM): the attestation must carry a valid signature by it.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Processes checking the parts in parallel (0: one per CPU).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def verify(run_dir: Path, expect_root: str | None, expect_seal: str | None, ledger: Path | None,
           ledger_head: str | None, public_key: Path | None, jobs: int, as_json: bool) -> None:  # fmt: skip
    """Recompute everything in RUN_DIR that can be recomputed; exit 1 naming the first thing that differs.

    Chains, heads and output rows of every part, file hashes, counts, the Merkle root, the manifest
    digest, scores and summary, a re-baseline record, and the attestation (docs/design.md lists each
    check); with --ledger, the run against its anchored seal, digest and root.
    """
    _hex64("--expect-root", expect_root)
    _hex64("--expect-seal", expect_seal)
    _hex64("--ledger-head", ledger_head)
    if ledger_head is not None and ledger is None:
        raise BadInput("--ledger-head", "needs --ledger LEDGER, the ledger whose head it is")
    checks: dict[str, Any] = {"expect_root": expect_root, "public_key": public_key, "jobs": jobs,
                              "expect_seal": expect_seal}  # fmt: skip
    if groups.is_group_dir(run_dir):
        if ledger is not None or expect_root is not None or expect_seal is not None:
            raise BadInput("GROUP_DIR", "--ledger, --expect-root and --expect-seal check one run: give a task's run "
                                        "directory (GROUP_DIR/TASK)")  # fmt: skip
        group = verify_group(run_dir, public_key=public_key, jobs=jobs)
        if as_json:
            _print_json(render.group_verify_record(group))
        else:
            render.render_group_verify(render.stdout_console(), group)
        return
    if ledger is not None:
        report = verify_anchored(run_dir, ledger, ledger_head, **checks)
    else:
        report = verify_run(run_dir, **checks)
    if as_json:
        _print_json(render.verify_record(report))
    else:
        render.render_verify(render.stdout_console(), report)


@cli.command(short_help="Verify a run and append its seal, digest and root to a ledger.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("ledger", type=RUN_PATH)
@click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Processes verifying the parts in parallel (0: one per CPU).")  # fmt: skip
def anchor(run_dir: Path, ledger: Path, jobs: int) -> None:
    """Verify RUN_DIR, then append its name, seal, digest and Merkle root to LEDGER (created when absent).

    LEDGER is append-only and itself a hash chain (docs/design.md "Ledger"). Anchoring the same run
    again changes nothing; a run of the same name with another seal is refused (exit 1). Prints the
    entry and the ledger's new head: publish the head, and `evalrun verify RUN_DIR --ledger LEDGER
    --ledger-head HEX` catches a run directory rewritten after it was anchored.
    """
    result = anchor_run(run_dir, ledger, jobs)
    line = result.line
    if result.appended:
        click.echo(f"ok: anchored run {line.entry.run} at {ledger} line {line.number}")
    else:
        click.echo(f"ok: run {line.entry.run} is anchored at {ledger} line {line.number} already, with this seal; "
                   "nothing appended")  # fmt: skip
    click.echo(f"entry: {line.text}")
    click.echo(f"ledger head: {result.head}")


@cli.command(short_help="Remove the lock a killed driver left on a run on an object store.")
@click.argument("location")
def unlock(location: str) -> None:
    """Remove the lock (.lock) that a driver killed while it ran LOCATION left there, so that `evalrun resume
    LOCATION` can finish the run (a task's run in a group: LOCATION is GROUP/TASK, as resume names it).

    Only a run on an object store can hold a dead driver's lock: on a file system the kernel releases it when its
    driver dies. Refused (exit 2) while the driver that holds it is running on this host; a driver on another node
    this cannot see: run it only when that driver is gone.
    """
    held_by = store.open_store(location, "LOCATION").unlock()
    if held_by is None:
        click.echo(f"{location}: no lock is held there; nothing to remove")
    else:
        click.echo(f"removed the lock of driver {held_by} from {location}")


@cli.command(short_help="Score the stored outputs again, with no engine.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@takes_config_dirs
def rescore(run_dir: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Score RUN_DIR's stored outputs again with the current scorer code; no engine is loaded.

    With no OVERRIDES the scores must come out identical (exit 1 otherwise: the scorer changed without a
    version bump). OVERRIDES change the scorer (e.g. name=number, normalize=[strip,lower],
    task.rubric=PATH); the new scores go beside the run, under RUN_DIR/rescore/, with a table per task.
    """
    report = rescore_run(run_dir, list(overrides))
    if as_json:
        _print_json(render.rescore_record(report))
    else:
        render.render_rescore(render.stdout_console(), report)


@cli.command(short_help="Run the harness again on the recorded responses.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("overrides", nargs=-1)
@click.option("--live", type=click.Choice(["agent", "user"]), metavar="SIDE",
              help="Hold the other side of a conversation fixed and run SIDE live (agent: the user's recorded "
                   "replies are served; user: the agent's).")  # fmt: skip
@click.option(
    "--draws",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="With --live: N repeats whose live side samples with fresh seeds (0: one, with the run's own).",
)
@click.option("--metric", metavar="NAME", help="With --live: the metric compared (default: pass).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@takes_config_dirs
def replay(run_dir: Path, overrides: tuple[str, ...], live: str | None, draws: int, metric: str | None,
           as_json: bool) -> None:  # fmt: skip
    """Run the harness again on RUN_DIR's recorded responses; every head, the root and the scores must match.

    OVERRIDES change the config replayed (e.g. task.template=PATH): a divergence is reported at the first
    entry that differs (exit 1). The verdict says whether this was a reproduction (the recording code, no
    overrides) or a test of other code or another config.

    With --live SIDE, a conversation run is repeated with the other side held fixed: each repeat is a new run
    (under run.root, as `evalrun run` makes them; OVERRIDES change how it runs) whose SIDE runs live on its
    engine; the report puts each repeat against the original, side by side, and prints the repeats' directories
    last.
    """
    if live is not None:
        held = held_repeats(run_dir, live, draws, list(overrides), metric)
        if as_json:
            _print_json(held.as_record())
        else:
            render.render_held(render.stdout_console(), held)
        return
    if draws or metric is not None:
        raise BadInput("--draws" if draws else "--metric", "goes with --live (a held repeat)")
    report = replay_run(run_dir, list(overrides))
    if as_json:
        _print_json(render.replay_record(report))
    else:
        render.render_replay(render.stdout_console(), report)
    if report.divergences:
        first = report.divergences[0]
        raise CheckFailed(f"{len(report.divergences)} of {report.episodes} episodes diverge; first: "
                          f"episode {first.episode} seq {first.seq}")  # fmt: skip
    if not report.matches:
        raise CheckFailed(report.verdict)


@cli.command(short_help="Is this run reproducible here? Replay, rescore and a live repeat.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("overrides", nargs=-1)
@click.option("--repeat-items", type=click.IntRange(min=1), default=DEFAULT_REPEAT_ITEMS, show_default=True,
              metavar="N", help="Items to run again live (all their episodes; all items if fewer).")  # fmt: skip
@click.option("--keep", type=RUN_PATH, metavar="DIR",
              help="Keep the repeat's run directory at DIR (default: a temporary directory, removed).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@takes_config_dirs
def check(run_dir: Path, overrides: tuple[str, ...], repeat_items: int, keep: Path | None, as_json: bool) -> None:
    """The three reproducibility checks of RUN_DIR, one verdict each; exit 1 if any fails.

    replay: the recorded model replies and tool results against a fresh harness and fresh worlds (every
    line, head, the root, the scores). rescore: the stored outputs scored again (bit-identical values).
    repeat: N items drawn from the master seed run again live with the recorded config; per episode the
    first divergent token and max |logprob difference|, TARr/TARa, the mean against the original's 95%
    interval, and the settings that differ. OVERRIDES change only how the repeat runs: cluster=NAME,
    cluster.KEY=VALUE, run.progress=BOOL.
    """
    if "=" in str(run_dir):
        raise BadInput("RUN_DIR", "usage: evalrun check RUN_DIR [--repeat-items N] [cluster.KEY=VALUE ...]")
    report = check_run(run_dir, repeat_items, list(overrides), keep)
    if as_json:
        _print_json(report.as_record())
    else:
        render.render_check(render.stdout_console(), report)
    if not report.passed:
        raise CheckFailed(report.failure())


@cli.command("prove", short_help="Inclusion proof of one episode under the Merkle root.")
@click.argument("run_dir", type=RUN_DIR)
@click.argument("episode_id")
@click.option("-o", "--output", type=RUN_PATH, metavar="PROOF.json", help="Write the proof to this file, not stdout.")
@click.option("--from", "from_seq", type=click.IntRange(min=0), default=0, metavar="SEQ",
              help="Disclose the chain from entry SEQ on (after the hash before it); the earlier entries stay "
                   "private.")  # fmt: skip
def prove_command(run_dir: Path, episode_id: str, output: Path | None, from_seq: int) -> None:
    """The audit path from episode EPISODE_ID of RUN_DIR to the run's Merkle root, and its chain's entries (all, or
    from --from SEQ on), as canonical JSON."""
    text = canonical_json(prove(run_dir, episode_id, from_seq).as_record())
    if output:
        output.write_text(text + "\n", encoding="utf-8")
    else:
        click.echo(text)


@cli.command("verify-proof", short_help="Check an inclusion proof against a Merkle root.")
@click.argument("proof_path", metavar="PROOF", type=RUN_PATH)
@click.option("--root", required=True, metavar="HEX", help="The run's Merkle root, obtained independently.")
def verify_proof(proof_path: Path, root: str) -> None:
    """Check that the episode in PROOF (from `evalrun prove`) is a leaf under ROOT; exit 1 if not."""
    _hex64("--root", root)
    proof = load_proof(proof_path)
    check_proof(proof, root)
    disclosed = (
        ""
        if proof.from_seq is None
        else (f"; entries {proof.from_seq} to {proof.from_seq + len(proof.lines) - 1} chain to its head")
    )
    click.echo(f"ok: episode {proof.episode_id} (head {proof.head}) is leaf {proof.leaf_index} of {proof.tree_size} "
               f"under root {root}{disclosed}")  # fmt: skip


@cli.command(short_help="(Re)write the run's in-toto attestation.")
@click.argument("run_dir", type=RUN_DIR)
@click.option("--key", type=RUN_PATH, metavar="PEM", help="Ed25519 private key (PEM) to sign with; unsigned without.")
def attest(run_dir: Path, key: Path | None) -> None:
    """(Re)write RUN_DIR/attestation.intoto.json from record.json; prints its path."""
    opened = open_run(run_dir)
    click.echo(store.in_locations(str(write_attestation(opened, load_record(opened), key))))


@cli.command(short_help="Record that a baseline was re-run under a new digest.")
@click.argument("old_baseline", type=RUN_DIR)
@click.argument("new_baseline", type=RUN_DIR)
@click.option("--reason", required=True, metavar="TEXT", help="Why the baseline was re-run (recorded, cited by gate).")
@click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Processes verifying the parts in parallel (0: one per CPU).")  # fmt: skip
def rebaseline(old_baseline: Path, new_baseline: Path, reason: str, jobs: int) -> None:
    """Record in NEW_BASELINE/rebaseline.json that it re-runs OLD_BASELINE under a new digest (docs/design.md
    "Re-baseline"): both runs verify, are runs of the same model and differ in digest. The record holds both
    digests, roots and seals, REASON and what changed; `evalrun gate` cites it, `evalrun verify` checks it."""
    record, path = rebaseline_runs(old_baseline, new_baseline, reason, jobs)
    render.render_rebaseline(render.stdout_console(), record.as_record())
    click.echo(store.in_locations(f"ok: wrote {path}"))


# --- analysis --------------------------------------------------------------------------------------


@cli.command(short_help="Manifest diff, then paired B - A per task and overall.")
@click.argument("run_a", type=RUN_DIR)
@click.argument("run_b", type=RUN_DIR)
@click.option("--interval", type=click.Choice(INTERVALS), default="clustered", show_default=True,
              help="Paired interval shown in the table (the JSON holds both).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def compare(run_a: Path, run_b: Path, interval: str, as_json: bool) -> None:
    """What changed from RUN_A to RUN_B (manifest diff), then B - A per task and overall.

    Per-item means, paired over the items both runs have, with the paired 95% interval, a paired test
    (McNemar for 0/1 values, else sign-flip permutation) and the unpaired interval beside it. Warns when
    more than one thing changed.
    """
    report = compare_paths(run_a, run_b)
    if as_json:
        _print_json(report.as_record())
    else:
        render.render_compare(render.stdout_console(), report, interval)
    if report.warning:
        click.echo(f"{PROG} compare: {report.warning}", err=True)


@cli.command(short_help="The six-field release-gate record of a run.")
@click.argument("run_dir", type=RUN_DIR)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def digest(run_dir: Path, as_json: bool) -> None:
    """The six-field release-gate record of RUN_DIR: candidate, model checkpoint, prompt pack, seed set,
    scoring, digest."""
    record = digest_record(load_run(run_dir))
    if as_json:
        _print_json(record)
    else:
        render.render_digest(render.stdout_console(), record)


@cli.command(short_help="Release gate: exit 1 unless the candidate beats the margin.")
@click.argument("candidate", type=RUN_DIR)
@click.argument("baseline", type=RUN_DIR)
@click.option("--rule", type=click.Choice(RULES), default="range", show_default=True,
              help="Margin rule: range (FACTOR x pooled range of per-seed means) or paired (the paired 95% "
                   "interval's lower end must be above 0).")  # fmt: skip
@click.option("--factor", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Range rule: margin = FACTOR x pooled range.")  # fmt: skip
@click.option("--interval", type=click.Choice(INTERVALS), default="clustered", show_default=True,
              help="Paired rule: which 95% interval.")  # fmt: skip
@click.option("--metric", help="Metric to gate on (default: the runs' only shared metric).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def gate(candidate: Path, baseline: Path, rule: str, factor: float, interval: str, metric: str | None,
         as_json: bool) -> None:  # fmt: skip
    """Release gate: exit 0 only if CANDIDATE and BASELINE have equal digests, scored the same items, and the
    candidate's mean beats the baseline's by more than the margin; else exit 1 (blocked)."""
    decision = gate_paths(candidate, baseline, rule=rule, metric=metric, factor=factor, interval=interval)
    if as_json:
        _print_json(decision.as_record())
    else:
        render.render_gate(render.stdout_console(), decision)
    if not decision.passed:
        raise CheckFailed(f"blocked: {decision.reason} [{decision.margin_rule}]")


@cli.command(short_help="TARr/TARa, divergence, accuracy spread over equal-digest runs.")
@click.argument("runs", nargs=-1, required=True, type=RUN_DIR)
@click.option("--metric", help="Metric for TARa and accuracy (default: the runs' only shared metric).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def nondet(runs: tuple[Path, ...], metric: str | None, as_json: bool) -> None:
    """Measured nondeterminism over two or more RUNS with equal digests, matched by episode.

    TARr/TARa (raw outputs / parsed answers identical), distinct completions, first divergent token,
    logprob drift before it, accuracy per run and its spread, and the settings that differ.
    """
    report = nondet_paths(list(runs), metric)
    if as_json:
        _print_json(report.as_record())
    else:
        render.render_nondet(render.stdout_console(), report)


# --- export --------------------------------------------------------------------------------------


@cli.command("export", short_help="Write a run as an Inspect AI eval log (inspect view).")
@click.argument("run_dir", type=RUN_DIR)
@click.option("--format", "format_", type=click.Choice(FORMATS), default="inspect", show_default=True,
              help="inspect: Inspect AI's .eval log, for `inspect view` and Inspect's log dataframes.")  # fmt: skip
@click.option("-o", "--output", type=RUN_PATH, required=True, metavar="FILE.eval", help="The file to write.")
@click.option("--no-verify", is_flag=True,
              help="Export without verifying the run first (the log's metadata says verified: false).")  # fmt: skip
def export(run_dir: Path, format_: str, output: Path, no_verify: bool) -> None:
    """Write the finished run in RUN_DIR to FILE.eval as an Inspect AI eval log: one sample per episode
    (input, messages, output, scores, evalrun's ids and heads in its metadata), the metrics of
    summary.json as its results. The run is verified first (exit 1 if it fails); an incomplete run is
    exit 2. Open the file with `inspect view --log-dir DIR` (DIR: the folder that holds it).
    """
    report = export_inspect(run_dir, output, verify=not no_verify)
    status = "verified" if report.verified else "not verified (--no-verify)"
    click.echo(f"exported {report.samples} samples of {store.location_of(run_dir)} ({status}) to {output}")


@cli.command(
    context_settings={"ignore_unknown_options": True},
    short_help="Batch-invariance canary: the engine's outputs alone vs in batches, bitwise.",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@takes_config_dirs
def canary(overrides: tuple[str, ...], as_json: bool) -> None:
    """Build one engine worker here (inline, no Ray) from the Hydra OVERRIDES of `evalrun run` (model, engine,
    determinism, ...), run the batch-invariance canary on it, and print one row per check and the verdict.

    A fixed needle prompt runs alone and inside batches of 2, 4, 8 and 16 other prompts, greedy and sampled
    with fixed seeds; its token ids and logprobs must equal those it got alone, bit for bit. Exit 0 when
    they do, 1 when not (the first mismatch is named), 2 on bad input.
    """
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise BadInput(flags[0], "unknown option (overrides are KEY=VALUE; --json for JSON)")
    prepared = runner.prepare(config.load(list(overrides)))
    result, worker = canary_on_demand(prepared.worker_spec)
    if as_json:
        keys = ("worker", "hardware", "engine", "determinism")
        _print_json({**result.as_record(), "worker": {k: worker[k] for k in keys}})
    else:
        render.render_canary(render.stdout_console(), result, worker)
    if not result.invariant:
        raise CheckFailed(describe_canary(result))


# --- report --------------------------------------------------------------------------------------


@cli.command("report", short_help="One self-contained HTML page of one or several runs.")
@click.argument("runs", nargs=-1, required=True, type=RUN_DIR)
@click.option("-o", "--output", type=RUN_PATH, required=True, metavar="FILE.html",
              help="Where to write the page (in a run: RUN_DIR/report.html, the one name verify accepts).")  # fmt: skip
@click.option("--rows", type=click.IntRange(min=0), default=ROWS, show_default=True, metavar="N",
              help="Episodes the table holds per run (the first N in run order).")  # fmt: skip
@click.option("--transcripts", type=click.IntRange(min=0), default=TRANSCRIPTS, show_default=True, metavar="N",
              help="Agent episodes per run whose step-by-step transcript the page holds.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Processes verify uses (0: one per CPU).")  # fmt: skip
def report_command(runs: tuple[Path, ...], output: Path, rows: int, transcripts: int, jobs: int) -> None:
    """Write one HTML page (inline CSS, script and plots; opens from disk, fetches nothing) of RUNS.

    Per run: verify's verdict (recomputed now; a failure is shown at the top), the six-field digest, Merkle
    root and seal, model pins, engine, determinism asked and honoured, hardware; scores with their intervals
    and the spread over seeds as plots; every episode in a searchable, filterable table; agent transcripts.
    With several runs, each is compared with the first (manifest diff, paired comparison per task) and,
    when their digests are equal, the nondeterminism report. Prints the page's path; exit 1 (after writing
    it) when a run fails verify.
    """
    data = build_report(list(runs), output, rows=rows, transcripts=transcripts, jobs=jobs)
    click.echo(str(output))
    failed = [r for r in data.runs if not r.verification.ok]
    if failed:
        raise CheckFailed(f"{failed[0].path}: verify: {failed[0].verification.message} (the report {output} "
                          "shows it)")  # fmt: skip


# --- models --------------------------------------------------------------------------------------------


@cli.command("pin", short_help="Write the model config that pins a model directory by its files' sha256.")
@click.argument("model_dir", type=RUN_PATH)
@click.option("-o", "--output", type=RUN_PATH, metavar="FILE.yaml",
              help="Write the config there (e.g. DIR/model/NAME.yaml in a config directory of your own, then "
                   "`evalrun run --config-dir DIR model=NAME`) and print its path; without it the config goes to "
                   "stdout.")  # fmt: skip
@click.option("--name", help="The config's name (default: the directory's name).")
@click.option("--id", "model_id", metavar="ID", help="The model's id, as manifests record it (default: its name).")
def pin(model_dir: Path, output: Path | None, name: str | None, model_id: str | None) -> None:
    """Pin the Hugging Face model directory MODEL_DIR: a model config with the sha256 of every file, the
    dtype from its config.json, and its chat template's sha256 as a comment.

    The config's path is MODEL_DIR as given: a relative one is read from the working directory when the
    config is used, as every relative path is. Exit 2 when MODEL_DIR is not a directory, has no config.json
    or no weight files (*.safetensors, *.bin), or its config or tokenizer does not load with transformers
    (offline).
    """
    text = model_config_yaml(model_dir, path=str(model_dir), name=name, model_id=model_id)
    if output is None:
        click.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    click.echo(str(output))


# --- frozen references --------------------------------------------------------------------------------


@cli.group(cls=EvalrunGroup, short_help="Build and check frozen references (solver results, ground truths).")
def references() -> None:
    """Frozen reference solutions under references/<world>/<version>/ (docs/design.md "Frozen references")."""


@references.command("build", context_settings={"ignore_unknown_options": True},
                    short_help="Freeze each task's reference: a CP-SAT solution or a ground truth.")  # fmt: skip
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--allow-feasible", is_flag=True, help="Freeze a FEASIBLE (not proven optimal) reference, saying why.")
@click.option("--max-deterministic-time", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="CP-SAT's deterministic time limit (work units, not seconds).")  # fmt: skip
@click.option("--random-seed", type=int, default=0, show_default=True, help="CP-SAT's random_seed.")
@click.option("--root", type=RUN_PATH, help="The references directory (default: the built-in ones, in the package).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@takes_config_dirs
def references_build(overrides: tuple[str, ...], allow_feasible: bool, max_deterministic_time: float,
                     random_seed: int, root: Path | None, as_json: bool) -> None:  # fmt: skip
    """Build the references of the world tasks Hydra OVERRIDES select (default task=shift_planner, its
    split): for a planning world one CP-SAT solve per instance, one worker, fixed seed (exit 1 if one
    is not OPTIMAL); for a world whose own code computes the answers (task=invoice_desk), its ground
    truth as it is now."""
    if root is None and checkout() is None:
        raise BadInput("--root", "the built-in references ship inside the installed evalrun package, which nothing "
                                 "writes into; give --root DIR (a directory of your own)")  # fmt: skip
    args = list(overrides)
    if not any(o.startswith("task=") for o in args):
        args.insert(0, "task=shift_planner")
    loaded = config.load(args)
    options = FreezeOptions(allow_feasible, max_deterministic_time, random_seed)
    frozen = kind_of(loaded).freeze(loaded, root, options)
    if as_json:
        _print_json(frozen.as_json())
    else:
        click.echo(frozen.message())


@references.command("check", short_help="Re-validate stored references without trusting them.")
@click.option("--world", "world_name", default="shift-planner", show_default=True, help="The world.")
@click.option("--version", "world_version", default="1", show_default=True, help="The world's version.")
@click.option("--answers", metavar="NAME@VERSION", help="Check a dataset task's frozen answer set instead.")
@click.option("--resolve", is_flag=True, help="Also re-solve with the recorded settings; compare status and objective.")
@click.option("--root", type=RUN_PATH, help="The references directory (default: the built-in ones, in the package).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def references_check(world_name: str, world_version: str, answers: str | None, resolve: bool, root: Path | None,
                     as_json: bool) -> None:  # fmt: skip
    """Check every reference of a set: index hashes, instance and model hashes, feasibility under the
    world's checker, the objective recomputed (a ground truth: every field recomputed). Exit 1 naming
    the instance and field of each problem. ``--answers``: a dataset task's answer set, its hashes."""
    if answers is not None:
        name, version = parse_set_name(answers, "--answers")
        index = load_index(name, version, root)  # missing: exit 2
        try:
            found = load_answers(name, version, root)[1]
        except BadInput as exc:
            raise CheckFailed(f"{exc.where}: {exc.message}") from exc
        if as_json:
            _print_json({"references": index.record(), "answers": len(found)})
        else:
            click.echo(f"answers ok: {len(found)} in {index.directory}; index sha256 {index.sha256}")
        return
    report = check_reference_set(world_name, world_version, resolve, root)
    if as_json:
        _print_json(report.as_json())
    elif not report.problems:
        click.echo(f"references ok: {report.checked} in {report.index.directory}"
                   f"{' (re-solved)' if resolve else ''}; index sha256 {report.index.sha256}")  # fmt: skip
    raise_problems(report)


# --- lm-eval task definitions ---------------------------------------------------------------------------

LM_EVAL_LIBRARY = "lm-eval"  # PATH's name for lm-eval's own shipped tasks


def _task_root(path: str) -> Path:
    if path == LM_EVAL_LIBRARY and not Path(path).exists():
        return lm_eval_catalog.library_dir()
    return Path(path)


@cli.group(cls=EvalrunGroup, short_help="lm-eval task YAMLs: what a directory defines, and whether each loads.")
def tasks() -> None:
    """lm-eval task YAMLs as lm-eval itself reads them (no model is loaded and no data is read). PATH is a
    directory of task YAMLs (what task.path names), one YAML, or `lm-eval` for lm-eval's own shipped tasks."""


@tasks.command("list", short_help="The tasks, groups and tags under PATH.")
@click.argument("path", metavar="PATH")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def tasks_list(path: str, as_json: bool) -> None:
    """The tasks, groups (with their members) and tags lm-eval's TaskManager finds under PATH."""
    found = lm_eval_catalog.catalog(_task_root(path))
    if as_json:
        _print_json({"root": str(found.root), "lm_eval_version": lm_eval_catalog.lm_eval_version(),
                     "definitions": [d.as_record() for d in found.definitions.values()],
                     "unreadable": {str(p): r for p, r in found.unreadable.items()}})  # fmt: skip
    else:
        render.render_task_list(render.stdout_console(), found)


@tasks.command("check", short_help="Whether each task and group under PATH loads, and every reason it does not.")
@click.argument("path", metavar="PATH")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def tasks_check(path: str, names: tuple[str, ...], as_json: bool) -> None:
    """Load every task and group under PATH (or the NAMES given; a tag stands for its tasks) as lm-eval loads it,
    up to its data: its YAML, every helper it imports, its TaskConfig, metrics, aggregations and filters, and what
    it asks of evalrun's engines. Every reason a task does not load is listed, and counts at the end. Exit 1 when
    one does not load."""
    found, checked = lm_eval_catalog.check(_task_root(path), names)
    if as_json:
        _print_json({"root": str(found.root), "lm_eval_version": lm_eval_catalog.lm_eval_version(),
                     "checked": [c.as_record() for c in checked], "counts": lm_eval_catalog.counts(checked),
                     "unreadable": {str(p): r for p, r in found.unreadable.items()}})  # fmt: skip
    else:
        render.render_task_check(render.stdout_console(), found, checked)
    refused = [c for c in checked if not c.loads]
    if refused or found.unreadable:
        raise CheckFailed(
            f"{len(refused)} of {len(checked)} do not load"
            + (f"; {len(found.unreadable)} YAML files do not read" if found.unreadable else "")
        )


def _usage_error(exc: click.UsageError) -> int:
    command = exc.ctx.command_path if exc.ctx is not None else PROG
    click.echo(f"{command}: error: {exc.format_message()} (see '{command} --help')", err=True)
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit code; without ``argv`` (the console script, ``python -m
    evalrun.cli``) it is the process's entry and leaves the process once the command is done (:func:`leave`)."""
    if argv is None:
        leave(_main(sys.argv[1:]))
    return _main(list(argv))


def leave(code: int) -> NoReturn:
    """Exit now, without the interpreter's teardown (docs/design.md "Start-up and exit").

    A command returns only once every file it wrote is closed (the run writer fsyncs its files) and any Ray
    it started is shut down; what the interpreter would still do at exit is the engine's teardown (seconds of
    finalizers and compiler worker pools) and writes nothing of evalrun's. So: flush the standard streams
    and the log handlers, stop the child processes this process started, and ``os._exit``.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    if "ray" in sys.modules:
        import ray

        with contextlib.suppress(Exception):
            if ray.is_initialized():
                ray.shutdown()
    for child in multiprocessing.active_children():  # e.g. vLLM's engine core, when not in-process
        child.kill()
    os._exit(code)


def _main(args: list[str]) -> int:
    if not args:  # usage, as an error
        click.echo(cli.get_help(click.Context(cli, info_name=PROG, help_option_names=HELP_OPTIONS)))
        return EXIT_BAD_INPUT
    if args[0] == "help":  # `evalrun help [COMMAND]`
        args = [*args[1:], "--help"]
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Ignored SIGINT is inherited (a background job of a shell, a parent that ignores it): then
        # Ctrl-C or `kill -INT` would do nothing and a run could not be interrupted and resumed.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = cli.main(args, prog_name=PROG, standalone_mode=False)
    except click.UsageError as exc:
        return _usage_error(exc)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo(f"{PROG}: interrupted", err=True)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":
    main()
