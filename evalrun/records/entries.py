"""What a chain's model entries record of a request: one definition for the harness that writes
them and the replay engine that matches recorded calls against new requests."""

from __future__ import annotations

from typing import Any, Protocol

from evalrun.records.canonical import sha256_hex


class SamplingRecord(Protocol):
    def as_record(self) -> dict[str, Any]: ...


def request_fields(prompt: str, sampling: SamplingRecord) -> dict[str, Any]:
    """What a model entry records of a generation request; its canonical JSON is hashed into ``request_hash``."""
    return {"prompt": prompt, "prompt_sha256": sha256_hex(prompt), "sampling": sampling.as_record()}


def loglikelihood_fields(context: str, continuation: str) -> dict[str, Any]:
    """What a model entry records of a loglikelihood request."""
    return {
        "continuation": continuation,
        "op": "loglikelihood",
        "prompt": context,
        "prompt_sha256": sha256_hex(context),
    }
