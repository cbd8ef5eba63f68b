"""Faults nobody planned for (issue 11): disk full, unwritable or taken destinations, non-UTF-8
input, Ctrl-C, a malformed root, a run that stopped between record.json and its attestation, and
stray files in a run directory. Each ends in one line naming the file and what to do, with the
stated exit code and no traceback. Engine-free: a stub dispatcher answers every prompt.
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from evalrun.cli.main import main
from evalrun.config import load
from evalrun.engines import Completion, GenerationRequest
from evalrun.episodes import EncodedPart, Provenance
from evalrun.episodes.encode import encode_part
from evalrun.episodes.harness import run_episodes
from evalrun.episodes.plan import Episode
from evalrun.errors import WriteFailed
from evalrun.pipeline import runner
from evalrun.pipeline.dispatch import DispatchStats, dispatcher_key
from evalrun.pipeline.worker import BatchOutcome
from evalrun.records.canonical import sha256_hex
from evalrun.rundir import layout, store, writer

GOLDEN = Path(__file__).parent / "golden" / "addition-v1"
CONFIG = ("limit=6", "cluster=inline", "cluster.batch_size=2", "run.progress=false")  # 3 parts


class StubEngine:
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion(text=f" {len(r.prompt)}", token_ids=(1, 2), logprobs=(-0.5, -0.25), finish_reason="stop",
                           prompt_tokens=len(r.prompt)) for r in requests]  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {"name": "stub", "version": "1", "settings": {}}


class StubDispatcher:
    """Runs batches through the real harness and encoder on :class:`StubEngine`; ``interrupt_after``
    raises KeyboardInterrupt (Ctrl-C) once that many batches are back."""

    def __init__(self, key: str, interrupt_after: int | None = None) -> None:
        self.key, self.stats, self.interrupt_after = key, DispatchStats(), interrupt_after

    def workers(self) -> list[dict[str, Any]]:
        determinism = {"asked": {}, "honoured": {}, "notes": []}
        return [{"worker": "stub", "hardware": "{}", "determinism": determinism, "engine": StubEngine().describe(),
                 "judge_engine": None}]  # fmt: skip

    def map(self, batches: Iterable[list[Episode]], generator: dict[str, Any],
            scoring: Any = None, sink: Any = None) -> Iterator[BatchOutcome]:  # fmt: skip
        for number, batch in enumerate(batches):
            if number == self.interrupt_after:
                raise KeyboardInterrupt
            part = encode_part(run_episodes(StubEngine(), batch, generator), Provenance("stub", "{}", len(batch), 0.0))
            yield BatchOutcome(part, len(batch), "stub")

    def close(self) -> None:
        pass


@pytest.fixture
def stub_engine(monkeypatch: pytest.MonkeyPatch) -> dict[str, int | None]:
    """Every dispatcher the runner opens is a stub; set ``["interrupt_after"]`` to Ctrl-C the next run."""
    plan: dict[str, int | None] = {"interrupt_after": None}

    def open_for(prepared: runner.Prepared) -> StubDispatcher:
        key = dispatcher_key(prepared.worker_spec, prepared.config.cluster)
        stub = StubDispatcher(key, plan["interrupt_after"])
        plan["interrupt_after"] = None  # only the next run is interrupted
        return stub

    monkeypatch.setattr(runner, "open_for", open_for)
    return plan


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if an engine (a dispatcher) would be opened."""

    def open_for(prepared: runner.Prepared) -> None:
        raise AssertionError("the engine was loaded before the fault was found")

    monkeypatch.setattr(runner, "open_for", open_for)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_dir_of(out: str) -> Path:
    return Path(out.strip().splitlines()[-1])


def disk_full_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The next write of a file called ``name`` fails as a full disk does: the temporary file is
    created, then ENOSPC."""
    real = store._write_synced

    def write(path: Path, data: bytes) -> None:
        if path.name == f".tmp-{name}":
            path.write_bytes(b"")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(store, "_write_synced", write)


# --- the end of a run is atomic; disk full at several points -------------------------------------


@pytest.fixture(scope="module")
def reference_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The undisturbed run's Merkle root."""
    prepared = runner.prepare(load([*CONFIG, f"run.root={tmp_path_factory.mktemp('ref')}"]))
    dispatcher = StubDispatcher(dispatcher_key(prepared.worker_spec, prepared.config.cluster))
    run = runner.execute(prepared, dispatcher)
    return json.loads((run / layout.RECORD).read_text())["merkle_root"]


