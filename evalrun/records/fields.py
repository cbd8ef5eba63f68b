"""JSON records as dotted field paths: how ``compare`` and ``rebaseline`` name what differs between two manifests."""

from __future__ import annotations

from typing import Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``; a list holding objects is indexed (``a.0.b``), other lists
    and an empty object are values."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, sub in value.items():
            flat.update(flatten(sub, f"{prefix}{key}."))
        return flat or {prefix.rstrip("."): {}}
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        flat = {}
        for index, sub in enumerate(value):
            flat.update(flatten(sub, f"{prefix}{index}."))
        return flat
    return {prefix.rstrip("."): value}


def differing_fields(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """(field, value in a, value in b) of every field whose values differ, in field order; a field
    missing on one side reads as None there."""
    fa, fb = flatten(a), flatten(b)
    return [
        (field, fa.get(field), fb.get(field)) for field in sorted(set(fa) | set(fb)) if fa.get(field) != fb.get(field)
    ]
