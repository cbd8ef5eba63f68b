"""The chain heads of a run's written episodes, kept compactly until the run's Merkle root is computed
(docs/design.md "Record": driver memory)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from evalrun.records.merkle import leaf_hash, root_of_leaf_hashes

DIGEST_BYTES = 32


def _digest_bytes(text: str, what: str) -> bytes:
    """A sha256 hex digest as its 32 bytes; ValueError naming ``what`` for anything else."""
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != DIGEST_BYTES or raw.hex() != text:
        raise ValueError(f"{what} {text!r} is not a sha256 hex digest")
    return raw


class Heads:
    """Episode id -> chain head, 64 bytes an episode: both are sha256 hex digests, kept as their bytes in
    arrival order (a dict of the hex strings takes about five times as much). ``id_sum`` is the sum of the
    ids mod 2**256, which lets a run check its episodes against its plan without holding either set."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._ids = bytearray()
        self._heads = bytearray()
        self.id_sum = 0
        self.add(pairs)

    def add(self, pairs: Iterable[tuple[str, str]]) -> None:
        ids, heads, total = bytearray(), bytearray(), 0
        for episode, head in pairs:
            raw = _digest_bytes(episode, "episode id")
            ids += raw
            heads += _digest_bytes(head, "head")
            total += int.from_bytes(raw, "big")
        self._ids += ids
        self._heads += heads
        self.id_sum = (self.id_sum + total) % (1 << 256)

    def __len__(self) -> int:
        return len(self._ids) // DIGEST_BYTES

    def items(self) -> Iterator[tuple[str, str]]:
        """(episode id, head) in arrival order."""
        for start in range(0, len(self._ids), DIGEST_BYTES):
            end = start + DIGEST_BYTES
            yield self._ids[start:end].hex(), self._heads[start:end].hex()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Heads) and sorted(self.items()) == sorted(other.items())

    __hash__ = None  # type: ignore[assignment]

    def _order(self) -> pa.Array:
        ids = pa.FixedSizeBinaryArray.from_buffers(pa.binary(DIGEST_BYTES), len(self), [None, pa.py_buffer(self._ids)])
        return pc.sort_indices(ids)  # bytes order is hex order: the same as sorting the hex strings

    def merkle_root(self) -> str:
        """The RFC 6962 root over (episode id, head) in episode-id order, as
        :func:`evalrun.records.merkle.merkle_root` computes it from the pairs; ValueError naming an
        episode id written more than once (a run's episodes are unique)."""

        def leaves() -> Iterator[bytes]:
            previous = None
            for index in self._order().to_numpy():
                start = int(index) * DIGEST_BYTES
                episode = self._ids[start : start + DIGEST_BYTES]
                if episode == previous:
                    raise ValueError(f"episode {episode.hex()} was written more than once")
                previous = episode
                yield leaf_hash(episode.hex(), self._heads[start : start + DIGEST_BYTES].hex())

        return root_of_leaf_hashes(leaves())
