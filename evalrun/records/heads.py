"""The chain heads of a run's written episodes, kept compactly until the run's Merkle root is computed
(docs/design.md "Record": driver memory)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from evalrun.records.merkle import BLOCK_LEAVES, DIGEST_BYTES, leaf_hash, root_of_leaf_blocks


def digest_bytes(text: str, what: str) -> bytes:
    """A sha256 hex digest as its 32 bytes; ValueError naming ``what`` for anything else."""
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != DIGEST_BYTES or raw.hex() != text:
        raise ValueError(f"{what} {text!r} is not a sha256 hex digest")
    return raw


def digest_order(digests: np.ndarray) -> np.ndarray:
    """The order that sorts digests (an n x 32 array of bytes) ascending, as sorting their hex strings would: by each
    digest's first big-endian 64-bit word, or, when two share it (for sha256s, about never), lexicographically by all
    four; a fifth of the time of the lexicographic sort, a hundredth of Arrow's sort of fixed-size binaries."""
    words = np.ascontiguousarray(digests).view(">u8").reshape(-1, DIGEST_BYTES // 8)
    order = np.argsort(words[:, 0], kind="stable")
    first = words[order, 0]
    if not (first[1:] == first[:-1]).any():
        return order.astype(np.int64)
    return np.lexsort(words.T[::-1]).astype(np.int64)


_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint16)  # byte -> its two hex digits


def digest_hex(digests: np.ndarray) -> pa.StringArray:
    """Digests (an n x 32 array of bytes) as an Arrow array of their hex strings, made without a Python string each."""
    n = len(digests)
    offsets = np.arange(0, 2 * DIGEST_BYTES * n + 1, 2 * DIGEST_BYTES, dtype=np.int32)
    text = _HEX[np.ascontiguousarray(digests)].tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))


def digest_sum(digests: bytes) -> int:
    """The sum mod 2**256 of 32-byte digests concatenated, each read as a big-endian integer: summed as columns of
    32-bit words (exact below 2**32 digests), a few nanoseconds a digest instead of a Python integer each."""
    words = np.frombuffer(digests, ">u4").reshape(-1, DIGEST_BYTES // 4).astype(np.uint64).sum(axis=0)
    return sum(int(word) << (32 * place) for place, word in enumerate(reversed(words.tolist()))) % (1 << 256)


@dataclass(frozen=True)
class PackedHeads:
    """A part's (episode id, head) pairs as :class:`Heads` keeps them: the 32 bytes of each episode id and of its RFC
    6962 leaf hash, in the part's order, and the ids' sum mod 2**256. Made where the heads are (the worker that ran
    the part), so the driver appends bytes instead of hashing each episode (docs/design.md "Workers write, the driver
    commits")."""

    ids: bytes
    leaves: bytes
    id_sum: int

    def __len__(self) -> int:
        return len(self.ids) // DIGEST_BYTES

    def episode_ids(self) -> list[str]:
        return [self.ids[i : i + DIGEST_BYTES].hex() for i in range(0, len(self.ids), DIGEST_BYTES)]


def pack_heads(pairs: Iterable[tuple[str, str]]) -> PackedHeads:
    """``pairs`` packed; ValueError naming an episode id or head that is not a sha256 hex digest."""
    ids, leaves = bytearray(), bytearray()
    for episode, head in pairs:
        ids += digest_bytes(episode, "episode id")
        digest_bytes(head, "head")
        leaves += leaf_hash(episode, head)
    return PackedHeads(bytes(ids), bytes(leaves), digest_sum(bytes(ids)))


class Heads:
    """Episode id -> chain head, as the run's Merkle root needs them: 64 bytes an episode, the 32 bytes of
    its id and of its RFC 6962 leaf hash (hashed as the heads arrive, so that the end of a run only sorts
    and folds), in arrival order; a dict of the hex strings takes about five times as much. ``id_sum`` is
    the sum of the ids mod 2**256, which lets a run check its episodes against its plan without holding
    either set."""

    SORT_CHUNK = 16 * BLOCK_LEAVES  # leaves taken in episode-id order at a time

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._ids = bytearray()
        self._leaves = bytearray()
        self.id_sum = 0
        self.add(pairs)

    def add(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.add_packed(pack_heads(pairs))

    def add_packed(self, packed: PackedHeads) -> None:
        if len(packed.ids) != len(packed.leaves) or len(packed.ids) % DIGEST_BYTES:
            raise ValueError("packed heads whose ids and leaves do not pair up")
        self._ids += packed.ids
        self._leaves += packed.leaves
        self.id_sum = (self.id_sum + packed.id_sum) % (1 << 256)

    def __len__(self) -> int:
        return len(self._ids) // DIGEST_BYTES

    def copy(self) -> Heads:
        copied = Heads()
        copied._ids, copied._leaves, copied.id_sum = bytearray(self._ids), bytearray(self._leaves), self.id_sum
        return copied

    def _pairs(self) -> list[tuple[bytes, bytes]]:
        return sorted((self._ids[i : i + DIGEST_BYTES], self._leaves[i : i + DIGEST_BYTES])
                      for i in range(0, len(self._ids), DIGEST_BYTES))  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Heads) and self._pairs() == other._pairs()

    __hash__ = None  # type: ignore[assignment]

    def merkle_root(self) -> str:
        """The RFC 6962 root over (episode id, head) in episode-id order, as
        :func:`evalrun.records.merkle.merkle_root` computes it from the pairs; ValueError naming an
        episode id written more than once (a run's episodes are unique)."""
        ids = np.frombuffer(self._ids, np.uint8).reshape(-1, DIGEST_BYTES)
        leaves = np.frombuffer(self._leaves, np.uint8).reshape(-1, DIGEST_BYTES)
        order = digest_order(ids)

        def sorted_leaves() -> Iterator[bytes]:
            previous = ids[:0]
            for start in range(0, len(order), self.SORT_CHUNK):
                chunk = order[start : start + self.SORT_CHUNK]
                in_order = np.concatenate([previous, ids[chunk]])
                repeated = np.flatnonzero((in_order[1:] == in_order[:-1]).all(axis=1))
                if len(repeated):
                    raise ValueError(f"episode {in_order[repeated[0]].tobytes().hex()} was written more than once")
                previous = in_order[-1:]
                yield leaves[chunk].tobytes()

        return root_of_leaf_blocks(sorted_leaves())
