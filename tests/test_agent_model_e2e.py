"""The shipped agent model on the real engine (issue 12): `agent=model` episodes over both families,
every model call in the chain, verified, replayed exactly from the recorded replies against fresh
worlds, rescored bit for bit from the final states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.runs import run_alone

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, prepare

pytestmark = pytest.mark.e2e

MODEL_AGENT = ["task=invoice_desk", "task.world.agent=model", "model=tiny_invoice_agent", "cluster=inline", "limit=6",
               "run.progress=false"]  # fmt: skip


@pytest.fixture(scope="module")
def model_run(agent_dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model-agent")
    return execute(prepare(load([*MODEL_AGENT, f"run.root={root}"])), agent_dispatcher)


def test_model_agent_episodes_are_recorded_verified_replayed_and_rescored(model_run: Path) -> None:
    rows = pq.read_table(model_run / "outputs").to_pylist()
    assert len(rows) == 6 and {r["item_id"].split("-")[0] for r in rows} == {"duplicates", "price"}
    assert all(r["finish_reason"] in ("done", "max_steps", "max_tokens", "failed") for r in rows)
    assert all(r["output_tokens"] > 0 for r in rows)
    for path in (model_run / "log").iterdir():
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        models = [e for e in entries if e["kind"] == "model"]
        assert models and all(m["request"]["prompt"].startswith("<s><|system|>") for m in models)  # chat template
        tools = [e for e in entries if e["kind"] == "tool"]
        observations = [e for e in entries if e["kind"] == "observation"]
        assert len(observations) == len(tools) + sum("reply" in o for o in observations)
    manifest = json.loads((model_run / "manifest.json").read_text())
    assert manifest["task"]["world"]["chat_template_sha256"] is not None
    assert manifest["decoding"]["max_tokens"] == manifest["task"]["world"]["reply_tokens"]

    assert verify_run(model_run).scores == "recomputed"
    replayed = replay_run(model_run, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical
    assert rescore_run(model_run, []).bytes_identical


def test_a_model_agent_replays_without_its_model_directory(model_run: Path, tmp_path: Path) -> None:
    """A model agent's prompts are rendered with the chat template the run recorded (manifest model.chat) and the
    tokenizer files it kept (RUN/tokenizer): a replay where the recorded model directory is gone reproduces
    every head. A run recorded before either (nothing to render with) whose model is gone is a BadInput naming
    model.path, before any episode."""
    moved = Path(shutil.copytree(model_run, tmp_path / "moved"))
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["model"]["path"] = str(tmp_path / "no-such-model")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    replayed = replay_run(moved, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical

    assert sorted(p.name for p in (moved / "tokenizer").iterdir()) == [  # what the run kept of its model
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    del manifest["model"]["chat"]  # a run recorded before either was kept
    (moved / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(moved / "tokenizer")
    with pytest.raises(BadInput, match=r"chat template.*manifest's model\.path") as caught:
        replay_run(moved, [])
    assert caught.value.where == "model.path"


NATIVE = ["task=invoice_desk", "task.world.agent=model", "model=tiny_tool_agent", "task.world.tool_parser=hermes",
          "cluster=inline", "run.progress=false"]  # fmt: skip


@pytest.fixture(scope="module")
def native_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped native tool-calling model (its chat template takes the tools), on its own engine."""
    return run_alone(prepare(load([*NATIVE, "limit=4", f"run.root={tmp_path_factory.mktemp('native')}"])))


def test_native_tool_calls_parsed_by_vllm_verified_replayed_rescored(native_run: Path, tmp_path: Path) -> None:
    """tool_format auto is native for a template that takes tools: the tools reach the model as JSON Schema, its
    Hermes-format replies are read by vLLM's hermes parser into tool calls (recorded raw in the chain), and the
    run verifies, replays (also with its model directory gone) and rescores exactly."""
    manifest = json.loads((native_run / "manifest.json").read_text())
    assert manifest["task"]["world"]["tool_format"] == {
        "name": "native",
        "parser": "hermes",
        "vllm": manifest["engine"]["version"].split("+")[0],
    }
    entries = [json.loads(line) for path in (native_run / "log").iterdir() for line in path.read_text().splitlines()]
    models = [e for e in entries if e["kind"] == "model"]
    assert models and all(m["response"]["text"].startswith("<tool_call>{") for m in models)
    assert all('"type":"function"' in m["request"]["prompt"] for m in models)  # the tools as JSON Schema
    tools = [e for e in entries if e["kind"] == "tool"]
    assert len(tools) > len(models)  # parsed calls, several per reply
    assert verify_run(native_run).scores == "recomputed"
    moved = Path(shutil.copytree(native_run, tmp_path / "moved"))
    manifest["model"]["path"] = str(tmp_path / "no-such-model")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    replayed = replay_run(moved, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical
    assert rescore_run(native_run, []).bytes_identical
