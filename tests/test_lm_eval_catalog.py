"""``evalrun tasks list|check``: a directory of lm-eval task YAMLs as lm-eval's own TaskManager and loader read it,
with no model and no data. One task's helper that does not import refuses that task alone, naming the package
and the lm-eval extra that brings it; every reason a task does not load is listed at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalrun.cli.main import main

GOOD = """task: good_gen
dataset_path: json
dataset_kwargs: {data_files: {test: data.jsonl}}
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
process_results: !function helpers.score
metric_list:
  - metric: points
    aggregation: mean
    higher_is_better: true
"""
NEEDS_LANGDETECT = """task: needs_langdetect
dataset_path: json
test_split: test
output_type: generate_until
doc_to_text: !function needs.text
doc_to_target: "{{answer}}"
"""
MANY_FAULTS = """task: many_faults
dataset_path: json
test_split: test
output_type: loglikelihood_rolling
doc_to_text: "{{text}}"
doc_to_image: image
should_decontaminate: true
doc_to_decontamination_query: "{{text}}"
not_a_key: 1
"""
UNKNOWN_FILTER = """task: unknown_filter
dataset_path: json
test_split: test
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
filter_list:
  - name: strict
    filter: [{function: no_such_filter}]
"""
GROUP = """group: suite
task: [good_gen, needs_langdetect]
aggregate_metric_list: [{metric: points}]
"""
OVERRIDING = """group: overriding
task:
  - task: good_gen
    num_fewshot: 5
"""
OVERRIDDEN_BADLY = """group: overridden_badly
task:
  - task: good_gen
    doc_to_image: picture
"""


def write_library(root: Path) -> Path:
    library = root / "library"
    library.mkdir()
    files = {"good.yaml": GOOD, "needs.yaml": NEEDS_LANGDETECT, "faults.yaml": MANY_FAULTS,
             "filter.yaml": UNKNOWN_FILTER, "suite.yaml": GROUP, "overriding.yaml": OVERRIDING,
             "overridden_badly.yaml": OVERRIDDEN_BADLY,
             "broken.yaml": "task: [unclosed\n",
             "helpers.py": "def score(doc, results):\n    return {'points': float(results[0] == doc['answer'])}\n",
             "needs.py": "import langdetect\n\ndef text(doc):\n    return doc['q']\n"}  # fmt: skip
    for name, text in files.items():
        (library / name).write_text(text, encoding="utf-8")
    return library


def test_check_loads_each_task_alone_and_gives_every_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library = write_library(tmp_path)
    assert main(["tasks", "check", str(library), "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c for c in record["checked"]}
    assert by_name["good_gen"]["loads"] and by_name["good_gen"]["reasons"] == []
    (missing,) = by_name["needs_langdetect"]["reasons"]
    assert "package 'langdetect' is not installed; lm-eval's extra ifeval brings it" in missing
    # both reasons at once; decontamination keys are lm-eval's (accepted), loglikelihood_rolling runs
    assert by_name["many_faults"]["reasons"] == ["keys lm-eval's TaskConfig does not have: not_a_key",
                                                 "doc_to_image: evalrun's engines take text only"]  # fmt: skip
    assert any("no_such_filter" in r for r in by_name["unknown_filter"]["reasons"])
    assert by_name["suite"]["reasons"] == ["member needs_langdetect does not load"]
    # a member's settings are checked with the task: the same task loads with some and not with others
    assert by_name["overriding"]["loads"]
    (refusal,) = by_name["overridden_badly"]["reasons"]
    assert refusal == ("evalrun does not run it as its tasks: task good_gen with the group's settings "
                       "{'doc_to_image': 'picture'}: doc_to_image: evalrun's engines take text only")  # fmt: skip
    assert [Path(p).name for p in record["unreadable"]] == ["broken.yaml"]
    assert record["counts"]["loads"] == {"tasks": [1, 4], "groups": [1, 3]}


def test_names_pick_tasks_and_a_name_not_there_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library = write_library(tmp_path)
    (library / "broken.yaml").unlink()
    assert main(["tasks", "check", str(library), "good_gen"]) == 0
    assert "tasks: 1 of 1 load (100.0%)" in capsys.readouterr().out
    assert main(["tasks", "check", str(library), "nope"]) == 2
    assert "nope: not defined under" in capsys.readouterr().err


def test_list_names_tasks_groups_and_tags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library = write_library(tmp_path)
    assert main(["tasks", "list", str(library), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    kinds = {d["name"]: d["kind"] for d in record["definitions"]}
    assert kinds == {"good_gen": "task", "needs_langdetect": "task", "many_faults": "task",
                     "unknown_filter": "task", "suite": "group", "overriding": "group",
                     "overridden_badly": "group"}  # fmt: skip
    assert main(["tasks", "list", str(tmp_path / "absent")]) == 2
