"""Several lm-eval tasks in one run: groups, tags and lists of names resolved as lm-eval 0.4.13 resolves them, the
group's metrics with lm-eval's definitions, and what evalrun does not implement refused by name, exit 2, before any
model loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers.lm_eval import TINY_TASK, write_tiny_data

from evalrun import cli
from evalrun.errors import BadInput
from evalrun.pipeline.groups import group_results
from evalrun.stats.groups import group_mean, group_stderr
from evalrun.tasks.lm_eval_groups import Aggregate, Group, Leaf, find_group

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "evalrun" / "tasks" / "builtin" / "lm_eval"


def _tasks(directory: Path, *names: str, tag: str | None = None) -> None:
    """A TINY_TASK YAML per name in ``directory`` (each tagged ``tag``), with their data."""
    write_tiny_data(directory)
    for name in names:
        text = TINY_TASK.replace("task: tiny", f"task: {name}") + (f"tag: {tag}\n" if tag else "")
        (directory / f"{name}.yaml").write_text(text, encoding="utf-8")


def test_the_shipped_group_resolves_as_lm_eval_builds_it() -> None:
    group = find_group(SHIPPED, "addition_suite")
    assert group is not None and group.kind == "group" and group.alias == "addition (generation and multiple choice)"
    assert [leaf.name for leaf in group.leaves()] == ["lm_eval_addition_gen", "lm_eval_addition_mc",
                                                      "lm_eval_addition_mc_prefix"]  # fmt: skip
    inline = group.members[1]
    assert isinstance(inline, Group) and inline.name == "addition_suite::choice"  # lm-eval's name of an inline group
    assert inline.aggregates == (Aggregate("acc", None, True), Aggregate("acc_norm", None, False))
    assert group.aggregates == (Aggregate("acc", None, True), Aggregate("exact_match", ("get-answer",), True))
    assert [g.name for g in group.groups()] == ["addition_suite", "addition_suite::choice"]
    assert all(leaf.path.is_file() for leaf in group.leaves())
    assert find_group(SHIPPED / "addition_suite.yaml", None) == group  # the group's YAML itself as task.path
    assert find_group(SHIPPED, "lm_eval_addition_mc") is None  # one task: a run of its own
    assert find_group(SHIPPED / "addition_mc" / "addition_mc.yaml", None) is None


def test_a_tag_is_its_tasks_in_name_order_and_a_list_names_several(tmp_path: Path) -> None:
    _tasks(tmp_path, "zeta", "alpha", tag="easy")
    _tasks(tmp_path, "other")
    tag = find_group(tmp_path, "easy")
    assert tag is not None and tag.kind == "tag" and [x.name for x in tag.leaves()] == ["alpha", "zeta"]
    listed = find_group(tmp_path, "other, easy")
    assert listed is not None and listed.kind == "tasks" and [x.name for x in listed.leaves()] == ["other", "alpha",
                                                                                                 "zeta"]  # fmt: skip
    # a tag inside a group is the group's own members (lm-eval adds its tasks one by one), a task once
    (tmp_path / "g.yaml").write_text("group: g\ntask: [easy, {task: alpha}, {group: sub, task: [other]}]\n")
    group = find_group(tmp_path, "g")
    assert group is not None and [m.name for m in group.members] == ["alpha", "zeta", "alpha", "g::sub"]
    assert [x.name for x in group.leaves()] == ["alpha", "zeta", "other"]


@pytest.mark.parametrize(
    ("group_yaml", "named"),
    [
        ("group: g\ntask: [a]\nnot_a_setting: 5\n", "g.yaml: not_a_setting"),  # neither a group's key nor a task's
        ("group: g\ntask: [{task: a, nope: 5}]\n", "g.yaml: task[0]: nope"),  # a member's
        ("group: g\ntask: [{task: inline, dataset_path: json}]\n", "g.yaml: task[0]: task"),  # an inline task
        ("group: g\ntask: [nope]\n", "g.yaml: task[0]"),  # a name the directory does not define
        (
            "group: g\ntask: [a]\naggregate_metric_list: [{metric: acc, aggregation: median}]\n",
            "aggregate_metric_list[0].aggregation",
        ),
        (
            "group: g\ntask: [a]\naggregate_metric_list: [{metric: acc, higher_is_better: true}]\n",
            "aggregate_metric_list[0].higher_is_better",
        ),
        ("group: g\ntask: [a]\ndescription: !function helpers.text\n", "g.yaml: description"),  # a function
        ("group: g\ntask: [a, {task: a, num_fewshot: 1}]\n", "task 'a' is in the group twice"),
        ("group: g\ntask: [h]\n---\n", "g.yaml"),  # not one mapping
        ("group: g\ntask: []\n", "g.yaml: task"),
    ],
)
def test_what_a_group_may_not_say_is_refused_naming_file_and_key(tmp_path: Path, group_yaml: str,
                                                                 named: str) -> None:  # fmt: skip
    _tasks(tmp_path, "a")
    (tmp_path / "helpers.py").write_text("def text(doc):\n    return 'x'\n", encoding="utf-8")
    (tmp_path / "g.yaml").write_text(group_yaml, encoding="utf-8")
    with pytest.raises(BadInput) as raised:
        find_group(tmp_path, "g")
    assert named in str(raised.value), raised.value


GROUP_SETTINGS = {
    "inner.yaml": "group: inner\ntask: [a, {task: b, num_fewshot: 1}]\nnum_fewshot: 2\ndescription: 'inner: '\n",
    "g.yaml": "group: g\ntask:\n  - {group: inner, description: 'outer: '}\n  - {group: sub, task: [{task: c, "
    "task_alias: third}], target_delimiter: '|'}\n  - easy\nnum_fewshot: 0\ntag: [ignored]\n"
    "aggregate_metric_list: [{metric: acc, aggregation: !function helpers.mean, weight_by_size: truez}]\n",
}


def test_a_groups_settings_reach_its_tasks_as_lm_evals_builder_gives_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's settings of its tasks, a member entry's and an enclosing group's, merged key by key as lm-eval
    0.4.13's TaskManager merges them: each task's config, read with its leaf's settings, is lm-eval's own."""
    from lm_eval.tasks import TaskManager

    from evalrun.tasks.lm_eval import read_definition
    from evalrun.tasks.lm_eval_catalog import STRUCTURAL_KEYS

    _tasks(tmp_path, "a", "b", "c")
    _tasks(tmp_path, "d", "e", tag="easy")
    (tmp_path / "helpers.py").write_text("def mean(values):\n    return sum(values) / len(values)\n")
    for name, text in GROUP_SETTINGS.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    group = find_group(tmp_path, "g")
    assert group is not None
    settings = {leaf.name: dict(leaf.overrides) for leaf in group.leaves()}
    assert settings == {
        "a": {"num_fewshot": 0, "description": "outer: "},  # the enclosing group's over the inner one's own
        "b": {"num_fewshot": 1, "description": "outer: "},  # a member entry's over both
        "c": {"num_fewshot": 0, "target_delimiter": "|", "task_alias": "third"},
        "d": {"num_fewshot": 0},  # a tag's tasks get the group's; tag, an index key, is dropped as lm-eval drops it
        "e": {"num_fewshot": 0},
    }
    # a function as a group's aggregation: lm-eval takes it and aggregates by the mean; "truez" is true to it
    assert group.aggregates == (Aggregate("acc", None, True, "helpers.mean"),)
    restored = Group.from_record(group.as_record())  # the group record holds each task's settings
    assert {leaf.name: dict(leaf.overrides) for leaf in restored.leaves()} == settings
    assert restored.aggregates == group.aggregates

    monkeypatch.chdir(tmp_path)  # lm-eval reads the tasks' data_files from where it runs
    built = TaskManager(include_path=str(tmp_path), include_defaults=False).load(["g"])
    theirs = {name: task.config for name, task in built["tasks"].items()}
    assert sorted(theirs) == sorted(settings)
    for leaf in group.leaves():
        ours = read_definition(leaf.path, leaf.overrides).resolved
        for key in ("num_fewshot", "description", "target_delimiter", "task_alias"):
            default = {"num_fewshot": None, "description": "", "target_delimiter": " ", "task_alias": None}[key]
            assert ours.get(key, default) == getattr(theirs[leaf.name], key), (leaf.name, key)
        assert not set(ours) & set(STRUCTURAL_KEYS) - {"tag"}


