"""Worker provenance (docs/design.md "Worker provenance"): what every engine worker reports about
itself, and drift, a worker that differs from the run's first worker in what can change results.

A worker's report (``EngineWorker.info()``) is provenance: it is kept out of every hash chain. Its
fingerprint is the part that can change what a model computes: engine name and version, library
versions, Python, hardware (CPU model, flags and the instruction set its kernels ran with; GPU model,
capability, driver and CUDA version) and the determinism settings honoured. Counts (cores, GPUs) and names
(host, pid) are left out: they differ between identical workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from evalrun.engines import ServedReport
from evalrun.errors import KeepsFields
from evalrun.records.canonical import differences

GPU_FIELDS = ("name", "capability", "driver", "cuda")


def hardware_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's hardware fingerprint (workers report it as canonical JSON text)."""
    hardware = info.get("hardware") or {}
    return json.loads(hardware) if isinstance(hardware, str) else dict(hardware)


def served_by(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The (model, system_fingerprint) of every server a worker's engines reach (a served model's: the engine's
    ``servers``, docs/design.md "Served models"), each once, in order; empty for engines in the worker's process."""
    found: list[dict[str, Any]] = []
    for engine in (info.get("engine"), info.get("judge_engine"), info.get("user_engine")):
        for server in (engine or {}).get("servers") or []:
            entry = {"model": server.get("model"), "system_fingerprint": server.get("system_fingerprint")}
            if entry not in found:
                found.append(entry)
    return found


def fingerprint(info: Mapping[str, Any]) -> dict[str, Any]:
    """What of a worker's report can change results; equal fingerprints, interchangeable workers."""
    hardware = hardware_of(info)
    gpu = hardware.get("gpu")
    engine = info.get("engine") or {}
    served = served_by(info)
    engine_part = {"name": engine.get("name"), "version": engine.get("version")}
    return {
        "engine": {**engine_part, "served_by": served} if served else engine_part,
        "libraries": dict(info.get("libraries") or {}),
        "python": info.get("python"),
        "hardware": {
            "machine": hardware.get("machine"),
            "cpu": hardware.get("cpu"),
            "cpu_flags": hardware.get("cpu_flags"),
            "isa": _isa_fingerprint(hardware.get("isa")),
            "gpu": None if gpu is None else {k: gpu.get(k) for k in GPU_FIELDS},
        },
        "determinism": dict((info.get("determinism") or {}).get("honoured") or {}),
    }


def _isa_fingerprint(isa: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What of a worker's instruction set chooses its kernels: the level, torch's and vLLM's kernels (the variables
    as the process had them are shown in its report, not compared: a level sets them)."""
    return None if isa is None else {k: isa.get(k) for k in ("asked", "aten", "vllm_kernels")}


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
    return [Drift(worker, first, *d) for d in differences(fingerprint(reference), fingerprint(info))]


def worker_record(info: Mapping[str, Any]) -> dict[str, Any]:
    """A worker as the manifest and record.json list it: its name, the hardware text every output row
    carries, its fingerprint (and its batch-invariance canary, when it ran one)."""
    canary = {"canary": info["canary"]} if "canary" in info else {}
    return {"worker": info["worker"], "hardware": info["hardware"], **fingerprint(info), **canary}


class DriftStopped(KeepsFields, Exception):
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

    def __init__(self, policy: str, on_warning: Callable[[Drift], None] = lambda d: None,
                 served_reference: Sequence[Mapping[str, Any]] | None = None) -> None:  # fmt: skip
        self.policy = policy
        self.on_warning = on_warning
        self.workers: dict[str, dict[str, Any]] = {}  # name -> worker_record
        self.drift: list[Drift] = []
        self._first: Mapping[str, Any] | None = None
        # the servers the run's answers must come from (a resumed run's: its manifest's first worker's), and
        # what the served engines met (ServedReport, summed)
        self._served_reference = None if served_reference is None else [dict(s) for s in served_reference]
        self.served = ServedReport()
        self._served_seen = False

    def see(self, info: Mapping[str, Any]) -> None:
        name = str(info["worker"])
        if name in self.workers:
            return
        found = drift(self._first, info) if self._first is not None else []
        if found and self.policy == "fail":
            raise DriftStopped(found)
        self._first = self._first or info
        if self._served_reference is None:
            self._served_reference = served_by(info)
        self.workers[name] = worker_record(info)
        self.drift.extend(found)
        for d in found:
            self.on_warning(d)

    def see_served(self, worker: str, report: ServedReport | None) -> None:
        """A batch's served report: an answer from a server other than the run's (another model or
        system_fingerprint: the backend changed mid-run) is drift, handled as a drifting worker's."""
        if report is None:
            return
        self._served_seen = True
        self.served = self.served + report
        reference = self._served_reference or []
        for url, model, system_fingerprint in sorted(report.answered_by):
            found = {"model": model, "system_fingerprint": system_fingerprint}
            if found in reference:
                continue
            d = Drift(worker, f"the run's servers {json.dumps(reference)}", f"server {url}",
                      reference[0] if len(reference) == 1 else reference, found)  # fmt: skip
            if self.policy == "fail":
                raise DriftStopped([d])
            if d not in self.drift:
                self.drift.append(d)
                self.on_warning(d)

    def as_record(self) -> dict[str, Any]:
        served = {"served": self.served.as_record()} if self._served_seen else {}
        return {"workers": list(self.workers.values()), "drift": [d.as_record() for d in self.drift], **served}
