"""Start-up and exit (docs/design.md "Start-up and exit"): the compile-cache choice, Ray workers that start
while the driver checks its inputs (and stop when a check fails), and a prompt exit that loses nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from evalrun.cli import main
from evalrun.engines.vllm import AOT_COMPILE, compile_choice
from evalrun.pipeline import dispatch

ROOT = Path(__file__).resolve().parent.parent


def test_evalrun_chooses_the_compile_path_that_reuses_its_cache(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.delenv(AOT_COMPILE, raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    assert compile_choice() == {"aot_compile": False, "cache_dir": str(tmp_path / "vllm" / "torch_compile_cache"),
                                "chosen_by": "evalrun"}  # fmt: skip
    monkeypatch.setenv(AOT_COMPILE, "1")  # the user's choice wins, and is recorded as theirs
    assert compile_choice()["aot_compile"] is True and compile_choice()["chosen_by"] == "environment"
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_choice()["cache_dir"] == str(tmp_path / "xdg" / "vllm" / "torch_compile_cache")


def _leaving(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "leaving.py"
    script.write_text(textwrap.dedent(body), encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)


def test_leaving_flushes_what_was_printed_and_keeps_the_exit_code(tmp_path: Path) -> None:
    done = _leaving(
        """
        import logging, sys
        from evalrun.cli.main import leave
        handler = logging.FileHandler(sys.argv[0] + ".log")
        logging.getLogger("x").addHandler(handler)
        logging.getLogger("x").warning("logged before leaving")
        sys.stdout.write("o" * 200_000 + "\\nlast line\\n")
        sys.stderr.write("an error line\\n")
        leave(3)
        """,
        tmp_path,
    )
    assert done.returncode == 3
    assert done.stdout.endswith("o" * 1000 + "\nlast line\n") and len(done.stdout) == 200_011
    assert done.stderr == "an error line\n"
    assert (tmp_path / "leaving.py.log").read_text(encoding="utf-8") == "logged before leaving\n"


def test_leaving_stops_the_child_processes_it_started(tmp_path: Path) -> None:
    done = _leaving(
        """
        import multiprocessing, sys, time
        from evalrun.cli.main import leave
        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
            child.start()
            print(child.pid, flush=True)
            leave(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text(errors="replace") if Path(f"/proc/{pid}").exists() else ""
        if "State:\tZ" in status:
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    assert not alive, f"child {pid} outlived the process that started it"


@pytest.mark.e2e
def test_ray_workers_start_while_the_inputs_are_checked_and_stop_when_a_check_fails(
    ray_session: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[Any] = []
    start_early = dispatch.start_early

    def recording(spec: Any, cluster: Any) -> Any:
        started.append(start_early(spec, cluster))
        return started[-1]

    monkeypatch.setattr(dispatch, "start_early", recording)
    model = Path(shutil.copytree(ROOT / "evalrun" / "models" / "tiny-adder", tmp_path / "model"))
    changed = model / "generation_config.json"
    changed.write_text(changed.read_text(encoding="utf-8") + " ", encoding="utf-8")  # its pin no longer holds
    code = main(["run", f"model.path={model}", f"run.root={tmp_path / 'runs'}", "run.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and f"{changed}: sha256 is" in err, err
    assert len(started) == 1 and isinstance(started[0], dispatch.RayDispatcher)
    assert started[0].actors() == []  # its workers were stopped (closed with the failed run)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
