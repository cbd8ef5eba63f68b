"""Input text files: UTF-8 or a BadInput naming the line; JSON Lines (datasets, few-shot pools) one object per line."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput


def read_utf8(path: Path) -> str:
    """The file as UTF-8 text; bytes that are not UTF-8 are a BadInput naming the line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        message = f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); save the file as UTF-8"
        raise BadInput(f"{path}:{line}", message) from None


def objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file:line, object)`` per non-blank line; a line that is not UTF-8 or not a JSON object is a BadInput
    naming it."""
    for number, line in enumerate(io.StringIO(read_utf8(path), newline=None), start=1):
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
