"""evalrun's errors cross process boundaries intact: each pickles and unpickles as the same class with the same fields,
so one raised in a Ray worker reaches the CLI as the one line and exit code it has inline (docs/design.md "Exit
codes"). Engine-free; the same errors raised in a real Ray worker are in test_worker_faults_e2e.py."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import click
import pyarrow as pa
import pytest
from helpers.errors import ERRORS, start_failed

import evalrun
from evalrun.cli.main import _failure
from evalrun.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, BadInput, CheckFailed
from evalrun.pipeline.dispatch import _cause
from evalrun.pipeline.worker import root_cause
from evalrun.records.outputs import every_episode_failed


@pytest.mark.parametrize(
    "error, fields", ERRORS, ids=lambda e: type(e).__name__ if isinstance(e, BaseException) else ""
)
def test_every_error_pickles_with_its_class_message_and_fields(error: BaseException, fields: tuple[str, ...]) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error) and back.args == error.args
    for name in fields:
        assert getattr(back, name) == getattr(error, name), name


def test_every_exception_class_evalrun_defines_is_round_tripped_above() -> None:
    """A new error class is added to ERRORS (and so checked) or this fails: one that does not pickle would reach the
    CLI from a Ray worker as Ray's UnserializableException and a traceback."""
    for module in pkgutil.walk_packages(evalrun.__path__, "evalrun."):
        if not module.name.endswith(".__main__"):  # (which runs the CLI)
            importlib.import_module(module.name)
    defined = {cls for cls in _subclasses(BaseException) if cls.__module__.startswith("evalrun.")}
    defined -= {click.ClickException} | {cls for cls in defined if issubclass(cls, click.ClickException)}
    defined = {cls for cls in defined if not cls.__name__.startswith("_")}  # a module's private control flow
    assert defined <= {type(error) for error, _ in ERRORS}, sorted(c.__qualname__ for c in defined)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_an_error_that_crossed_a_process_is_the_same_line_and_exit_code() -> None:
    for error, code in [(BadInput("cluster.num_workers", "1 of 6 placed"), EXIT_BAD_INPUT), (start_failed(), 2),
                        (CheckFailed("gate blocked"), EXIT_CHECK_FAILED)]:  # fmt: skip
        here, there = _failure("evalrun run", error), _failure("evalrun run", pickle.loads(pickle.dumps(error)))
        assert (there.message, there.exit_code) == (here.message, here.exit_code)
        assert there.exit_code == code and "\n" not in there.message


class _RayTaskError(Exception):
    """Stands in for ray.exceptions.RayTaskError: what Ray raises in the driver, the worker's exception as ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::RayEngineWorker.info() (pid=1)\n  File ...\nevalrun.errors.BadInput: ...")
        self.cause = cause


def test_the_cause_of_a_ray_error_is_the_workers_error_with_its_traceback() -> None:
    cause = pickle.loads(pickle.dumps(BadInput("engine.base_url", "no server answers")))
    found = _cause(_RayTaskError(cause))
    assert found is cause and found.remote_traceback.startswith("ray::RayEngineWorker.info()")
    plain = Exception("no cause")
    assert _cause(plain) is plain


def test_the_root_cause_is_the_innermost_exceptions_last_line() -> None:
    try:
        try:
            raise ValueError("Available memory\n(4000.0 GiB requested). Decrease VLLM_CPU_KVCACHE_SPACE.")
        except ValueError as inner:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "ValueError: (4000.0 GiB requested). Decrease VLLM_CPU_KVCACHE_SPACE"


def test_a_run_measured_nothing_only_when_every_episode_failed() -> None:
    def outputs(*reasons: str) -> pa.Table:
        return pa.table({"finish_reason": pa.array(reasons, pa.string())})

    assert every_episode_failed(outputs("failed", "failed"))
    assert not every_episode_failed(outputs("failed", "stop"))
    assert not every_episode_failed(outputs("length", "length"))
    assert not every_episode_failed(outputs())
