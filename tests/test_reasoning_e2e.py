"""A reasoning model on the real engine: models/tiny-thinking-adder (scripts/build_model.py --thinking) thinks
``b+a=s`` between ``<think>`` and ``</think>`` before it answers ``s``. With ``task.reasoning_parser`` its answers
are scored and its thinking recorded beside them; the run verifies, replays (also with its model directory gone,
from the tokenizer files it kept, which replay checks against record.json) and rescores exactly. One engine in
this process for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import MODELS_DIR, load
from evalrun.errors import CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, open_for, prepare

pytestmark = pytest.mark.e2e

THINKING = ("model=tiny_thinking_adder", "task=addition", "decoding.stop=[]", "cluster=inline", "run.progress=false",
            "determinism.canary=false", "limit=20")  # fmt: skip


@pytest.fixture(scope="module")
def thinking_dispatcher() -> Iterator[Dispatcher]:
    d = open_for(prepare(load([*THINKING, "limit=1"])))
    yield d
    d.close()


def _run(dispatcher: Dispatcher, root: Path, *overrides: str) -> Path:
    return execute(prepare(load([*THINKING, f"run.root={root}", *overrides])), dispatcher)


def _mean(run: Path) -> float:
    return json.loads((run / "summary.json").read_text())["tasks"]["addition"]["exact_match"]["mean"]


def _responses(run: Path) -> list[dict]:
    return [entry["response"] for path in sorted((run / "log").iterdir()) for line in path.read_text().splitlines()
            if (entry := json.loads(line))["kind"] == "model"]  # fmt: skip


def _audited(run: Path) -> None:
    """The run verifies, replays to every recorded head and score, and rescores bit for bit."""
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert replayed.reproduced == 20 and not replayed.divergences and replayed.root_matches
    assert replayed.scores_identical and rescore_run(run, []).bytes_identical


def test_the_answer_is_scored_the_thinking_recorded_and_the_run_replays(thinking_dispatcher: Dispatcher,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    split = _run(thinking_dispatcher, tmp_path, "task.reasoning_parser=deepseek_r1")
    rows = pq.read_table(split / "outputs").to_pylist()
    responses = _responses(split)
    assert len(rows) == 20 and all("<think>" not in r["output"] and r["output"].strip() for r in rows)
    assert all(r["text"].startswith("<think>") and r["reasoning"] and r["content"] for r in responses)
    assert sorted(r["output"] for r in rows) == sorted(r["content"] for r in responses)
    assert _mean(split) >= 0.9  # held-out sums; 40 of 40 right when this was written
    _audited(split)
    # the same replies taken whole: exact_match reads "<think>b+a=s</think>..." and nothing matches
    whole = _run(thinking_dispatcher, tmp_path / "whole")
    assert _mean(whole) == 0.0 and all(r["output"].startswith("<think>") for r in pq.read_table(whole / "outputs")
                                       .to_pylist())  # fmt: skip


def test_enable_thinking_false_closes_the_think_block_and_the_parser_reads_a_plain_answer(
    thinking_dispatcher: Dispatcher, tmp_path: Path
) -> None:
    run = _run(thinking_dispatcher, tmp_path, "task.reasoning_parser=qwen3",
               "+task.chat_template_kwargs.enable_thinking=false")  # fmt: skip
    responses = _responses(run)
    assert all("reasoning" not in r and r["content"] == r["text"] and "<think>" not in r["text"] for r in responses)
    assert _mean(run) >= 0.9
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["digest_inputs"]["prompt_pack"]["chat"]["kwargs"] == {"enable_thinking": False}
    assert manifest["digest_inputs"]["prompt_pack"]["reasoning"]["parser"] == "qwen3"


def test_a_run_whose_model_is_gone_replays_from_its_kept_tokenizer_and_refuses_a_changed_one(
    thinking_dispatcher: Dispatcher, tmp_path: Path
) -> None:
    run = _run(thinking_dispatcher, tmp_path, "task.reasoning_parser=deepseek_r1")
    model = MODELS_DIR / "tiny-thinking-adder"
    moved = model.with_name(model.name + ".moved-by-test")
    model.rename(moved)
    try:
        _audited(run)  # the parser reads the replies again with the run's own copy of the tokenizer
        kept = run / "tokenizer" / "tokenizer_config.json"
        kept.write_text(kept.read_text().replace("<think>", "<thinking>"))
        with pytest.raises(CheckFailed, match=r"tokenizer/tokenizer_config\.json: sha256 differs from record\.json"):
            replay_run(run, [])
    finally:
        moved.rename(model)
