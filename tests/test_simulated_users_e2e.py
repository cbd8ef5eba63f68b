"""Simulated users played by a model on the real engine (issue 31): support-desk's customer played by the shipped
tiny agent model (its replies are nonsense, and recorded like any model's), the scripted agent talking to it;
recorded, verified, replayed without any engine, rescored exactly; held repeats; the two sides apart in nondet and
check; the Inspect export's user messages; a customer model whose pinned files change changes the digest, and
compare names it. SmolLM2 playing both sides is measured in the README ("Simulated users"), not here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.forgery import reseal

from evalrun.analysis.compare import compare_paths
from evalrun.analysis.nondet import nondet_paths
from evalrun.audit.check import check_run
from evalrun.audit.held import held_repeats
from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.engines.pins import hash_model_dir
from evalrun.errors import CheckFailed
from evalrun.export.inspect_log import export_inspect
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.manifest import Digest
from evalrun.pipeline.runner import execute, open_for, prepare
from evalrun.records.entries import parse_line
from evalrun.report.data import transcript_steps

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
TALK = ["task=support_desk", "task.world.user=model", "model=tiny_invoice_agent", "cluster=inline", "limit=3",
        "task.world.user_decoding.temperature=1.0", "task.world.user_decoding.max_tokens=24",
        "run.progress=false"]  # fmt: skip


@pytest.fixture(scope="module")
def talker() -> Iterator[Dispatcher]:
    """This module's inline engine (the tiny agent model), its own: an in-process vLLM engine closed by an earlier
    test takes vLLM's process-wide parallel state with it, so a session engine made before that cannot run after."""
    dispatcher = open_for(prepare(load([*TALK, "limit=1"])))
    yield dispatcher
    dispatcher.close()