@pytest.mark.parametrize("name", ["part-00001.parquet", "part-00002.jsonl", layout.SCORES, layout.SUMMARY,
                                  layout.RECORD, layout.ATTESTATION])  # fmt: skip
def test_disk_full_during_a_run_says_so_and_resume_completes_it(
    stub_engine: dict[str, int | None], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path, reference_root: str, name: str,
) -> None:  # fmt: skip
    run = tmp_path / "run"
    disk_full_at(monkeypatch, name)
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.dir={run}")
    line = one_line(err)
    assert code == 2 and line.startswith(f"evalrun run: error: {run}/"), line
    assert name in line and "no space left" in line and f"`evalrun resume {run}`" in line
    assert not list(run.rglob(".tmp-*")) and not (run / layout.LOCK).exists()
    assert not (run / layout.ATTESTATION).exists()
    code, _out, err = cli(capsys, "verify", str(run))
    assert code == 1 and "incomplete" in one_line(err) and f"evalrun resume {run}" in err

    monkeypatch.undo()  # the space is freed (stub_engine is patched again below)
    monkeypatch.setattr(runner, "open_for", lambda prepared: StubDispatcher(
        dispatcher_key(prepared.worker_spec, prepared.config.cluster)))  # fmt: skip
    code, out, err = cli(capsys, "resume", str(run))
    assert code == 0, err
    assert run_dir_of(out) == run
    assert f"report: {run / layout.REPORT}" in out.splitlines()  # the finished run's report, as `run` writes it
    code, _out, err = cli(capsys, "verify", str(run), "--expect-root", reference_root)
    assert code == 0, err


class LosingDispatcher(StubDispatcher):
    """Loses batch 1's results, or answers it with one episode the plan does not hold in place of its last."""

    def __init__(self, key: str, swap: bool) -> None:
        super().__init__(key)
        self.swap = swap

    def map(self, batches: Iterable[list[Episode]], generator: dict[str, Any],
            scoring: Any = None, sink: Any = None) -> Iterator[BatchOutcome]:  # fmt: skip
        def tampered() -> Iterator[list[Episode]]:
            for number, batch in enumerate(batches):
                if number == 1 and self.swap:
                    yield [*batch[:-1], replace(batch[-1], episode_id=sha256_hex("an unplanned episode"))]
                elif number != 1:
                    yield batch

        yield from super().map(tampered(), generator, scoring)


@pytest.mark.parametrize("swap", [False, True], ids=["lost", "unplanned"])
def test_a_run_whose_results_are_not_its_plan_fails_before_its_record(tmp_path: Path, swap: bool) -> None:
    prepared = runner.prepare(load([*CONFIG, f"run.root={tmp_path}"]))
    dispatcher = LosingDispatcher(dispatcher_key(prepared.worker_spec, prepared.config.cluster), swap)
    with pytest.raises(RuntimeError, match="the written episodes are not the planned ones"):
        runner.execute(prepared, dispatcher)
    (run,) = tmp_path.iterdir()
    assert not (run / layout.RECORD).exists() and not (run / layout.ATTESTATION).exists()


