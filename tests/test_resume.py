"""A driver SIGKILLed at any point leaves a run that `evalrun resume` finishes with the same root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalrun.audit.verify import verify_run
from evalrun.cli import main
from evalrun.errors import BadInput
from evalrun.pipeline import runner
from evalrun.pipeline.runner import load_run_config
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs
from evalrun.rundir.writer import locked
from tests.conftest import evalrun_process as evalrun

pytestmark = pytest.mark.e2e  # starts the engine

CONFIG = ("limit=30", "decoding=sample", "cluster=inline", "cluster.batch_size=5")  # 6 parts


def root(run: Path) -> str:
    return json.loads((run / "record.json").read_text())["merkle_root"]


@pytest.mark.parametrize("failpoint", ["before-first-part", "after-part-2", "before-record"])
def test_resume_after_a_killed_driver_gives_the_uninterrupted_root(run_eval, tmp_path: Path, failpoint: str) -> None:
    expected = root(run_eval(*CONFIG[:2]))  # same episodes on the shared Ray worker, other batch size
    run = tmp_path / "run"
    killed = evalrun(tmp_path, "run", *CONFIG, f"run.dir={run}", "run.progress=false", failpoint=failpoint)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run / "record.json").exists()
    parts_before = {p.name: p.read_bytes() for p in RunDir(run).output_parts()}

    resumed = evalrun(tmp_path, "resume", str(run), "run.progress=false")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.strip().splitlines()[-1] == str(run)
    assert root(run) == expected
    rec = json.loads((run / "record.json").read_text())
    assert rec["dispatch"]["kept_parts"] == len(parts_before)
    for name, data in parts_before.items():  # complete parts were kept as they were
        assert (run / "outputs" / name).read_bytes() == data
    ids = read_outputs(RunDir(run), ["episode_id"]).column("episode_id").to_pylist()
    assert len(ids) == len(set(ids)) == 30
    assert not list(run.rglob(".tmp-*")) and not (run / ".lock").exists()


def test_second_driver_and_changed_config_are_refused(run_eval, tmp_path: Path) -> None:
    run = run_eval("limit=5")
    (run / "record.json").unlink()  # as if interrupted during the final writes
    with locked(RunDir(run)):
        busy = evalrun(tmp_path, "resume", str(run))
    assert busy.returncode == 2 and "another evalrun driver" in busy.stderr

    config = run / "config.yaml"
    config.write_text(config.read_text().replace("temperature: 0.0", "temperature: 0.5"))
    changed = evalrun(tmp_path, "resume", str(run))
    assert changed.returncode == 2 and "decoding" in changed.stderr and "manifest.json" in changed.stderr
    assert not (run / "record.json").exists()

    wrong = evalrun(tmp_path, "resume", str(run), "decoding.temperature=0")
    assert wrong.returncode == 2 and "decoding.temperature" in wrong.stderr
    with pytest.raises(BadInput, match="the rest is the run's own") as caught:  # what a served model computes
        load_run_config(RunDir(run), ["engine.served_model=other"])
    assert caught.value.where == "engine.served_model=other"


def test_a_complete_run_is_left_as_it_is_and_says_so(run_eval, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing runs for a run whose record and attestation are written: no results table reprinted as if it had
    run, no engine, not a byte changed."""
    run = run_eval("limit=3")
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out.strip().splitlines() == [str(run)] and "is complete already" in err
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
    summary = json.loads((run / "summary.json").read_text())  # a forged figure: refused, never shown as the results
    summary["overall"]["exact_match"]["mean"] = 0.99
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["resume", str(run)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "summary.json: its sha256 differs from record.json: the run was altered" in err


def _interrupted_before_record(run: Path) -> None:
    """As if the driver died after its last part, before record.json and the attestation."""
    (run / "record.json").unlink()
    (run / "attestation.intoto.json").unlink()


def test_a_resume_with_every_part_kept_starts_no_engine_and_records_that_it_resumed(
    run_eval, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_eval("limit=6", "cluster.batch_size=3")
    expected = root(run)
    _interrupted_before_record(run)
    monkeypatch.setattr(runner, "open_for", lambda prepared: pytest.fail("an engine was started"))
    assert runner.resume(run, []) == run
    record = json.loads((run / "record.json").read_text())
    assert record["merkle_root"] == expected and record["dispatch"]["resumed"] is True
    assert record["dispatch"]["kept_parts"] == 2 and verify_run(run).episodes == 6


def test_a_resume_that_keeps_no_part_still_records_that_it_resumed(run_eval, dispatcher) -> None:
    run = run_eval("limit=4")
    _interrupted_before_record(run)
    for part in [*RunDir(run).output_parts(), *(run / "log").glob("part-*.jsonl")]:
        part.unlink()
    assert runner.resume(run, [], dispatcher) == run
    record = json.loads((run / "record.json").read_text())
    assert record["dispatch"]["resumed"] is True and record["dispatch"]["kept_parts"] == 0


def test_a_damaged_kept_part_is_refused_naming_it_before_any_engine_starts(
    run_eval, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """resume keeps only parts that verify: a kept part whose chain was edited is refused (exit 1, naming the file
    and what to do), not sealed into a "complete" run that fails verify."""
    run = run_eval("limit=6", "cluster.batch_size=3")
    _interrupted_before_record(run)
    log = run / "log" / "part-00001.jsonl"
    text = log.read_text()
    log.write_text(text.replace('"seed":', '"seed": ', 1) if '"seed":' in text else text[:-2] + "x\n")
    monkeypatch.setattr(runner, "open_for", lambda prepared: pytest.fail("an engine was started"))
    capsys.readouterr()
    assert main(["resume", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "log/part-00001.jsonl" in err[0], err
    assert f"resume keeps only parts that verify: remove {log} and {run / 'outputs' / 'part-00001.parquet'}" in err[0]
    assert not (run / "record.json").exists()
