"""Seed derivation (docs/design.md "Seeds"): every random choice draws from a seed derived here.

``derive_seed(master, purpose, *keys)`` is the first 8 bytes, big-endian, of
``sha256(canonical([master, purpose, *keys]))``. It depends only on its arguments, never on
dispatch order, batch composition, worker or thread.
"""

from __future__ import annotations

import hashlib
import random

from evalrun.records.canonical import canonical_json

SeedKey = str | int


def derive_seed(master: int, purpose: str, *keys: SeedKey) -> int:
    """An unsigned 64-bit seed for ``purpose`` under ``keys``."""
    digest = hashlib.sha256(canonical_json([master, purpose, *keys]).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def derive_rng(master: int, purpose: str, *keys: SeedKey) -> random.Random:
    """A fresh ``random.Random`` seeded by :func:`derive_seed`."""
    return random.Random(derive_seed(master, purpose, *keys))
