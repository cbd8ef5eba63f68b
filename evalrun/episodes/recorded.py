"""Reading a recorded manifest's sections for verify's checks: every failure names the manifest and field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalrun.errors import CheckFailed
from evalrun.rundir import layout


def manifest_failure(message: str) -> CheckFailed:
    return CheckFailed(f"{layout.MANIFEST}: {message}")


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def section(manifest: Mapping[str, Any], dotted: str) -> dict[str, Any]:
    """``manifest[a][b]...`` as a dict; CheckFailed naming the field when it is missing or not an object."""
    value: Any = manifest
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    if not isinstance(value, dict):
        raise manifest_failure(f"{dotted} is missing or not an object")
    return value


def without(record: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != key}
