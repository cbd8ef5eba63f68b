"""Seed derivation (docs/design.md "Seeds"): every random choice draws from a seed derived here.

``derive_seed(master, purpose, *keys)`` is the first 8 bytes, big-endian, of
``sha256(canonical([master, purpose, *keys]))``. It depends only on its arguments, never on
dispatch order, batch composition, worker or thread.

A master seed the user leaves to evalrun (``seeds.master=auto``) is drawn once, at validation, by
:func:`generate_master_seed`, and recorded like any other (docs/design.md "Seeds").
"""

from __future__ import annotations

import hashlib
import random
import secrets

from evalrun.records.canonical import canonical_json

SeedKey = str | int
MASTER_SEED_LIMIT = 2**53  # master seeds are recorded as JSON numbers: integers in [0, 2**53)


def derive_seed(master: SeedKey, purpose: str, *keys: SeedKey) -> int:
    """An unsigned 64-bit seed for ``purpose`` under ``keys``. ``master`` is a master seed, or a seed derived here
    given as its decimal string (as records hold 64-bit seeds: JSON numbers stop at 2**53)."""
    return seed_of(canonical_json([master, purpose, *keys]))


def seed_of(canonical: str) -> int:
    """The seed of ``[master, purpose, *keys]`` already encoded as canonical JSON."""
    return int.from_bytes(hashlib.sha256(canonical.encode("utf-8")).digest()[:8], "big")


def derive_rng(master: int, purpose: str, *keys: SeedKey) -> random.Random:
    """A fresh ``random.Random`` seeded by :func:`derive_seed`."""
    return random.Random(derive_seed(master, purpose, *keys))


def generate_master_seed() -> int:
    """A fresh master seed from the operating system's randomness, in ``[0, MASTER_SEED_LIMIT)``."""
    return secrets.randbelow(MASTER_SEED_LIMIT)
