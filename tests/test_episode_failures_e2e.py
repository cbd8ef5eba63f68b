"""Per-episode failures on the real vLLM engine (issue 11, item 2): prompts longer than the tiny
model's context of 128 tokens among good ones; the run completes, verify and replay pass."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS, load
from evalrun.episodes.harness import run_batches, run_episodes
from evalrun.pipeline.dispatch import InlineDispatcher
from evalrun.pipeline.manifest import generator_info
from evalrun.pipeline.runner import execute, prepare

pytestmark = pytest.mark.e2e  # starts the engine


def test_too_long_prompts_fail_their_episodes_on_vllm_and_the_run_completes(
    inline_dispatcher: InlineDispatcher, tmp_path: Path
) -> None:
    dataset = tmp_path / "data.jsonl"
    long_items = {3, 8}
    rows = [{"id": f"q-{i:03d}", "question": ("1+" * 150 + "1") if i in long_items else f"{i}+1", "answer": str(i + 1)}
            for i in range(12)]  # fmt: skip
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared = prepare(load([f"task.dataset={dataset}", "task.references=null",
                             f"task.template={BUILTIN_TASKS}/addition/template.jinja", "cluster=inline",
                             "cluster.batch_size=6", f"run.root={tmp_path / 'runs'}",
                             "run.progress=false"]))  # fmt: skip
    assert sum(e.rejection is not None for e in prepared.episodes) == 2  # found before any engine call
    run = execute(prepared, inline_dispatcher)
    # Without the check, vLLM refuses them itself: the batch is split and the good episodes still run.
    unchecked = [replace(e, rejection=None) for e in prepared.episodes[:6]]
    results = run_episodes(inline_dispatcher.worker.engine, unchecked, generator_info())
    # The same through the inline stream (requests queued ahead): the refused batch runs alone, split.
    streamed = [r for batch in run_batches(inline_dispatcher.worker.engine, [unchecked[:2], unchecked[2:], unchecked],
                                           generator_info()) for r in batch]  # fmt: skip
    assert [r.head for r in streamed] == [r.head for r in results] * 2
    refused = [r for r in results if r.error is not None]
    assert [r.episode.item_id for r in refused] == ["q-003"]
    assert "maximum context length is 128 tokens" in (refused[0].error or "")
    assert all(r.completion.finish_reason != "failed" for r in results if r.error is None)

    outputs = pq.read_table(run / "outputs").to_pydict()
    failed = sorted(i for i, r in zip(outputs["item_id"], outputs["finish_reason"], strict=True) if r == "failed")
    assert failed == ["q-003", "q-008"] and len(outputs["item_id"]) == 12
    summary = json.loads((run / "summary.json").read_text())
    (metric,) = summary["overall"]
    assert summary["overall"][metric]["errors"] == 2
    verify_run(run)
    report = replay_run(run, [])
    assert not report.divergences and report.root_matches and report.scores_identical
