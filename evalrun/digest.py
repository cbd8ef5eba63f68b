"""Canonical JSON and SHA-256: the one place every hash in evalrun comes from.

Canonical JSON is RFC 8785 (JCS); every hash is SHA-256 in lowercase hex.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import rfc8785

_CHUNK = 1 << 20


def canonical_json(value: Any) -> str:
    """RFC 8785 serialisation of ``value`` as text (no trailing newline)."""
    return rfc8785.dumps(value).decode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def canonical_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def combine(parts: Iterable[str]) -> str:
    """Digest of several hex hashes: sha256 of their concatenation, in the order given."""
    return sha256_hex("".join(parts))
