"""One instance of every exception class evalrun defines, with the fields its users read: what test_errors.py pickles
and test_worker_faults_e2e.py raises in a Ray worker."""

from __future__ import annotations

from pathlib import Path

from evalrun.engines import EngineDown, RequestRejected
from evalrun.engines.openai import ServerDown
from evalrun.engines.replay import Divergence
from evalrun.errors import BadInput, CheckFailed, Interrupted, WriteFailed
from evalrun.pipeline.dispatch import WorkersNotPlaced
from evalrun.pipeline.provenance import Drift, DriftStopped
from evalrun.pipeline.worker import EngineStartFailed
from evalrun.records.canonical import CanonicalJSONError
from evalrun.records.entries import EntryError
from evalrun.worlds.base import ToolError
from evalrun.worlds.guard import NetworkUsed, RecorderBypassed


def start_failed() -> EngineStartFailed:
    failed = EngineStartFailed("/models/m", "the vllm engine did not start on worker ray-0@h:1: OSError: gone")
    failed.remote_traceback = "Traceback (most recent call last):\n  ...\nOSError: gone\n"
    return failed


ERRORS: list[tuple[BaseException, tuple[str, ...]]] = [
    (BadInput("engine.base_url", "http://127.0.0.1:1/v1: no server answers"), ("where", "message")),
    (WriteFailed("runs/x/summary.json", "no space left on the device"), ("where", "message")),
    (CheckFailed("verify: the merkle root differs"), ()),
    (Interrupted(Path("runs/addition-1")), ("run",)),
    (start_failed(), ("where", "message", "remote_traceback")),
    (WorkersNotPlaced("cluster.num_workers", "1 of 6 workers placed"), ("where", "message")),
    (EntryError("kind", "expected one of model, tool"), ("field", "message")),
    (Divergence("ab12", 3, "a model entry", "a tool entry"), ("episode", "seq", "expected", "got")),
    (DriftStopped([Drift("ray-1", "ray-0", "engine.version", "0.32.0", "0.33.0")]), ("drifts",)),
    (CanonicalJSONError("NaN cannot be represented"), ()),
    (RequestRejected("prompt longer than the context"), ()),
    (EngineDown("the server stopped answering"), ()),
    (ServerDown("no answer through 5 retries"), ()),
    (ToolError("no invoice INV-9"), ()),
    (NetworkUsed("socket.connect inside a world"), ()),
    (RecorderBypassed("time.time inside a world"), ()),
]
