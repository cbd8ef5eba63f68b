"""Engine and Ray log lines: routed by logging handlers (never stdout; stderr from WARNING up, all with -v),
kept in RUN_DIR/logs/ as provenance that verify accepts and no hash covers (docs/design.md "Logs")."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalrun.cli.main import main
from evalrun.engines import logs
from evalrun.pipeline.runlogs import write_logs
from evalrun.pipeline.worker import CollectedLogs
from evalrun.records.formats import PROVENANCE_FIELDS, Record, seal_of
from evalrun.rundir import layout

GOLDEN = Path(__file__).parent / "golden" / "addition-v1"


@pytest.fixture
def routing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh routing for the test, and the process's logging as it was afterwards."""
    root = logging.getLogger()
    handlers, levels = list(root.handlers), {n: logging.getLogger(n).level for n in ("vllm", "transformers")}
    monkeypatch.setattr(logs, "_routing", None)
    root.handlers[:] = [h for h in handlers if not isinstance(h, (logs.LogCapture, logs.StderrHandler))]
    with warnings.catch_warnings():
        yield
    logging.captureWarnings(False)
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_engine_records_go_to_the_capture_and_only_errors_to_stderr(
    routing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine's warnings are about the machine (tcmalloc, thread binding): the run's log files have them, on
    every dispatcher; its errors, and evalrun's own warnings, reach the terminal, each once."""
    capture = logs.route()
    engine = logging.getLogger("vllm.entrypoints.test")
    engine.info("non-default args: {'dtype': 'float32'}")
    engine.warning("libtcmalloc is not found")
    engine.error("the KV cache does not fit")
    engine.error("the KV cache does not fit")  # vLLM repeats some: stderr shows each once
    logging.getLogger("evalrun.test").warning("a setting of evalrun's own")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["vllm.entrypoints.test: ERROR: the KV cache does not fit",
                                "evalrun.test: WARNING: a setting of evalrun's own"]  # fmt: skip
    text = capture.text()
    assert "INFO [vllm.entrypoints.test" in text and "non-default args" in text
    assert "WARNING [vllm.entrypoints.test" in text and "libtcmalloc is not found" in text
    assert text.count("the KV cache does not fit") == 2  # the log file keeps every record


def test_verbose_shows_every_record_on_stderr_and_still_none_on_stdout(
    routing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.route(verbose=True)
    logs.route()  # a later call (the worker's, the engine's) keeps the choice
    assert logs.verbose()
    logging.getLogger("vllm.test").info("Initializing a V1 LLM engine")
    out, err = capsys.readouterr()
    assert out == "" and "vllm.test: INFO: Initializing a V1 LLM engine" in err


def test_a_ray_actors_stderr_is_its_log_file(routing: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.route(stderr_is_a_log=True)
    logging.getLogger("vllm.test").info("non-default args: {}")
    assert re.search(r"^\S+ \S+ INFO \[vllm\.test test_logs\.py:\d+\] non-default args", capsys.readouterr().err)


def test_a_library_stream_handler_on_stdout_is_taken_over(routing: None, capsys: pytest.CaptureFixture[str]) -> None:
    library = logging.getLogger("transformers.test")
    own = logging.StreamHandler(sys.stdout)
    kept = logging.FileHandler("/dev/null")
    library.addHandler(own)
    library.addHandler(kept)
    library.propagate = False
    try:
        capture = logs.route()
        library.error("loaded on stdout before evalrun routed it")
        assert own not in library.handlers and kept in library.handlers
        out, err = capsys.readouterr()
        assert out == "" and "loaded on stdout" in err and "loaded on stdout" in capture.text()
    finally:
        library.removeHandler(kept)
        kept.close()
        library.propagate = True


def test_python_warnings_are_logged_deprecations_in_the_file_only(
    routing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = logs.route()
    warnings.simplefilter("always")
    warnings.warn("`torch.distributed.reduce_op` is deprecated", FutureWarning, stacklevel=1)
    warnings.warn("the tokenizer has no chat template", UserWarning, stacklevel=1)
    out, err = capsys.readouterr()
    assert out == ""
    assert "reduce_op" not in err and "UserWarning: the tokenizer has no chat template" in err
    assert "FutureWarning: `torch.distributed.reduce_op` is deprecated" in capture.text()


def test_a_capture_keeps_its_first_and_last_lines_within_its_limit() -> None:
    capture = logs.LogCapture(limit=400)
    capture.setFormatter(logging.Formatter("%(message)s"))
    for i in range(100):
        capture.handle(logging.LogRecord("vllm", logging.INFO, __file__, 1, f"line {i:03d}", None, None))
    text = capture.text()
    assert text.startswith("line 000\n") and text.endswith("line 099\n") and len(text) < 500
    assert "log lines left out ..." in text and "line 050" not in text


def test_stdio_files_are_read_back_only_when_they_are_files(tmp_path: Path) -> None:
    """A Ray worker's stdout and stderr are files: what C++ code writes to fd 2 is read back too."""
    script = (
        "import os, sys; from evalrun.engines import logs; print('from print'); "
        "os.write(2, b'[W utils.cpp:68] Warning: NUMA binding\\n'); sys.stderr.write(repr(logs.stdio_files_text()))"
    )
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    with out.open("w") as o, err.open("w") as e:
        subprocess.run([sys.executable, "-c", script], stdout=o, stderr=e, check=True)
    text = err.read_text()
    assert "=== stdout ===\\nfrom print\\n" in text and "=== stderr ===\\n[W utils.cpp:68] Warning: NUMA" in text
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert piped.stderr.endswith("None")  # pipes (a terminal, a driver's redirected output) are not read


class _Logs:
    def __init__(self, collected: CollectedLogs | Exception) -> None:
        self.collected = collected

    def logs(self) -> CollectedLogs:
        if isinstance(self.collected, Exception):
            raise self.collected
        return self.collected


def test_write_logs_writes_each_log_and_records_what_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = layout.RunDir(tmp_path)
    texts = {"ray-0": "INFO non-default args\n", "driver": "Started a local Ray instance.\n", "../x": "no"}
    recorded = write_logs(run, _Logs(CollectedLogs(texts, {"ray-1": "no answer within 30 s"})))  # type: ignore[arg-type]
    assert recorded["files"] == ["logs/driver.log", "logs/ray-0.log"]
    assert set(recorded["failed"]) == {"../x", "ray-1"} and recorded["failed"]["ray-1"] == "no answer within 30 s"
    assert (tmp_path / "logs" / "ray-0.log").read_text() == "INFO non-default args\n"
    assert "the log of ray-1 was not kept (no answer within 30 s)" in capsys.readouterr().err


def test_a_log_collection_that_raises_is_recorded_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = write_logs(layout.RunDir(tmp_path), _Logs(TimeoutError("the worker hung")))  # type: ignore[arg-type]
    assert recorded == {"files": [], "failed": {"dispatcher": "TimeoutError: the worker hung"}}
    assert "the log of dispatcher was not kept (TimeoutError: the worker hung)" in capsys.readouterr().err
    # a dispatcher plug-in without logs(): recorded, and no warning (nothing went wrong)
    assert write_logs(layout.RunDir(tmp_path), object())["failed"] == {"dispatcher": "it has no logs()"}  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""


def test_a_log_file_name_must_be_a_plain_name() -> None:
    run = layout.RunDir(Path("/r"))
    assert run.log_file("inline-0") == Path("/r/logs/inline-0.log")
    for bad in ("../record", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="cannot name a log file"):
            run.log_file(bad)


@pytest.fixture
def golden_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(GOLDEN, tmp_path / "run"))


def test_verify_accepts_logs_and_nothing_else_beside_them(
    golden_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (golden_copy / "logs").mkdir()
    (golden_copy / "logs" / "inline-0.log").write_text("INFO non-default args\n")
    (golden_copy / "logs" / "driver.log").write_text("")
    assert main(["verify", str(golden_copy)]) == 0
    for stray in ("logs/notes.txt", "logs/.tmp-ray-0.log", "notes.log"):
        (golden_copy / stray).write_text("")
        assert main(["verify", str(golden_copy)]) == 1
        assert f"{stray}: not a file of an evalrun run directory" in capsys.readouterr().err
        (golden_copy / stray).unlink()
    (golden_copy / "logs" / "sub").mkdir()
    assert main(["verify", str(golden_copy)]) == 1
    assert "logs/sub: not a folder of an evalrun run directory" in capsys.readouterr().err


def test_logs_are_provenance_outside_the_seal() -> None:
    record = json.loads((GOLDEN / layout.RECORD).read_text())
    assert "logs" in PROVENANCE_FIELDS and "logs" not in record  # a run made before logs/ verifies as it is
    with_logs = Record.model_validate({**record, "logs": {"files": ["logs/ray-0.log"], "failed": {}}})
    assert seal_of(with_logs) == seal_of(Record.model_validate(record))


def test_the_verbose_flag_is_a_top_level_option(routing: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-v", "verify", str(GOLDEN)]) == 0 and logs.verbose()
    assert main(["verify", str(GOLDEN)]) == 0 and not logs.verbose()
    capsys.readouterr()
    main(["--help"])
    assert "-v, --verbose" in capsys.readouterr().out


def test_a_watch_reads_what_a_library_says_of_itself_while_it_is_watched(routing: None) -> None:
    """vLLM's warm-up seconds, from its own record (no API returns them): the first match while watched, none after."""
    from evalrun.engines.vllm import WARMUP

    logs.route()  # vLLM's logger at its INFO level, as a run has it
    core = logging.getLogger("vllm.v1.engine.core")
    with logs.watching("vllm.v1.engine.core", WARMUP) as watch:
        core.info("init engine (profile, create kv cache, warmup model) took 35.21 s")
        core.info("init engine (profile, create kv cache, warmup model) took 99.00 s")
    core.info("init engine (profile, create kv cache, warmup model) took 1.00 s")
    assert watch.value == 35.21 and watch not in core.handlers
    with logs.watching("vllm.v1.engine.core", WARMUP) as quiet:
        core.info("something else")
    assert quiet.value is None
