"""engine=openai against a scripted stand-in server (a test double for the one thing it isolates: what a server
answers, 429s, 500s, malformed JSON, a dropped connection): retries, the adaptive limit, refusals. The real
server is tests/test_served_e2e.py's."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from evalrun.config import MODELS_DIR
from evalrun.engines import GenerationRequest, RequestRejected, SamplingSpec
from evalrun.engines.openai import PROBE_PROMPT, OpenAIEngine, ServerDown, signed_seed
from evalrun.errors import BadInput

MODEL = MODELS_DIR / "tiny-adder"
Script = Callable[[dict[str, Any], int], tuple[int, dict[str, str], bytes]]


def completion(text: str = " 86", ids: tuple[int, ...] | None = (97, 11, 9, 2),
               fingerprint: str = "vllm-0.32.0-abcdef12") -> bytes:  # fmt: skip
    if ids is None:  # a server that gives no token ids (not vLLM)
        return json.dumps({"id": "cmpl-1", "model": "tiny-adder", "choices": [{"index": 0, "text": text,
                           "finish_reason": "stop"}], "usage": {"prompt_tokens": 10}}).encode()  # fmt: skip
    return json.dumps({"id": "cmpl-1", "model": "tiny-adder", "system_fingerprint": fingerprint,
                       "choices": [{"index": 0, "text": text, "token_ids": list(ids), "finish_reason": "stop",
                                    "logprobs": {"token_logprobs": [-0.5] * len(ids)}}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": len(ids)}}).encode()  # fmt: skip


class Stub:
    """A local HTTP server answering /v1/models, evalrun's probe (``probe``'s answer) and, for the other
    /v1/completions requests, what ``script`` says per request."""

    def __init__(self, script: Script, probe: bytes | None = None) -> None:
        self.script = script
        self.probe = probe or completion()
        self.bodies: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {}, json.dumps({"data": [{"id": "tiny-adder", "root": "x",
                                                              "max_model_len": 128}]}).encode())  # fmt: skip
                else:
                    self._send(404, {}, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("prompt") == PROBE_PROMPT:
                    self._send(200, {}, stub.probe)
                    return
                stub.bodies.append(body)
                status, headers, payload = stub.script(body, len(stub.bodies))
                if status == 0:  # drop the connection without an answer
                    self.connection.close()
                    return
                self._send(status, headers, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub() -> Iterator[Callable[..., Stub]]:
    made: list[Stub] = []

    def make(script: Script, probe: bytes | None = None) -> Stub:
        made.append(Stub(script, probe))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _engine(url: str, **settings: Any) -> OpenAIEngine:
    return OpenAIEngine(MODEL, "float32", {"base_url": url, "max_retries": 3, "timeout_s": 2.0, **settings})


def _request(seed: int = 7) -> GenerationRequest:
    return GenerationRequest("Q: 3+83\nA:", SamplingSpec(0.0, 1.0, 0, 8, ("\n",), seed, True), "e", 0)


def test_a_request_carries_its_settings_and_the_answer_keeps_the_server(stub: Callable[..., Stub]) -> None:
    server = stub(lambda body, n: (200, {}, completion()))
    engine = _engine(server.url)
    (out,) = engine.generate([_request(2**64 - 5)])
    body = server.bodies[0]
    assert body["prompt"] == "Q: 3+83\nA:" and body["seed"] == signed_seed(2**64 - 5) == -5
    assert body["stop"] == ["\n"] and body["max_tokens"] == 8 and body["logprobs"] == 0 and body["return_token_ids"]
    assert out.text == " 86" and out.token_ids == (97, 11, 9, 2) and out.logprobs == (-0.5,) * 4
    assert out.server == {"model": "tiny-adder", "system_fingerprint": "vllm-0.32.0-abcdef12"}
    (served,) = engine.describe()["servers"]
    assert served["max_model_len"] == 128 and served["system_fingerprint"] == "vllm-0.32.0-abcdef12"
    assert engine.take_report().answered_by == {(server.url, "tiny-adder", "vllm-0.32.0-abcdef12")}
    engine.close()


def test_429_with_retry_after_halves_the_limit_and_the_request_goes_through(stub: Callable[..., Stub]) -> None:
    def script(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        return (429, {"Retry-After": "0"}, b'{"error":{"message":"slow down"}}') if n == 1 else (200, {}, completion())

    engine = _engine(stub(script).url, max_concurrency=8)
    (out,) = engine.generate([_request()])
    assert out.text == " 86" and engine._pool.servers[0].limit == 5  # halved to 4, grown back by one
    report = engine.take_report()
    assert (report.faults, report.retries, report.limit_changes) == ({"http_429": 1}, 1, 1)
    assert not engine.take_report().faults  # counted once
    engine.close()


@pytest.mark.parametrize("fault", ["500", "malformed", "dropped"])
def test_server_faults_are_retried_and_a_server_that_stays_down_stops_the_run(
    stub: Callable[..., Stub], fault: str
) -> None:
    answers = {"500": (500, {}, b"oops"), "malformed": (200, {}, b"{not json"), "dropped": (0, {}, b"")}
    flaky = _engine(stub(lambda body, n: answers[fault] if n <= 2 else (200, {}, completion())).url)
    assert flaky.generate([_request()])[0].text == " 86" and flaky.retried == 2
    kind = {"500": "http_500", "malformed": "malformed", "dropped": "connection"}[fault]
    assert flaky.take_report().faults == {kind: 2}
    down = _engine(stub(lambda body, n: answers[fault]).url, max_retries=1)
    with pytest.raises(ServerDown, match="no answer after 2 tries"):
        down.generate([_request()])


def test_a_request_the_server_refuses_is_the_episodes_not_the_runs(stub: Callable[..., Stub]) -> None:
    refusal = json.dumps({"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}).encode()
    engine = _engine(stub(lambda body, n: (400, {}, refusal)).url)
    with pytest.raises(RequestRejected, match="HTTP 400: prompt too long"):
        engine.generate([_request()])
    assert engine.retried == 0


def test_a_server_serving_another_model_is_refused(stub: Callable[..., Stub], tmp_path: Path) -> None:
    server = stub(lambda body, n: (200, {}, completion()))
    with pytest.raises(BadInput, match=r"serves \['tiny-adder'\], not 'other'"):
        _engine(server.url, served_model="other")


def test_requests_stay_in_flight_across_batches_and_a_refusal_takes_its_place(stub: Callable[..., Stub]) -> None:
    """The engine queues (QueueingEngine): submitted requests go on while the harness records a batch; a request
    the server refuses comes back as its reason, for the harness to record that episode as failed."""
    from evalrun.engines import QueueingEngine

    def script(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], bytes]:
        if body["prompt"] == "too long":
            return 400, {}, json.dumps({"error": {"message": "prompt too long"}}).encode()
        return 200, {}, completion(text=body["prompt"])

    engine = _engine(stub(script).url)
    assert isinstance(engine, QueueingEngine) and engine.queue_depth == 128
    first = engine.submit([_request(), GenerationRequest("too long", _request().sampling, "f", 0)])
    second = engine.submit([GenerationRequest("next", _request().sampling, "g", 0)])
    done = engine.collect(first)
    assert done[0].text == "Q: 3+83\nA:" and done[1] == "the server refused the request: HTTP 400: prompt too long"
    assert engine.collect(second)[0].text == "next"
    engine.close()


def test_a_server_without_token_ids_is_refused_unless_evalrun_tokenizes_its_replies(stub: Callable[..., Stub]) -> None:
    """An OpenAI-compatible server that is not vLLM (SGLang, TGI, llama.cpp give no token ids): refused at the
    probe, naming the server, the missing feature and the setting, not one failed episode at a time; with
    ``engine.token_ids=local`` its replies' text is tokenized here, and logprobs that do not fit those tokens
    are left out rather than misplaced."""
    from transformers import AutoTokenizer

    from evalrun.engines import preflight

    server = stub(lambda body, n: (200, {}, completion(ids=None)), probe=completion(ids=None))
    with pytest.raises(BadInput, match=r"gives no token ids .*set engine.token_ids=local") as raised:
        preflight("openai", MODEL, {"base_url": server.url})
    assert raised.value.where == "engine.base_url" and server.bodies == []
    engine = _engine(server.url, token_ids="local")
    (reply,) = engine.generate([_request()])
    tokens = AutoTokenizer.from_pretrained(str(MODEL)).encode(" 86", add_special_tokens=False)
    assert reply.text == " 86" and list(reply.token_ids) == tokens and reply.logprobs == ()
    assert engine.describe()["token_ids"] == "local" and engine.describe()["servers"][0]["token_ids"] is False
    engine.close()


def test_a_run_scored_by_loglikelihood_needs_the_servers_prompt_logprobs(stub: Callable[..., Stub]) -> None:
    from evalrun.engines import preflight

    server = stub(lambda body, n: (200, {}, completion()))  # token ids, but no prompt logprobs
    preflight("openai", MODEL, {"base_url": server.url})  # generation only: fine
    with pytest.raises(BadInput, match=r"gives no prompt logprobs .*scores by loglikelihood"):
        preflight("openai", MODEL, {"base_url": server.url}, frozenset({"loglikelihood"}))
    # lm-eval's loglikelihood_rolling is scored in token windows, which a served engine is not sent: refused
    with pytest.raises(BadInput, match=r"rolling loglikelihood .*engine=vllm or engine=hf"):
        preflight("openai", MODEL, {"base_url": server.url}, frozenset({"loglikelihood", "loglikelihood_rolling"}))


def test_several_servers_share_the_requests_and_must_agree(stub: Callable[..., Stub]) -> None:
    one, two = (stub(lambda body, n: (200, {}, completion(text=body["prompt"]))) for _ in range(2))
    engine = _engine([one.url, two.url], max_concurrency=2)
    requests = [GenerationRequest(f"Q{i}", _request().sampling, f"e{i}", 0) for i in range(12)]
    assert [c.text for c in engine.generate(requests)] == [f"Q{i}" for i in range(12)]  # request order kept
    assert one.bodies and two.bodies and len(one.bodies) + len(two.bodies) == 12
    assert [s["base_url"] for s in engine.describe()["servers"]] == [one.url, two.url]
    assert {url for url, _, _ in engine.take_report().answered_by} == {one.url, two.url}
    engine.close()
    other = stub(lambda body, n: (200, {}, completion()), probe=completion(fingerprint="vllm-0.32.0-99999999"))
    with pytest.raises(BadInput, match=r"differs from .* in system_fingerprint"):
        _engine([one.url, other.url])


@pytest.mark.parametrize(("value", "field"), [("localhost:8000", "engine.base_url"), ([], "engine.base_url"),
                                              (["http://a:1/v1", "ftp://b"], "engine.base_url.1")])  # fmt: skip
def test_base_url_is_a_url_or_a_list_of_urls(value: Any, field: str) -> None:
    from evalrun.config.settings import EngineConfig

    with pytest.raises(BadInput) as raised:
        EngineConfig.from_record({**EngineConfig(name="openai").as_record(), "base_url": value}).check()
    assert raised.value.where == field
    config = EngineConfig.from_record({**EngineConfig(name="openai").as_record(), "base_url": ["http://a:1/v1"]})
    assert config.base_url == ("http://a:1/v1",) and config.as_record()["base_url"] == ["http://a:1/v1"]


def test_the_judges_engine_is_checked_under_its_own_name_before_anything_loads() -> None:
    """``+engine@judge_engine=openai``: its settings are an engine section's, named ``judge_engine.*`` in errors."""
    from evalrun.config import load

    rubric = ["task=report_rubric", "+engine@judge_engine=openai"]
    with pytest.raises(BadInput) as raised:
        load([*rubric, "judge_engine.base_url=localhost:8000"])
    assert raised.value.where == "judge_engine.base_url"
    with pytest.raises(BadInput) as raised:
        load([*rubric, "judge_engine.base_url=http://a:1/v1", "judge_engine.max_concurrency=0"])
    assert raised.value.where == "judge_engine.max_concurrency"
    with pytest.raises(BadInput) as raised:
        load(["task=report_rubric", "+engine@judge_engine=openai"])  # no URL and no serve
    assert raised.value.where == "judge_engine.base_url"
    config = load([*rubric, "judge_engine.base_url=http://a:1/v1"])
    assert config.engine.name == "vllm" and config.judge_engine is not None and config.judge_engine.name == "openai"


