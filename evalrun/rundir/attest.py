"""In-toto Statement v1 for a finished run, optionally signed with Ed25519 in a DSSE envelope.

``RUN_DIR/attestation.intoto.json`` holds either the Statement itself (unsigned) or a DSSE
envelope (https://github.com/secure-systems-lab/dsse) whose payload is the Statement. Subjects
are record.json and every file record.json lists, each with its sha256; the predicate carries the
manifest digest and the Merkle root. Signing needs ``cryptography`` and a PEM Ed25519 private key
(``openssl genpkey -algorithm ed25519 -out key.pem``; public half: ``openssl pkey -in key.pem
-pubout -out key.pub``); ``evalrun run`` signs when ``EVALRUN_SIGNING_KEY`` names such a key.
The Statement, its predicate and the envelope are typed in :mod:`evalrun.records.formats`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json, file_sha256, sha256_hex
from evalrun.records.formats import (
    PAYLOAD_TYPE,
    AttestationPredicate,
    Envelope,
    Record,
    Signature,
    Statement,
    Subject,
    SubjectDigest,
    first_error,
)
from evalrun.rundir import layout, writer
from evalrun.rundir.layout import ATTESTATION
from evalrun.rundir.reader import load_record

SIGNING_KEY_ENV = "EVALRUN_SIGNING_KEY"


def build_statement(run: layout.RunDir, record: Record) -> Statement:
    files = [(layout.RECORD, file_sha256(run.record)), *sorted(record.files.items())]
    predicate = AttestationPredicate(
        merkle_root=record.merkle_root, digest=record.digest, manifest_sha256=record.manifest_sha256,
        episodes=record.episodes, record_format=record.format,
    )  # fmt: skip
    subject = [Subject(name=name, digest=SubjectDigest(sha256=sha)) for name, sha in files]
    return Statement(subject=subject, predicate=predicate)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _load_key(path: Path, private: bool) -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - cryptography ships with the dev environment
        raise BadInput(str(path), "signing needs the 'cryptography' package (pip install cryptography)") from exc
    try:
        data = path.read_bytes()
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))  # fmt: skip
    except (OSError, ValueError, TypeError) as exc:
        raise BadInput(str(path), f"expected a PEM Ed25519 {'private' if private else 'public'} key ({exc})") from exc
    wanted = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    if not isinstance(key, wanted):
        raise BadInput(str(path), f"expected an Ed25519 key, got {type(key).__name__}")
    return key


def _keyid(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)


def signing_key() -> Path | None:
    """The private key ``EVALRUN_SIGNING_KEY`` names: what signs a run's attestation and its checkpoints."""
    key = os.environ.get(SIGNING_KEY_ENV)
    return Path(key) if key else None


def sign(key_path: Path, payload_type: str, payload: bytes) -> Signature:
    """An Ed25519 signature of the DSSE pre-authentication encoding of ``payload``, with the key's id."""
    key = _load_key(key_path, private=True)
    signature = key.sign(pae(payload_type, payload))
    return Signature(keyid=_keyid(key.public_key()), sig=base64.b64encode(signature).decode("ascii"))


def signature_valid(public_key: Path, payload_type: str, payload: bytes, signatures: list[bytes]) -> bool:
    """Whether one of ``signatures`` verifies over ``payload`` with the PEM Ed25519 public key."""
    from cryptography.exceptions import InvalidSignature

    key = _load_key(public_key, private=False)
    message = pae(payload_type, payload)
    for sig in signatures:
        try:
            key.verify(sig, message)
            return True
        except InvalidSignature:
            continue
    return False


def write_attestation(run: layout.RunDir, record: Record, key_path: Path | None = None) -> Path:
    """Write the attestation for a finished run (record.json already written)."""
    statement = build_statement(run, record)
    document: Statement | Envelope = statement
    if key_path is not None:
        payload = canonical_json(statement.as_record()).encode("utf-8")
        document = Envelope(payloadType=PAYLOAD_TYPE, payload=base64.b64encode(payload).decode("ascii"),
                            signatures=[sign(key_path, PAYLOAD_TYPE, payload)])  # fmt: skip
    path = run.path / ATTESTATION
    writer.write_json(path, document)
    return path


def attest_finished_run(run_path: Path) -> Path:
    """Called by the runner after record.json: sign when ``EVALRUN_SIGNING_KEY`` names a key."""
    run = layout.RunDir(run_path)
    return write_attestation(run, load_record(run), signing_key())


def _fail(message: str) -> CheckFailed:
    return CheckFailed(f"{ATTESTATION}: {message}")


def check_attestation(run: layout.RunDir, record: Record, public_key: Path | None) -> str:
    """Check the attestation against the run (whose files are already verified); returns its status."""
    path = run.path / ATTESTATION
    if not path.exists():
        if public_key is not None:
            raise _fail("missing, but a public key was given to check its signature")
        return "absent"
    if public_key is not None:
        _load_key(public_key, private=False)  # a bad key file is named before the attestation is read
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(f"not valid JSON ({exc})") from exc
    signed = isinstance(document, dict) and "payloadType" in document
    status = "checked"
    if signed:
        try:
            envelope = Envelope.model_validate(document)
            payload = base64.b64decode(envelope.payload, validate=True)
            signatures = [base64.b64decode(s.sig, validate=True) for s in envelope.signatures]
            statement = json.loads(payload)
        except ValidationError as exc:
            field, message = first_error(exc)
            raise _fail(f"malformed DSSE envelope (field {field}: {message})") from None
        except (binascii.Error, ValueError) as exc:
            raise _fail(f"malformed DSSE envelope ({exc})") from exc
        if envelope.payloadType != PAYLOAD_TYPE:
            raise _fail(f"payloadType {envelope.payloadType!r}, expected {PAYLOAD_TYPE!r}")
        status = "signed, signature not checked"
        if public_key is not None:
            if not signature_valid(public_key, PAYLOAD_TYPE, payload, signatures):
                raise _fail("no signature verifies with the given public key")
            status = "signature checked"
    elif public_key is not None:
        raise _fail("not signed, but a public key was given")
    else:
        statement = document
    expected = build_statement(run, record)
    try:
        stated = Statement.model_validate(statement)
    except ValidationError as exc:
        field, message = first_error(exc)
        raise _fail(f"not an in-toto Statement of an evalrun run (field {field}: {message})") from None
    if stated.subject != expected.subject:
        names = {s.name: s.digest for s in expected.subject}
        got = {s.name: s.digest for s in stated.subject}
        differing = sorted(n for n in names.keys() | got.keys() if names.get(n) != got.get(n))
        raise _fail(f"subject {differing[0] if differing else '?'} does not match the run's files")
    if stated.predicate != expected.predicate:
        raise _fail("predicate does not match record.json (merkle_root, digest, episodes)")
    return status
