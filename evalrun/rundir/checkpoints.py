"""Checkpoints, the store: RUN_DIR/checkpoints/checkpoint-SEQ.json (:class:`~evalrun.records.formats.Checkpoint`),
each written atomically (temporary name, fsync, rename, directory fsync) and signed when a signing key is set;
read back whole and checked for form (a file that is not one names itself)."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from pydantic import ValidationError

from evalrun.errors import CheckFailed
from evalrun.records.canonical import canonical_json
from evalrun.records.formats import CHECKPOINT_PAYLOAD_TYPE, Checkpoint, first_error
from evalrun.rundir import attest, layout, writer
from evalrun.rundir.ledger import run_name


def checkpoint_name(run_path: Path, seq: int) -> str:
    """The name a run's checkpoint is anchored under in a ledger: ``RUN/checkpoint-SEQ`` (RUN the directory's
    name, as the run itself is anchored)."""
    return f"{run_name(run_path)}/checkpoint-{seq:06d}"


def write_checkpoint(run: layout.RunDir, checkpoint: Checkpoint, key_path: Path | None) -> Checkpoint:
    """Write ``checkpoint`` (signed with ``key_path`` when given) as the run's checkpoint of its seq."""
    if key_path is not None:
        signature = attest.sign(key_path, CHECKPOINT_PAYLOAD_TYPE, signed_bytes(checkpoint))
        checkpoint = checkpoint.model_copy(update={"signature": signature})
    run.checkpoints.mkdir(exist_ok=True)
    writer.write_json(run.checkpoint(checkpoint.seq), checkpoint)
    return checkpoint


def signed_bytes(checkpoint: Checkpoint) -> bytes:
    """What a checkpoint's signature signs: the canonical JSON of its claims."""
    return canonical_json(checkpoint.claims()).encode("utf-8")


def read_checkpoints(run: layout.RunDir) -> list[tuple[str, Checkpoint]]:
    """Every checkpoint of the run in seq order, each with its path relative to the run; CheckFailed naming a
    file that is not a checkpoint."""
    found = []
    for path in run.checkpoint_files():
        rel = path.relative_to(run.path).as_posix()
        try:
            found.append((rel, Checkpoint.model_validate(json.loads(path.read_bytes()))))
        except ValidationError as exc:
            field, message = first_error(exc)
            raise CheckFailed(f"{rel}: not a checkpoint of an evalrun run (field {field}: {message})") from None
        except (OSError, ValueError) as exc:
            raise CheckFailed(f"{rel}: not a checkpoint of an evalrun run ({exc})") from None
    return found


def signature_status(rel: str, checkpoint: Checkpoint, public_key: Path | None) -> str:
    """signed, not checked | signature checked | unsigned; CheckFailed when a given key does not verify it."""
    if checkpoint.signature is None:
        if public_key is not None:
            raise CheckFailed(f"{rel}: not signed, but a public key was given")
        return "unsigned"
    if public_key is None:
        return "signed, not checked"
    try:
        signature = base64.b64decode(checkpoint.signature.sig, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CheckFailed(f"{rel}: malformed signature ({exc})") from None
    if not attest.signature_valid(public_key, CHECKPOINT_PAYLOAD_TYPE, signed_bytes(checkpoint), [signature]):
        raise CheckFailed(f"{rel}: its signature does not verify with the given public key")
    return "signature checked"
