"""The command line on stored run directories, no engine: help, exit codes, error lines, tables and --json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pyarrow.parquet as pq
import pytest

from evalrun import config
from evalrun.analysis.runs import digest_record, load_run
from evalrun.cli import cli, main
from evalrun.cli.render import render_summary, stdout_console
from evalrun.config import load as load_config
from evalrun.pipeline import dispatch, groups, runner

GOLDEN = Path(__file__).resolve().parent / "golden"
ADDITION, MC = GOLDEN / "addition-v1", GOLDEN / "mc-v1"
COMMANDS = {"run", "resume", "verify", "rescore", "replay", "prove", "verify-proof", "attest", "anchor", "rebaseline",
            "compare", "digest", "gate", "nondet", "references", "check", "export", "canary",
            "report", "pin", "unlock", "tasks"}  # fmt: skip


def evalrun(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, prefix: str) -> str:
    """stderr holds exactly one line, the error, and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err, err
    return lines[0]


def record_of(run: Path) -> dict[str, Any]:
    return json.loads((run / "record.json").read_text())


@pytest.fixture
def addition(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ADDITION, tmp_path / "addition"))


# --- help and usage --------------------------------------------------------------------------------


def test_every_command_and_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(cli.commands) == COMMANDS
    code, out, _ = evalrun(capsys, "--help")
    assert code == 0 and all(f"  {name} " in out for name in COMMANDS)
    for name, command in cli.commands.items():
        assert command.help and command.short_help, name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts}"
        code, out, _ = evalrun(capsys, name, "--help")
        assert code == 0 and out.startswith(f"Usage: evalrun {name} "), out


