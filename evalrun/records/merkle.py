"""RFC 6962 Merkle tree hash over a run's episodes (docs/design.md "Record"), and audit paths for inclusion proofs."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence

EMPTY_ROOT = hashlib.sha256(b"").hexdigest()
DIGEST_BYTES = 32  # a sha256 digest


def leaf(episode_id: str, head: str) -> bytes:
    return f"{episode_id}:{head}".encode()


def leaf_hash(episode_id: str, head: str) -> bytes:
    """RFC 6962 leaf hash of one episode, for callers that hash leaves in parallel."""
    return _leaf_hash(leaf(episode_id, head))


def _leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _tree_hash(hashes: Sequence[bytes]) -> bytes:
    if len(hashes) == 1:
        return hashes[0]
    split = 1 << ((len(hashes) - 1).bit_length() - 1)  # largest power of two < n
    return _node_hash(_tree_hash(hashes[:split]), _tree_hash(hashes[split:]))


BLOCK_LEAVES = 4096  # leaves hashed a level at a time: a perfect subtree of the tree


def root_of_leaf_hashes(leaf_hashes: Iterable[bytes]) -> str:
    """Root over leaf hashes already in episode-id order (:func:`root_of_leaf_blocks` of their blocks)."""
    source = iter(leaf_hashes)
    return root_of_leaf_blocks(iter(lambda: b"".join(itertools.islice(source, BLOCK_LEAVES)), b""))


def root_of_leaf_blocks(blocks: Iterable[bytes]) -> str:
    """Root over leaf hashes already in episode-id order, given as blocks of concatenated hashes, each but the last
    a multiple of :data:`BLOCK_LEAVES` hashes long. Folded as they come: memory is a block and one hash per level.
    RFC 6962's tree splits at the largest power of two below n, so it is the perfect subtrees of n's binary digits,
    largest first, joined from the right; each block's full :data:`BLOCK_LEAVES` are such subtrees, hashed a level
    at a time (a pass over bytes, not a Python object a node), and the last block's rest is split by its digits."""
    subtrees: list[tuple[int, bytes]] = []  # (leaves, hash) of perfect subtrees, sizes strictly decreasing
    for block in blocks:
        leaves, offset = len(block) // DIGEST_BYTES, 0
        sizes = [BLOCK_LEAVES] * (leaves // BLOCK_LEAVES)
        rest = leaves % BLOCK_LEAVES  # the last block's: its binary digits, largest first
        sizes += [1 << bit for bit in reversed(range(BLOCK_LEAVES.bit_length())) if rest & (1 << bit)]
        for size in sizes:
            node = _perfect_root(block[offset * DIGEST_BYTES : (offset + size) * DIGEST_BYTES])
            offset += size
            while subtrees and subtrees[-1][0] == size:
                node = _node_hash(subtrees.pop()[1], node)
                size *= 2
            subtrees.append((size, node))
    if not subtrees:
        return EMPTY_ROOT
    root = subtrees.pop()[1]
    while subtrees:
        root = _node_hash(subtrees.pop()[1], root)
    return root.hex()


def _perfect_root(hashes: bytes) -> bytes:
    """The root of a perfect subtree: its leaf hashes (a power of two of them) concatenated."""
    while len(hashes) > DIGEST_BYTES:
        hashes = b"".join([hashlib.sha256(b"\x01" + hashes[i : i + 2 * DIGEST_BYTES]).digest()
                           for i in range(0, len(hashes), 2 * DIGEST_BYTES)])  # fmt: skip
    return hashes


def merkle_root(heads: Iterable[tuple[str, str]]) -> str:
    """Root over ``(episode_id, head)`` pairs, sorted by episode id; order of arrival is irrelevant."""
    return root_of_leaf_hashes([leaf_hash(eid, head) for eid, head in sorted(heads)])


def audit_path(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    """RFC 6962 PATH(m, D[n]) over leaf hashes, leaf to root."""
    if len(hashes) <= 1:
        return []
    split = 1 << ((len(hashes) - 1).bit_length() - 1)
    if index < split:
        return [*audit_path(index, hashes[:split]), _tree_hash(hashes[split:])]
    return [*audit_path(index - split, hashes[split:]), _tree_hash(hashes[:split])]


def root_from_path(leaf_data: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes | None:
    """The root an audit path leads to, or None if the path cannot belong to a tree of ``size``."""
    if not 0 <= index < size:
        return None
    fn, sn, r = index, size - 1, _leaf_hash(leaf_data)
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = _node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = _node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return r if sn == 0 else None
