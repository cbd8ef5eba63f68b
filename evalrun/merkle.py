"""RFC 6962 Merkle tree hash over a run's episodes (DESIGN.md "Run root")."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

EMPTY_ROOT = hashlib.sha256(b"").hexdigest()


def leaf(episode_id: str, head: str) -> bytes:
    return f"{episode_id}:{head}".encode()


def _leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _tree_hash(hashes: Sequence[bytes]) -> bytes:
    if len(hashes) == 1:
        return hashes[0]
    split = 1 << ((len(hashes) - 1).bit_length() - 1)  # largest power of two < n
    return _node_hash(_tree_hash(hashes[:split]), _tree_hash(hashes[split:]))


def merkle_root(heads: Iterable[tuple[str, str]]) -> str:
    """Root over ``(episode_id, head)`` pairs, sorted by episode id; order of arrival is irrelevant."""
    leaves = [_leaf_hash(leaf(eid, head)) for eid, head in sorted(heads)]
    if not leaves:
        return EMPTY_ROOT
    return _tree_hash(leaves).hex()
