"""Worker provenance (docs/design.md "Worker provenance"): what every engine worker reports about
itself, and drift, a worker that differs from the run's first worker in what can change results.

A worker's report (``EngineWorker.info()``) is provenance: it is kept out of every hash chain. Its
fingerprint is the part that can change what a model computes: engine name and version, library
versions, Python, hardware (CPU model; GPU model, capability, driver and CUDA version) and the
determinism settings honoured. Counts (cores, GPUs) and names (host, pid) are left out: they
differ between identical workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

GPU_FIELDS = ("name", "capability", "driver", "cuda")


def hardware_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's hardware fingerprint (workers report it as canonical JSON text)."""
    hardware = info.get("hardware") or {}
    return json.loads(hardware) if isinstance(hardware, str) else dict(hardware)


def fingerprint(info: Mapping[str, Any]) -> dict[str, Any]:
    """What of a worker's report can change results; equal fingerprints, interchangeable workers."""
    hardware = hardware_of(info)
    gpu = hardware.get("gpu")
    engine = info.get("engine") or {}
    return {
        "engine": {"name": engine.get("name"), "version": engine.get("version")},
        "libraries": dict(info.get("libraries") or {}),
        "python": info.get("python"),
        "hardware": {
            "machine": hardware.get("machine"),
            "cpu": hardware.get("cpu"),
            "gpu": None if gpu is None else {k: gpu.get(k) for k in GPU_FIELDS},
        },
        "determinism": dict((info.get("determinism") or {}).get("honoured") or {}),
    }


def _differences(expected: Any, found: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(dotted field, expected, found) for every leaf that differs; a mapping against a non-mapping
    (no GPU against a GPU) is one difference."""
    if isinstance(expected, Mapping) and isinstance(found, Mapping):
        for key in [*expected, *(k for k in found if k not in expected)]:
            yield from _differences(expected.get(key), found.get(key), f"{path}.{key}" if path else str(key))
    elif expected != found:
        yield path, expected, found


@dataclass(frozen=True)
class Drift:
    """One field in which ``worker`` differs from ``reference``, the run's first worker."""

    worker: str
    reference: str
    field: str  # dotted: engine.version, libraries.torch, hardware.gpu.name, determinism.batch_invariant
    expected: Any
    found: Any

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> str:
        return (
            f"worker {self.worker} differs from {self.reference} in {self.field}: "
            f"{json.dumps(self.found)} instead of {json.dumps(self.expected)}"
        )


def drift(reference: Mapping[str, Any], info: Mapping[str, Any]) -> list[Drift]:
    """Every fingerprint field in which ``info`` differs from ``reference``, in field order."""
    worker, first = str(info.get("worker")), str(reference.get("worker"))
    return [Drift(worker, first, *d) for d in _differences(fingerprint(reference), fingerprint(info), "")]


def worker_record(info: Mapping[str, Any]) -> dict[str, Any]:
    """A worker as the manifest and record.json list it: its name, the hardware text every output row
    carries, its fingerprint (and its batch-invariance canary, when it ran one)."""
    canary = {"canary": info["canary"]} if "canary" in info else {}
    return {"worker": info["worker"], "hardware": info["hardware"], **fingerprint(info), **canary}


class DriftStopped(Exception):
    """A worker drifted under ``run.on_drift=fail``."""

    def __init__(self, drifts: Sequence[Drift]) -> None:
        self.drifts = list(drifts)
        more = f" (and {len(drifts) - 1} more fields)" if len(drifts) > 1 else ""
        super().__init__(f"{drifts[0].message()}{more}")


class WorkerWatch:
    """The workers that served a run, in the order they were first seen, and their drift from the first.

    ``fail``: a drifting worker raises :class:`DriftStopped`; ``warn``: its drift is kept (and given to
    ``on_warning``) and the run goes on.
    """

    def __init__(self, policy: str, on_warning: Callable[[Drift], None] = lambda d: None) -> None:
        self.policy = policy
        self.on_warning = on_warning
        self.workers: dict[str, dict[str, Any]] = {}  # name -> worker_record
        self.drift: list[Drift] = []
        self._first: Mapping[str, Any] | None = None

    def see(self, info: Mapping[str, Any]) -> None:
        name = str(info["worker"])
        if name in self.workers:
            return
        found = drift(self._first, info) if self._first is not None else []
        if found and self.policy == "fail":
            raise DriftStopped(found)
        self._first = self._first or info
        self.workers[name] = worker_record(info)
        self.drift.extend(found)
        for d in found:
            self.on_warning(d)

    def as_record(self) -> dict[str, Any]:
        return {"workers": list(self.workers.values()), "drift": [d.as_record() for d in self.drift]}
