"""Few-shot, multiple-choice and rubric-graded tasks on the real engine (issue 6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalrun import cli
from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS, MODELS_DIR, load
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, prepare

pytestmark = pytest.mark.e2e


def rows(run: Path) -> dict[str, dict]:
    table = pq.read_table(run / "outputs")
    return {r["episode_id"]: r for r in table.to_pylist()}


def record(run: Path) -> dict:
    return json.loads((run / "record.json").read_text())


def chains(run: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for part in sorted((run / "log").glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            entry = json.loads(line)
            out.setdefault(entry["episode"], []).append(entry)
    return out


@pytest.fixture(scope="module")
def mc_run(dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mc")
    return execute(prepare(load(["task=addition_mc", "limit=8", f"run.root={root}", "run.progress=false",
                                 "cluster.batch_size=3", "task.choices.cannot_assess=N/A"])), dispatcher)  # fmt: skip


@pytest.fixture(scope="module")
def rubric_run(dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rubric")
    return execute(prepare(load(["task=report_rubric", "limit=5", f"run.root={root}", "run.progress=false"])),
                   dispatcher)  # fmt: skip


def test_multiple_choice_records_orders_option_scores_and_both_metrics(mc_run: Path) -> None:
    planned = {e.episode_id: e for e in prepare(load(["task=addition_mc", "limit=8",
                                                      "task.choices.cannot_assess=N/A"])).episodes}  # fmt: skip
    out, logs = rows(mc_run), chains(mc_run)
    assert set(out) == set(planned)
    for eid, row in out.items():
        episode = planned[eid]
        assert row["shuffle_order"] == list(episode.shuffle_order) == logs[eid][0]["shuffle_order"]
        assert len(row["option_logprobs"]) == 5 and all(v < 0 for v in row["option_logprobs"])
        options = [e for e in logs[eid] if e["kind"] == "model" and e["request"].get("op") == "loglikelihood"]
        assert [e["request"]["continuation"] for e in options] == [f" {o}" for o in episode.options]
        assert [e["response"]["logprob"] for e in options] == row["option_logprobs"]
        assert logs[eid][-1]["model_calls"] == 6  # the letter generation and five option scores
    scores = pq.read_table(mc_run / "scores.parquet").to_pylist()
    assert {s["metric"] for s in scores} == {"choice_letter", "choice_loglikelihood"}
    for s in scores:
        if s["metric"] == "choice_loglikelihood":
            logprobs = out[s["episode_id"]]["option_logprobs"]
            best = logprobs.index(max(logprobs))
            assert s["extracted"] == str(best) and s["value"] == float(best == int(out[s["episode_id"]]["target"]))
    assert verify_run(mc_run, jobs=1).episodes == 8
    assert rescore_run(mc_run, []).identical
    report = replay_run(mc_run, [])
    assert report.reproduced == 8 and report.root_matches and report.scores_identical


def test_same_seed_same_records_across_worker_counts(mc_run: Path, two_workers: Dispatcher, tmp_path: Path) -> None:
    again = execute(prepare(load(["task=addition_mc", "limit=8", f"run.root={tmp_path}", "run.progress=false",
                                  "cluster.batch_size=2", "cluster.num_workers=2",
                                  "task.choices.cannot_assess=N/A"])), two_workers)  # fmt: skip
    assert record(again)["merkle_root"] == record(mc_run)["merkle_root"]
    a, b = rows(mc_run), rows(again)
    assert {k: (r["prompt"], r["shuffle_order"]) for k, r in a.items()} == {
        k: (r["prompt"], r["shuffle_order"]) for k, r in b.items()
    }


def test_fewshot_ids_are_recorded_in_rows_and_chains(run_eval) -> None:
    run = run_eval("task=addition_fewshot", "limit=6", "seeds.set=[0,1]")
    planned = {e.episode_id: e for e in prepare(load(["task=addition_fewshot", "limit=6", "seeds.set=[0,1]"])).episodes}
    out, logs = rows(run), chains(run)
    assert set(out) == set(planned)
    for eid, row in out.items():
        assert row["fewshot_ids"] == list(planned[eid].fewshot_ids) == logs[eid][0]["fewshot"]
        assert len(row["fewshot_ids"]) == 3 and row["prompt"] == planned[eid].prompt
    assert verify_run(run, jobs=1).episodes == 12
    assert replay_run(run, []).root_matches


def test_rubric_judge_calls_are_in_the_chain_and_rescoring_reuses_them(rubric_run: Path, monkeypatch) -> None:
    out, logs = rows(rubric_run), chains(rubric_run)
    for eid, row in out.items():
        judges = [e for e in logs[eid] if e["kind"] == "model" and e.get("role") == "judge"]
        # 2 criteria x 3 judges, each scoring every option (with "unsure"): 3 + 4 options
        assert len(judges) == 3 * 3 + 3 * 4
        assert len(row["judgements"]) == 6
        for judgement in row["judgements"]:
            calls = [e for e in judges if (e["criterion"], e["judge"]) == (judgement["criterion"], judgement["judge"])]
            assert [e["shuffle_order"] for e in calls] == [judgement["shuffle_order"]] * len(calls)
            assert [c["option"] for c in calls] == judgement["shuffle_order"]  # shown order
            assert judgement["option_logprobs"] == [
                next(c["response"]["logprob"] for c in calls if c["option"] == k) for k in range(len(calls))
            ]
            assert row["output"] in calls[0]["request"]["prompt"]
    assert verify_run(rubric_run, jobs=1).episodes == 5

    # rescoring needs no engine: building one would fail this test
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was built")

    monkeypatch.setattr("evalrun.engines.vllm.VLLMEngine.__init__", no_engine)
    monkeypatch.setattr("evalrun.engines.hf.HFEngine.__init__", no_engine)
    for _ in range(3):
        report = rescore_run(rubric_run, [])
        assert report.identical and report.bytes_identical and not report.scorer_changed
    replayed = replay_run(rubric_run, [])
    assert replayed.reproduced == 5 and replayed.root_matches and replayed.scores_identical


def test_a_weight_edit_rescores_the_recorded_verdicts(rubric_run: Path, tmp_path: Path, capsys) -> None:
    edited_dir = shutil.copytree(BUILTIN_TASKS / "report_rubric", tmp_path / "edited")
    edited = edited_dir / "rubric.yaml"
    edited.write_text(edited.read_text().replace("weight: 2", "weight: 7"))
    old = pq.read_table(rubric_run / "scores.parquet").to_pylist()
    report = rescore_run(rubric_run, [f"task.rubric={edited}"])
    assert report.scorer_changed and not report.identical and report.written is not None
    new = pq.read_table(report.written / "scores.parquet").to_pylist()
    before = {(r["episode_id"], r["metric"]): r["value"] for r in old}
    after = {(r["episode_id"], r["metric"]): r["value"] for r in new}
    assert before.keys() == after.keys()
    changed = {metric for (_, metric), value in after.items() if before[(_, metric)] != value}
    assert changed == {"rubric"}  # only the weighted total moves; every criterion's verdicts are reused
    scorer = json.loads((report.written / "scorer.json").read_text())
    assert scorer["context"]["rubric"]["criteria"][0]["weight"] == 7
    assert cli.main(["rescore", str(rubric_run), f"task.rubric={edited}"]) == 0
    # the judges would have seen another question: that is a new run, not a rescore
    edited.write_text(edited.read_text().replace("Total right?", "Sum right?"))
    with pytest.raises(BadInput) as caught:
        rescore_run(rubric_run, [f"task.rubric={edited}"])
    assert str(edited) in caught.value.where and "criteria" in caught.value.message
    assert cli.main(["rescore", str(rubric_run), f"task.rubric={edited}"]) == 2


def test_replay_reports_a_judge_template_edit_at_the_first_judge_call(rubric_run: Path, tmp_path: Path) -> None:
    task_dir = shutil.copytree(BUILTIN_TASKS / "report_rubric", tmp_path / "task")
    judge = task_dir / "judge" / "user.jinja"
    judge.write_text(judge.read_text().replace("->", "=>"))
    report = replay_run(rubric_run, [f"task.rubric={task_dir / 'rubric.yaml'}"])
    assert report.reproduced == 0 and len(report.divergences) == 5
    first = report.divergences[0]
    assert first.seq == 2  # header, the policy's call, then the first judge call
    assert "=>" in first.got


def perturbed_copy(tmp_path: Path) -> Path:
    """The embedded model with noise on its embeddings: another judge, same tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file

    target = Path(shutil.copytree(MODELS_DIR / "tiny-adder", tmp_path / "judge"))
    weights = load_file(target / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    name = next(k for k in sorted(weights) if "embed" in k)
    weights[name] = weights[name] + 0.5 * torch.randn(weights[name].shape, generator=generator)
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_a_separate_judge_model_grades_in_the_same_worker(tmp_path: Path) -> None:
    base = ["task=report_rubric", "limit=3", "engine=hf", "cluster=inline", "run.progress=false"]
    own = execute(prepare(load([*base, f"run.root={tmp_path / 'own'}"])))
    judge_dir = perturbed_copy(tmp_path)
    judged = [*base, f"run.root={tmp_path / 'other'}", "+model@judge_model=tiny_adder",
              f"judge_model.path={judge_dir}", "judge_model.pinned=false"]  # fmt: skip
    other = execute(prepare(load(judged)))
    a, b = rows(own), rows(other)
    assert {k: r["output"] for k, r in a.items()} == {k: r["output"] for k, r in b.items()}  # same policy
    logprobs = [(ja["option_logprobs"], jb["option_logprobs"])
                for k in a for ja, jb in zip(a[k]["judgements"], b[k]["judgements"], strict=True)]  # fmt: skip
    assert all(x != y for x, y in logprobs)  # every judge call went to the other model
    ma, mb = (json.loads((r / "manifest.json").read_text()) for r in (own, other))
    assert ma["judge_model"] is None and mb["judge_model"]["files"] != mb["model"]["files"]
    assert mb["judge_model"]["pinned"] is False
    assert mb["digest"]["scoring"] != ma["digest"]["scoring"]
    assert (mb["digest"]["prompt_pack"], mb["digest"]["seed_set"]) == (
        ma["digest"]["prompt_pack"],
        ma["digest"]["seed_set"],
    )
    assert mb["workers"] and verify_run(other, jobs=1).episodes == 3
    assert rescore_run(other, []).identical
    assert replay_run(other, []).root_matches


def test_a_judge_model_without_a_rubric_is_bad_input(tmp_path: Path) -> None:
    code = cli.main(["run", "+model@judge_model=tiny_adder", f"run.root={tmp_path / 'runs'}"])
    assert code == 2 and not tmp_path.joinpath("runs").exists()


def test_the_context_model_uses_fewshot_examples_and_ranks_options(tmp_path: Path) -> None:
    """The example packs measure something real on the model trained for prompts after context."""
    base = ["model=tiny_adder_context", "engine=hf", "cluster=inline", "run.progress=false", f"run.root={tmp_path}"]
    means = {}
    for task in ("addition_fewshot", "addition_mc"):
        run = execute(prepare(load([*base, f"task={task}", "limit=20"])))
        summary = json.loads((run / "summary.json").read_text())
        means.update({metric: value["mean"] for metric, value in summary["overall"].items()})
    assert means["exact_match"] >= 0.8  # with three worked examples before each question
    assert means["choice_loglikelihood"] >= 0.8  # four options, chance is 0.25
    assert means["choice_letter"] == 0.0  # it was never taught to answer with a letter
