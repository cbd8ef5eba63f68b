"""What a careful forger does after editing a run's files: every hash record.json lists, the manifest's hash, the
digest, the seal and the attestation made to match again, so that only what verify recomputes can tell."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalrun.records.canonical import file_sha256
from evalrun.records.formats import Record, seal_of
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record


def reseal(path: Path) -> str:
    """Re-seal the run at ``path`` over its files as they are now; returns the new seal."""
    run = layout.RunDir(path)
    record = load_record(run)
    manifest = json.loads(run.manifest.read_text())
    files = {rel: file_sha256(path / rel) for rel in record.files}
    forged = Record.model_validate({**record.as_record(), "files": files, "manifest_sha256": files[layout.MANIFEST],
                                    "digest": manifest["digest"]["digest"]})  # fmt: skip
    forged = forged.model_copy(update={"seal": seal_of(forged)})
    writer.write_json(run.record, forged)
    write_attestation(run, forged, None)
    assert forged.seal is not None
    return forged.seal


def set_field(dotted: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of a manifest (or any JSON object): the field at ``dotted`` (``model.id``) set to ``value``."""

    def edit(record: dict[str, Any]) -> None:
        *parents, last = dotted.split(".")
        target = record
        for key in parents:
            target = target[key]
        target[last] = value

    return edit
