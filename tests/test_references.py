"""Frozen CP-SAT references (issue 13): the shift-planner world, ``evalrun references build`` and ``check``,
evaluation that reads references and never solves. Engine-free (the scripted agent)."""

from __future__ import annotations

import json
import shutil
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from evalrun.cli.main import main
from evalrun.config import load
from evalrun.episodes import kind_of_manifest
from evalrun.episodes.agent import ScriptedAgent, run_agent_episodes
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.manifest import scoring_context
from evalrun.pipeline.runner import prepare
from evalrun.rundir import references
from evalrun.worlds import reference_sets, solver
from evalrun.worlds.reference_sets import build_references, check_reference_set
from evalrun.worlds.scripted import scripted_policy
from evalrun.worlds.shift_planner import generate_instance, plan_violations, verify_shift_planner
from evalrun.worlds.solver import Solved, SolverSettings
from evalrun.worlds.suite import suite_from_mapping, world_tasks

GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}
COMMITTED = references.REFERENCES_ROOT / "shift-planner" / "1"


def tasks(first: int = 1000, stop: int = 1003) -> list[Any]:
    return world_tasks(suite_from_mapping({
        "name": "shift-planner", "version": "1", "family": ["cost", "rest"],
        "seeds": {"train": [0, 1000], "test": [first, stop]}, "split": "test",
    }))  # fmt: skip


def copy_set(tmp_path: Path) -> Path:
    root = tmp_path / "refs"
    shutil.copytree(COMMITTED, root / "shift-planner" / "1")
    return root


def test_build_twice_is_byte_identical_and_matches_the_committed_files(tmp_path: Path) -> None:
    builds = []
    for name in ("a", "b"):
        build_references(tasks(), root=tmp_path / name)
        directory = tmp_path / name / "shift-planner" / "1"
        builds.append({p.name: p.read_bytes() for p in sorted(directory.iterdir())})
    assert builds[0] == builds[1] and len(builds[0]) == 7  # 6 instances and the index
    for name, data in builds[0].items():
        if name != references.INDEX:
            assert (COMMITTED / name).read_bytes() == data, name
    record = json.loads(builds[0]["cost-1000.json"])
    assert record["status"] == "OPTIMAL" and record["solver"]["ortools"] == solver.ortools_version()
    assert record["solver"]["parameters"] == {"max_deterministic_time": 10, "num_workers": 1, "random_seed": 0,
                                              "log_search_progress": False}  # fmt: skip


def test_the_committed_set_checks_and_re_solves(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_reference_set("shift-planner", "1", resolve=True)
    assert report.checked == 100 and report.problems == ()
    assert main(["references", "check"]) == 0
    assert "references ok: 100" in capsys.readouterr().out


@pytest.mark.parametrize(("field", "value"), [("objective", 1), ("best_bound", 7), ("model_sha256", "0" * 64)])
def test_editing_one_value_fails_the_check_naming_instance_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any
) -> None:
    root = copy_set(tmp_path)
    path = root / "shift-planner" / "1" / "rest-1007.json"
    record = json.loads(path.read_text())
    record[field] = value
    path.write_bytes(references.encode(record))
    problems = check_reference_set("shift-planner", "1", root=root).problems
    assert {(p.item, p.field) for p in problems} >= {("rest-1007", field), ("rest-1007", "sha256")}
    assert {p.item for p in problems} == {"rest-1007"}
    assert main(["references", "check", "--root", str(root)]) == 1
    assert f"rest-1007: {field}:" in capsys.readouterr().err


def test_an_infeasible_stored_solution_fails_the_check(tmp_path: Path) -> None:
    root = copy_set(tmp_path)
    path = root / "shift-planner" / "1" / "cost-1001.json"
    record = json.loads(path.read_text())
    record["solution"] = record["solution"][1:]
    path.write_bytes(references.encode(record))
    fields = {p.field for p in check_reference_set("shift-planner", "1", root=root).problems}
    assert {"solution", "objective", "sha256"} <= fields


def test_bad_input_exits_2(tmp_path: Path) -> None:
    assert main(["references", "check", "--world", "no-such-world"]) == 2
    assert main(["references", "check", "--world", "invoice-desk", "--version", "7"]) == 2  # no such version
    assert main(["references", "check", "--root", str(tmp_path / "missing")]) == 2


def _not_optimal(instance: Any, settings: SolverSettings) -> Solved:
    solved = solver.solve(instance, settings)
    return Solved("FEASIBLE", solved.objective, solved.best_bound - 5, solved.solution, solved.parameters_text,
                  solved.model_sha256)  # fmt: skip


