"""Per-episode failures are results, not crashes (issue 11, item 2; docs/design.md "Failed episodes").

Engine-free: a stub engine refuses, like vLLM, the whole batch when one of its requests is too
long; the run completes, the refused episodes are recorded as failed, and verify and replay pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS, load
from evalrun.engines import ENGINES, Completion, GenerationRequest, RequestRejected, engine
from evalrun.pipeline.dispatch import DISPATCHERS
from evalrun.pipeline.runner import execute, prepare
from evalrun.records.entries import EndEntry, FailedCallEntry, parse_line

REFUSED_ITEMS = ("add-002", "add-005")
CALLS: list[int] = []  # batch sizes the stub engine was asked to run


@pytest.fixture
def refusing_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registers ``refusing``: answers every prompt, but refuses a batch holding a prompt of a refused item."""
    for registry in (ENGINES, DISPATCHERS):
        monkeypatch.setattr(registry, "_plugins", dict(registry._plugins))
    CALLS.clear()

    @engine("refusing")
    class RefusingEngine:
        def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
            self.settings = settings

        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            CALLS.append(len(requests))
            for r in requests:
                if any(item in r.prompt for item in self.refused_questions):
                    raise RequestRejected(f"The decoder prompt (length {len(r.prompt)}) is too long")
            return [Completion(" 1", (7,), (), "stop", 3) for _ in requests]

        refused_questions: tuple[str, ...] = ()  # set by each test

        def loglikelihood(self, requests: list[Any]) -> list[Any]:
            raise NotImplementedError

        def describe(self) -> dict[str, Any]:
            return {"name": "refusing", "version": "0", "settings": self.settings}

    yield


def _questions() -> dict[str, str]:
    rows = [json.loads(line) for line in (BUILTIN_TASKS / "addition" / "test.jsonl").read_text().splitlines()]
    return {r["id"]: r["question"] for r in rows}


def test_a_refused_request_fails_its_episode_and_the_run_completes(refusing_engine: None, tmp_path: Path) -> None:
    questions = _questions()
    ENGINES.get("refusing").refused_questions = tuple(questions[i] for i in REFUSED_ITEMS)
    overrides = ["engine.name=refusing", "cluster=inline", "cluster.batch_size=4", "limit=8", "determinism=off",
                 f"run.root={tmp_path}", "run.progress=false"]  # fmt: skip
    run = execute(prepare(load(overrides)))

    # Split in halves, not retried: items 0-3 refused (4), 0-1 run (2), 2-3 refused (2), 2 refused (1), 3 runs (1);
    # then items 4-7 (4), 4-5 refused (2), 4 runs (1), 5 refused (1), 6-7 run (2).
    assert CALLS == [4, 2, 2, 1, 1, 4, 2, 1, 1, 2]
    outputs = pq.read_table(run / "outputs").to_pydict()
    failed = {i for i, r in zip(outputs["item_id"], outputs["finish_reason"], strict=True) if r == "failed"}
    assert failed == set(REFUSED_ITEMS) and len(outputs["item_id"]) == 8

    ends = {}
    for path in sorted((run / "log").iterdir()):
        entries = [parse_line(line) for line in path.read_text().splitlines()]
        for entry in entries:
            if isinstance(entry, EndEntry):
                ends[entry.episode] = entry
        assert sum(isinstance(e, FailedCallEntry) for e in entries) == sum(
            e.status == "error" for e in entries if isinstance(e, EndEntry)
        )
    errors = [e for e in ends.values() if e.status == "error"]
    assert len(errors) == 2 and all(e.error and "too long" in e.error for e in errors)
    ok_lines = [line for p in (run / "log").iterdir() for line in p.read_text().splitlines() if '"kind":"end"' in line]
    assert sum(line.endswith(',"seq":2,"status":"ok"}') for line in ok_lines) == 6  # ok entries as before

    scores = pq.read_table(run / "scores.parquet").to_pydict()
    by_item = dict(zip(scores["item_id"], scores["value"], strict=True))
    assert all(by_item[i] == 0.0 for i in REFUSED_ITEMS)
    summary = json.loads((run / "summary.json").read_text())
    (metric,) = summary["overall"]
    assert summary["overall"][metric]["errors"] == 2 and summary["overall"][metric]["n_observations"] == 8
    assert summary["tasks"]["addition"][metric]["errors"] == 2

    verify_run(run)
    report = replay_run(run, [])
    assert not report.divergences and report.root_matches and report.scores_identical


def test_a_run_without_failures_has_no_errors_field(refusing_engine: None, tmp_path: Path) -> None:
    ENGINES.get("refusing").refused_questions = ("no such question",)
    overrides = ["engine.name=refusing", "cluster=inline", "limit=3", "determinism=off", f"run.root={tmp_path}",
                 "run.progress=false"]  # fmt: skip
    run = execute(prepare(load(overrides)))
    summary = json.loads((run / "summary.json").read_text())
    assert all("errors" not in m for m in summary["overall"].values())
    verify_run(run)
