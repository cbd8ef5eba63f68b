"""The smallest lm-eval task YAML the tests edit, and where its data go."""

from __future__ import annotations

from pathlib import Path

TINY_TASK = """\
task: tiny
dataset_path: json
dataset_kwargs: {data_files: {test: test.jsonl}}
test_split: test
doc_to_text: "Q: {{q}}\\nA:"
doc_to_target: a
"""


def write_tiny_data(directory: Path) -> None:
    """``test.jsonl`` beside a TINY_TASK YAML in ``directory``: two questions."""
    (directory / "test.jsonl").write_text('{"q": "1+1", "a": "2"}\n{"q": "2+2", "a": "4"}\n', encoding="utf-8")
