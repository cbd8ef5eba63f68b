"""A served run survives its server's faults and loses nothing to them.

Through a proxy in front of the session's real vLLM server, one run meets every fault the client handles (a 429
with Retry-After, a 500, a 503, a 200 that is not JSON, a connection dropped without an answer, an answer held
back past the client's timeout): each is retried, the run finishes with the rows and Merkle root of a run that met
none (the slow request reached the server twice and was written once), and record.json counts each fault by its
kind, the retries and the concurrency limit's cuts. A second real server, killed outright (SIGKILL of its process
group) once two parts are committed, stops the run resumably (CheckFailed naming `evalrun resume`, no
record.json); restarted on the same port, `resume` finishes the run with the records of a run it never met, and no
server process is left behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import SERVED
from helpers.proxy import FaultProxy
from helpers.runs import output_columns, run_alone

from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.engines.server import VLLMServer
from evalrun.errors import CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, open_for, prepare, resume, worker_spec

pytestmark = pytest.mark.e2e

FAULTS = ("http_429", "http_500", "http_503", "malformed", "drop", "slow")
COUNTED_AS = {"http_429": "http_429", "http_500": "http_500", "http_503": "http_503", "malformed": "malformed",
              "drop": "connection", "slow": "timeout"}  # fmt: skip


def _record(run: Path) -> dict:
    return json.loads((run / "record.json").read_text())


def _assert_same_records(run: Path, clean: Path) -> None:
    rows = output_columns(run)
    assert len(rows) == 20 and len({r[0] for r in rows}) == 20  # every episode, each once
    assert rows == output_columns(clean)  # text, token ids and logprobs
    assert _record(run)["merkle_root"] == _record(clean)["merkle_root"]
    assert verify_run(run).scores == "recomputed"


def test_every_fault_is_retried_counted_once_and_leaves_the_records_of_a_clean_run(
    served: Dispatcher, tmp_path: Path
) -> None:
    proxy = FaultProxy(served.worker.engine.identity.base_url, slow_s=6.0)
    try:
        url = ("engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder",
               "engine.timeout_s=3", "engine.max_retries=6", "engine.max_concurrency=4",
               "cluster.batch_size=5")  # fmt: skip
        proxy.faults.extend(FAULTS)
        run = run_alone(prepare(load([*SERVED, *url, f"run.root={tmp_path / 'faults'}"])))
        assert not proxy.faults and proxy.given == dict.fromkeys(FAULTS, 1)
        assert proxy.forwarded == 20 + 1  # the slow request's answer came too late: it reached the server twice
        clean = run_alone(prepare(load([*SERVED, *url, f"run.root={tmp_path / 'clean'}"])))
        assert proxy.forwarded == 21 + 20
    finally:
        proxy.close()
    _assert_same_records(run, clean)
    served_record = _record(run)["dispatch"]["served"]
    assert served_record["faults"] == {COUNTED_AS[f]: 1 for f in FAULTS}
    assert served_record["retries"] == len(FAULTS)
    assert served_record["limit_changes"] >= 1  # the 429 and the 503 halve the limit (while it is above 1)
    assert _record(clean)["dispatch"]["served"] == {"faults": {}, "retries": 0, "limit_changes": 0}


def _group_gone(pgid: int, within_s: float = 10.0) -> bool:
    """No process of the process group ``pgid`` is left (waiting up to ``within_s`` for reaping)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_a_server_killed_mid_run_stops_it_resumably_and_a_restarted_one_finishes_it(
    served: Dispatcher, tmp_path: Path
) -> None:
    """One request at a time, so that the kill (before the 11th request is relayed) comes after exactly two
    batches of five were answered. The server killed is the session's own (the last test to use it), restarted on
    its port and handed back to the fixture, which stops it: one server start, not two."""
    spec = worker_spec(load([*SERVED, "engine=vllm_server"]))  # as engine=vllm_server starts the session's server
    settings = spec.engine.as_record()
    assert settings == served.worker.engine.describe()["settings"]
    model = Path(spec.model_path)
    name = settings.get("served_model") or model.name
    for_server = {**settings, "dtype": settings.get("dtype") or spec.model_dtype}
    servers = [served.worker.engine._server]
    port = int(servers[0].base_url.removesuffix("/v1").rsplit(":", 1)[1])
    proxy = FaultProxy(servers[0].base_url)
    killed: list[int] = []

    def kill_at_the_eleventh(forwarded: int) -> None:
        if forwarded == 11 and not killed:
            process = servers[-1].process
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            killed.append(process.pid)

    try:
        url = ("engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder",
               "engine.timeout_s=10", "engine.max_retries=1", "engine.max_concurrency=1",
               "cluster.batch_size=5")  # fmt: skip
        prepared = prepare(load([*SERVED, *url, f"run.root={tmp_path / 'killed'}"]))
        client = open_for(prepared)
        try:
            proxy.on_forward = kill_at_the_eleventh
            with pytest.raises(CheckFailed, match=r"no answer after 2 tries.*evalrun resume") as caught:
                execute(prepared, client)
            assert killed == [servers[0].process.pid] and _group_gone(servers[0].process.pid)
            (run,) = (tmp_path / "killed").iterdir()
            assert str(run) in str(caught.value) and not (run / "record.json").exists()
            assert len(list((run / "outputs").iterdir())) == 2  # the two batches answered before the kill
            proxy.on_forward = None
            servers.append(VLLMServer.start(model, name, for_server, port=port))  # the same port: the same URL
            served.worker.engine._server = servers[-1]  # the fixture stops it
            assert servers[-1].base_url == servers[0].base_url
            before = proxy.forwarded
            resume(run, [], client)
            assert proxy.forwarded - before == 10  # only the missing episodes
        finally:
            client.close()
        clean = run_alone(prepare(load([*SERVED, *url, f"run.root={tmp_path / 'clean'}"])))
    finally:
        proxy.close()
    assert servers[0].process.poll() is not None and _group_gone(servers[0].process.pid)  # the killed one is gone
    _assert_same_records(run, clean)
    served_record = _record(run)["dispatch"]["served"]
    assert served_record["faults"].keys() == {"connection"} and served_record["faults"]["connection"] >= 2
    assert served_record["retries"] >= 1
