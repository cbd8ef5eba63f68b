"""A finished run's checkpoints, checked: each recomputed from the final heads of the episodes it covered, and
against the ledger it was anchored to (docs/design.md "Checkpoints")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from evalrun.errors import CheckFailed
from evalrun.records.chain import GENESIS
from evalrun.records.formats import Record, checkpoint_hash
from evalrun.records.merkle import root_of_leaf_hashes
from evalrun.rundir import layout
from evalrun.rundir.checkpoints import checkpoint_name, read_checkpoints, signature_status
from evalrun.rundir.ledger import Ledger, run_name
from evalrun.rundir.reader import read_config


def check_checkpoints(run: layout.RunDir, record: Record, leaves_of: Mapping[str, list[tuple[str, bytes]]],
                      public_key: Path | None) -> str:  # fmt: skip
    """Every checkpoint of the verified run (whose parts' ``leaves_of``, by output part, are checked already):
    its chain (seq, prev), the run's digest, each part it lists as the finished run holds it (the same sha256),
    the parts of the one before it among them, its episodes and its Merkle root recomputed from those parts'
    heads, its signature; returns what was checked, or CheckFailed naming the checkpoint."""
    found = read_checkpoints(run)
    if not found:
        return "absent"
    prev, covered, statuses = GENESIS, {}, set()
    for position, (rel, checkpoint) in enumerate(found):
        if checkpoint.seq != position:
            raise CheckFailed(f"{rel}: seq {checkpoint.seq}, expected {position}: a checkpoint before it is missing")
        if checkpoint.prev != prev:
            raise CheckFailed(f"{rel}: prev {checkpoint.prev} is not the hash of the checkpoint before it ({prev})")
        if checkpoint.digest != record.digest:
            raise CheckFailed(f"{rel}: digest {checkpoint.digest} differs from the run's {record.digest}")
        for name, sha in checkpoint.parts.items():
            if record.files.get(name) != sha:
                held = "does not hold" if name not in record.files else "holds with another sha256"
                raise CheckFailed(f"{rel}: lists {name}, which the finished run {held}")
        dropped = sorted(set(covered) - set(checkpoint.parts))
        if dropped:
            raise CheckFailed(f"{rel}: leaves out {dropped[0]}, which the checkpoint before it lists")
        outputs = [name for name in checkpoint.parts if name.startswith(f"{layout.OUTPUTS}/")]
        logs = {name for name in checkpoint.parts if name.startswith(f"{layout.LOG}/")}
        unpaired = sorted(out for out in outputs if out.replace(layout.OUTPUTS, layout.LOG, 1).replace(
            ".parquet", ".jsonl") not in logs)  # fmt: skip
        if unpaired or len(logs) != len(outputs) or len(checkpoint.parts) != len(outputs) + len(logs):
            raise CheckFailed(f"{rel}: its parts are not log and output parts in pairs")
        leaves = sorted(pair for out in outputs for pair in leaves_of[out])
        if checkpoint.episodes != len(leaves):
            raise CheckFailed(f"{rel}: {checkpoint.episodes} episodes, its {len(outputs)} parts hold {len(leaves)}")
        root = root_of_leaf_hashes([h for _eid, h in leaves])
        if root != checkpoint.merkle_root:
            raise CheckFailed(f"{rel}: merkle_root {checkpoint.merkle_root} differs from the root of the final heads "
                              f"of the {len(leaves)} episodes it covered ({root})")  # fmt: skip
        statuses.add(signature_status(rel, checkpoint, public_key))
        prev, covered = checkpoint_hash(checkpoint), checkpoint.parts
    return f"{len(found)} checked ({', '.join(sorted(statuses))})"


def check_anchored_checkpoints(run: layout.RunDir, ledger: Ledger, record: Record) -> str:
    """The run's checkpoints against the ledger: each one anchored there with its hash, the run's digest and its
    root; every checkpoint of the run the ledger anchors still in the run. When the ledger anchors none, they
    must all be there if the run was made with this ledger as ``run.ledger``."""
    name = run_name(run.path)
    anchored = {line.entry.run: line for line in ledger.lines if line.entry.run.startswith(f"{name}/checkpoint-")}
    found = read_checkpoints(run)
    configured = read_config(run).get("run", {}).get("ledger")
    required = bool(anchored) or (configured is not None and Path(configured).resolve() == ledger.path.resolve())
    checked = 0
    for rel, checkpoint in found:
        line = anchored.pop(checkpoint_name(run.path, checkpoint.seq), None)
        if line is None:
            if required:
                raise CheckFailed(f"{rel}: not anchored at {ledger.path}, which anchors the run's checkpoints")
            continue
        for field, mine in (("seal", checkpoint_hash(checkpoint)), ("digest", record.digest),
                            ("merkle_root", checkpoint.merkle_root)):  # fmt: skip
            if getattr(line.entry, field) != mine:
                raise CheckFailed(f"{rel}: anchored at {ledger.path} line {line.number} with {field} "
                                  f"{getattr(line.entry, field)}; the checkpoint's is {mine}")  # fmt: skip
        checked += 1
    if anchored:
        line = min(anchored.values(), key=lambda x: x.number)
        raise CheckFailed(f"{ledger.path}:{line.number}: anchors {line.entry.run}, which the run does not hold: "
                          "the run was rewritten after it")  # fmt: skip
    return f"{checked} of {len(found)} checkpoints anchored"
