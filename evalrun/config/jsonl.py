"""JSON Lines input files (datasets, few-shot pools): one object per non-blank line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput


def objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file:line, object)`` per non-blank line; a line that is not a JSON object is a BadInput naming it."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadInput(where, f"expected one JSON object per line ({exc.msg})") from exc
            if not isinstance(value, dict):
                raise BadInput(where, f"expected a JSON object, got {type(value).__name__}")
            yield where, value
