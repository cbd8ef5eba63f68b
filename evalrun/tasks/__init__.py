"""Tasks: a hashed JSON Lines dataset, a versioned prompt template file, and a scorer.

Templates are Jinja files rendered with strict undefined variables: a field the item lacks is an
error, never an empty string. Every field of an item is available to the template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, StrictUndefined, Template
from jinja2.exceptions import UndefinedError

from evalrun.config import EvalConfig
from evalrun.digest import file_sha256, sha256_hex
from evalrun.errors import BadInput

_JINJA = Environment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)


@dataclass(frozen=True)
class Item:
    id: str
    fields: Mapping[str, Any]
    target: str


@dataclass(frozen=True)
class Task:
    name: str
    items: tuple[Item, ...]
    template_text: str
    dataset_path: Path
    dataset_sha256: str
    template_path: Path

    @property
    def template_sha256(self) -> str:
        return sha256_hex(self.template_text)

    def compiled(self) -> Template:
        return _JINJA.from_string(self.template_text)


def load_task(config: EvalConfig) -> Task:
    """Read the dataset (already checked by config.validate) and template of ``config``'s task."""
    spec = config.section("task")
    items = []
    with open(config.dataset_path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                record = json.loads(line)
                items.append(
                    Item(id=str(record[spec["id_field"]]), fields=record, target=str(record[spec["target_field"]]))
                )
    if config.raw["limit"] is not None:
        items = items[: config.raw["limit"]]
    return Task(
        name=spec["name"],
        items=tuple(items),
        template_text=config.template_path.read_text(encoding="utf-8"),
        dataset_path=config.dataset_path,
        dataset_sha256=file_sha256(config.dataset_path),
        template_path=config.template_path,
    )


def render_prompts(task: Task) -> dict[str, str]:
    """Prompt text per item id; a template variable an item lacks is a BadInput naming both."""
    template = task.compiled()
    prompts = {}
    for item in task.items:
        try:
            prompts[item.id] = template.render(**item.fields)
        except UndefinedError as exc:
            raise BadInput(str(task.template_path), f"item {item.id!r}: {exc.message}") from exc
    return prompts
