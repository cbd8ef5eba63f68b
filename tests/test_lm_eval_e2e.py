"""lm-eval task YAMLs on the real engine (``task=lm_eval task.path=...``): each shipped suite runs with the
prompts lm-eval builds, verifies, replays and rescores exactly; an edited filter rescores without a model call,
changes the scores and names what changed; an edited dataset is refused at resume and shown by compare; what
evalrun does not implement is refused, exit 2, one line, before any model loads."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers.lm_eval import TINY_TASK, write_tiny_data

from evalrun import cli
from evalrun.analysis.compare import compare_paths
from evalrun.audit.groups import verify_group
from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline import groups
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import prepare, resume
from evalrun.records.canonical import canonical_hash
from evalrun.rundir import store
from evalrun.tasks.lm_eval import load_task
from tests.conftest import S3_BUCKET

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "evalrun" / "tasks" / "builtin" / "lm_eval"
GOLDEN = ROOT / "tests" / "lm_eval_requests"
YAMLS = ("addition_gen/addition_gen.yaml", "addition_gen/addition_gen_3shot.yaml", "addition_mc/addition_mc.yaml",
         "addition_fn/addition_fn.yaml", "addition_ll/addition_ll.yaml", "addition_gen/addition_gen_prefix.yaml",
         "addition_mc/addition_mc_prefix.yaml", "addition_gen/addition_gen_vote.yaml",
         "addition_fn/addition_fn_fewshot.yaml")  # fmt: skip
LIMIT = 10


def _run(run_eval: Callable[..., Path], path: Path, *overrides: str) -> Path:
    return run_eval("task=lm_eval", f"task.path={path}", f"limit={LIMIT}", *overrides)


@pytest.mark.e2e
@pytest.mark.parametrize("yaml_path", YAMLS)
def test_a_shipped_suite_runs_with_lm_evals_prompts_and_verifies_replays_and_rescores(
    run_eval: Callable[..., Path], yaml_path: str
) -> None:
    task = load_task(SHIPPED / yaml_path)
    run = _run(run_eval, SHIPPED / yaml_path)
    rows = sorted(pq.read_table(run / "outputs").to_pylist(), key=lambda r: int(r["item_id"]))
    golden = [json.loads(line) for line in (GOLDEN / f"{task.name}.jsonl").read_text().splitlines()][:LIMIT]
    assert [r["item_id"] for r in rows] == [str(g["doc_id"]) for g in golden]
    assert [r["prompt"] for r in rows] == [g["requests"][0][0] for g in golden]  # lm-eval's own prompts
    for row in rows:  # the examples shown are recorded by their place in the few-shot split
        assert len(row["fewshot_ids"]) == task.num_fewshot
        before = row["prompt"][: row["prompt"].rindex(task.eval_split.docs[int(row["item_id"])]["question"])]
        for example in row["fewshot_ids"]:  # shown before the document's own question
            split, index = example.split(":")
            assert task.splits[split].docs[int(index)]["question"] in before
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    metrics = {s["metric"] for s in scores}
    if task.output_type == "multiple_choice":
        assert metrics == {"acc", "acc_norm"} and all(len(r["option_logprobs"]) == 4 for r in rows)
        assert all(r["finish_reason"] == "not_generated" for r in rows)  # scored by loglikelihood only
    elif task.output_type == "loglikelihood":  # the target's loglikelihood, and whether it is the greedy answer
        assert metrics == {"perplexity", "acc"} and all(r["finish_reason"] == "not_generated" for r in rows)
        assert [json.loads(r["target"])["doc"] for r in rows] == [g["doc"] for g in golden]  # scored against it
        by_item = {(s["item_id"], s["metric"]): s["value"] for s in scores}
        for row in rows:
            ((logprob,), (greedy,)) = row["option_logprobs"], row["option_greedy"]
            assert by_item[row["item_id"], "perplexity"] == logprob < 0
            assert by_item[row["item_id"], "acc"] == float(greedy)
        summary = json.loads((run / "summary.json").read_text())["tasks"][task.name]
        assert summary["perplexity"]["perplexity"] == pytest.approx(math.exp(-summary["perplexity"]["mean"]))
    else:
        assert metrics == {f"exact_match/{task.filter_names[0]}"}
        assert all(r["finish_reason"] in ("stop", "length") for r in rows)
        if task.repeats > 1:  # every reply kept, the first the output; the answer their majority (lm-eval's filter)
            extracted = {s["item_id"]: s["extracted"] for s in scores}
            for row in rows:
                assert len(row["replies"]) == task.repeats and row["replies"][0] == row["output"]
                numbers = [(re.findall(r"(-?\d+)", reply) or ["[invalid]"])[0] for reply in row["replies"]]
                assert extracted[row["item_id"]] == Counter(numbers).most_common(1)[0][0]
        else:
            assert all(r["replies"] is None for r in rows)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["task"]["kind"] == "lm_eval" and manifest["task"]["name"] == task.name
    assert manifest["task"]["lm_eval"] == task.scoring_record()
    assert manifest["task"]["dataset"]["splits"]["test"]["docs"] == 40
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert replayed.reproduced == LIMIT and not replayed.divergences and replayed.scores_identical
    assert rescore_run(run, []).bytes_identical


@pytest.mark.e2e
@pytest.mark.parametrize(("yaml_path", "column"), [("addition_ll/addition_ll.yaml", "option_greedy"),
                                                   ("addition_gen/addition_gen_vote.yaml", "replies")])  # fmt: skip
def test_a_forged_greedy_flag_or_reply_fails_verify_naming_the_column(
    run_eval: Callable[..., Path], tmp_path: Path, yaml_path: str, column: str
) -> None:
    """A loglikelihood task's acc is its row's option_greedy, a repeated task's answer its replies' majority: verify
    checks both against the chain's responses."""
    run = _run(run_eval, SHIPPED / yaml_path, "limit=2")
    forged = Path(shutil.copytree(run, tmp_path / "forged"))
    part = sorted((forged / "outputs").iterdir())[0]
    table = pq.read_table(part)
    rows = table.to_pylist()
    rows[0][column] = [not rows[0][column][0]] if column == "option_greedy" else ["1", *rows[0][column][1:]]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), part)
    with pytest.raises(CheckFailed, match=rf"column '{column}' differs from the chain"):
        verify_run(forged)


