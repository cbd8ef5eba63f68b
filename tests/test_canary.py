"""The batch-invariance canary without a real engine: the comparison, the verdict and the first mismatch
on engines whose one defect is known; the worker, the manifest, `evalrun canary` and nondet around it."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from evalrun.analysis.nondet import nondet_paths, worker_canaries
from evalrun.cli.main import main
from evalrun.config import DeterminismConfig, EngineConfig, load
from evalrun.engines import ENGINES, Completion, GenerationRequest, RequestRejected, engine
from evalrun.pipeline import canary
from evalrun.pipeline.runner import execute, prepare
from evalrun.pipeline.worker import EngineWorker, WorkerSpec
from evalrun.records.canonical import canonical_json
from evalrun.records.formats import CANARY_FORMAT

GOLDEN = Path(__file__).resolve().parent / "golden"
Skew = Callable[[GenerationRequest, int, int], float]  # request, its index, batch size -> added to its logprobs
Flip = Callable[[GenerationRequest, int, int], bool]  # request, its index, batch size -> its first token changes


class FakeEngine:
    """Tokens and logprobs are a function of the request alone (prompt, seed, temperature), except for the one
    defect a test gives it: ``skew`` added to every logprob, ``flip`` changing the first token."""

    def __init__(self, skew: Skew | None = None, flip: Flip | None = None) -> None:
        self.skew, self.flip = skew, flip
        self.batches: list[int] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.batches.append(len(requests))
        completions = []
        for index, r in enumerate(requests):
            key = f"{r.prompt}|{r.sampling.seed}|{r.sampling.temperature}".encode()
            base = int.from_bytes(hashlib.sha256(key).digest()[:4], "big")
            ids = [(base + j) % 97 for j in range(r.sampling.max_tokens)]
            if self.flip is not None and self.flip(r, index, len(requests)):
                ids[0] = (ids[0] + 1) % 97
            shift = self.skew(r, index, len(requests)) if self.skew is not None else 0.0
            logprobs = tuple(-0.25 * (j + 1) + shift for j in range(len(ids)))
            completions.append(Completion("", tuple(ids), logprobs, "length", len(r.prompt)))
        return completions

    def loglikelihood(self, requests: list[Any]) -> list[Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": "fake", "version": "0", "settings": {}}


EPSILON = 2.0**-20


def batch_dependent_logprobs(request: GenerationRequest, index: int, size: int) -> float:
    """What a batch-variant kernel does: the numbers move with the batch's size, never the tokens."""
    return EPSILON * (size - 1)


def test_an_engine_whose_logprobs_depend_on_the_batch_is_not_invariant_and_the_first_mismatch_is_named() -> None:
    result = canary.run_canary(FakeEngine(skew=batch_dependent_logprobs))
    assert result.invariant is False
    first = result.first_mismatch
    assert first is not None
    assert (first.mode, first.batch_size, first.position, first.token_index, first.differs_in) == (
        "greedy", 2, canary.POSITIONS["greedy"][2], 0, "logprobs")  # fmt: skip
    assert not any(c.equal for c in result.checks)
    assert result.max_abs_logprob_diff == EPSILON * 15  # the batch of 16; exact in binary floating point
    assert [c.max_abs_logprob_diff for c in result.checks[:4]] == [EPSILON * (s - 1) for s in canary.BATCH_SIZES]
    line = canary.describe(result)
    assert line.startswith("NOT batch-invariant: 8 of 8 canary checks differ, max |dlogprob| ")
    assert "; first: greedy, batch size 2" in line and line == canary.failure_line(result.as_record())


def test_an_engine_whose_outputs_depend_on_the_request_alone_is_invariant() -> None:
    fake = FakeEngine()
    result = canary.run_canary(fake)
    assert result.invariant is True and result.first_mismatch is None
    assert result.max_abs_logprob_diff == 0.0 and all(c.max_abs_logprob_diff == 0.0 for c in result.checks)
    assert [(c.mode, c.batch_size) for c in result.checks] == [
        (mode, size) for mode in canary.MODES for size in canary.BATCH_SIZES]  # fmt: skip
    assert fake.batches == [1, 2, 4, 8, 16] * 2 and result.engine_calls == 10
    assert result.needle_tokens == {"greedy": canary.MAX_TOKENS, "sampled": canary.MAX_TOKENS}
    assert canary.describe(result).startswith("batch-invariant:")


