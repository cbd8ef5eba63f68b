"""`evalrun check` without an engine: the seeded sample, the repeat's plan, per-episode agreement, the replay
and rescore verdicts on the golden runs, and bad input (exit 2) before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalrun.audit.check import (
    Generation,
    RecordedEpisode,
    episode_agreement,
    plan_repeat,
    replay_verdict,
    rescore_verdict,
    sample_items,
)
from evalrun.audit.rescore import rescore_recorded
from evalrun.cli import main
from evalrun.config import MODELS_DIR, validate
from evalrun.config.compose import load_stored
from evalrun.errors import BadInput
from evalrun.rundir import layout
from evalrun.rundir.reader import read_outputs

GOLDEN = Path(__file__).resolve().parent / "golden"
ADDITION = GOLDEN / "addition-v1"
# The golden runs name the model where the checkout kept it then (models/, now evalrun/models/): moved weights
MOVED = f"model.path={MODELS_DIR / 'tiny-adder'}"
ITEMS = [f"add-{i:03d}" for i in range(200)]


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- the sample ------------------------------------------------------------------------------------


def test_the_sample_is_drawn_from_the_master_seed_alone_and_nested() -> None:
    eight = sample_items(ITEMS, 8, 1234, "addition")
    assert eight == sample_items(list(reversed(ITEMS)), 8, 1234, "addition")  # not the order items come in
    assert len(eight) == 8 and list(eight) == sorted(eight) and set(eight) <= set(ITEMS)
    assert set(sample_items(ITEMS, 3, 1234, "addition")) < set(eight)  # a larger N repeats a superset
    assert eight != sample_items(ITEMS, 8, 1235, "addition")
    assert eight != sample_items(ITEMS, 8, 1234, "other-task")
    assert sample_items(ITEMS[:5], 8, 1234, "addition") == tuple(ITEMS[:5])  # fewer items than N: all of them


def test_the_repeat_plan_is_the_recorded_config_on_the_sampled_items_with_the_original_ids(tmp_path: Path) -> None:
    before = listing(ADDITION)
    plan = plan_repeat(layout.RunDir(ADDITION), 3, [MOVED], tmp_path / "repeat")
    outputs = read_outputs(layout.RunDir(ADDITION), ["episode_id", "item_id"]).to_pydict()
    assert plan.items == sample_items(outputs["item_id"], 3, 1234, "addition") and plan.items_in_run == 4
    assert {e.episode_id for e in plan.prepared.episodes} == plan.original_ids
    assert plan.original_ids == {e for e, i in zip(*outputs.values(), strict=True) if i in plan.items}
    assert len(plan.original_ids) == 3 and plan.tokens_required  # the golden run is determinism=strict
    assert plan.prepared.config.run.dir == str(tmp_path / "repeat")
    assert not (tmp_path / "repeat").exists() and listing(ADDITION) == before  # nothing written yet


# --- agreement of one episode ----------------------------------------------------------------------


def episode(*calls: Generation, answer: tuple = ((("exact_match", "5"),), None), head: str = "h") -> RecordedEpisode:
    return RecordedEpisode("add-001", 0, 0, head, calls, answer)


def test_agreement_names_the_first_divergent_call_and_token_and_the_logprob_drift_before_it() -> None:
    a = episode(Generation("12", (1, 2, 3), (-0.1, -0.2, -0.3)))
    same = episode_agreement("e", a, a)
    assert same.identical_tokens and same.identical_raw and same.first_divergence is None
    assert same.max_abs_logprob_diff == 0.0
    b = episode(Generation("13", (1, 2, 4), (-0.1, -0.25, -0.3)), head="other")
    diverged = episode_agreement("e", a, b)
    assert not diverged.identical_tokens and not diverged.identical_raw and not diverged.same_head
    assert diverged.identical_answer  # the same extracted answer
    position = diverged.first_divergence
    assert position is not None and (position.call, position.token, position.original, position.repeat) == (0, 2, 3, 4)
    assert position.describe() == "call 0 token 2 (original token 3, repeat 4)"
    assert diverged.max_abs_logprob_diff == pytest.approx(0.05)  # position 1, before the divergence
    drift = episode_agreement("e", a, episode(Generation("12", (1, 2, 3), (-0.1, -0.2, -0.4))))
    assert drift.identical_tokens and drift.max_abs_logprob_diff == pytest.approx(0.1)  # reported, not a divergence


def test_agreement_over_several_calls_failed_calls_and_missing_calls() -> None:
    first, second = Generation("A", (7,), (-1.0,)), Generation("", (5, 6), (-2.0,))
    two = episode(first, second)
    other_second = episode(first, Generation("", (5, 6), (-2.5,)))  # a loglikelihood call: its summed logprob
    assert episode_agreement("e", two, other_second).identical_tokens
    assert episode_agreement("e", two, other_second).max_abs_logprob_diff == pytest.approx(0.5)
    position = episode_agreement("e", two, episode(first)).first_divergence  # a call the repeat did not make
    assert position is not None and (position.call, position.token, position.original) == (1, 0, None)
    failed = episode_agreement("e", episode(Generation("", (), (), "refused")), episode(Generation("", (), (), "x")))
    assert failed.first_divergence is not None and failed.first_divergence.call == 0


# --- replay and rescore verdicts, engine-free ------------------------------------------------------


def test_the_golden_run_replays_and_rescores_and_nothing_is_written_into_it() -> None:
    before = listing(ADDITION)
    replay, report = replay_verdict(ADDITION)
    assert replay.passed and report is not None and report.matches and replay.first_divergence is None
    assert "replayed with other code than the recording's" in replay.summary  # recorded by older code: it says so
    rescore, rescored = rescore_verdict(ADDITION)
    assert rescore.passed and rescored is not None and rescored.identical
    assert listing(ADDITION) == before


def test_rescore_recorded_names_the_first_differing_row_and_writes_nothing(tmp_path: Path) -> None:
    run = Path(shutil.copytree(ADDITION, tmp_path / "run"))
    table = pq.read_table(run / layout.SCORES)
    rows = table.to_pylist()
    rows[2]["value"] = 1.0 - rows[2]["value"]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), run / layout.SCORES)
    before = listing(run)
    report = rescore_recorded(run)
    assert not report.identical and report.written is None and listing(run) == before
    first = report.first_difference
    assert first is not None and (first.episode_id, first.metric) == (rows[2]["episode_id"], rows[2]["metric"])
    assert first.recorded == rows[2]["value"] and first.rescored == 1.0 - rows[2]["value"]
    verdict, _ = rescore_verdict(run)
    assert not verdict.passed and verdict.first_divergence is not None
    assert verdict.first_divergence.startswith(f"episode {rows[2]['episode_id']} metric exact_match")


# --- bad input: exit 2 before anything runs --------------------------------------------------------


def error_line(capsys: pytest.CaptureFixture[str], *args: str | Path) -> str:
    code = main(["check", *map(str, args)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_bad_input_is_exit_2_naming_what(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such run directory" in error_line(capsys, tmp_path / "nothing")
    run = Path(shutil.copytree(ADDITION, tmp_path / "run"))
    assert "--repeat-items" in error_line(capsys, run, "--repeat-items", "0")
    assert "--keep" in error_line(capsys, run, "--keep", run / "repeat")
    assert "task.name=other" in error_line(capsys, run, "task.name=other")  # what the run computes is its own
    assert "cluster=nowhere" in error_line(capsys, run, "cluster=nowhere")
    (run / layout.RECORD).unlink()
    line = error_line(capsys, run)
    assert "incomplete run (record.json is missing)" in line and "evalrun resume" in line
    assert not (tmp_path / "repeat").exists()


def test_a_stored_config_takes_a_cluster_group_choice_before_its_settings() -> None:
    stored = ADDITION / layout.CONFIG
    config = validate(load_stored(stored, ["cluster.batch_size=3", "cluster=local", MOVED], ["cluster"]))
    assert config.cluster.name == "local" and config.cluster.batch_size == 3 and config.cluster.max_in_flight == 2
    with pytest.raises(BadInput, match=r"cluster=nope: expected cluster=NAME with NAME one of \['inline', 'local'"):
        load_stored(ADDITION / layout.CONFIG, ["cluster=nope"], ["cluster"])
    with pytest.raises(BadInput):  # replay and rescore take settings only
        load_stored(ADDITION / layout.CONFIG, ["cluster=local"])
