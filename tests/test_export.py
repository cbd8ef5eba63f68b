"""`evalrun export --format inspect`: the run as an Inspect AI eval log, read back with inspect-ai itself
(a test dependency; evalrun never imports it): samples, scores and metrics against the run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalrun.cli import main
from evalrun.config import BUILTIN_TASKS, load
from evalrun.engines import ENGINES, Completion, GenerationRequest, RequestRejected, engine
from evalrun.export.inspect_log import export_inspect
from evalrun.pipeline.dispatch import DISPATCHERS
from evalrun.pipeline.runner import execute, prepare
from evalrun.records.entries import ToolEntry, parse_line
from evalrun.records.formats import Record, seal_of

inspect_log = pytest.importorskip(
    "inspect_ai.log", reason="inspect-ai (a dev dependency: pip install -e .[dev]) is not importable"
)

GOLDEN = Path(__file__).parent / "golden"


def _rows(run: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(run / name).to_pylist()


def _export(run: Path, out: Path, *args: str) -> int:
    return main(["export", str(run), "--format", "inspect", "-o", str(out), *args])


def _check_against_run(log: Any, run: Path) -> None:
    """Every sample, score and metric of ``log`` is what ``run`` recorded."""
    record = json.loads((run / "record.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    rows = {r["episode_id"]: r for r in _rows(run, "outputs")}
    scores: dict[str, list[dict[str, Any]]] = {}
    for score in _rows(run, "scores.parquet"):
        scores.setdefault(score["episode_id"], []).append(score)
    assert log.status == "success" and log.eval.task == manifest["task"]["name"]
    assert log.eval.model == f"{manifest['engine']['name']}/{manifest['model']['id']}"
    assert log.eval.metadata["merkle_root"] == record["merkle_root"]
    assert log.eval.metadata["digest"]["digest"] == record["digest"]
    assert log.eval.metadata["seal"] == seal_of(Record.model_validate(record)) and log.eval.metadata["verified"]
    assert log.eval.model_generate_config.temperature == manifest["decoding"]["temperature"]
    assert len(log.samples) == len(rows) == record["episodes"]["written"]
    estimates = summary["tasks"][manifest["task"]["name"]]
    results = {s.name: s for s in log.results.scores}
    assert results.keys() == estimates.keys()
    for metric, estimate in estimates.items():
        assert results[metric].metrics["mean"].value == estimate["mean"]
        if estimate["se"] is not None:
            assert results[metric].metrics["stderr"].value == estimate["se"]
    for sample in log.samples:
        row = rows[sample.metadata["episode_id"]]
        assert (sample.id, sample.epoch, sample.target) == (row["item_id"], 1 + row["repeat"], row["target"])
        assert sample.metadata["head"] == row["head"]
        assert (sample.metadata["seed"], sample.metadata["repeat"]) == (row["seed"], row["repeat"])
        assert sample.metadata["sampling_seed"] == str(row["seeds"]["sampling"])
        assert sample.metadata["fewshot_ids"] == row["fewshot_ids"]
        assert sample.metadata["shuffle_order"] == row["shuffle_order"]
        assert sample.input == row["prompt"] == sample.messages[0].text
        assert sample.output.completion == row["output"] == sample.messages[-1].text
        assert [m.role for m in sample.messages] == ["user", "assistant"]
        assert sample.output.metadata["token_ids"] == row["token_ids"]
        assert {name: (s.value, s.answer) for name, s in sample.scores.items()} == {
            s["metric"]: (s["value"], s["extracted"]) for s in scores[row["episode_id"]]
        }


@pytest.mark.parametrize("golden", ["addition-v1", "mc-v1"])
def test_a_golden_run_exports_and_reads_back(golden: str, tmp_path: Path) -> None:
    out = tmp_path / f"{golden}.eval"
    assert _export(GOLDEN / golden, out) == 0
    log = inspect_log.read_eval_log(str(out))
    _check_against_run(log, GOLDEN / golden)
    header = inspect_log.read_eval_log(str(out), header_only=True)  # how `inspect view` lists a log
    assert header.samples is None and header.eval.metadata["merkle_root"] == log.eval.metadata["merkle_root"]
    summaries = inspect_log.read_eval_log_sample_summaries(str(out))
    assert sorted((s.id, s.epoch) for s in summaries) == sorted((s.id, s.epoch) for s in log.samples)
    # the same run exports to the same bytes
    again = export_inspect(GOLDEN / golden, tmp_path / "again.eval")
    assert again.sha256 == export_inspect(GOLDEN / golden, tmp_path / "third.eval").sha256
    assert out.read_bytes() == (tmp_path / "again.eval").read_bytes()


def test_multiple_choice_details_are_in_the_sample_metadata(tmp_path: Path) -> None:
    out = tmp_path / "mc.eval"
    export_inspect(GOLDEN / "mc-v1", out)
    rows = {r["episode_id"]: r for r in _rows(GOLDEN / "mc-v1", "outputs")}
    for sample in inspect_log.read_eval_log(str(out)).samples:
        row = rows[sample.metadata["episode_id"]]
        assert sample.metadata["option_logprobs"] == row["option_logprobs"] and row["shuffle_order"]


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


def test_a_bad_run_directory_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.eval"
    missing = tmp_path / "no-such-run"
    assert _export(missing, out) == 2
    assert f"{missing}: no such run directory" in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    assert _export(tmp_path / "notes", out) == 2
    assert "not a run directory" in capsys.readouterr().err
    incomplete = _copy(GOLDEN / "addition-v1", tmp_path)
    (incomplete / "attestation.intoto.json").unlink()
    assert _export(incomplete, out) == 2
    err = capsys.readouterr().err
    assert "attestation.intoto.json: missing: the run is incomplete" in err and "evalrun resume" in err
    assert not out.exists()


def test_the_output_must_be_an_eval_file_outside_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(GOLDEN / "addition-v1", tmp_path)
    assert _export(run, tmp_path / "log.json") == 2
    assert "-o: expected a .eval file" in capsys.readouterr().err
    assert _export(run, run / "log.eval") == 2
    assert "inside the run directory" in capsys.readouterr().err
    assert _export(run, tmp_path / "missing-dir" / "log.eval") == 2
    assert f"-o: {tmp_path / 'missing-dir'}: no such directory" in capsys.readouterr().err
    assert main(["export", str(run), "--format", "helm", "-o", str(tmp_path / "x.eval")]) == 2


def test_a_run_failing_verify_is_refused_unless_no_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(GOLDEN / "addition-v1", tmp_path)
    table = pq.read_table(run / "scores.parquet")
    rows = table.to_pylist()
    rows[0]["value"] = 1.0 - rows[0]["value"]  # a changed score: the file no longer has its recorded sha256
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), run / "scores.parquet")
    out = tmp_path / "forged.eval"
    assert _export(run, out) == 1
    err = capsys.readouterr().err
    assert "check failed: scores.parquet: sha256 differs from record.json" in err and "--no-verify" in err
    assert not out.exists()
    assert _export(run, out, "--no-verify") == 0
    assert "not verified" in capsys.readouterr().out
    log = inspect_log.read_eval_log(str(out))
    assert log.eval.metadata["verified"] is False
    forged = next(s for s in log.samples if s.metadata["episode_id"] == rows[0]["episode_id"])
    assert forged.scores[rows[0]["metric"]].value == rows[0]["value"]  # exported as it is, flagged unverified


def test_an_unreadable_run_is_exit_2_with_no_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(GOLDEN / "addition-v1", tmp_path)
    log_part = run / "log" / "part-00000.jsonl"
    log_part.write_bytes(log_part.read_bytes()[:-40])  # truncated mid-line
    assert _export(run, tmp_path / "out.eval", "--no-verify") == 2
    err = capsys.readouterr().err
    assert f"{run}: cannot be read: log/part-00000.jsonl" in err and "truncated" in err


# --- end to end: the default run and an agent run on the shared engine ---------------------------


def test_the_default_run_exports_with_200_samples_and_its_exact_match_mean(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    run = run_eval()
    out = tmp_path / "default.eval"
    assert _export(run, out) == 0
    log = inspect_log.read_eval_log(str(out))
    assert len(log.samples) == 200
    summary = json.loads((run / "summary.json").read_text())
    mean = summary["tasks"]["addition"]["exact_match"]["mean"]
    (exact_match,) = [s for s in log.results.scores if s.name == "exact_match"]
    assert exact_match.metrics["mean"].value == mean
    _check_against_run(log, run)
    # Inspect's log dataframes read it too: one row per sample, the same scores
    analysis = pytest.importorskip("inspect_ai.analysis", reason="inspect-ai's dataframes need pandas")
    frame = analysis.samples_df(str(out), quiet=True)
    assert len(frame) == 200 and frame["score_exact_match"].mean() == pytest.approx(mean)
    assert set(frame["metadata_head"]) == {r["head"] for r in _rows(run, "outputs")}


def test_an_agent_run_exports_its_tool_calls_as_messages(run_eval: Callable[..., Path], tmp_path: Path) -> None:
    run = run_eval("task=invoice_desk", "limit=2")
    out = tmp_path / "agent.eval"
    assert _export(run, out) == 0
    log = inspect_log.read_eval_log(str(out))
    chains: dict[str, list[Any]] = {}
    for line in (run / "log" / "part-00000.jsonl").read_text().splitlines():
        entry = parse_line(line)
        chains.setdefault(entry.episode, []).append(entry)
    assert len(log.samples) == len(chains) == 2
    for sample in log.samples:
        tools = [e for e in chains[sample.metadata["episode_id"]] if isinstance(e, ToolEntry)]
        calls = [c for m in sample.messages if m.role == "assistant" for c in m.tool_calls or []]
        assert [(c.function, c.arguments) for c in calls] == [(t.request.name, t.request.arguments) for t in tools]
        results = [m for m in sample.messages if m.role == "tool"]
        assert [m.tool_call_id for m in results] == [c.id for c in calls]  # every call answered, in call order
        assert calls[-1].function == "submit_report"
        assert sample.messages[0].role == "user" and sample.input == sample.messages[0].text
        assert sample.metadata["world"]["agent"] == "scripted" and sample.metadata["stop"] == "done"
        assert sample.metadata["final_state"]["done"] is True
        assert any(m.metadata and m.metadata.get("reads") for m in results)  # the clock/uuid reads of the calls
        assert {name: score.value for name, score in sample.scores.items()} == {
            "precision": 1.0, "recall": 1.0, "f1": 1.0, "pass": 1.0,
        }  # fmt: skip
    assert {s.name for s in log.results.scores} == {"precision", "recall", "f1", "pass"}


# --- engine-free: failed episodes and several trials per item, with a stub engine ----------------

REFUSED_ITEM = "add-001"


@pytest.fixture
def stub_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A finished run on a stub engine that refuses one item's prompt (its episodes fail), with two
    seeds and two repeats per item."""
    for registry in (ENGINES, DISPATCHERS):
        monkeypatch.setattr(registry, "_plugins", dict(registry._plugins))
    refused = next(
        json.loads(line)["question"]
        for line in (BUILTIN_TASKS / "addition" / "test.jsonl").read_text().splitlines()
        if json.loads(line)["id"] == REFUSED_ITEM
    )

    @engine("refusing-export")
    class RefusingEngine:
        def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
            self.settings = settings

        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            if any(refused in r.prompt for r in requests):
                raise RequestRejected("The decoder prompt is too long")
            return [Completion(" 7", (7, 2), (-0.5, -0.25), "stop", 2) for _ in requests]

        def loglikelihood(self, requests: list[Any]) -> list[Any]:
            raise NotImplementedError

        def describe(self) -> dict[str, Any]:
            return {"name": "refusing-export", "version": "0", "settings": self.settings}

    overrides = ["engine.name=refusing-export", "cluster=inline", "limit=3", "determinism=off", "seeds.set=[0,1]",
                 "seeds.repeats=2", f"run.root={tmp_path / 'runs'}", "run.progress=false"]  # fmt: skip
    return execute(prepare(load(overrides)))