@pytest.mark.e2e
def test_an_edited_filter_rescores_without_a_model_call_and_says_what_changed(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(SHIPPED / "addition_gen", tmp_path / "task"))
    run = _run(run_eval, copy / "addition_gen.yaml")
    yaml = copy / "addition_gen.yaml"
    yaml.write_text(yaml.read_text().replace('regex_pattern: "(-?\\\\d+)"', 'regex_pattern: "(\\\\d)"'))
    report = rescore_run(run, [f"task.path={yaml}"])
    assert report.scorer_changed and not report.identical
    assert report.changed == ("filter_list.0.filter.0.regex_pattern",)
    (diff,) = report.diffs
    assert diff.metric == "exact_match/get-answer" and diff.changed_episodes > 0 and diff.new_mean < diff.old_mean
    # the rescore wrote apart (the run's own scores as they were); the YAML at the recorded path is the edited one
    # now, which no longer scores as the run recorded: a plain rescore (and verify's recomputation) refuse it
    assert report.written is not None and report.written.parent.name == "rescore"
    with pytest.raises(BadInput, match="its scoring is not what the run recorded"):
        rescore_run(run, [])
    yaml.write_text(yaml.read_text().replace("Q: {{question}}", "Question: {{question}}"))
    with pytest.raises(BadInput, match=r"what the model was shown .* changed \(prompt_pack\.settings\.doc_to_text\)"):
        rescore_run(run, [f"task.path={yaml}"])


