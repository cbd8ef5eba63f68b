"""Served models on a real server: ``engine=vllm_server`` starts vLLM's OpenAI-compatible server of the pinned
default model on 127.0.0.1 (once for the module: about 80-100 s on 2 cores), and ``engine=openai`` runs against
it by URL. The default task through the server gives the offline engine's tokens and logprobs bit for bit; every
model entry keeps what the server said of itself; the runs verify, replay (no server needed) and rescore
exactly; a URL where nothing listens, or a server serving another model, is refused before any episode."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.engines.server import free_port
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, open_for, prepare

pytestmark = pytest.mark.e2e

SERVED = ("cluster=inline", "run.progress=false", "determinism.canary=false", "limit=20")


@pytest.fixture(scope="module")
def server() -> Iterator[Dispatcher]:
    """An inline worker whose engine started a vLLM server of the default model (engine=vllm_server)."""
    d = open_for(prepare(load([*SERVED, "engine=vllm_server", "limit=1"])))
    yield d
    d.close()
    assert d.worker.engine._server is None  # stopped


def _base_url(server: Dispatcher) -> str:
    return server.worker.engine.base_url


def _model_entries(run: Path) -> list[dict]:
    return [entry for path in sorted((run / "log").iterdir()) for line in path.read_text().splitlines()
            if (entry := json.loads(line))["kind"] == "model"]  # fmt: skip


def _columns(run: Path) -> list[tuple]:
    rows = pq.read_table(run / "outputs", columns=["episode_id", "output", "token_ids", "token_logprobs"])
    return sorted(tuple(map(str, r.values())) for r in rows.to_pylist())


def test_a_served_run_gives_the_offline_engines_tokens_and_records_the_server(
    server: Dispatcher, run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    served = execute(prepare(load([*SERVED, "engine=vllm_server", f"run.root={tmp_path / 'served'}"])), server)
    # the offline engine in the session's Ray worker (an in-process vLLM engine shares vLLM's process-wide state
    # with every other one the session made and closed)
    offline = run_eval("limit=20")
    assert _columns(served) == _columns(offline)  # text, token ids and logprobs, bit for bit
    entries = _model_entries(served)
    assert len(entries) == 20 and all(e["response"]["server"]["model"] == "tiny-adder" for e in entries)
    assert all(e["response"]["server"]["system_fingerprint"].startswith("vllm-0.32.0-") for e in entries)
    manifest = json.loads((served / "manifest.json").read_text())
    engine = manifest["engine"]
    assert engine["name"] == "openai" and engine["server"]["model"] == "tiny-adder"
    assert engine["server"]["max_model_len"] == 128 and manifest["model"]["pinned"] is True
    assert verify_run(served).scores == "recomputed"
    replayed = replay_run(served, [])
    assert replayed.reproduced == 20 and not replayed.divergences and replayed.root_matches
    assert replayed.scores_identical and rescore_run(served, []).bytes_identical


def test_a_server_evalrun_did_not_start_is_reached_by_its_url(server: Dispatcher, tmp_path: Path) -> None:
    """engine=openai to the same server by URL: a dispatcher of its own, no model loaded in this process; the
    same tokens as through the started server."""
    url = ("engine=openai", f"engine.base_url={_base_url(server)}", "engine.served_model=tiny-adder")
    config = load([*SERVED, *url, f"run.root={tmp_path}", "decoding=sample", "seeds=five", "limit=4"])
    prepared = prepare(config)
    client = open_for(prepared)  # the server answers and serves the model
    try:
        first = execute(prepared, client)
        again = execute(prepare(load([*SERVED, *url, f"run.root={tmp_path / 'again'}", "decoding=sample",
                                      "seeds=five", "limit=4"])), client)  # fmt: skip
    finally:
        client.close()
    assert _columns(first) == _columns(again)  # seeded sampling, request by request: repeatable
    assert verify_run(first).scores == "recomputed"


def test_nothing_listening_or_another_model_is_refused_before_any_episode(server: Dispatcher) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BadInput, match="no server answers") as caught:
        open_for(prepare(load([*SERVED, "engine=openai", f"engine.base_url={nobody}"])))
    assert caught.value.where == "engine.base_url"
    with pytest.raises(BadInput, match=r"serves \['tiny-adder'\], not 'other'") as caught:
        open_for(prepare(load([*SERVED, "engine=openai", f"engine.base_url={_base_url(server)}",
                               "engine.served_model=other"])))  # fmt: skip
    assert caught.value.where == "engine.served_model"
    with pytest.raises(BadInput, match="engine=openai needs the server's URL") as caught:
        load(["engine=openai"])
    assert caught.value.where == "engine.base_url"


class FlakyProxy:
    """A forwarding proxy in front of the real server (a test double for the one thing it isolates: a server
    that goes away): it forwards every request until ``fail_after`` completions went through, then drops the
    connection on each one until healed."""

    def __init__(self, target: str, fail_after: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import httpx

        self.fail_after, self.forwarded, self.dropped = fail_after, 0, 0
        proxy, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                if method == "POST":
                    with lock:
                        down = proxy.fail_after is not None and proxy.forwarded >= proxy.fail_after
                        proxy.dropped += down
                        proxy.forwarded += not down
                    if down:
                        self.connection.close()
                        return
                answer = httpx.request(method, target.removesuffix("/v1") + self.path, content=body,
                                       headers={"Content-Type": "application/json"}, timeout=120)  # fmt: skip
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def do_GET(self) -> None:
                self._relay("GET")

            def do_POST(self) -> None:
                self._relay("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_server_that_goes_away_stops_the_run_resumably_and_resume_finishes_it(
    server: Dispatcher, tmp_path: Path
) -> None:
    """The server stops answering after 10 of 20 requests: the run stops (exit 1, naming `evalrun resume`) with its
    first parts committed; resumed once the server is back, it runs only the missing episodes and ends with the
    records a run without the fault makes."""
    from evalrun.errors import CheckFailed
    from evalrun.pipeline.runner import resume

    proxy = FlakyProxy(_base_url(server), fail_after=10)
    try:
        flaky = ("engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder",
                 "engine.max_retries=1", "engine.max_concurrency=5", "cluster.batch_size=5")  # fmt: skip
        prepared = prepare(load([*SERVED, *flaky, f"run.root={tmp_path / 'flaky'}"]))
        client = open_for(prepared)
        try:
            with pytest.raises(CheckFailed, match=r"no answer after 2 tries.*evalrun resume") as caught:
                execute(prepared, client)
            assert proxy.dropped >= 2 and proxy.forwarded == 10
            (run,) = (tmp_path / "flaky").iterdir()
            assert str(run) in str(caught.value) and not (run / "record.json").exists()
            kept = len(list((run / "outputs").iterdir()))
            assert kept == 2  # the two batches the server answered, committed
            proxy.fail_after = None  # the server is back
            resume(run, [], client)
        finally:
            client.close()
        clean_run = prepare(load([*SERVED, *flaky, f"run.root={tmp_path / 'clean'}"]))
        clean_client = open_for(clean_run)
        try:
            clean = execute(clean_run, clean_client)
        finally:
            clean_client.close()
    finally:
        proxy.close()
    assert proxy.forwarded == 10 + 10 + 20  # nothing sent twice that was answered: the resume sent the other 10
    assert verify_run(run).scores == "recomputed"
    assert _columns(run) == _columns(clean)
    record, again = (json.loads((r / "record.json").read_text())["merkle_root"] for r in (run, clean))
    assert record == again