def test_disk_full_before_the_manifest_says_remove_and_run_again(
    stub_engine: dict[str, int | None], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    disk_full_at(monkeypatch, layout.MANIFEST)
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.dir={tmp_path / 'run'}")
    line = one_line(err)
    assert code == 2 and "manifest.json" in line and "no space left" in line and "run again" in line
    assert not list((tmp_path / "run").rglob(".tmp-*"))


def test_a_run_with_record_but_no_attestation_is_incomplete_until_resumed(
    stub_engine: dict[str, int | None], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    code, out, err = cli(capsys, "run", *CONFIG, f"run.root={tmp_path}")
    run = run_dir_of(out)
    attestation = (run / layout.ATTESTATION).read_bytes()
    (run / layout.ATTESTATION).unlink()
    (run / f".tmp-{layout.ATTESTATION}").write_bytes(b"")  # as a driver killed while writing it leaves it
    code, _out, err = cli(capsys, "verify", str(run))
    assert code == 1 and "attestation.intoto.json: missing: the run is incomplete" in one_line(err)
    code, _out, err = cli(capsys, "resume", str(run))
    assert code == 0, err
    assert (run / layout.ATTESTATION).read_bytes() == attestation
    assert not list(run.rglob(".tmp-*"))
    assert cli(capsys, "verify", str(run))[0] == 0


def test_a_failed_write_leaves_no_temporary_file_and_names_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    disk_full_at(monkeypatch, "x.json")
    with pytest.raises(WriteFailed) as caught:
        writer.write_atomic(tmp_path / "x.json", b"{}")
    assert caught.value.where == str(tmp_path / "x.json") and "no space left" in caught.value.message
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(WriteFailed, match="directory is missing"):
        writer.write_atomic(tmp_path / "gone" / "x.json", b"{}")


# --- Ctrl-C ----------------------------------------------------------------------------------------


def test_ctrl_c_during_a_run_exits_130_naming_the_run_and_the_resume_command(
    stub_engine: dict[str, int | None], capsys: pytest.CaptureFixture[str], tmp_path: Path, reference_root: str,
) -> None:  # fmt: skip
    run = tmp_path / "run"
    stub_engine["interrupt_after"] = 1
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.dir={run}")
    assert code == 130
    assert one_line(err) == f"evalrun run: interrupted: the run in {run} is incomplete; `evalrun resume {run}` " \
                            "finishes it"  # fmt: skip
    assert not (run / layout.LOCK).exists() and not (run / layout.RECORD).exists()
    assert cli(capsys, "resume", str(run))[0] == 0
    assert cli(capsys, "verify", str(run), "--expect-root", reference_root)[0] == 0


# --- bad input found before the engine loads -----------------------------------------------------


def test_an_existing_run_dir_is_refused_before_the_engine_loads(
    no_engine: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.dir={tmp_path / 'taken'}")
    assert code == 2 and one_line(err).startswith("evalrun run: error: run.dir: ") and "not empty" in err


def test_an_unwritable_run_root_is_refused_before_the_engine_loads(
    no_engine: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.root={tmp_path / 'file' / 'runs'}")
    assert code == 2 and "run.root" in one_line(err) and "not a directory" in err
    monkeypatch.setattr(store.os, "access", lambda path, mode: False)  # as for a non-root user
    code, _out, err = cli(capsys, "run", *CONFIG, f"run.root={tmp_path / 'runs'}")
    assert code == 2 and one_line(err).startswith("evalrun run: error: run.root: ") and "not writable" in err


def test_a_dataset_with_non_utf8_bytes_names_the_line(
    no_engine: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dataset = tmp_path / "data.jsonl"
    dataset.write_bytes(b'{"id": "1", "a": 1, "b": 2, "answer": "3"}\n{"id": "2", "a": "\xff", "answer": "4"}\n')
    code, _out, err = cli(capsys, "run", *CONFIG, f"task.dataset={dataset}", f"run.root={tmp_path}")
    assert code == 2, err
    assert one_line(err).startswith(f"evalrun run: error: {dataset}:2: not valid UTF-8 (byte 0xff at column 19)")


def test_a_template_or_pack_with_non_utf8_bytes_names_the_line(
    no_engine: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_bytes(b"Q: {{ a }}+{{ b }}\nA \xe9:")
    code, _out, err = cli(capsys, "run", *CONFIG, f"task.template={template}", f"run.root={tmp_path}")
    assert code == 2, err
    assert one_line(err).startswith(f"evalrun run: error: {template}:2: not valid UTF-8 (byte 0xe9 at column 3)")
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "pack.yaml").write_bytes(b"name: p\nversion: '1'\nuser: \xff\n")
    code, _out, err = cli(capsys, "run", *CONFIG, "task=addition_fewshot", f"task.prompt_pack={pack}",
                          f"run.root={tmp_path}")  # fmt: skip
    assert code == 2, err
    assert one_line(err).startswith(f"evalrun run: error: {pack / 'pack.yaml'}:3: not valid UTF-8 (byte 0xff")


@pytest.mark.parametrize("args", [("verify", str(GOLDEN), "--expect-root", "zz"),
                                  ("verify", str(GOLDEN), "--expect-root", "a" * 63 + "g"),
                                  ("verify-proof", "proof.json", "--root", "12")])  # fmt: skip
def test_a_malformed_root_is_bad_input(args: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = cli(capsys, *args)
    assert code == 2 and "expected 64 hexadecimal digits" in one_line(err)


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = cli(capsys, "--debug", "verify", str(GOLDEN), "--expect-root", "zz")
    assert code == 2 and "Traceback" in err and err.strip().endswith("got 'zz'")


# --- verify flags every file a run does not write -------------------------------------------------


@pytest.fixture
def golden_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(GOLDEN, tmp_path / "run"))


@pytest.mark.parametrize(("stray", "flagged"), [
    ("notes.txt", "notes.txt: not a file"), (".tmp-x", ".tmp-x: not a file"),
    (".tmp-record.json", ".tmp-record.json: not a file"), ("rescore/notes.txt", "rescore/notes.txt: not a file"),
    ("rescore/0123456789abcdef/x.json", "rescore/0123456789abcdef/x.json: not a file"),
    ("log/sub/part-00000.jsonl", "log/sub: not a folder"), ("extra/", "extra: not a folder"),
])  # fmt: skip
def test_verify_flags_a_file_no_run_writes(
    golden_copy: Path, stray: str, flagged: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = golden_copy / stray
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if stray.endswith("/") else path.write_text("")
    code, _out, err = cli(capsys, "verify", str(golden_copy))
    assert code == 1
    assert one_line(err) == f"evalrun verify: check failed: {flagged} of an evalrun run directory"


def test_verify_accepts_rescore_outputs_and_a_held_lock_only(
    golden_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rescored = golden_copy / "rescore" / "0123456789abcdef"
    rescored.mkdir(parents=True)
    for name in (layout.SCORES, layout.SUMMARY, layout.RESCORER):
        (rescored / name).write_text("")
    assert cli(capsys, "verify", str(golden_copy))[0] == 0
    with writer.locked(layout.RunDir(golden_copy)):
        assert cli(capsys, "verify", str(golden_copy))[0] == 0
    (golden_copy / layout.LOCK).write_text("123")  # left by a killed driver: nobody holds it
    code, _out, err = cli(capsys, "verify", str(golden_copy))
    assert code == 1 and ".lock: not a file of an evalrun run directory" in err


def test_verify_flags_a_symbolic_link(golden_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (golden_copy / "link").symlink_to(golden_copy / layout.RECORD)
    code, _out, err = cli(capsys, "verify", str(golden_copy))
    assert code == 1 and "link: a symbolic link" in one_line(err)


def test_background_commit_writes_what_writing_each_part_in_turn_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer thread groups parts (here 3 at a time at most) yet writes the same files, hashes and heads as
    committing each part in the dispatch loop; ``on_durable`` sees every part once it is on disk, in order, with
    the bytes that were written."""
    prepared = runner.prepare(load([*CONFIG[:2], "run.progress=false"]))
    batches = [prepared.episodes[i : i + 1] for i in range(len(prepared.episodes))]
    parts = [encode_part(run_episodes(StubEngine(), b, {}), Provenance("stub", "{}", 1, 0.0)) for b in batches]
    monkeypatch.setattr(writer.PartWriter, "MAX_GROUP", 3)
    each = writer.PartWriter(layout.create_run_dir(tmp_path, "each"))
    durable: list[int] = []
    background_run = layout.create_run_dir(tmp_path, "background")

    def seen(index: int, part: EncodedPart) -> None:
        assert background_run.output_part(index).read_bytes() == part.table == parts[index].table
        assert background_run.log_part(index).read_bytes() == part.log
        durable.append(index)

    background = writer.PartWriter(background_run, background=True, on_durable=seen)
    for part in parts:
        assert each.write(part) and background.write(part)
        assert not background.write(part)  # a batch is never written twice, queued or not
    background.flush()
    assert durable == list(range(len(parts)))
    assert background.file_hashes == each.file_hashes and background.heads == each.heads
    for name in each.file_hashes:
        assert (background_run.path / name).read_bytes() == (each.run.path / name).read_bytes()
    background.close()