def test_failed_episodes_and_trials_map_to_errors_and_epochs(stub_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "stub.eval"
    assert _export(stub_run, out) == 0
    log = inspect_log.read_eval_log(str(out))
    assert log.eval.config.epochs == 4 and len(log.samples) == 12
    trials = {(s.metadata["seed"], s.metadata["repeat"]): s.epoch for s in log.samples}
    assert trials == {(0, 0): 1, (0, 1): 2, (1, 0): 3, (1, 1): 4}
    assert sorted((s.id, s.epoch) for s in log.samples) == [
        (item, epoch) for item in ("add-000", "add-001", "add-002") for epoch in (1, 2, 3, 4)
    ]
    for sample in log.samples:
        (score,) = sample.scores.values()
        if sample.id == REFUSED_ITEM:
            assert "too long" in sample.error.message and "too long" in sample.output.error
            assert sample.output.choices == [] and [m.role for m in sample.messages] == ["user"]
            assert score.value == 0 and "too long" in score.explanation
        else:
            assert sample.error is None and score.explanation is None
            assert sample.output.completion == " 7" and sample.output.metadata["token_logprobs"] == [-0.5, -0.25]
    (exact_match,) = log.results.scores
    summary = json.loads((stub_run / "summary.json").read_text())["tasks"]["addition"]["exact_match"]
    assert exact_match.metrics["mean"].value == summary["mean"]
    assert exact_match.metadata["estimate"]["errors"] == summary["errors"] == 4