def test_a_reference_that_is_not_optimal_is_refused_unless_allowed(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(reference_sets, "solve", _not_optimal)
    with pytest.raises(CheckFailed, match=r"not OPTIMAL .*cost-1000: FEASIBLE"):
        build_references(tasks(), root=tmp_path)
    assert not (tmp_path / "shift-planner").exists()  # nothing written
    build_references(tasks(), allow_feasible=True, root=tmp_path)
    record = json.loads((tmp_path / "shift-planner" / "1" / "cost-1000.json").read_text())
    assert record["status"] == "FEASIBLE" and record["accepted"].startswith("--allow-feasible")
    monkeypatch.undo()
    assert check_reference_set("shift-planner", "1", root=tmp_path).problems == ()
    resolved = check_reference_set("shift-planner", "1", resolve=True, root=tmp_path).problems
    assert {(p.item, p.field) for p in resolved} >= {("cost-1000", "status")}


def _run(policy: Any) -> list[Any]:
    prepared = prepare(load(["task=shift_planner"]))
    return run_agent_episodes(prepared.episodes, ScriptedAgent(policy), GENERATOR)


def test_the_optimal_plan_scores_gap_0_and_greedy_a_positive_gap() -> None:
    optimal = _run(scripted_policy)
    assert len(optimal) == 100
    assert all(r.stop == "done" and r.scores == {"feasible": 1.0, "gap": 0.0, "pass": 1.0} for r in optimal)
    greedy = _run(partial(scripted_policy, plan="greedy"))
    feasible = [r.scores["gap"] for r in greedy if r.scores["feasible"] == 1.0]
    assert sum(gap > 0 for gap in feasible) >= 40 and all(0 <= gap < 1 for gap in feasible)
    infeasible = [r.scores for r in greedy if r.scores["feasible"] == 0.0]
    assert infeasible and all(s == {"feasible": 0.0, "gap": 1.0, "pass": 0.0} for s in infeasible)
    final = optimal[0].final_state
    assert final["reference"]["objective"] == json.loads((COMMITTED / "cost-1000.json").read_text())["objective"]
    assert final["reference"]["index_sha256"] == references.load_index("shift-planner", "1").sha256


def test_an_infeasible_or_missing_plan_fails() -> None:
    (result,) = _run(scripted_policy)[:1]
    final = dict(result.final_state)
    final["submitted"] = final["submitted"][1:]  # a shift short of workers
    assert plan_violations(generate_instance(1000, "cost"), [tuple(p) for p in final["submitted"]])
    assert verify_shift_planner(final) == {"feasible": 0.0, "gap": 1.0, "pass": 0.0}
    assert verify_shift_planner({**final, "submitted": None}) == {"feasible": 0.0, "gap": 1.0, "pass": 0.0}


def test_evaluation_never_imports_or_calls_the_solver(monkeypatch: Any) -> None:
    for name in [m for m in sys.modules if m == "ortools" or m.startswith("ortools.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "ortools", None)  # any `import ortools...` now raises ImportError

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the solver was called during evaluation")

    for name in ("solve", "build_model", "model_sha256", "ortools_version"):
        monkeypatch.setattr(solver, name, forbidden)
    prepared = prepare(load(["task=shift_planner", "limit=6"]))
    results = run_agent_episodes(prepared.episodes, ScriptedAgent(), GENERATOR)
    assert [r.scores["pass"] for r in results] == [1.0] * 6


def test_a_missing_reference_is_bad_input_before_any_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BadInput, match="no reference for cost-0"):
        prepare(load(["task=shift_planner", "task.world.split=train", "limit=2"]))
    assert main(["run", "task=shift_planner", "task.world.split=train", "limit=2", "cluster=inline"]) == 2
    assert "no reference for cost-0" in capsys.readouterr().err


def test_a_mismatched_reference_is_bad_input(tmp_path: Path, monkeypatch: Any) -> None:
    root = copy_set(tmp_path)
    monkeypatch.setattr(references, "REFERENCES_ROOT", root)
    path = root / "shift-planner" / "1" / "cost-1000.json"
    path.write_bytes(path.read_bytes().replace(b'"objective":', b'"objective":1'))
    with pytest.raises(BadInput, match="differs from the index"):
        prepare(load(["task=shift_planner", "limit=2"]))


def test_the_manifest_and_scoring_context_record_the_reference_set() -> None:
    prepared = prepare(load(["task=shift_planner", "limit=2"]))
    record = prepared.task.as_record()
    expected = {"name": "shift-planner", "version": "1",
                "index_sha256": references.load_index("shift-planner", "1").sha256}  # fmt: skip
    assert record["references"] == expected
    context = scoring_context(prepared.kind, prepared.config, prepared.task, prepared.model)
    assert context.verifier is not None and context.verifier["references"] == expected
    manifest = {"task": {"name": "shift-planner", "world": record}}
    assert kind_of_manifest(manifest).recorded_scoring_context(manifest, None).as_record() == context.as_record()
    assert kind_of_manifest(manifest).recorded_scoring_record(manifest) == context.as_record()
    invoice = prepare(load(["task=invoice_desk", "limit=2"])).task
    assert invoice.as_record()["references"]["name"] == "invoice-desk"  # its frozen ground truths


def test_the_references_group_and_its_commands_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["references", "--help"], ["references", "build", "--help"], ["references", "check", "--help"]):
        assert main(args) == 0
        assert capsys.readouterr().out.startswith(f"Usage: evalrun {' '.join(args[:-1])}")


# --- ground truths the world computes (invoice-desk) ---------------------------------------------

INVOICE_SETS = Path(__file__).resolve().parents[1] / "evalrun" / "references" / "invoice-desk"


def invoice_tasks(first: int = 1000, stop: int = 1003) -> list[Any]:
    return world_tasks(suite_from_mapping({
        "name": "invoice-desk", "version": "1", "family": ["duplicates", "price-differences"],
        "seeds": {"test": [first, stop]}, "split": "test",
    }))  # fmt: skip


def test_invoice_truths_build_byte_identical_to_the_committed_set(tmp_path: Path) -> None:
    build_references(invoice_tasks(), root=tmp_path)
    for item in ("duplicates-1000", "price-differences-1002"):
        built = (tmp_path / "invoice-desk" / "1" / f"{item}.json").read_bytes()
        assert built == (INVOICE_SETS / "1" / f"{item}.json").read_bytes()
    record = json.loads((INVOICE_SETS / "1" / "duplicates-1000.json").read_text())
    assert record["truth"] and record["world"] == {"name": "invoice-desk", "version": "1"}
    assert check_reference_set("invoice-desk", "1").problems == ()


def test_an_edited_truth_fails_check_and_refuses_the_run_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "refs"
    shutil.copytree(INVOICE_SETS / "1", root / "invoice-desk" / "1")
    path = root / "invoice-desk" / "1" / "price-differences-1001.json"
    record = json.loads(path.read_text())
    record["truth"] = [*record["truth"], ["I9", 1]]
    path.write_text(json.dumps(record))
    report = check_reference_set("invoice-desk", "1", root=root)
    assert {(p.item, p.field) for p in report.problems} == {("price-differences-1001", "sha256"),
                                                            ("price-differences-1001", "truth")}  # fmt: skip
    assert main(["references", "check", "--world", "invoice-desk", "--root", str(root)]) == 1
    monkeypatch.setattr(references, "REFERENCES_ROOT", root)
    with pytest.raises(BadInput, match=r"price-differences-1001"):
        prepare(load(["task=invoice_desk", "limit=4"]))


def test_a_changed_rule_without_a_new_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The world's code computes another truth than the frozen one: the run stops before any model loads."""
    from evalrun.worlds import invoice_desk

    computed = invoice_desk.truth_reference
    changed = staticmethod(lambda task: {**computed(task), "truth": []})
    monkeypatch.setattr(invoice_desk.InvoiceDesk, "compute_reference", changed)
    with pytest.raises(BadInput, match=r"truth: frozen .* now computes \[\]"):
        prepare(load(["task=invoice_desk", "limit=2"]))
    assert {p.field for p in check_reference_set("invoice-desk", "1").problems} == {"truth"}


# --- a dataset task's frozen answers ---------------------------------------------------------------


def test_built_in_tasks_are_scored_against_their_frozen_answer_sets() -> None:
    prepared = prepare(load(["task=addition", "limit=3"]))
    expected = {"name": "addition", "version": "1", "index_sha256": references.load_index("addition", "1").sha256}
    assert prepared.task.references == expected
    context = scoring_context(prepared.kind, prepared.config, prepared.task, prepared.model)
    assert context.references == expected and context.as_record()["references"] == expected
    manifest = {"task": {"name": "addition", "choices": {"field": None}, "references": expected}, "model": {}}
    assert kind_of_manifest(manifest).recorded_scoring_context(manifest, None).as_record() == context.as_record()
    assert kind_of_manifest(manifest).recorded_scoring_record(manifest) == context.as_record()
    assert main(["references", "check", "--answers", "addition@1"]) == 0


def test_a_dataset_answer_that_drifted_from_the_frozen_set_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "refs"
    shutil.copytree(references.set_directory("addition", "1"), root / "addition" / "1")
    monkeypatch.setattr(references, "REFERENCES_ROOT", root)
    path = root / "addition" / "1" / "answers.json"
    record = json.loads(path.read_text())
    record["answers"]["add-001"] = "131"
    index = references.write_answers("addition", "1", record["answers"], root)  # consistently rehashed
    with pytest.raises(BadInput, match=r"item 'add-001': the frozen answer is '131', the dataset says '130'"):
        prepare(load(["task=addition", "limit=3"]))
    path.write_text(path.read_text().replace('"131"', '"132"'))  # edited behind the index's back
    assert main(["references", "check", "--answers", "addition@1", "--root", str(root)]) == 1
    assert index.sha256 != references.load_index("addition", "1", COMMITTED.parents[1]).sha256
    with pytest.raises(BadInput, match=r"task\.references"):
        prepare(load(["task=addition", "task.references=addition"]))
