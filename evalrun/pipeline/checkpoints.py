"""Checkpoints while a run generates: every ``run.checkpoint_every_parts`` parts and/or ``run.checkpoint_every_s``
seconds, the driver commits what is durable by then (records.formats.Checkpoint: the parts' hashes, their episodes'
count and Merkle root), signed when ``EVALRUN_SIGNING_KEY`` is set, and appends it to ``run.ledger`` when one is
given (``RUN/checkpoint-SEQ``, in the format ``evalrun anchor`` writes). A resumed run goes on from the checkpoints
it finds, which must list only parts it keeps. verify recomputes every checkpoint from the finished run's heads
(evalrun.audit.verify). See docs/design.md "Checkpoints".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from evalrun.config import RunConfig
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline import failpoints
from evalrun.records.chain import GENESIS
from evalrun.records.formats import Checkpoint, checkpoint_hash
from evalrun.records.heads import Heads
from evalrun.rundir import layout, ledger
from evalrun.rundir.checkpoints import checkpoint_name, read_checkpoints, write_checkpoint


class Checkpointer:
    """Told of each part once it is durable (in the part writer's committer thread), it commits a checkpoint when
    one is due. ``heads`` are the part writer's, of its durable parts (a resumed run's kept ones among them), read,
    never copied: a run holds its heads once. ``kept_files`` are a resumed run's parts on disk: their files'
    hashes."""

    def __init__(self, run: layout.RunDir, digest: str, settings: RunConfig, key: Path | None, heads: Heads,
                 kept_files: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.run, self.digest, self.key, self.clock = run, digest, key, clock
        self.every_parts, self.every_s = settings.checkpoint_every_parts, settings.checkpoint_every_s
        self.ledger = Path(settings.ledger) if settings.ledger is not None else None
        self.heads = heads
        self.files = dict(kept_files or {})
        self.seq, self.prev = 0, GENESIS
        for rel, found in read_checkpoints(run):  # a resumed run's: they must list only parts it keeps
            lost = sorted(name for name, sha in found.parts.items() if self.files.get(name) != sha)
            if lost:
                raise BadInput(rel, f"lists {lost[0]}, which this run does not keep as it was: the run directory "
                                    "was altered")  # fmt: skip
            self.seq, self.prev = found.seq + 1, checkpoint_hash(found)
        self.parts_since = 0
        self.last = clock()

    @property
    def enabled(self) -> bool:
        return self.every_parts is not None or self.every_s is not None

    def committed(self, files: Mapping[str, str]) -> None:
        """A part is durable (its episodes' heads are in ``heads`` by now): its files' hashes; commit a checkpoint
        if one is due."""
        self.files.update(files)
        self.parts_since += 1
        due_parts = self.every_parts is not None and self.parts_since >= self.every_parts
        due_time = self.every_s is not None and self.clock() - self.last >= self.every_s
        if due_parts or due_time:
            self.commit()

    def commit(self) -> Checkpoint:
        """Write the checkpoint of everything durable now (and anchor it in the ledger)."""
        root = self.heads.merkle_root()
        checkpoint = Checkpoint(
            seq=self.seq, prev=self.prev, digest=self.digest, episodes=len(self.heads), parts=dict(sorted(
                self.files.items())), merkle_root=root, created_at=datetime.now(timezone.utc).isoformat(
                timespec="seconds"),
        )  # fmt: skip
        written = write_checkpoint(self.run, checkpoint, self.key)
        if self.ledger is not None:
            name = checkpoint_name(self.run.path, checkpoint.seq)
            try:
                ledger.append(self.ledger, name, checkpoint_hash(written), self.digest, root, what="checkpoint")
            except CheckFailed as exc:  # a ledger whose chain is broken, or that anchors this name otherwise
                raise BadInput("run.ledger", str(exc)) from exc
        self.seq, self.prev = checkpoint.seq + 1, checkpoint_hash(written)
        self.parts_since, self.last = 0, self.clock()
        failpoints.hit(f"after-checkpoint-{checkpoint.seq}")
        return written