def test_no_arguments_print_the_usage_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = evalrun(capsys)
    assert code == 2 and out.startswith("Usage: evalrun")
    code, out, _ = evalrun(capsys, "help", "verify")
    assert code == 0 and out.startswith("Usage: evalrun verify")
    code, _, err = evalrun(capsys, "frobnicate")
    assert code == 2 and "frobnicate" in one_error_line(err, "evalrun: error:")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["verify", str(ADDITION), "--no-such-option"], "--no-such-option"),
        (["verify", str(ADDITION), "--jobs", "-1"], "--jobs"),
        (["gate", "--factor", "0", "a", "b"], "--factor"),
        (["gate", "--rule", "vibes", "a", "b"], "--rule"),
        (["compare", "--interval", "wide", "a", "b"], "--interval"),
        (["verify-proof", "proof.json"], "--root"),
        (["verify", str(ADDITION), "--ledger-head", "xyz"], "--ledger-head"),
        (["rebaseline", str(ADDITION), str(MC)], "--reason"),
        (["anchor", str(ADDITION)], "LEDGER"),
        (["nondet"], "RUNS"),
        (["verify"], "RUN_DIR"),
        (["run", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_usage_errors_exit_2_naming_the_option(capsys: pytest.CaptureFixture[str], args: list[str], named: str) -> None:
    code, _, err = evalrun(capsys, *args)
    assert code == 2 and named in one_error_line(err, f"evalrun {args[0]}: error:")


def test_bad_input_and_failed_checks_are_one_line_on_stderr(addition: Path, tmp_path: Path, capsys) -> None:
    code, out, err = evalrun(capsys, "verify", tmp_path / "nothing-here")
    assert code == 2 and out == ""
    assert one_error_line(err, "evalrun verify: error: ").endswith("no such run directory")
    code, out, err = evalrun(capsys, "verify", addition, "--expect-root", "0" * 64)
    assert code == 1 and out == ""
    assert one_error_line(err, "evalrun verify: check failed: --expect-root: the run's root is ")


# --- audit -----------------------------------------------------------------------------------------


def test_verify_reports_what_it_checked_then_ok(capsys: pytest.CaptureFixture[str]) -> None:
    root = record_of(ADDITION)["merkle_root"]
    code, out, _ = evalrun(capsys, "verify", ADDITION)
    lines = out.splitlines()
    assert code == 0 and lines[-1].startswith("ok: 4 episodes, ") and root in lines[-1]
    rows = {line.split("  ")[0]: line.split()[-1] for line in lines[:-1]}
    assert rows["episodes"] == "4" and rows["merkle root"] == root and rows["attestation"] == "checked"
    assert all(line == line.rstrip() for line in lines)  # no padding after the last column
    code, out, _ = evalrun(capsys, "verify", ADDITION, "--json")
    report = json.loads(out)
    assert code == 0 and report["format"] == "evalrun.verify/1" and report["ok"] is True
    assert (report["episodes"], report["merkle_root"], report["run"]) == (4, root, str(ADDITION))


def test_rescore_and_replay_print_their_verdicts(addition: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = evalrun(capsys, "rescore", addition)
    assert code == 0 and out.strip() == "rescored 4 rows: bit-identical to scores.parquet"
    code, out, _ = evalrun(capsys, "rescore", addition, "name=number")
    assert code == 0 and "with a changed scorer" in out
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()[2:]}
    assert rows[("addition", "number_match")] == ["-", "1.0000", "-", "4"]  # before, after, delta, changed
    code, out, _ = evalrun(capsys, "rescore", addition, "name=number", "--json")
    report = json.loads(out)
    assert report["format"] == "evalrun.rescore/1" and report["scorer_changed"] and not report["identical"]
    assert Path(report["written"]).parent == addition / "rescore"

    code, out, _ = evalrun(capsys, "replay", addition)
    lines = out.splitlines()
    assert code == 0 and lines[-1].startswith("ok: 4 episodes replayed")
    assert lines[0].startswith("verdict: replayed with different code")  # the golden run is from an older commit
    code, out, _ = evalrun(capsys, "replay", addition, "--json")
    report = json.loads(out)
    assert code == 0 and report["format"] == "evalrun.replay/1" and report["matches"] and report["reproduced"] == 4


def test_prove_verify_proof_and_attest(addition: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = record_of(addition)["merkle_root"]
    episode = pq.read_table(addition / "outputs" / "part-00000.parquet").column("episode_id")[0].as_py()
    proof = tmp_path / "proof.json"
    assert evalrun(capsys, "prove", addition, episode, "-o", proof)[0] == 0
    code, out, _ = evalrun(capsys, "verify-proof", proof, "--root", root)
    assert code == 0 and out.startswith(f"ok: episode {episode} ")
    code, _, err = evalrun(capsys, "verify-proof", proof, "--root", "1" * 64)
    assert code == 1 and one_error_line(err, "evalrun verify-proof: check failed: ")
    code, out, _ = evalrun(capsys, "prove", addition, episode)
    assert code == 0 and json.loads(out) == json.loads(proof.read_text())
    code, out, _ = evalrun(capsys, "attest", addition)
    assert code == 0 and out.strip() == str(addition / "attestation.intoto.json")


# --- analysis --------------------------------------------------------------------------------------


def test_compare_prints_the_diff_and_a_row_per_task_and_overall(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = evalrun(capsys, "compare", ADDITION, ADDITION)
    assert code == 0 and err == ""
    assert "manifest diff (A -> B): 0 fields differ; things changed: none" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("addition ", "(overall) "))]
    assert [r[:3] for r in rows] == [["addition", "exact_match", "4"], ["(overall)", "exact_match", "4"]]
    assert all(r[3:6] == ["1.0000", "1.0000", "+0.0000"] and r[-2:] == ["mcnemar", "1"] for r in rows)
    code, out, _ = evalrun(capsys, "compare", ADDITION, ADDITION, "--json")
    assert code == 0 and json.loads(out)["format"] == "evalrun.compare/1"


def test_compare_warns_loudly_when_more_than_one_thing_changed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = evalrun(capsys, "compare", ADDITION, MC)
    assert code == 0
    warning = next(line for line in out.splitlines() if line.startswith("!!! WARNING: "))
    assert "things changed" in warning and "WARNING" in err
    assert any(line.split()[:1] == ["dataset"] for line in out.splitlines())  # a row of the diff table


def test_digest_prints_the_six_fields_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = evalrun(capsys, "digest", MC)
    expected = digest_record(load_run(MC))
    assert code == 0 and dict(line.split(maxsplit=1) for line in out.splitlines()) == expected
    code, out, _ = evalrun(capsys, "digest", MC, "--json")
    assert code == 0 and json.loads(out) == expected


def test_gate_blocks_a_run_that_does_not_beat_itself(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = evalrun(capsys, "gate", "--rule", "paired", ADDITION, ADDITION)
    lines = out.splitlines()
    assert code == 1 and lines[-1].startswith("BLOCKED: candidate exceeds baseline by +0.0000")
    assert any(line.startswith("rule ") and "paired: margin = distance" in line for line in lines)
    assert one_error_line(err, "evalrun gate: check failed: blocked: ")
    code, out, _ = evalrun(capsys, "gate", "--rule", "paired", ADDITION, ADDITION, "--json")
    assert code == 1 and json.loads(out)["passed"] is False
    code, out, err = evalrun(capsys, "gate", ADDITION, MC)  # no shared metric
    assert code == 2 and "--metric" in one_error_line(err, "evalrun gate: error: ")


def test_nondet_over_two_copies_of_a_run(addition: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = shutil.copytree(addition, tmp_path / "other")
    code, out, _ = evalrun(capsys, "nondet", addition, other)
    assert code == 0 and out.startswith("nondet over 2 runs with equal digests; metric exact_match")
    measures = {line.split("  ")[0]: line.split()[-1] for line in out.splitlines()}
    assert measures["TARr@2 (raw outputs identical)"] == "1.0000"
    assert measures["TARa@2 (parsed answers identical)"] == "1.0000"
    code, out, _ = evalrun(capsys, "nondet", addition, other, "--json")
    assert code == 0 and json.loads(out)["tarr"] == 1.0
    code, _, err = evalrun(capsys, "nondet", addition)
    assert code == 2 and one_error_line(err, "evalrun nondet: error: ")


# --- run: the results, then the run directory ------------------------------------------------------


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """`evalrun run` with the engine, config and plan replaced: each job 'runs' into a copy of a golden run."""
    made: list[Path] = []
    job = SimpleNamespace(worker_spec="spec", config=SimpleNamespace(cluster="cluster", report=True))
    dispatcher = SimpleNamespace(close=lambda: None)

    def execute(prepared: object, d: object) -> Path:
        made.append(Path(shutil.copytree(ADDITION if len(made) % 2 == 0 else MC, tmp_path / f"run-{len(made)}")))
        return made[-1]

    monkeypatch.setattr(
        config, "load", lambda overrides: SimpleNamespace(seeds=config.SeedsConfig(), cluster="cluster")
    )
    monkeypatch.setattr(runner, "prepare", lambda loaded: job)
    monkeypatch.setattr(runner, "open_for", lambda prepared: dispatcher)
    monkeypatch.setattr(runner, "execute", execute)
    monkeypatch.setattr(runner, "check_destination", lambda config: None)
    monkeypatch.setattr(runner, "check_ledger", lambda config: None)
    monkeypatch.setattr(groups, "plan_group", lambda config: None)  # one task per job
    monkeypatch.setattr(runner, "check_plugins", lambda config: None)
    monkeypatch.setattr(runner, "worker_spec", lambda config: "spec")
    monkeypatch.setattr(dispatch, "start_early", lambda spec, cluster: None)
    monkeypatch.setattr(dispatch, "dispatcher_key", lambda spec, cluster: "one dispatcher")
    return made


def test_run_prints_the_results_table_then_the_run_directory_last(fake_runs: list[Path], capsys) -> None:
    code, out, _ = evalrun(capsys, "run", "limit=4")
    lines = out.splitlines()
    assert code == 0 and lines[-1] == str(fake_runs[0])
    assert lines[0] == f"results: {fake_runs[0]}"
    assert lines[1].split() == ["task", "metric", "mean", "95%", "interval", "items", "trials", "spread"]
    assert lines[3].split() == ["addition", "exact_match", "1.0000", "[1.0000,", "1.0000]", "4", "1", "0.0000"]
    # the run's HTML report, its path just before the run directory; verify accepts it in the run
    report = fake_runs[0] / "report.html"
    assert lines[-2] == f"report: {report}" and "evalrun report" in report.read_text(encoding="utf-8")
    assert evalrun(capsys, "verify", fake_runs[0])[0] == 0


def test_an_image_not_pinned_by_digest_stops_run_before_any_engine_loads(fake_runs: list[Path], monkeypatch,
                                                                          capsys) -> None:  # fmt: skip
    monkeypatch.setenv("EVALRUN_IMAGE", "registry.example.org/evalrun:latest")
    monkeypatch.setattr(runner, "open_for", lambda prepared: pytest.fail("an engine was started"))
    monkeypatch.setattr(dispatch, "start_early", lambda spec, cluster: pytest.fail("a worker was started"))
    code, _, err = evalrun(capsys, "run", "limit=4")
    assert code == 2 and "EVALRUN_IMAGE='registry.example.org/evalrun:latest'" in err and not fake_runs


def test_a_multirun_ends_with_one_run_directory_per_job(fake_runs: list[Path], capsys) -> None:
    code, out, _ = evalrun(capsys, "run", "-m", "seeds.master=1,2")
    lines = out.splitlines()
    assert code == 0 and len(fake_runs) == 2 and lines[-2:] == [str(p) for p in fake_runs]
    assert [line for line in lines if line.startswith("results: ")] == [f"results: {p}" for p in fake_runs]
    assert any(line.split()[:2] == ["addition_mc", "choice_letter"] for line in lines)
    reports = [line for line in lines if line.startswith("report: ")]
    assert reports == [f"report: {p / 'report.html'}" for p in fake_runs]


def test_report_false_builds_no_report(fake_runs: list[Path], monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    job = SimpleNamespace(worker_spec="spec", config=SimpleNamespace(cluster="cluster", report=False))
    monkeypatch.setattr(runner, "prepare", lambda loaded: job)
    code, out, _ = evalrun(capsys, "run", "report=false")
    assert code == 0 and out.splitlines()[-1] == str(fake_runs[0])
    assert "report: " not in out and not (fake_runs[0] / "report.html").exists()


def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_stands(
    fake_runs: list[Path], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    made = runner.execute

    def execute(prepared: object, d: object) -> Path:
        run = made(prepared, d)
        (run / "report.html").mkdir()  # nothing can be written there
        return run

    monkeypatch.setattr(runner, "execute", execute)
    code, out, err = evalrun(capsys, "run", "limit=4")
    assert code == 0 and out.splitlines()[-1] == str(fake_runs[0]) and "report: " not in out
    warning = one_error_line(err, "evalrun run: warning: ")
    assert "report.html: the report was not written" in warning and "the run is complete and valid" in warning
    assert f"evalrun report {fake_runs[0]} -o {fake_runs[0] / 'report.html'}" in warning


def test_run_with_master_auto_prints_the_generated_seed_once_per_job(fake_runs: list[Path], monkeypatch,
                                                                       capsys) -> None:  # fmt: skip
    loaded: list[config.EvalConfig] = []
    monkeypatch.setattr(config, "load", lambda overrides: loaded.append(load_config(overrides)) or loaded[-1])
    code, out, err = evalrun(capsys, "run", "seeds.master=auto", "limit=2")
    assert code == 0 and out.splitlines()[-1] == str(fake_runs[0])
    (seeds,) = [c.seeds for c in loaded]
    assert seeds.master_generated and 0 <= seeds.master < 2**53
    assert err.splitlines() == [f"evalrun run: seeds.master=auto: generated master seed {seeds.master}"]
    loaded.clear()
    code, _, err = evalrun(capsys, "run", "-m", "seeds.master=auto", "limit=2,3")
    masters = [c.seeds.master for c in loaded]
    assert code == 0 and len(set(masters)) == 2  # each job its own seed
    assert err.splitlines() == [f"evalrun run: seeds.master=auto: generated master seed {m} (job seeds.master=auto "
                                f"limit={n})" for m, n in zip(masters, (2, 3), strict=True)]  # fmt: skip
    loaded.clear()
    code, _, err = evalrun(capsys, "run", "seeds.master=7", "limit=2")
    assert code == 0 and err == "" and not loaded[0].seeds.master_generated


@pytest.mark.parametrize("value", ["banana", "-1", "1.5", str(2**53)])
def test_run_refuses_a_bad_master_seed_naming_the_field(value: str, capsys) -> None:
    code, _, err = evalrun(capsys, "run", f"seeds.master={value}")
    line = one_error_line(err, "evalrun run: error: seeds.master: ")
    assert code == 2 and "expected a non-negative integer or auto" in line


def test_the_results_table_adds_overall_rows_when_there_are_several_tasks(capsys) -> None:
    est = {"mean": 0.5, "ci95": None, "n_items": 1, "trials_per_item": 2.5, "spread": 0.25}
    summary = {"tasks": {"a": {"m": est}, "b": {"m": est}}, "overall": {"m": {**est, "ci95": [0.25, 0.75]}}}
    render_summary(stdout_console(), summary, title="results")
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
    assert rows == [["a", "m", "0.5000", "-", "1", "2.5", "0.2500"], ["b", "m", "0.5000", "-", "1", "2.5", "0.2500"],
                    ["(overall)", "m", "0.5000", "[0.2500,", "0.7500]", "1", "2.5", "0.2500"]]  # fmt: skip
    named = {"format": "evalrun.summary/2", "tasks": {"a": {"m": {**est, "ci95": [0.1, 0.9], "interval": "wilson"}}}}
    render_summary(stdout_console(), named, title="results")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[5] == "method" and lines[3].split() == ["a", "m", "0.5000", "[0.1000,", "0.9000]",
                                                                     "wilson", "1", "2.5", "0.2500"]  # fmt: skip
    failed = {"tasks": {"a": {"m": {**est, "errors": 5}}, "b": {"m": est}}, "overall": {"m": {**est, "errors": 5}}}
    render_summary(stdout_console(), failed, title="results")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-1] == "errors"
    assert [line.split()[-1] for line in lines[3:]] == ["5", "0", "5"]


# --- as a process ----------------------------------------------------------------------------------


def test_the_read_only_commands_load_no_engine() -> None:
    code = (
        "import sys\n"
        "from evalrun.cli import main\n"
        f"codes = [main(['verify', {str(ADDITION)!r}]), main(['compare', {str(ADDITION)!r}, {str(ADDITION)!r}])]\n"
        "loaded = [m for m in ('vllm', 'torch', 'ray', 'transformers') if m in sys.modules]\n"
        "assert codes == [0, 0] and not loaded, (codes, loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_python_dash_m_exits_with_the_command_code() -> None:
    args = [sys.executable, "-m", "evalrun.cli", "gate", "--rule", "paired", str(ADDITION), str(ADDITION)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1].startswith("BLOCKED: ")
    assert done.stderr.startswith("evalrun gate: check failed: blocked: ")