def test_a_token_that_changes_in_sampled_batches_names_the_sampled_check_and_no_logprob_after_it() -> None:
    def sampled_needle_not_first(request: GenerationRequest, index: int, size: int) -> bool:
        return request.sampling.temperature > 0 and request.prompt == canary.NEEDLE and index > 0

    result = canary.run_canary(FakeEngine(flip=sampled_needle_not_first))
    first = result.first_mismatch
    assert first is not None and (first.mode, first.batch_size, first.token_index, first.differs_in) == (
        "sampled", 2, 0, "token_ids")  # fmt: skip
    assert all(c.equal for c in result.checks if c.mode == "greedy")
    assert [c.equal for c in result.checks if c.mode == "sampled"] == [False, False, True, False]  # needle at 0 in 8
    assert result.max_abs_logprob_diff == 0.0  # logprobs of different tokens are not compared


def test_the_needle_keeps_its_seed_and_sits_where_the_layout_says() -> None:
    fake = FakeEngine()
    seen: list[list[GenerationRequest]] = []
    original = fake.generate
    fake.generate = lambda requests: seen.append(requests) or original(requests)  # type: ignore[method-assign]
    canary.run_canary(fake)
    for requests in seen:
        needles = [(i, r) for i, r in enumerate(requests) if r.prompt == canary.NEEDLE]
        assert len(needles) == 1
        index, needle = needles[0]
        mode = "greedy" if needle.sampling.temperature == 0 else "sampled"
        assert needle.sampling == seen[0 if mode == "greedy" else 5][0].sampling  # the seed it had alone
        if len(requests) > 1:
            assert index == canary.POSITIONS[mode][len(requests)]
        assert len({r.prompt for r in requests}) == len(requests)  # fillers differ from each other
        assert all(r.sampling.temperature == needle.sampling.temperature for r in requests)
    assert max(len(p) for p in (canary.NEEDLE, *canary.FILLERS)) + canary.MAX_TOKENS <= 81


@pytest.mark.parametrize(
    ("ids", "logprobs", "expected"),
    [
        ((1, 2), (-0.5, -1.0), (True, None, None)),
        ((1, 2), (-0.5, -1.0 + 2.0**-30), (False, 1, "logprobs")),
        ((1, 3), (-0.5, -1.0), (False, 1, "token_ids")),
        ((1,), (-0.5,), (False, 1, "length")),
    ],
)
def test_compare_is_bitwise_and_names_the_first_difference(ids: Any, logprobs: Any, expected: Any) -> None:
    alone = Completion("", (1, 2), (-0.5, -1.0), "length", 3)
    c = canary.compare(alone, Completion("", ids, logprobs, "length", 3))
    assert (c.equal, c.first_difference, c.differs_in) == expected
    assert c.max_abs_logprob_diff == (2.0**-30 if expected[2] == "logprobs" else 0.0)


def test_compare_tells_minus_zero_from_zero_and_a_missing_logprob_from_a_number() -> None:
    zero = Completion("", (1,), (0.0,), "stop", 3)
    minus_zero = Completion("", (1,), (-0.0,), "stop", 3)
    missing = Completion("", (1,), (None,), "stop", 3)
    assert canary.compare(zero, zero).equal and canary.compare(missing, missing).equal
    c = canary.compare(zero, minus_zero)
    assert not c.equal and c.differs_in == "logprobs" and c.max_abs_logprob_diff == 0.0
    assert not canary.compare(zero, missing).equal


def test_the_record_is_canonical_json_with_its_format() -> None:
    result = canary.run_canary(FakeEngine(skew=batch_dependent_logprobs))
    record = json.loads(canonical_json(result.as_record()))
    assert record["format"] == CANARY_FORMAT and record["invariant"] is False
    assert record["batch_sizes"] == [2, 4, 8, 16] and record["modes"] == ["greedy", "sampled"]
    assert record["first_mismatch"] == {"mode": "greedy", "batch_size": 2, "position": 1, "token_index": 0,
                                        "differs_in": "logprobs"}  # fmt: skip
    assert record["definition_sha256"] == canary.definition_sha256() and len(record["checks"]) == 8


