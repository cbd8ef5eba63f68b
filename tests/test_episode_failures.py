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
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS, load
from evalrun.engines import ENGINES, Completion, GenerationRequest, RequestRejected, engine
from evalrun.episodes.context import load_tokenizer
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import DISPATCHERS
from evalrun.pipeline.runner import execute, prepare
from evalrun.records.entries import EndEntry, FailedCallEntry, parse_line
from evalrun.scoring import SCORERS, Score, scorer

ROOT = Path(__file__).resolve().parents[1]
REFUSED_ITEMS = ("add-002", "add-005")
CALLS: list[int] = []  # batch sizes the stub engine was asked to run (the runs skip the canary: episodes' calls only)


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
                 "determinism.canary=false", f"run.root={tmp_path}", "run.progress=false"]  # fmt: skip
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


def test_a_scorer_that_raises_fails_only_that_episode(refusing_engine: None, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:  # fmt: skip
    """A scorer fault is the episode's: its score rows say why it scores 0, the summary counts it
    under ``errors``, the others are scored; verify recomputes the error, rescore reproduces it."""
    monkeypatch.setattr(SCORERS, "_plugins", dict(SCORERS._plugins))
    ENGINES.get("refusing").refused_questions = ("no such question",)

    @scorer("fragile", version="1")
    def fragile(spec: Any, context: Any) -> Any:
        def score(row: Any) -> list[Score]:
            if row["target"] == "99":  # one item's target, as if its format surprised the scorer
                raise ValueError("cannot parse\n target 99")
            return [Score("fragile", 1.0, row["output"])]

        return score

    overrides = ["engine.name=refusing", "cluster=inline", "limit=6", "determinism=off", f"run.root={tmp_path}",
                 "run.progress=false", "task.scorer.name=fragile"]  # fmt: skip
    run = execute(prepare(load(overrides)))
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    raised = [r for r in scores if r["error"] is not None]
    assert len(raised) == 1 and raised[0]["value"] == 0.0 and raised[0]["extracted"] is None
    assert raised[0]["error"] == "scorer fragile raised ValueError: cannot parse target 99"
    assert all(r["value"] == 1.0 for r in scores if r["error"] is None) and len(scores) == 6
    summary = json.loads((run / "summary.json").read_text())
    assert summary["overall"]["fragile"]["errors"] == 1 and summary["overall"]["fragile"]["n_observations"] == 6
    verify_run(run)
    assert rescore_run(run, []).bytes_identical


# --- prompts longer than the context, found before any engine call ----------------------------


def _long_dataset(tmp_path: Path, n: int, long_ids: set[int]) -> Path:
    """An addition dataset whose items in ``long_ids`` have questions far beyond the tiny model's 128 tokens."""
    path = tmp_path / "data.jsonl"
    rows = [{"id": f"q-{i:03d}", "question": ("1+" * 150 + "1") if i in long_ids else f"{i}+1", "answer": str(i + 1)}
            for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _overlong_run(tmp_path: Path, mode: str) -> list[str]:
    dataset = _long_dataset(tmp_path, 6, {1, 4})
    ENGINES.get("refusing").refused_questions = ("1+" * 150 + "1",)  # the engine would refuse the long ones
    return ["engine.name=refusing", "cluster=inline", f"task.dataset={dataset}", "task.references=null",
            f"task.on_overlong={mode}", "determinism=off", "determinism.canary=false", f"run.root={tmp_path / 'runs'}",
            "run.progress=false"]  # fmt: skip


def test_overlong_prompts_fail_their_episodes_without_an_engine_call(refusing_engine: None, tmp_path: Path) -> None:
    run = execute(prepare(load(_overlong_run(tmp_path, "fail_episode"))))
    assert CALLS == [4]  # the two long prompts never reached the engine
    outputs = pq.read_table(run / "outputs").to_pydict()
    assert sorted(i for i, r in zip(outputs["item_id"], outputs["finish_reason"], strict=True) if r == "failed") == [
        "q-001", "q-004"]  # fmt: skip
    log = "".join(p.read_text() for p in (run / "log").iterdir())
    assert log.count('"status":"error"') == 2 and "does not fit the model's context of 128 tokens" in log
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["task"]["on_overlong"] == manifest["identity"]["task"]["on_overlong"] == "fail_episode"
    verify_run(run)
    report = replay_run(run, [])
    assert not report.divergences and report.root_matches and report.scores_identical


def test_on_overlong_error_names_the_items_before_the_model_loads(refusing_engine: None, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"task.on_overlong.*2 items.*q-001, q-004"):
        prepare(load(_overlong_run(tmp_path, "error")))
    with pytest.raises(BadInput, match=r"task\.on_overlong"):
        load(["task.on_overlong=drop"])


def test_truncate_left_sends_and_records_the_last_tokens(refusing_engine: None, tmp_path: Path) -> None:
    run = execute(prepare(load(_overlong_run(tmp_path, "truncate_left"))))
    assert CALLS == [6]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["digest_inputs"]["prompt_pack"]["on_overlong"] == "truncate_left"  # what the model sees changed
    tokenizer = load_tokenizer(ROOT / "evalrun" / "models" / "tiny-adder")
    outputs = pq.read_table(run / "outputs").to_pydict()
    lengths = {i: len(tokenizer.encode(p).ids) for i, p in zip(outputs["item_id"], outputs["prompt"], strict=True)}
    assert lengths["q-001"] <= 127 and lengths["q-004"] <= 127 and lengths["q-000"] < 20
    assert set(outputs["finish_reason"]) != {"failed"}
    log = "".join(p.read_text() for p in (run / "log").iterdir())
    assert (
        json.dumps(outputs["prompt"][outputs["item_id"].index("q-001")])[1:-1] in log
    )  # the chain holds what was sent
    verify_run(run)
    report = replay_run(run, [])
    assert not report.divergences and report.root_matches and report.scores_identical
