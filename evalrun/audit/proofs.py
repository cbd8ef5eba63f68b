"""Inclusion proofs: one episode against a run's Merkle root, without the rest of the run.

The tree is :mod:`evalrun.records.merkle`'s (RFC 6962 over ``episode_id:head`` leaves, sorted by episode
id). ``prove`` emits the audit path (RFC 6962 section 2.1.1) plus the episode's chain lines, so the
checker recomputes the head from the disclosed entries, the leaf from the head, and the root from
the path (RFC 9162 section 2.1.3.2).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.chain import GENESIS, link
from evalrun.records.entries import EntryError, parse_line
from evalrun.records.formats import PROOF_FORMAT, Proof, first_error
from evalrun.records.merkle import audit_path, leaf, leaf_hash, root_from_path, root_of_leaf_hashes
from evalrun.rundir import layout
from evalrun.rundir.reader import load_record, open_run, read_outputs


def episode_lines(run: layout.RunDir, episode_id: str) -> tuple[str, ...]:
    needle = f'"episode":"{episode_id}"'
    for part in sorted(run.log.glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as fh:
            lines = tuple(line.rstrip("\n") for line in fh if needle in line)
        if lines:
            return lines
    return ()


def prove(path: Path, episode_id: str, from_seq: int = 0) -> Proof:
    """The proof of ``episode_id`` under the run's root, its chain disclosed from entry ``from_seq`` on (0: whole)."""
    run = open_run(path)
    record = load_record(run)
    cols = read_outputs(run, ["episode_id", "head"]).to_pydict()
    heads = sorted(zip(cols["episode_id"], cols["head"], strict=True))
    index = next((i for i, (eid, _) in enumerate(heads) if eid == episode_id), None)
    if index is None:
        raise BadInput(episode_id, f"no such episode in {run.path}")
    hashes = [leaf_hash(eid, head) for eid, head in heads]
    root = root_of_leaf_hashes(hashes)
    if root != record.merkle_root:
        raise CheckFailed(f"{layout.RECORD}: merkle_root differs from the root of the output heads; run verify")
    lines = list(episode_lines(run, episode_id))
    if not 0 <= from_seq < len(lines):
        raise BadInput("--from", f"an entry of episode {episode_id}: 0 to {len(lines) - 1}, got {from_seq}")
    disclosed = {} if from_seq == 0 else {"from_seq": from_seq, "prev": parse_line(lines[from_seq]).prev}
    return Proof(
        episode_id=episode_id, head=heads[index][1], leaf_index=index, tree_size=len(heads),
        path=[h.hex() for h in audit_path(index, hashes)], root=root, lines=lines[from_seq:], **disclosed,
    )  # fmt: skip


def load_proof(path: Path) -> Proof:
    """A proof file; BadInput naming the field for anything :class:`Proof` does not allow."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(str(path), f"expected a proof written by evalrun prove ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != PROOF_FORMAT:
        raise BadInput(f"{path}: format", f"expected {PROOF_FORMAT!r}")
    try:
        return Proof.model_validate(data)
    except ValidationError as exc:
        field, message = first_error(exc)
        raise BadInput(f"{path}: {field}", message) from None


def check_proof(proof: Proof, root: str) -> None:
    """Raise CheckFailed unless the disclosed chain (from its header, or from ``from_seq`` after ``prev``) ends at
    ``head`` and the path leads to ``root``; a disclosed entry that was edited, moved or left out is named."""
    if (proof.from_seq is None) != (proof.prev is None) or (proof.from_seq is not None and not proof.lines):
        raise CheckFailed(f"episode {proof.episode_id}: a proof from a step gives from_seq, prev and the lines")
    if proof.lines:
        first = proof.from_seq or 0
        head = GENESIS if proof.prev is None else proof.prev
        for seq, line in enumerate(proof.lines, start=first):
            try:
                entry = parse_line(line)
            except EntryError as exc:
                raise CheckFailed(f"episode {proof.episode_id} seq {seq}: disclosed line is not a chain entry "
                                  f"(field {exc.field}: {exc.message})") from None  # fmt: skip
            if entry.episode != proof.episode_id or entry.seq != seq:
                raise CheckFailed(f"episode {proof.episode_id} seq {seq}: the disclosed line is entry {entry.seq} "
                                  f"of episode {entry.episode} (moved, or one left out before it)")  # fmt: skip
            if entry.prev != head:
                before = "the proof's prev" if seq == first else f"entry {seq - 1}"
                raise CheckFailed(f"episode {proof.episode_id} seq {seq}: disclosed chain entry does not link to "
                                  f"{before} (that one or this one was edited)")  # fmt: skip
            try:
                head = link(head, line)
            except UnicodeEncodeError:  # a lone surrogate: no chain line (UTF-8 text) holds one
                raise CheckFailed(f"episode {proof.episode_id} seq {seq}: disclosed line is not UTF-8 text") from None
        if head != proof.head:
            last = (proof.from_seq or 0) + len(proof.lines) - 1
            raise CheckFailed(f"episode {proof.episode_id}: disclosed chain ends at {head} after entry {last}, not at "
                              f"head {proof.head} (entry {last} was edited, or entries after it left out)")  # fmt: skip
    got = root_from_path(leaf(proof.episode_id, proof.head), proof.leaf_index, proof.tree_size,
                         [bytes.fromhex(h) for h in proof.path])  # fmt: skip
    if got is None or got.hex() != root.lower():
        raise CheckFailed(f"episode {proof.episode_id}: the audit path leads to {got.hex() if got else 'no root'}, "
                          f"not to {root}")  # fmt: skip