def test_at_worker_start_a_canary_that_cannot_run_says_why_and_never_raises() -> None:
    class Refusing(FakeEngine):
        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            raise RequestRejected("The decoder prompt (length 68) is longer than the maximum model length of 32")

    class LoglikelihoodOnly:
        def describe(self) -> dict[str, Any]:
            return {}

    class NotGenerating(FakeEngine):
        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            raise NotImplementedError

    assert canary.canary_at_start(FakeEngine(), enabled=False, stand_in=False) == (None, None)
    result, note = canary.canary_at_start(FakeEngine(), enabled=True, stand_in=False)
    assert result is not None and result.invariant and note is None
    for engine_, stand_in, reason in (
        (FakeEngine(), True, "stand-in"), (Refusing(), False, "refused its prompts (The decoder prompt"),
        (LoglikelihoodOnly(), False, "does not generate"), (NotGenerating(), False, "does not generate"),
    ):  # fmt: skip
        result, note = canary.canary_at_start(engine_, enabled=True, stand_in=stand_in)
        assert result is None and note is not None and note.startswith("determinism.canary: not run") and reason in note


# --- the worker, the manifest, the command and nondet (a registered fake engine: no model loads) ----------


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two engines registered for the test only: ``fake`` (batch-invariant) and ``skewed`` (logprobs move with
    the batch size)."""
    monkeypatch.setattr(ENGINES, "_plugins", dict(ENGINES._plugins))

    @engine("fake")
    class Fake(FakeEngine):
        def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
            super().__init__()

    @engine("skewed")
    class Skewed(FakeEngine):
        def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
            super().__init__(skew=batch_dependent_logprobs)

    yield


OFF = DeterminismConfig(name="off", enabled=False, batch_invariant=False, cublas_workspace_config="")


def test_the_worker_reports_its_canary_and_none_when_it_is_off(fake_engines: None) -> None:
    spec = WorkerSpec(model_path="unused", model_dtype="float32", engine=EngineConfig(name="skewed"), determinism=OFF)
    info = EngineWorker(spec, "w").info()
    assert info["canary"]["invariant"] is False and info["canary"]["first_mismatch"]["batch_size"] == 2
    off = WorkerSpec(model_path="unused", model_dtype="float32", engine=EngineConfig(name="skewed"),
                     determinism=DeterminismConfig(**{**OFF.as_record(), "canary": False}))  # fmt: skip
    info = EngineWorker(off, "w").info()
    assert info["canary"] is None and not any("canary" in n for n in info["determinism"]["notes"])
    stand_in = WorkerSpec(model_path="unused", model_dtype="float32", engine=EngineConfig(name="skewed"),
                          determinism=OFF, engine_factory=lambda spec: FakeEngine())  # fmt: skip
    info = EngineWorker(stand_in, "w").info()
    assert info["canary"] is None and any("stand-in" in n for n in info["determinism"]["notes"])


def _run(tmp_path: Path, *overrides: str) -> Path:
    return execute(prepare(load(["engine.name=fake", "cluster=inline", "limit=3", "determinism=off",
                                 f"run.root={tmp_path}", "run.progress=false", *overrides])))  # fmt: skip


def test_the_manifest_lists_each_workers_canary_null_when_off_and_nondet_shows_them(
    fake_engines: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on, off = _run(tmp_path), _run(tmp_path, "determinism.canary=false")
    workers = [json.loads((run / "manifest.json").read_text())["workers"] for run in (on, off)]
    assert workers[0][0]["canary"]["invariant"] is True and workers[0][0]["canary"]["max_abs_logprob_diff"] == 0
    assert workers[1][0]["canary"] is None
    identities = [json.loads((run / "manifest.json").read_text())["identity"]["determinism"] for run in (on, off)]
    assert identities[0] == identities[1] and "canary" not in identities[0]  # not what decides the results

    report = nondet_paths([on, off])
    assert [(c.run, c.status, c.batch_sizes) for c in report.canaries] == [
        (0, "invariant", (2, 4, 8, 16)), (1, "not run", ())]  # fmt: skip
    assert main(["nondet", str(on), str(off)]) == 0
    text = capsys.readouterr().out
    assert "batch-invariance canary per worker" in text
    assert any(line.split()[:1] == ["0"] and "invariant" in line and "2,4,8,16" in line for line in text.splitlines())
    assert main(["nondet", str(on), str(off), "--json"]) == 0
    canaries = json.loads(capsys.readouterr().out)["canaries"]
    assert [c["status"] for c in canaries] == ["invariant", "not run"]


def test_nondet_says_not_recorded_for_a_run_made_before_the_canary() -> None:
    manifest = json.loads((GOLDEN / "addition-v1" / "manifest.json").read_text())
    (found,) = worker_canaries(0, manifest)
    assert found.status == "not recorded" and found.max_abs_logprob_diff is None


def test_the_canary_command_prints_a_row_per_check_and_exits_1_naming_the_first_mismatch(
    fake_engines: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["canary", "engine.name=fake", "determinism=off", "determinism.canary=false"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("greedy", "sampled"))]
    assert len(rows) == 8 and all("bitwise equal" in row for row in rows)
    assert out.splitlines()[-1].startswith("ok: batch-invariant")  # run although determinism.canary=false

    assert main(["canary", "engine.name=skewed", "determinism=off"]) == 1
    captured = capsys.readouterr()
    assert sum("DIFFER" in line for line in captured.out.splitlines()) == 8
    assert captured.err.strip() == (
        "evalrun canary: check failed: NOT batch-invariant: 8 of 8 canary checks differ, max |dlogprob| 1.431e-05 "
        "(batch size 1 against 2, 4, 8, 16); first: greedy, batch size 2, needle at 1, token 0 (logprobs)"
    )
    assert main(["canary", "engine.name=skewed", "determinism=off", "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["format"] == CANARY_FORMAT and record["invariant"] is False
    assert record["worker"]["engine"]["name"] == "fake" and "honoured" in record["worker"]["determinism"]


def test_the_canary_command_refuses_bad_input_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["canary", "engine.name=tpu"]) == 2
    assert "engine.name" in capsys.readouterr().err
    assert main(["canary", "--jsn"]) == 2


# --- a failed canary in a run: the warning, the record, the table and report, require_invariant -------------


@pytest.fixture
def torch_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a strict worker sets in this process (torch's flags and threads, vLLM's variables), restored after."""
    import torch

    for name in ("VLLM_BATCH_INVARIANT", "CUBLAS_WORKSPACE_CONFIG", "VLLM_CPU_ATTN_SPLIT_KV"):
        monkeypatch.delenv(name, raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.get_num_threads())  # fmt: skip
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
    torch.set_num_threads(before[4])