def test_tool_calls_go_to_the_chat_api_with_their_arguments_as_json_text() -> None:
    from evalrun.engines.openai import api_messages

    call = {"id": "call_1_0", "type": "function", "function": {"name": "find", "arguments": {"b": 1, "a": [2]}}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    sent = api_messages(messages)
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"b": 1, "a": [2]}'  # the object's own key order
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"b": 1, "a": [2]}  # not changed in place
    assert sent[0] == messages[0]


def test_a_request_cancelled_as_a_connection_is_made_for_it_leaves_the_client_usable() -> None:
    """One request holds the only connection, a second waits for one, and the server closes the first's connection as
    it answers: a new connection is made for the second, which is cancelled before it runs (as ``cancel()`` cancels
    the requests left after a server went down). httpcore 1.0.9 keeps that connection's slot for ever
    (encode/httpcore#1093): a client whose pool is capped at the engine's limit, one here, times out every later
    request (``PoolTimeout``) against a server that answers."""
    import asyncio

    from evalrun.engines.openai import http_client

    class Closing(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            for k, v in {"Content-Type": "application/json", "Content-Length": "2", "Connection": "close"}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Closing)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def race() -> int:
        client = http_client(f"http://127.0.0.1:{server.server_address[1]}", None, timeout=2.0, connections=1)
        try:
            for _ in range(3):
                waiting: list[asyncio.Task[Any]] = []

                async def first(waiting: list[asyncio.Task[Any]]) -> None:
                    await client.post("/x", json={})
                    waiting[0].cancel()  # the second was handed a new connection as this one closed; it has not run

                holder = asyncio.create_task(first(waiting))
                await asyncio.sleep(0)
                waiting.append(asyncio.create_task(client.post("/x", json={})))
                await holder
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting[0]
            return (await client.post("/x", json={})).status_code
        finally:
            await client.aclose()

    try:
        assert asyncio.run(race()) == 200
    finally:
        server.shutdown()
