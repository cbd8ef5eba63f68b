"""Yesterday's records stay readable: run directories written by the code before the package regroup
(commit 73bc763, tests/golden/) verify, and replay with today's code reproduces every head, the root
and the scores, reported as a replay with different code. Engine-free: replay answers every model call
from the recorded log."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS
from evalrun.rundir.reader import load_record, open_run

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORDED_COMMIT = "73bc763"

# The runs recorded absolute paths of the checkout they were made in; point them at this checkout.
RELOCATE = {
    "addition-v1": [f"task.dataset={BUILTIN_TASKS}/addition/test.jsonl",
                    f"task.template={BUILTIN_TASKS}/addition/template.jinja"],
    "mc-v1": [f"task.dataset={BUILTIN_TASKS}/addition_mc/test.jsonl", f"task.prompt_pack={BUILTIN_TASKS}/addition_mc"],
}  # fmt: skip


@pytest.fixture(params=sorted(RELOCATE))
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy (replay and rescore may write beside the run) and the overrides that relocate it."""
    run = Path(shutil.copytree(GOLDEN / request.param, tmp_path / request.param))
    return run, RELOCATE[request.param]


def test_golden_runs_verify(golden: tuple[Path, list[str]]) -> None:
    run, _ = golden
    report = verify_run(run)
    record = load_record(open_run(run))
    assert report.merkle_root == record.merkle_root
    assert report.episodes == record.episodes.written > 0


def test_golden_runs_replay_every_head_root_and_score_with_different_code(golden: tuple[Path, list[str]]) -> None:
    run, relocate = golden
    report = replay_run(run, relocate)
    assert report.divergences == ()
    assert report.reproduced == report.episodes > 0
    assert report.root_matches and report.scores_identical
    assert not report.same_code
    assert RECORDED_COMMIT in report.verdict and "not a reproduction" in report.verdict


def test_golden_runs_rescore_bit_for_bit(golden: tuple[Path, list[str]]) -> None:
    run, _ = golden
    report = rescore_run(run, [])
    assert report.identical