def test_a_group_that_contains_itself_is_refused(tmp_path: Path) -> None:
    _tasks(tmp_path, "a")
    (tmp_path / "g.yaml").write_text("group: g\ntask: [a, h]\n", encoding="utf-8")
    (tmp_path / "h.yaml").write_text("group: h\ntask: [g]\n", encoding="utf-8")
    with pytest.raises(BadInput, match="group 'g' contains itself"):
        find_group(tmp_path, "g")


def test_a_name_nothing_defines_lists_the_tasks_groups_and_tags_there(tmp_path: Path) -> None:
    _tasks(tmp_path, "a", tag="t")
    (tmp_path / "g.yaml").write_text("group: g\ntask: [a]\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"tasks a; groups g; tags t"):
        find_group(tmp_path, "a,missing")


def test_group_mean_and_stderr_are_lm_evals_formulas() -> None:
    # aggregate_subtask_metrics: sum(v * n) / sum(n); every n 1 unless weighted
    assert group_mean([1.0, 0.5], [2, 4]) == pytest.approx(4 / 6)
    assert group_mean([1.0, 0.5], [2, 4], weight_by_size=False) == 0.75
    # pooled_sample_stderr: sqrt(sum((n - 1) se^2 n) / (sum(n) - k) / sum(n))
    pooled = math.sqrt((1 * 0.1**2 * 2 + 3 * 0.2**2 * 4) / (6 - 2) / 6)
    assert group_stderr([0.1, 0.2], [2, 4]) == pytest.approx(pooled, rel=1e-15)
    assert group_stderr([0.1, 0.2], [2, 4], weight_by_size=False) == pytest.approx(math.sqrt(0.05) / 2)
    assert group_stderr([0.0], [1]) is None  # no degrees of freedom
    with pytest.raises(ValueError):
        group_mean([], [])


def _estimate(mean: float, n: int, se: float | None, **more: float) -> dict:
    return {"mean": mean, "n_items": n, "se": se, **more}


def test_group_results_discover_filters_and_leave_out_and_name_a_task_without_the_metric() -> None:
    leaves = (Leaf("gen", Path()), Leaf("mc", Path()), Leaf("ll", Path()))
    group = Group("g", "group", leaves, (Aggregate("exact_match"), Aggregate("acc", ("none",), False),
                                         Aggregate("perplexity")))  # fmt: skip
    summaries = {
        "gen": {"overall": {"exact_match/strict": _estimate(0.5, 4, 0.25), "exact_match/flex": _estimate(1, 4, 0)}},
        "mc": {"overall": {"acc": _estimate(0.25, 8, 0.1), "exact_match/strict": _estimate(0.0, 8, 0.0)}},
        "ll": {"overall": {"acc": _estimate(1.0, 2, 0.0), "perplexity": _estimate(-2.0, 2, 0.5, perplexity=7.389)}},
    }
    metrics = group_results(group, summaries)["g"]["metrics"]
    assert list(metrics) == ["exact_match/flex", "exact_match/strict", "acc", "perplexity"]  # filters sorted
    strict = metrics["exact_match/strict"]
    assert strict["mean"] == pytest.approx((0.5 * 4 + 0.0 * 8) / 12) and strict["n_items"] == 12
    assert strict["tasks"] == ["gen", "mc"] and strict["missing"] == ["ll"]
    assert strict["stderr"] == pytest.approx(math.sqrt((3 * 0.25**2 * 4 + 7 * 0) / 10 / 12))
    assert metrics["acc"]["mean"] == 0.625 and metrics["acc"]["weight_by_size"] is False  # unweighted
    # a perplexity is its task's exp(-mean) (lm-eval's task value), with no stderr
    assert metrics["perplexity"]["mean"] == 7.389 and metrics["perplexity"]["stderr"] is None


def test_bad_groups_exit_2_with_one_line_before_any_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _tasks(tmp_path, "a")
    (tmp_path / "g.yaml").write_text("group: g\ntask: [a]\nnot_a_setting: 3\n", encoding="utf-8")
    for name in ("g", "a,nope"):
        code = cli.main(["run", "task=lm_eval", f"task.path={tmp_path}", f"task.name={name}" if "," not in name
                         else f'task.name="{name}"', "cluster=inline", f"run.root={tmp_path / 'runs'}"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert ("g.yaml: not_a_setting" if name == "g" else "no task, group or tag 'nope'") in err[0], err
    assert not (tmp_path / "runs").exists()
