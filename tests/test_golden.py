"""Yesterday's records stay readable: run directories written by earlier code (tests/golden/) verify, and replay
with today's code reproduces every head, the root and the scores, reported as a replay with different code; rescore
gives the same scores bit for bit. Engine-free: replay answers every model call from the recorded log.

Two kinds: single-turn runs from before the package regroup (commit 73bc763), and agent runs (commit 5c5b69c: the
scripted agent and the model agent, in invoice-desk versions 1 and 2 and shift-planner; commit 87bdc6d: the
scripted_asking agent, whose question to the vendor's contact draws), whose schedules hold model, tool, clock,
uuid, env, random, observation and join entries, so a change to an entry kind, the tool-call format or
a world shows up here. The agent runs name a model directory of the checkout they were made in; elsewhere replay
reads the tokenizer the run keeps (checked with the model directories moved away).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS
from evalrun.rundir.reader import load_record, open_run

GOLDEN = Path(__file__).resolve().parent / "golden"
AGENT_RUNS = ("invoice-desk-scripted-v1", "invoice-desk-v2-scripted-v1", "invoice-desk-model-v1",
              "shift-planner-scripted-v1", "shift-planner-model-v1", "invoice-desk-asking-v1")  # fmt: skip
RECORDED_COMMIT = {"addition-v1": "73bc763", "mc-v1": "73bc763", **dict.fromkeys(AGENT_RUNS[:-1], "5c5b69c"),
                   "invoice-desk-asking-v1": "87bdc6d"}  # fmt: skip

# The dataset runs recorded absolute paths of the checkout they were made in; point them at this checkout.
RELOCATE = {
    "addition-v1": [f"task.dataset={BUILTIN_TASKS}/addition/test.jsonl",
                    f"task.template={BUILTIN_TASKS}/addition/template.jinja"],
    "mc-v1": [f"task.dataset={BUILTIN_TASKS}/addition_mc/test.jsonl", f"task.prompt_pack={BUILTIN_TASKS}/addition_mc"],
    **{name: [] for name in AGENT_RUNS},
}  # fmt: skip


@pytest.fixture(params=sorted(RECORDED_COMMIT))
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
    assert RECORDED_COMMIT[run.name] in report.verdict and "not a reproduction" in report.verdict


def test_golden_runs_rescore_bit_for_bit(golden: tuple[Path, list[str]]) -> None:
    run, _ = golden
    report = rescore_run(run, [])
    assert report.identical


def test_the_agent_goldens_hold_every_kind_of_schedule_entry() -> None:
    """What the agent goldens pin: between them, every entry kind an agent episode records (``random``: the
    scripted_asking agent's question to invoice-desk's vendor contact, the one tool that draws)."""
    kinds = set()
    for name in AGENT_RUNS:
        for part in sorted((GOLDEN / name / "log").glob("part-*.jsonl")):
            kinds |= {json.loads(line)["kind"] for line in part.read_text(encoding="utf-8").splitlines()}
    assert kinds >= {"header", "model", "tool", "clock", "uuid", "env", "random", "observation", "join", "end"}