@pytest.mark.e2e
def test_an_edited_dataset_is_refused_at_resume_and_shown_by_compare(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(SHIPPED / "addition_mc", tmp_path / "task"))
    before = _run(run_eval, copy / "addition_mc.yaml", f"run.root={tmp_path / 'before'}")
    data = copy / "test.jsonl"
    data.write_text(data.read_text().replace('"3+83"', '"3+84"', 1))
    after = _run(run_eval, copy / "addition_mc.yaml", f"run.root={tmp_path / 'after'}")
    report = compare_paths(before, after)
    assert report.changed == ("dataset",)
    assert [d.field for d in report.diffs] == ["task.dataset.sha256"]  # the evaluated split's rows, canonical
    (before / "record.json").unlink()  # as if it had stopped before its end
    with pytest.raises(BadInput, match=r"task\.dataset_sha256 changed"):
        resume(before, [])


@pytest.mark.e2e
def test_a_multiple_choice_target_delimiter_is_what_each_choice_is_scored_after(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(SHIPPED / "addition_mc", tmp_path / "task"))
    yaml = copy / "addition_mc.yaml"
    yaml.write_text(yaml.read_text().replace("num_fewshot: 0", 'num_fewshot: 1\ntarget_delimiter: ""'))
    task = load_task(yaml)
    run = _run(run_eval, yaml)
    expected = [r.continuations for r in task.requests()][:LIMIT]
    assert expected[0][0] == str(task.task.doc_to_choice(task.eval_split.docs[0])[0])  # no space before the choice
    logs: dict[str, list[dict]] = {}
    for part in sorted((run / "log").glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            logs.setdefault(json.loads(line)["episode"], []).append(json.loads(line))
    rows = sorted(pq.read_table(run / "outputs").to_pylist(), key=lambda r: int(r["item_id"]))
    for row, continuations in zip(rows, expected, strict=True):
        chain = logs[row["episode_id"]]
        scored = [e for e in chain if e["kind"] == "model" and e["request"].get("op") == "loglikelihood"]
        assert tuple(e["request"]["continuation"] for e in scored) == continuations
        assert [e["response"]["logprob"] for e in scored] == row["option_logprobs"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["task"]["choices"]["delimiter"] == ""  # each continuation is lm-eval's, its delimiter in it
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert replayed.reproduced == LIMIT and not replayed.divergences


@pytest.mark.e2e
def test_documents_process_docs_makes_differently_are_refused_at_resume_though_its_source_is_the_same(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(SHIPPED / "addition_fn", tmp_path / "task"))
    utils = copy / "utils.py"  # the label is read from a file beside it, which no hash covers but the documents'
    label = "(__import__('pathlib').Path(__file__).with_name('label.txt').read_text())"
    utils.write_text(utils.read_text().replace('f"Q: {', f'f"{{{label}}}: {{'))
    (copy / "label.txt").write_text("Q")
    run = _run(run_eval, copy / "addition_fn.yaml")
    recorded = json.loads((run / "manifest.json").read_text())["task"]["dataset"]["processed_docs_sha256"]
    (run / "record.json").unlink()  # as if it had stopped before its end
    (copy / "label.txt").write_text("Question")
    with pytest.raises(BadInput, match=r"task\.processed_docs_sha256\.test changed"):
        resume(run, [])
    assert load_task(copy / "addition_fn.yaml").processed_docs_sha256["test"] != recorded["test"]


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.e2e
def test_apply_chat_template_is_task_chat_format_chat_and_in_the_digest(
    run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    """lm-eval's --apply_chat_template: the prompts are the turns through the chat template (here a file's, the
    default model has none), a choice is scored with no target delimiter, the template is in the digest, and
    the run verifies and replays."""
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    yaml = SHIPPED / "addition_mc/addition_mc.yaml"
    run = _run(run_eval, yaml, "task.chat_format=chat", f"task.chat_template={template}")
    rows = sorted(pq.read_table(run / "outputs").to_pylist(), key=lambda r: int(r["item_id"]))
    task = load_task(yaml)
    for row, doc in zip(rows, task.eval_split.docs, strict=False):
        assert row["prompt"] == f"<|im_start|>user\n{task.task.doc_to_text(doc)}<|im_end|>\n<|im_start|>assistant\n"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["task"]["choices"]["delimiter"] == ""
    assert manifest["task"]["prompt_pack"]["chat"]["origin"] == "file"
    first = next((run / "log").glob("part-*.jsonl")).read_text().splitlines()
    continuations = [json.loads(line).get("request", {}).get("continuation") for line in first]
    assert str(task.task.doc_to_choice(task.eval_split.docs[int(rows[0]["item_id"])])[0]) in continuations
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert replayed.reproduced == LIMIT and not replayed.divergences


BASE = TINY_TASK


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (BASE + "doc_to_image: image\n", ": evalrun does not run it: doc_to_image"),
        (BASE + "not_a_key: 1\n", ": lm-eval does not build it: TypeError"),
        (BASE.replace("test_split: test", "test_split: validation"), ": test_split: the dataset has no split"),
        (
            BASE.replace('"Q: {{q}}\\nA:"', "!function nope.text"),
            ": lm-eval does not read it: no helper file nope.py beside the YAML",
        ),
        (
            BASE.replace(
                "dataset_path: json\ndataset_kwargs: {data_files: {test: test.jsonl}}",
                "dataset_path: openai/gsm8k\ndataset_name: main",
            ),
            ": dataset_kwargs.revision: the commit",
        ),
    ],
)
def test_bad_yamls_exit_2_with_one_line_before_any_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               text: str, named: str) -> None:  # fmt: skip
    write_tiny_data(tmp_path)
    (tmp_path / "utils.py").write_text("def score(doc, results):\n    return {}\n", encoding="utf-8")
    path = tmp_path / "task.yaml"
    path.write_text(text, encoding="utf-8")
    code = cli.main(["run", "task=lm_eval", f"task.path={path}", "cluster=inline", f"run.root={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(path) in err[0] and named in err[0], err
    assert not (tmp_path / "runs").exists()


def _group_plan(tmp_path: Path, path: Path, name: str = "addition_suite", limit: int = 4) -> groups.GroupPlan:
    plan = groups.plan_group(load(["task=lm_eval", f"task.path={path}", f"task.name={name}", f"limit={limit}",
                                   f"run.root={tmp_path / 'runs'}", "run.progress=false"]))  # fmt: skip
    assert plan is not None
    return plan


@pytest.mark.e2e
def test_a_group_runs_each_task_as_a_run_of_its_own_and_reports_lm_evals_group_metrics(
    dispatcher: Dispatcher, tmp_path: Path
) -> None:
    plan = _group_plan(tmp_path, SHIPPED)
    record = groups.run_group(plan, [prepare(m) for m in plan.members], dispatcher)
    tasks = ["lm_eval_addition_gen", "lm_eval_addition_mc", "lm_eval_addition_mc_prefix"]
    assert sorted(p.name for p in plan.directory.iterdir()) == ["config.yaml", "group.json", *tasks]
    overall = {t: json.loads((plan.directory / t / "summary.json").read_text())["overall"] for t in tasks}
    for task in tasks:  # each a complete run of its one task, with that task's digest
        manifest = json.loads((plan.directory / task / "manifest.json").read_text())
        assert manifest["task"]["name"] == task and verify_run(plan.directory / task).episodes == 4
    assert json.loads((plan.directory / "group.json").read_text()) == json.loads(json.dumps(record))
    results = record["results"]
    acc = [overall[t]["acc"] for t in tasks[1:]]  # the group's acc: the two choice tasks', weighted by size
    assert results["addition_suite"]["metrics"]["acc"]["mean"] == pytest.approx(sum(a["mean"] for a in acc) / 2)
    assert results["addition_suite"]["metrics"]["acc"]["missing"] == ["lm_eval_addition_gen"]
    assert results["addition_suite"]["metrics"]["exact_match/get-answer"]["mean"] == pytest.approx(
        overall["lm_eval_addition_gen"]["exact_match/get-answer"]["mean"])  # fmt: skip
    assert set(results) == {"addition_suite", "addition_suite::choice"}
    report = verify_group(plan.directory)
    assert report.seal == record["seal"] and list(report.tasks) == tasks
    with pytest.raises(BadInput, match=r"a group of runs, not a run: give one of its tasks' runs, .*/TASK \(lm_eval"):
        rescore_run(plan.directory, [])  # the commands of one run say which runs the group holds

    # the record's figures are recomputed from the tasks' runs, its seal from the record
    forged = Path(shutil.copytree(plan.directory, tmp_path / "forged"))
    edited = json.loads((forged / "group.json").read_text())
    edited["results"]["addition_suite"]["metrics"]["acc"]["mean"] = 0.99
    body = {k: v for k, v in edited.items() if k != "seal"}
    (forged / "group.json").write_text(json.dumps({**body, "seal": canonical_hash(body)}))
    with pytest.raises(CheckFailed, match="results of 'addition_suite' differ"):
        verify_group(forged)
    (forged / "group.json").write_text(json.dumps({**body, "seal": record["seal"]}))
    with pytest.raises(CheckFailed, match=r"seal .* is not the sha256 of the record"):
        verify_group(forged)

    # interrupted after its second task: resume keeps the complete runs and runs the rest on the same engine
    resumed = Path(shutil.copytree(plan.directory, tmp_path / "resumed"))
    shutil.rmtree(resumed / tasks[-1])
    (resumed / "group.json").unlink()
    with pytest.raises(CheckFailed, match="the group is incomplete"):
        verify_group(resumed)
    ran: list[Path] = []
    again = groups.resume_group(resumed, dispatcher=dispatcher, on_task=ran.append)
    assert ran == [resumed / tasks[-1]] and again["results"] == record["results"]
    verify_group(resumed)


@pytest.mark.e2e
def test_a_groups_settings_of_its_tasks_are_run_recorded_and_scored_with(dispatcher: Dispatcher,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """The shipped addition_settings group (lm-eval's group and member settings: num_fewshot over the tasks' 0): each
    task runs with the settings its group gives it, records them (its config's task.overrides, its scoring record,
    the group record), and verifies, replays and rescores with them, the YAMLs unchanged."""
    plan = _group_plan(tmp_path, SHIPPED, "addition_settings", limit=3)
    record = groups.run_group(plan, [prepare(m) for m in plan.members], dispatcher)
    given = {"lm_eval_addition_gen": {"num_fewshot": 1},
             "lm_eval_addition_mc": {"num_fewshot": 2, "task_alias": "addition_mc (2-shot)"}}  # fmt: skip
    assert [m.get("overrides") for m in record["group"]["members"]] == list(given.values())
    for task, settings in given.items():
        run = plan.directory / task
        rows = pq.read_table(run / "outputs").to_pylist()
        shots = settings["num_fewshot"]
        assert [r["prompt"].count("Q: ") for r in rows] == [shots + 1] * 3  # the examples, then the question
        assert yaml.safe_load((run / "config.yaml").read_text())["task"]["overrides"] == settings
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["task"]["lm_eval"]["overrides"] == settings
        assert manifest["task"]["prompt_pack"]["settings"]["num_fewshot"] == shots
        verify_run(run)
        assert replay_run(run, []).matches
        assert rescore_run(run, []).identical  # scored again by lm-eval with the recorded settings
    verify_group(plan.directory)


@pytest.mark.e2e
def test_a_group_on_an_object_store_runs_verifies_and_resumes_there(
    dispatcher: Dispatcher, s3_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group with run.root on S3 (moto, started by the session): each task's run is made under GROUP/TASK on the
    store, its worker putting its parts there; verify reads the group from its location; a group interrupted before
    its last task is resumed from the store and comes out with the same results."""
    root = f"s3://{S3_BUCKET}/groups-{uuid.uuid4().hex[:8]}?endpoint_url={s3_server}"
    plan = groups.plan_group(load(["task=lm_eval", f"task.path={SHIPPED}", "task.name=addition_suite", "limit=2",
                                   f'run.root="{root}"', "run.progress=false"]))  # fmt: skip
    assert plan is not None and plan.location.startswith(f"s3://{S3_BUCKET}/groups-")
    record = groups.run_group(plan, [prepare(m) for m in plan.members], dispatcher)
    tasks = [m.task.name for m in plan.members]
    remote = store.open_store(plan.location)
    names = remote.names()
    assert {"config.yaml", "group.json"} <= set(names)
    assert json.loads(remote.read("group.json")) == json.loads(json.dumps(record))
    for task in tasks:  # each task's run complete on the store, its parts put there by its worker, its lock let go
        committed = {"record.json", "attestation.intoto.json", "outputs/part-00000.parquet"}
        assert {f"{task}/{name}" for name in committed} <= set(names)
        assert not list((plan.directory / task / "outputs").iterdir())
        assert f"{task}/.lock" not in names
        assert yaml.safe_load(remote.read(f"{task}/config.yaml"))["run"]["dir"] == store.join(plan.location, task)
    store.discard(plan.directory)

    assert cli.main(["verify", plan.location]) == 0, capsys.readouterr().err
    assert f"ok: group addition_suite: {len(tasks)} tasks verified" in capsys.readouterr().out

    # interrupted before its last task: resumed from the store, the last task's run made there, the record again
    for name in names:
        if name == "group.json" or name.startswith(f"{tasks[-1]}/"):
            remote.remove(name)
    assert cli.main(["verify", plan.location]) == 1
    assert f"`evalrun resume {plan.location}` finishes it" in capsys.readouterr().err  # its location, not the copy's
    copy = store.snapshot(plan.location)
    ran: list[Path] = []
    try:
        again = groups.resume_group(copy, dispatcher=dispatcher, on_task=ran.append)
        assert ran == [copy / tasks[-1]] and store.location_of(ran[0]) == store.join(plan.location, tasks[-1])
    finally:
        store.discard(copy)
    assert again["results"] == record["results"]  # the same episodes (each run's seal covers when it ran)
    assert [(m["digest"], m["merkle_root"]) for m in again["members"]] == [
        (m["digest"], m["merkle_root"]) for m in record["members"]]  # fmt: skip
    assert f"{tasks[-1]}/outputs/part-00000.parquet" in remote.names()
    assert cli.main(["verify", plan.location]) == 0, capsys.readouterr().err


@pytest.mark.e2e
def test_a_group_task_whose_dataset_changed_is_refused_at_resume(dispatcher: Dispatcher, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(SHIPPED, tmp_path / "tasks"))
    plan = _group_plan(tmp_path, copy, limit=2)
    groups.run_group(plan, [prepare(m) for m in plan.members], dispatcher)
    (plan.directory / "group.json").unlink()
    data = copy / "addition_mc" / "test.jsonl"
    data.write_text(data.read_text().replace('"3+83"', '"3+84"', 1))  # an upstream edit of the first question
    changed = r"lm_eval_addition_mc/manifest.json: the run would now be made differently: task.dataset"
    with pytest.raises(BadInput, match=changed):
        groups.resume_group(plan.directory, dispatcher=dispatcher)


@pytest.mark.e2e
def test_a_group_killed_in_its_first_task_resumes_from_the_command_line_and_verifies(tmp_path: Path) -> None:
    """As a user runs it: `evalrun run` of a group killed in its first task's run (a power cut: SIGKILL after its
    first part), `evalrun verify` says the group is incomplete, `evalrun resume GROUP_DIR` finishes that run and
    runs the rest on one engine, prints the group's table and its directory last; then it verifies."""
    group = tmp_path / "group"
    command = [sys.executable, "-m", "evalrun.cli", "run", "task=lm_eval", f"task.path={SHIPPED}",
               "task.name=addition_suite", "limit=4", "cluster=inline", "cluster.batch_size=2", f"run.dir={group}",
               "run.progress=false", "report=false"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    killed = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**env,
                            "EVALRUN_FAILPOINT": "after-part-0"})  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(p.name for p in group.iterdir()) == ["config.yaml", "lm_eval_addition_gen"]
    verify = subprocess.run([sys.executable, "-m", "evalrun.cli", "verify", str(group)], capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
    assert verify.returncode == 1 and "the group is incomplete (tasks finished: none)" in verify.stderr
    done = subprocess.run([sys.executable, "-m", "evalrun.cli", "resume", str(group), "run.progress=false"],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == str(group) and any(line.startswith("addition_suite::choice   acc ") for line in lines)
    record = json.loads((group / "lm_eval_addition_gen" / "record.json").read_text())
    assert record["dispatch"]["resumed"]  # the first task's run finished, not made again
    assert cli.main(["verify", str(group)]) == 0
