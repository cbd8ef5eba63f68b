"""Inclusion proofs: one episode against a run's Merkle root, without the rest of the run.

The tree is :mod:`evalrun.records.merkle`'s (RFC 6962 over ``episode_id:head`` leaves, sorted by episode
id). ``prove`` emits the audit path (RFC 6962 section 2.1.1) plus the episode's chain lines, so the
checker recomputes the head from the disclosed entries, the leaf from the head, and the root from
the path (RFC 9162 section 2.1.3.2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.chain import GENESIS, link
from evalrun.records.merkle import audit_path, leaf, leaf_hash, root_from_path, root_of_leaf_hashes
from evalrun.rundir import layout
from evalrun.rundir.reader import load_record, open_run

PROOF_FORMAT = "evalrun.proof/1"
_HEX64 = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class InclusionProof:
    episode_id: str
    head: str
    leaf_index: int
    tree_size: int
    path: tuple[str, ...]
    root: str
    lines: tuple[str, ...]  # the episode's chain, disclosed

    def as_record(self) -> dict[str, Any]:
        return {
            "format": PROOF_FORMAT,
            "episode_id": self.episode_id,
            "head": self.head,
            "leaf_index": self.leaf_index,
            "tree_size": self.tree_size,
            "path": list(self.path),
            "root": self.root,
            "lines": list(self.lines),
        }


def episode_lines(run: layout.RunDir, episode_id: str) -> tuple[str, ...]:
    needle = f'"episode":"{episode_id}"'
    for part in sorted(run.log.glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as fh:
            lines = tuple(line.rstrip("\n") for line in fh if needle in line)
        if lines:
            return lines
    return ()


def prove(path: Path, episode_id: str) -> InclusionProof:
    run = open_run(path)
    record = load_record(run)
    cols = run.read_outputs(["episode_id", "head"]).to_pydict()
    heads = sorted(zip(cols["episode_id"], cols["head"], strict=True))
    index = next((i for i, (eid, _) in enumerate(heads) if eid == episode_id), None)
    if index is None:
        raise BadInput(episode_id, f"no such episode in {run.path}")
    hashes = [leaf_hash(eid, head) for eid, head in heads]
    root = root_of_leaf_hashes(hashes)
    if root != record["merkle_root"]:
        raise CheckFailed(f"{layout.RECORD}: merkle_root differs from the root of the output heads; run verify")
    return InclusionProof(
        episode_id=episode_id, head=heads[index][1], leaf_index=index, tree_size=len(heads),
        path=tuple(h.hex() for h in audit_path(index, hashes)), root=root, lines=episode_lines(run, episode_id),
    )  # fmt: skip


def _hex64(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX64:
        raise BadInput(where, "expected 64 lowercase hex digits")
    return value


def load_proof(path: Path) -> InclusionProof:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(str(path), f"expected a proof written by evalrun prove ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != PROOF_FORMAT:
        raise BadInput(f"{path}: format", f"expected {PROOF_FORMAT!r}")
    try:
        proof = InclusionProof(
            episode_id=str(data["episode_id"]), head=_hex64(data["head"], f"{path}: head"),
            leaf_index=int(data["leaf_index"]), tree_size=int(data["tree_size"]),
            path=tuple(_hex64(h, f"{path}: path") for h in data["path"]), root=_hex64(data["root"], f"{path}: root"),
            lines=tuple(str(line) for line in data.get("lines", [])),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(str(path), f"missing or malformed field ({exc})") from exc
    return proof


def check_proof(proof: InclusionProof, root: str) -> None:
    """Raise CheckFailed unless the disclosed chain ends at ``head`` and the path leads to ``root``."""
    if proof.lines:
        head = GENESIS
        for seq, line in enumerate(proof.lines):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = {}
            if (
                not isinstance(entry, dict)
                or entry.get("episode") != proof.episode_id
                or entry.get("seq") != seq
                or entry.get("prev") != head
            ):
                raise CheckFailed(f"episode {proof.episode_id} seq {seq}: disclosed chain entry does not link")
            head = link(head, line)
        if head != proof.head:
            raise CheckFailed(f"episode {proof.episode_id}: disclosed chain ends at {head}, not at head {proof.head}")
    got = root_from_path(leaf(proof.episode_id, proof.head), proof.leaf_index, proof.tree_size,
                         [bytes.fromhex(h) for h in proof.path])  # fmt: skip
    if got is None or got.hex() != root.lower():
        raise CheckFailed(f"episode {proof.episode_id}: the audit path leads to {got.hex() if got else 'no root'}, "
                          f"not to {root}")  # fmt: skip