SKEWED_LINE = ("NOT batch-invariant: 8 of 8 canary checks differ, max |dlogprob| 1.431e-05 (batch size 1 against 2, "
               "4, 8, 16); first: greedy, batch size 2, needle at 1, token 0 (logprobs)")  # fmt: skip


def _cli_run(tmp_path: Path, *overrides: str) -> int:
    return main(["run", "cluster=inline", "limit=3", f"run.root={tmp_path / 'runs'}", "run.progress=false",
                 *overrides])  # fmt: skip


def _runs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "runs"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_a_strict_run_whose_canary_fails_warns_once_and_its_table_report_and_timings_show_the_record(
    fake_engines: None, torch_state: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli_run(tmp_path, "engine.name=skewed") == 0  # determinism=strict, the default
    out, err = capsys.readouterr()
    (run,) = _runs(tmp_path)
    warnings = [line for line in err.splitlines() if "batch-invariant" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("evalrun: warning: worker inline-0@") and SKEWED_LINE in warnings[0]
    # the record the table and the report read: the manifest's, with the verdict and the figures
    record = json.loads((run / "manifest.json").read_text())["workers"][0]["canary"]
    assert record["invariant"] is False and record["max_abs_logprob_diff"] == pytest.approx(1.431e-05, rel=1e-3)
    assert sum(not c["equal"] for c in record["checks"]) == 8 and record["batch_sizes"] == [2, 4, 8, 16]
    lines = out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("results: "))
    under = [line for line in lines[table:] if line.startswith("warning: worker ")]
    assert len(under) == 1 and SKEWED_LINE in under[0], out
    assert lines[-1] == str(run)
    timings = next(line for line in err.splitlines() if line.startswith("timings: "))
    assert re.search(r"; canary \d+\.\d s \(inline-0@", timings), timings
    seconds = json.loads((run / "record.json").read_text())["timings"]["canary"]
    assert list(seconds.values()) == [record["seconds"]]
    html = (run / "report.html").read_text()
    assert 'id="canary-failed-0"' in html and "not batch-invariant" in html and "8 of 8 canary checks differ" in html


def test_an_invariant_or_unstrict_run_prints_no_warning_yet_the_table_still_shows_a_recorded_failure(
    fake_engines: None, torch_state: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli_run(tmp_path, "engine.name=fake") == 0
    out, err = capsys.readouterr()
    assert "batch-invariant" not in out + err
    assert "canary-failed" not in (_runs(tmp_path)[0] / "report.html").read_text()
    assert _cli_run(tmp_path / "off", "engine.name=skewed", "determinism=off") == 0
    out, err = capsys.readouterr()
    assert "batch-invariant" not in err  # determinism=off asks for nothing: no warning while it runs
    assert sum(SKEWED_LINE in line for line in out.splitlines()) == 1  # what the record says, shown


def test_the_table_and_report_read_the_recorded_canary_of_a_finished_or_old_run(
    fake_engines: None, torch_state: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evalrun.cli import render
    from evalrun.report import build_report

    run = _run(tmp_path, "engine.name=skewed")  # through the runner, not the command: nothing printed yet
    capsys.readouterr()
    data = build_report([run], tmp_path / "again.html")  # as `evalrun report RUN` builds it, from the files
    assert data.runs[0].canary_failures == (f"worker {_worker(run)}: {SKEWED_LINE}",)
    assert 'id="canary-failed-0"' in (tmp_path / "again.html").read_text()
    (run / "attestation.intoto.json").unlink()  # stopped between its record and its attestation
    assert main(["resume", str(run)]) == 0  # attested now, its table printed from its record
    out, err = capsys.readouterr()
    assert sum(SKEWED_LINE in line for line in out.splitlines()) == 1
    # what this resume did, and not the timings of the invocation that made the run
    assert "its attestation, the one thing missing, is written now (nothing ran)" in err and "timings:" not in err
    golden = Path(shutil.copytree(GOLDEN / "addition-v1", tmp_path / "addition-v1"))  # made before the canary
    data = build_report([golden], tmp_path / "golden.html")
    assert data.runs[0].canary_failures == () and "canary-failed" not in (tmp_path / "golden.html").read_text()
    manifest = json.loads((golden / "manifest.json").read_text())
    console = render.stdout_console()
    render.render_canary_failures(console, manifest, None)
    assert capsys.readouterr().out == ""


def _worker(run: Path) -> str:
    return json.loads((run / "manifest.json").read_text())["workers"][0]["worker"]


def test_failure_lines_come_from_the_record_alone_and_count_workers_that_replaced_others() -> None:
    failed = canary.run_canary(FakeEngine(skew=batch_dependent_logprobs)).as_record()
    passed = canary.run_canary(FakeEngine()).as_record()
    manifest = {"workers": [{"worker": "ray-0", "canary": passed}, {"worker": "ray-1", "canary": None},
                            {"worker": "old"}]}  # fmt: skip
    record = {"dispatch": {"workers": [{"worker": "ray-0", "canary": failed}, {"worker": "ray-2", "canary": failed}]}}
    assert canary.failure_lines(manifest) == []
    assert canary.failure_lines(manifest, record) == [f"worker ray-2: {SKEWED_LINE}"]  # ray-0: the manifest's
    assert canary.failure_line(failed) == SKEWED_LINE
    assert not canary.record_failed(None) and not canary.record_failed(passed) and canary.record_failed(failed)


def test_require_invariant_stops_a_run_whose_canary_fails_with_exit_1_and_nothing_written(
    fake_engines: None, torch_state: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for profile in ("strict", "off"):
        assert _cli_run(tmp_path, "engine.name=skewed", f"determinism={profile}",
                        "determinism.require_invariant=true") == 1  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("evalrun run: check failed: worker inline-0@"), err
        assert err[-1].endswith(f"{SKEWED_LINE} (determinism.require_invariant=true; nothing was written)")
        assert not any("warning" in line and "batch-invariant" in line for line in err)  # the error says it
        assert _runs(tmp_path) == []  # no run directory: nothing that could pass for a result
    assert _cli_run(tmp_path, "engine.name=fake", "determinism.require_invariant=true") == 0
    (run,) = _runs(tmp_path)
    assert "require_invariant: true" in (run / "config.yaml").read_text()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["determinism"]["asked"]["require_invariant"] is True
    assert "require_invariant" not in manifest["identity"]["determinism"]  # checks the engine, computes nothing


def test_require_invariant_needs_the_canary_and_is_left_out_of_the_records_while_unset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "determinism.require_invariant=true", "determinism.canary=false"]) == 2
    assert "determinism.require_invariant: true needs determinism.canary=true" in capsys.readouterr().err
    config = load([])
    assert config.determinism.require_invariant is None and "require_invariant" not in config.determinism.as_record()


def test_require_invariant_stops_on_a_canary_that_did_not_run_naming_why() -> None:
    from evalrun.errors import CheckFailed
    from evalrun.pipeline.runner import check_canary

    config = load(["determinism.require_invariant=true"])
    note = "determinism.canary: not run: the engine refused its prompts (too long)"
    info = {"worker": "w", "canary": None, "determinism": {"notes": [note, "another note"]}}
    with pytest.raises(CheckFailed) as caught:
        check_canary(config, info, None)
    assert str(caught.value) == (
        f"worker w: the batch-invariance canary did not run: {note} "
        "(determinism.require_invariant=true needs it to pass; nothing was written)"
    )
    check_canary(load([]), info, None)  # without it, a canary that did not run is a note, as before


def test_a_worker_runs_torch_on_the_cpus_it_is_given_and_records_them(fake_engines: None, torch_state: None) -> None:
    import torch

    from evalrun.pipeline.runner import worker_threads

    assert worker_threads(load([])) == worker_threads(load(["cluster=inline"])) == 1
    assert worker_threads(load(["cluster.cpus_per_worker=2.5"])) == 2
    assert worker_threads(load(["cluster.cpus_per_worker=0.5"])) == 1
    spec = WorkerSpec(model_path="unused", model_dtype="float32", engine=EngineConfig(name="fake"), determinism=OFF,
                      threads=1)  # fmt: skip
    info = EngineWorker(spec, "w").info()
    assert info["determinism"]["honoured"]["torch_threads"] == torch.get_num_threads() == 1
    info = EngineWorker(WorkerSpec(**{**spec.__dict__, "threads": None}), "w").info()  # left as it is
    assert info["determinism"]["honoured"]["torch_threads"] == torch.get_num_threads()


def test_the_timings_line_shows_each_workers_canary_and_old_records_read_as_before() -> None:
    from evalrun.cli.render import timings_line
    from evalrun.pipeline.runner import PhaseClock

    workers = [{"worker": "ray-0", "engine_load_s": 8.2, "canary": {"seconds": 1.25}},
               {"worker": "ray-1", "engine_load_s": 9.0, "canary": None}]  # fmt: skip
    timings = PhaseClock().record(workers)
    assert timings["engine_load"] == {"ray-0": 8.2, "ray-1": 9.0} and timings["canary"] == {"ray-0": 1.25}
    assert timings_line({"start-up": 1.0, **timings}) == ("start-up 1.00 s; engine load 8.2 s (ray-0), 9.0 s (ray-1); "
                                                          "canary 1.2 s (ray-0)")  # fmt: skip
    assert "canary" not in PhaseClock().record([{"worker": "w", "engine_load_s": 1.0, "canary": None}])
    # vLLM's warm-up, within the engine's load, as vLLM reported it
    warmed = PhaseClock().record([{"worker": "w", "engine_load_s": 50.0, "warmup_s": 38.5, "canary": None}])
    assert warmed["warmup"] == {"w": 38.5}
    assert timings_line({"start-up": 1.0, **warmed}) == ("start-up 1.00 s; engine load 50.0 s (w); of which warm-up "
                                                         "38.5 s (w)")  # fmt: skip
    assert timings_line({"start-up": 1.0, "engine_load": {"w": 2.0}}) == "start-up 1.00 s; engine load 2.0 s (w)"
