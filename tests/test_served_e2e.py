"""Served models on a real server: ``engine=vllm_server`` starts vLLM's OpenAI-compatible server of the pinned
default model on 127.0.0.1 (once for the module: about 80-100 s on 2 cores), and ``engine=openai`` runs against
it by URL. The default task through the server gives the offline engine's tokens and logprobs bit for bit; every
model entry keeps what the server said of itself; the runs verify, replay (no server needed) and rescore
exactly; a URL where nothing listens, or a server serving another model, is refused before any episode."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
from evalrun.pipeline.runner import check_before_engine, execute, open_for, prepare

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
    server: Dispatcher, inline_dispatcher: Dispatcher, tmp_path: Path
) -> None:
    served = execute(prepare(load([*SERVED, "engine=vllm_server", f"run.root={tmp_path / 'served'}"])), server)
    offline = execute(
        prepare(load(["cluster=inline", "run.progress=false", "limit=20", f"run.root={tmp_path / 'offline'}"])),
        inline_dispatcher,
    )  # its own canary setting
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
    check_before_engine(config)  # the server answers and serves the model
    prepared = prepare(config)
    client = open_for(prepared)
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
        check_before_engine(load(["engine=openai", f"engine.base_url={nobody}"]))
    assert caught.value.where == "engine.base_url"
    with pytest.raises(BadInput, match=r"serves \['tiny-adder'\], not 'other'") as caught:
        check_before_engine(load(["engine=openai", f"engine.base_url={_base_url(server)}",
                                  "engine.served_model=other"]))  # fmt: skip
    assert caught.value.where == "engine.served_model"
    with pytest.raises(BadInput, match="engine=openai needs the server's URL") as caught:
        load(["engine=openai"])
    assert caught.value.where == "engine.base_url"