@pytest.fixture(scope="module")
def talk_run(talker: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("talk")
    return execute(prepare(load([*TALK, f"run.root={root}"])), talker)


def _entries(run: Path) -> list:
    return [parse_line(line) for part in sorted((run / "log").iterdir()) for line in part.read_text().splitlines()]


def test_the_customers_turns_are_recorded_verified_replayed_without_an_engine_and_rescored(talk_run: Path) -> None:
    users = [e for e in _entries(talk_run) if e.kind == "model" and getattr(e, "role", None) == "user"]
    assert users and all(u.request.sampling.temperature == 1.0 and u.request.sampling.max_tokens == 24 for u in users)
    manifest = json.loads((talk_run / "manifest.json").read_text())
    assert manifest["task"]["world"]["user"]["model"] == "run"
    assert verify_run(talk_run).scores == "recomputed"
    replayed = replay_run(talk_run, [])  # the replay engine serves every reply, the customer's too: no model loads
    assert replayed.matches, replayed.verdict
    assert rescore_run(talk_run, []).bytes_identical


def test_verify_refuses_a_user_decoding_the_chains_were_not_sampled_with(talk_run: Path, tmp_path: Path) -> None:
    """A careful forger: the user's decoding changed everywhere the manifest holds it, the digest recomputed from its
    inputs, the run re-sealed; only the chains' requests, which verify reads, tell."""
    forged = tmp_path / "forged"
    shutil.copytree(talk_run, forged)
    manifest = json.loads((forged / "manifest.json").read_text())
    for world in (manifest["task"]["world"], manifest["identity"]["task"]["world"],
                  manifest["digest_inputs"]["prompt_pack"]["world"]):  # fmt: skip
        world["user"]["decoding"]["temperature"] = 0.0
    manifest["digest"] = manifest["identity"]["digest"] = Digest.of_inputs(manifest["digest_inputs"]).as_record()
    (forged / "manifest.json").write_text(json.dumps(manifest))
    reseal(forged)
    with pytest.raises(CheckFailed, match=r"task\.world\.user\.decoding\.temperature"):
        verify_run(forged)


def test_a_held_customer_repeat_serves_the_recorded_replies_and_its_run_replays_on_its_own(
    talk_run: Path, talker: Dispatcher, tmp_path: Path
) -> None:
    report = held_repeats(talk_run, "agent", 0, [f"run.root={tmp_path}"], dispatcher=talker)
    (repeat,) = report.repeats
    assert (repeat.episodes, repeat.live_identical, repeat.unexpected_turns, repeat.failed) == (3, 3, 0, 0)
    assert report.sides["user"].identical == report.sides["user"].episodes > 0 and report.spread == 0
    held = Path(repeat.run_dir)
    manifest = json.loads((held / "manifest.json").read_text())
    original = json.loads((talk_run / "record.json").read_text())
    assert manifest["task"]["world"]["held"]["merkle_root"] == original["merkle_root"]
    assert json.loads((held / "record.json").read_text())["merkle_root"] == original["merkle_root"]  # the same talk
    verify_run(held)
    assert replay_run(held, []).matches  # the held replies are in its own chains
    # nondet ORIGINAL HELD: the digests differ by the held side alone, which is named; the talk is the same
    compared = nondet_paths([talk_run, held], "pass")
    assert compared.held == {str(held): {"side": "user", "from_digest": original["digest"]}}  # the agent live
    assert compared.sides is not None and compared.sides["user"].identical == compared.sides["user"].episodes == 3


def test_nondet_and_check_measure_the_agent_and_the_customer_apart(
    talk_run: Path, talker: Dispatcher, tmp_path: Path
) -> None:
    again = execute(prepare(load([*TALK, f"run.root={tmp_path}", "cluster.batch_size=1"])), talker)
    report = nondet_paths([talk_run, again], "pass")
    assert report.sides is not None
    user = report.sides["user"]
    assert user.episodes == 3 and user.identical == 3 and user.tarr == 1.0 and user.calls > 0  # seeded, CPU: exact
    assert report.sides["agent"].calls == 0  # the scripted agent makes no model call
    checked = check_run(talk_run, repeat_items=2, dispatcher=talker)
    assert checked.passed, checked.failure()
    assert checked.repeat is not None and checked.repeat.sides is not None
    assert checked.repeat.sides["user"].identical == checked.repeat.sides["user"].episodes > 0


def test_the_customers_turns_are_user_messages_of_the_export_and_steps_of_the_transcript(
    talk_run: Path, tmp_path: Path
) -> None:
    from inspect_ai.log import read_eval_log

    out = tmp_path / "talk.eval"
    export_inspect(talk_run, out)
    sample = read_eval_log(str(out)).samples[0]
    said = [m for m in sample.messages if m.role == "user" and m.source == "generate"]
    assert said and all(m.metadata["simulated_user"] == "model" for m in said)
    tool = next(m for m in sample.messages if m.role == "tool" and m.function == "send_message")
    assert json.loads(tool.content)["reply"] == said[0].content
    entries = _entries(talk_run)
    first = [e for e in entries if e.episode == entries[0].episode]
    steps = transcript_steps(first)
    assert any(s.kind == "user" and s.title.startswith("simulated user (model)") for s in steps)


def test_a_customer_model_whose_pinned_files_change_changes_the_digest_and_compare_names_it(tmp_path: Path) -> None:
    """The customer played by a model of its own (user_model, a second engine in the worker): the same directory,
    one file changed between the runs and pinned again."""
    customer = tmp_path / "customer"
    shutil.copytree(ROOT / "evalrun" / "models" / "tiny-invoice-agent", customer)
    base = load([*TALK, "limit=1", "+model@user_model=tiny_invoice_agent", f"run.root={tmp_path / 'runs'}"])
    assert base.user_model is not None

    def prepared() -> object:
        pins = hash_model_dir(customer)
        return prepare(replace(base, user_model=replace(base.user_model, path=str(customer), sha256=pins)))

    first = prepared()
    dispatcher = open_for(first)
    try:
        before = execute(first, dispatcher)
        config = json.loads((customer / "generation_config.json").read_text())
        (customer / "generation_config.json").write_text(json.dumps({**config, "note": "changed"}))
        after = execute(prepared(), dispatcher)  # the same worker: its engines were loaded from the same directory
    finally:
        dispatcher.close()
    manifest = json.loads((before / "manifest.json").read_text())
    assert manifest["user_model"]["path"] == str(customer) and manifest["identity"]["user_model"]["files"]
    report = compare_paths(before, after)
    assert "user model" in report.changed
    assert {d.field.split(".files.")[0] for d in report.diffs if d.category == "user model"} >= {
        "task.world.user.model", "user_model"}  # fmt: skip
    assert json.loads((before / "manifest.json").read_text())["digest"]["prompt_pack"] != json.loads(
        (after / "manifest.json").read_text())["digest"]["prompt_pack"]  # fmt: skip
    assert verify_run(after).scores == "recomputed"


def test_the_scripted_customer_and_agent_give_the_same_root_on_one_worker_and_on_two(
    dispatcher: Dispatcher, two_workers: Dispatcher, tmp_path: Path
) -> None:
    """Every held-out family, over Ray: one worker, then two taking batches as they can (order, batch and worker
    may differ; the chains do not)."""
    common = ["task=support_desk", "limit=25", "cluster.batch_size=4", "run.progress=false", f"run.root={tmp_path}"]
    one = execute(prepare(load(common)), dispatcher)
    two = execute(prepare(load([*common, "cluster.num_workers=2"])), two_workers)
    roots = [json.loads((run / "record.json").read_text())["merkle_root"] for run in (one, two)]
    assert roots[0] == roots[1]
    summary = json.loads((one / "summary.json").read_text())
    assert summary["tasks"]["support-desk"]["pass"]["mean"] == 1.0
