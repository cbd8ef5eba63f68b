"""Shared fixtures: one Ray instance and one engine worker for the whole test session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# The S3-compatible server the tests start (s3_server) takes any credentials; set before Ray starts, so that the
# engine workers, which write parts into it, have them too (they inherit the environment Ray started with).
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from evalrun.config import load
from evalrun.pipeline import failpoints
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import Prepared, execute, open_for, prepare

ENGINE_FIXTURES = frozenset({"ray_session", "dispatcher", "run_eval", "two_workers", "audit_run", "inline_dispatcher",
                             "agent_dispatcher", "served"})  # fmt: skip
SERVED = ("cluster=inline", "run.progress=false", "determinism.canary=false", "limit=20")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a shared engine or Ray fixture starts an engine: it is ``e2e`` whether marked or not,
    so ``pytest -m "not e2e"`` never starts one."""
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    # Logical CPUs: the shared worker plus the two-worker pool of the dispatch tests (2 real cores).
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def dispatcher(ray_session: None) -> Iterator[Dispatcher]:
    """One Ray engine worker on the default model and engine settings, shared by every e2e test."""
    d = open_for(prepare(load(["limit=1"])))
    yield d
    d.close()


@pytest.fixture
def run_eval(dispatcher: Dispatcher, tmp_path: Path):
    """Run a config (Hydra overrides) on the shared engine; returns the run directory."""

    def run(*overrides: str) -> Path:
        prepared: Prepared = prepare(load([f"run.root={tmp_path / 'runs'}", "run.progress=false", *overrides]))
        return execute(prepared, dispatcher)

    return run


@pytest.fixture(scope="session")
def two_workers(ray_session: None) -> Iterator[Dispatcher]:
    """Two Ray engine workers (the placement and failure tests); ``cluster.num_workers=2`` configs."""
    d = open_for(prepare(load(["limit=1", "cluster.num_workers=2"])))
    yield d
    d.close()


@pytest.fixture(scope="session")
def audit_run(dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small finished run (12 episodes in 3 parts) shared by the audit tests: copy it before changing it."""
    root = tmp_path_factory.mktemp("audit")
    prepared = prepare(load([f"run.root={root}", "run.progress=false", "limit=12", "cluster.batch_size=5"]))
    return execute(prepared, dispatcher)


@pytest.fixture(scope="session")
def inline_dispatcher() -> Iterator[Dispatcher]:
    """One engine in this process (``cluster=inline``) on the default model and engine settings: for tests
    that need the engine itself (``inline_dispatcher.worker.engine``) or the inline run path."""
    d = open_for(prepare(load(["limit=1", "cluster=inline"])))
    yield d
    d.close()


AGENT_MODEL = ("task=invoice_desk", "task.world.agent=model", "model=tiny_invoice_agent", "cluster=inline")


@pytest.fixture(scope="session")
def agent_dispatcher() -> Iterator[Dispatcher]:
    """One engine in this process on the shipped agent model (``AGENT_MODEL`` configs)."""
    d = open_for(prepare(load([*AGENT_MODEL, "limit=1"])))
    yield d
    d.close()


@pytest.fixture(scope="session")
def served() -> Iterator[Dispatcher]:
    """An inline worker whose engine started a vLLM server of the default model (engine=vllm_server; about
    80-100 s on 2 cores): the session's one server, reached by URL as ``served.worker.engine.identity.base_url``."""
    d = open_for(prepare(load([*SERVED, "engine=vllm_server", "limit=1"])))
    yield d
    d.close()
    assert d.worker.engine._server is None  # stopped


def evalrun_process(cwd: Path, *args: str, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """``evalrun ARGS`` in a process of its own, armed to SIGKILL itself at ``failpoint``
    (evalrun.pipeline.failpoints) when one is named."""
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if failpoint:
        env[failpoints.ENV] = failpoint
    return subprocess.run([sys.executable, "-m", "evalrun.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)  # fmt: skip


S3_BUCKET = "evalrun-test"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto in server mode on 127.0.0.1, one per session, with the bucket ``evalrun-test``: yields its endpoint URL
    (a run's location is ``s3://evalrun-test/PREFIX?endpoint_url=URL``). ``EVALRUN_MOTO_PYTHON`` names another
    interpreter that has moto[s3] and flask, when this one has not."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    python = os.environ.get("EVALRUN_MOTO_PYTHON") or sys.executable
    server = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start on {endpoint} (exit {server.poll()})") from None
                time.sleep(0.2)
        request = urllib.request.Request(f"{endpoint}/{S3_BUCKET}", method="PUT")  # moto takes any signature
        urllib.request.urlopen(request, timeout=10).close()
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
