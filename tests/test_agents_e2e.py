"""Agent runs end to end through `evalrun run` on the shared engine worker (issue 12): recorded,
verified, replayed against fresh worlds, rescored from final states; the same heads on any worker
count or batch size; a forged final state fails verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.forgery import reseal

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.errors import CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, prepare
from evalrun.rundir.reader import load_record, open_run
from evalrun.worlds.invoice_desk import InvoiceDesk

AGENT = ("task=invoice_desk", "limit=8", "seeds.repeats=2")


@pytest.fixture(scope="module")
def agent_run(dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agents")
    return execute(prepare(load([f"run.root={root}", "run.progress=false", *AGENT])), dispatcher)


def test_scripted_agent_run_is_recorded_verified_replayed_and_rescored(agent_run: Path) -> None:
    outputs = pq.read_table(agent_run / "outputs").to_pylist()
    assert len(outputs) == 16 and {r["finish_reason"] for r in outputs} == {"done"}
    assert {r["item_id"].split("-")[0] for r in outputs} == {"duplicates", "price"}  # both families
    scores = pq.read_table(agent_run / "scores.parquet").to_pylist()
    assert {r["metric"] for r in scores} == {"precision", "recall", "f1", "pass"}
    assert all(r["value"] == 1.0 for r in scores)  # the scripted agent solves both families
    summary = json.loads((agent_run / "summary.json").read_text())
    assert summary["overall"]["pass"]["mean"] == 1.0
    manifest = json.loads((agent_run / "manifest.json").read_text())
    world = manifest["task"]["world"]
    assert world["versions"]["world"] == "1" and world["agent"] == "scripted" and world["items"] == 8
    assert manifest["digest_inputs"]["prompt_pack"]["world"] == world

    report = verify_run(agent_run)
    assert report.scores == "recomputed"
    replayed = replay_run(agent_run, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical
    assert rescore_run(agent_run, []).bytes_identical  # from the stored final states, no world run


def test_same_heads_on_two_workers_and_any_batch_size(agent_run: Path, two_workers: Dispatcher,
                                                      tmp_path: Path) -> None:  # fmt: skip
    overrides = [f"run.root={tmp_path}", "run.progress=false", "cluster.num_workers=2", "cluster.batch_size=3", *AGENT]
    other = execute(prepare(load(overrides)), two_workers)
    assert load_record(open_run(other)).merkle_root == load_record(open_run(agent_run)).merkle_root
    heads = {r["episode_id"]: r["head"] for r in pq.read_table(other / "outputs").to_pylist()}
    assert heads == {r["episode_id"]: r["head"] for r in pq.read_table(agent_run / "outputs").to_pylist()}
    rows = pq.read_table(other / "outputs").to_pylist()
    assert (
        max(r["batch_size"] for r in rows)
        <= 3
        < max(r["batch_size"] for r in pq.read_table(agent_run / "outputs").to_pylist())
    )


def test_a_forged_final_state_fails_verify(agent_run: Path, tmp_path: Path) -> None:
    forged = Path(shutil.copytree(agent_run, tmp_path / "forged"))
    part = sorted((forged / "outputs").iterdir())[0]
    table = pq.read_table(part)
    rows = table.to_pylist()
    state = json.loads(rows[0]["final_state"])
    state["submitted"] = []  # as if the agent had reported nothing
    rows[0]["final_state"] = json.dumps(state)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), part)
    with pytest.raises(CheckFailed, match=r"column 'final_state' differs from the chain"):
        verify_run(forged)


def test_world_version_2_runs_beside_version_1(run_eval, agent_run: Path) -> None:
    v2 = run_eval("task=invoice_desk", "limit=2", "task.world.version=2")
    manifest = json.loads((v2 / "manifest.json").read_text())
    assert manifest["task"]["world"]["versions"]["world"] == "2"
    first = json.loads((agent_run / "manifest.json").read_text())
    assert manifest["digest"]["prompt_pack"] != first["digest"]["prompt_pack"]
    verify_run(v2)
    log = "".join(p.read_text() for p in (v2 / "log").iterdir())
    assert '"currency"' in log  # version 2 shows invoices with their currency


def test_planning_run_scores_against_frozen_references_and_records_them(run_eval) -> None:
    """shift-planner (issue 13): the run reads frozen CP-SAT references, never the solver; the manifest
    names the reference set; verify, replay and rescore reproduce the scores."""
    run = run_eval("task=shift_planner", "limit=4")
    manifest = json.loads((run / "manifest.json").read_text())
    references = manifest["task"]["world"]["references"]
    assert (
        references["name"] == "shift-planner" and references["version"] == "1" and len(references["index_sha256"]) == 64
    )
    assert manifest["digest_inputs"]["scoring"]["context"]["verifier"]["references"] == references
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    assert {(r["metric"], r["value"]) for r in scores} == {("feasible", 1.0), ("gap", 0.0), ("pass", 1.0)}
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert not replayed.divergences and replayed.root_matches and replayed.scores_identical
    assert rescore_run(run, []).bytes_identical


def test_the_scoring_digest_covers_the_verifiers_source_and_the_libraries(
    agent_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier edited without a version bump changes the scoring digest (its source's hash is in the world's
    recorded versions and the scoring context); a manifest whose recorded verifier source was rewritten fails
    verify naming the part; numpy's and pyarrow's versions are scoring inputs too."""
    manifest = json.loads((agent_run / "manifest.json").read_text())
    scoring = manifest["digest_inputs"]["scoring"]
    assert set(scoring["libraries"]) == {"numpy", "pyarrow"}
    source = manifest["task"]["world"]["versions"]["verifier_source"]
    assert scoring["context"]["verifier"]["verifier_source"] == source == InvoiceDesk.verifier_source_sha256()
    config = load(["run.progress=false", *AGENT])
    before = prepare(config).digest
    monkeypatch.setattr(InvoiceDesk, "verifier_source_sha256", classmethod(lambda cls: "0" * 64))  # an edit
    after = prepare(config).digest
    assert after.scoring != before.scoring and after.digest != before.digest
    forged = Path(shutil.copytree(agent_run, tmp_path / "forged"))
    manifest["task"]["world"]["versions"]["verifier_source"] = "0" * 64
    (forged / "manifest.json").write_text(json.dumps(manifest))
    reseal(forged)  # a careful forger: every hash, the seal and the attestation made to match
    # named where it was recorded first: the world's record (its versions) that the prompt-pack part hashes too
    with pytest.raises(CheckFailed, match=r"manifest.json: digest_inputs.prompt_pack.world differs from task.world"):
        verify_run(forged)
