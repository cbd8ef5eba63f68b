"""The benchmarks at a smoke size, so that a change that breaks one fails the suite (the figures they
print are not checked: machines here are noisy). The engine benchmarks run in this process on the
session's shared engines (tests/conftest.py). bench_report's smoke test is in tests/test_report.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from evalrun.config import MODELS_DIR, load
from evalrun.pipeline.dispatch import InlineDispatcher
from evalrun.pipeline.runner import prepare

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str, *args: str) -> str:
    """Run scripts/bench_NAME.py with ``args`` as a user does; its stdout (it must succeed)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / f"bench_{name}.py"), *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_bench_records_smoke(tmp_path: Path) -> None:
    """Write (three ways, byte-identical), verify and rescore a synthetic run through the real code."""
    out = _bench("records", "--episodes", "300", "--part-size", "100", "--jobs", "2", "--dir", str(tmp_path))
    assert re.search(r"write   : 300 episodes", out)
    assert re.search(r"verify  : 900 log entries, 300 rows", out)
    assert re.search(r"rescore : 300 rows", out)


@pytest.mark.e2e
def test_bench_startup_smoke() -> None:
    """Two whole processes on 4 items: the raw vLLM script (with evalrun's vLLM settings) and `evalrun run
    cluster=inline`, each timed from spawn to exit, and their ratio."""
    out = _bench("startup", "--rounds", "1", "--no-warmup", "--limit", "4", "--modes", "raw-tuned,inline")
    assert re.search(r"round 1 raw-tuned .* raw: 4 prompts, \d+ tokens", out), out
    assert re.search(r"round 1 inline .* timings: start-up", out), out
    assert re.search(r"^ratio inline/raw-tuned: \d+\.\d{3}$", out, re.MULTILINE), out


def test_bench_dispatch_smoke() -> None:
    """(b) the stand-in engine on 1 and 2 Ray workers and (c) the driver's memory at 2,000 episodes, in a
    child process; (a) loads the real engine twice and is left out."""
    out = _bench("dispatch", "--skip-a", "--rounds", "1", "--seeds", "1", "--workers", "1,2", "--scale", "2000")
    assert re.search(r"1 workers: .* parallel efficiency 1\.000 \(whole run, .* \(200 episodes\)", out)
    assert re.search(r"2 workers: .* parallel efficiency \d\.\d{3} \(whole run, .* \(200 episodes\)", out)
    assert len(re.findall(r"dispatch loop alone \(generation \+ writing, .* parallel efficiency \d\.\d{3}", out)) == 2
    assert re.search(r"2,000 episodes: peak RSS +\d+ MiB .* driver CPU +[\d.]+ us/episode", out)


def _script(name: str) -> ModuleType:
    """A benchmark script imported from its path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "scripts" / f"bench_{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
def test_bench_overhead_smoke(inline_dispatcher: InlineDispatcher, tmp_path: Path) -> None:
    """Raw vLLM generate, the engine adapter and the run path on the shared in-process engine: 20 episodes, 1 round."""
    bench = _script("overhead")
    prepared = prepare(load(bench.overrides_for(1, tmp_path, ["limit=20"])))
    out = "\n".join(bench.measure(prepared, inline_dispatcher, 1))
    assert "episodes per round: 20, rounds: 1" in out
    assert re.search(r"raw vllm.LLM.generate +: +[\d.]+ episodes/s", out)
    assert re.search(r"evalrun run path +: +[\d.]+ episodes/s", out)
    assert re.search(r"evalrun engine adapter *: +[\d.]+ episodes/s", out)
    assert re.search(r"ratio evalrun/raw +: [\d.]+", out)
    assert re.search(r"ratio evalrun/adapter +: [\d.]+", out)


@pytest.mark.e2e
def test_bench_canary_smoke(inline_dispatcher: InlineDispatcher) -> None:
    """One canary round on the shared in-process engine."""
    worker = inline_dispatcher.worker
    out = "\n".join(_script("canary").measure(worker, worker.engine_load_s, worker.engine_load_s, 1, "defaults"))
    assert re.search(r"engine vllm \S+ \(defaults\); worker start without the canary", out)
    assert re.search(r"canary 0: [\d.]+ s \([\d.]+ s CPU\), \d+ engine calls; .*batch-invariant", out), out
    assert "median canary over 1 rounds" in out


@pytest.mark.e2e
def test_bench_agents_smoke(agent_dispatcher: InlineDispatcher) -> None:
    """Four live agent episodes in lockstep and one alone on the shared agent-model engine."""
    agent = MODELS_DIR / "tiny-invoice-agent"
    out = "\n".join(_script("agents").measure(agent_dispatcher.worker.engine, agent, 4, 1))
    assert "episodes: 4 live, lockstep; baseline: first 1 one at a time" in out
    assert re.search(r"model calls per engine call: [\d.]+ \(\d+ model calls in \d+ engine calls; first turn: 4\)", out)
    assert re.search(r"episodes/s: lockstep [\d.]+, one at a time [\d.]+, ratio [\d.]+x", out)
    assert re.search(r"same replies both ways: \d/1; same head .*: \d/1; pass rate \(lockstep\): [\d.]+", out)
