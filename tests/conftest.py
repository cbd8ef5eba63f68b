"""Shared fixtures: one Ray instance and one engine worker for the whole test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from evalrun.config import load
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
