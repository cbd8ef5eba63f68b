"""A real instruct model no one here trained, SmolLM2-135M-Instruct (30 layers, ChatML chat template), on
the real engine: chat-formatted single-turn prompts, a model agent's replies ending at its end of turn, and
a run that replays, verifies and rescores with the model directory gone. One engine (in this process) for
the module; the model is built into evalrun's cache by scripts/build_smollm2.py (setup runs it; here it is
run again, which is a hash check when it is built)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.checkout import CHECKOUT

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, open_for, prepare
from evalrun.records.outputs import output_warnings

pytestmark = pytest.mark.e2e

# the canary is left to tests/test_canary*.py: on this model it costs more than the runs here
SMOL = ("model=smollm2_135m_instruct", "cluster=inline", "run.progress=false", "determinism.canary=false")
TEMPLATE_SHA256 = "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788"  # its chat_template.jinja


@pytest.fixture(scope="module")
def smol_dispatcher() -> Iterator[Dispatcher]:
    subprocess.run([sys.executable, str(CHECKOUT / "scripts" / "build_smollm2.py"), "--quiet"], check=True)
    d = open_for(prepare(load([*SMOL, "task=addition_chat", "limit=1"])))
    yield d
    d.close()


def _run(dispatcher: Dispatcher, root: Path, *overrides: str) -> Path:
    return execute(prepare(load([*SMOL, f"run.root={root}", *overrides])), dispatcher)


def _model_calls(run: Path) -> list[dict]:
    return [entry for path in sorted((run / "log").iterdir()) for line in path.read_text().splitlines()
            if (entry := json.loads(line))["kind"] == "model"]  # fmt: skip


@pytest.fixture(scope="module")
def chat_run(smol_dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(smol_dispatcher, tmp_path_factory.mktemp("smol"), "task=addition_chat", "limit=6")


def test_a_system_template_gives_chat_formatted_non_empty_answers(chat_run: Path, smol_dispatcher: Dispatcher,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """Through the model's chat template every answer is a non-empty turn ended by the model's <|im_end|>; the
    same pack as plain text (the system template pasted before the question) is what the model does not expect:
    every answer runs on to the token limit, and the run says so."""
    rows = pq.read_table(chat_run / "outputs").to_pylist()
    assert len(rows) == 6 and all(r["output"].strip() and r["finish_reason"] == "stop" for r in rows)
    assert all(r["token_ids"][-1] == 2 for r in rows)  # <|im_end|>, the end of its turn
    assert all(r["prompt"].startswith("<|im_start|>system\nYou are a calculator.") for r in rows)
    assert all(r["prompt"].endswith("<|im_start|>assistant\n") for r in rows)
    manifest = json.loads((chat_run / "manifest.json").read_text())
    assert manifest["task"]["prompt_pack"]["chat"]["template_sha256"] == TEMPLATE_SHA256
    assert manifest["digest_inputs"]["prompt_pack"]["chat"]["template_sha256"] == TEMPLATE_SHA256
    assert manifest["model"]["chat"]["template_sha256"] == TEMPLATE_SHA256
    assert output_warnings(pq.read_table(chat_run / "outputs")) == []

    plain = _run(smol_dispatcher, tmp_path, "task=addition_chat", "limit=6", "task.chat_format=plain")
    outputs = pq.read_table(plain / "outputs")
    assert "chat" not in json.loads((plain / "manifest.json").read_text())["digest_inputs"]["prompt_pack"]
    assert not any(r.startswith("<|im_start|>") for r in outputs.column("prompt").to_pylist())
    # SmolLM2 given "You are a calculator. ...What is 3+83?" as plain text rambles on to the token limit
    assert output_warnings(outputs) == ["all 6 outputs were cut at the token limit (decoding.max_tokens): none "
                                        "ended by itself or at a stop string"]  # fmt: skip


def test_a_run_replays_verifies_and_rescores_after_its_model_directory_is_moved_away(chat_run: Path) -> None:
    model_dir = Path(json.loads((chat_run / "manifest.json").read_text())["model"]["path"])
    moved = model_dir.with_name(model_dir.name + ".moved-by-test")
    model_dir.rename(moved)
    try:
        assert not model_dir.exists()
        replayed = replay_run(chat_run, [])
        assert replayed.reproduced == 6 and not replayed.divergences and replayed.root_matches
        assert replayed.scores_identical
        assert verify_run(chat_run).scores == "recomputed"
        assert rescore_run(chat_run, []).bytes_identical
    finally:
        moved.rename(model_dir)


def test_a_model_agents_replies_end_at_its_end_of_turn_not_at_a_newline(smol_dispatcher: Dispatcher,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """``agent=model`` replies have the world's own stop strings (none): a reply runs to the model's end of turn
    or its token limit, with its newlines, where the decoding group's ``"\\n"`` used to cut every first reply after
    one line. The replies are in the model's chat template, and the run verifies and replays."""
    run = _run(smol_dispatcher, tmp_path, "task=invoice_desk", "task.world.agent=model", "limit=1",
               "task.world.reply_tokens=48", "task.world.max_steps=2")  # fmt: skip
    calls = _model_calls(run)
    assert calls and all(c["request"]["sampling"]["stop"] == [] for c in calls)
    assert all(c["request"]["prompt"].startswith("<|im_start|>system\nTools:") for c in calls)
    first = calls[0]["response"]
    assert first["finish_reason"] in ("stop", "length") and len(first["token_ids"]) > 1
    assert first["finish_reason"] == "length" or first["token_ids"][-1] == 2  # the token limit, or <|im_end|>
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical
