"""A forwarding proxy in front of a real server (a test double for the one thing it isolates: a server that
misbehaves). It relays every request to ``target``; completion requests other than evalrun's probe can be given
faults, one per request in the order they come (``faults``), or every one once ``down_after`` of them were
forwarded (a server that went away; 0: at once):

- ``drop``: the connection closed without an answer;
- ``http_429`` / ``http_503``: the status with ``Retry-After: 1``; ``http_500``: a server error;
- ``malformed``: a 200 answer that is not JSON;
- ``slow``: the answer held back ``slow_s`` seconds (past the client's timeout), then sent;
- ``fingerprint``: the real answer with another ``system_fingerprint`` (a backend that changed mid-run).

``text_only`` makes the server behind it one of the OpenAI-compatible servers that are not vLLM (llama.cpp's,
TGI, SGLang as they answer by default): every answer, the probe's too, without vLLM's token ids, prompt
logprobs and prompt text.

Every fault given and every request forwarded is counted. ``on_forward``, when set, is called with the count
(this request's included) before each forwarded completion request is relayed: a test's way to act at a given
point of a run (kill the server behind the proxy, say). A request the server behind the proxy cannot be reached
for (it was killed) has its connection closed without an answer, as a server that went away closes it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from evalrun.engines.openai import PROBE_PROMPT

OTHER_FINGERPRINT = "vllm-0.32.0-0ther000"


class FaultProxy:
    def __init__(self, target: str, slow_s: float = 4.0) -> None:
        self.faults: deque[str | None] = deque()  # the next completion requests' faults, in order (None: none)
        self.down_after: int | None = None  # then every completion request dropped
        self.rewrite = False  # every answer with OTHER_FINGERPRINT
        self.text_only = False  # every answer without vLLM's extensions
        self.slow_s = slow_s
        self.on_forward: Callable[[int], None] | None = None  # called with `forwarded` before each relay
        self.forwarded = 0  # completion requests answered by the real server (probes not counted)
        self.given: Counter[str] = Counter()
        self.last_request = time.monotonic()  # when the last completion request came
        proxy, lock = self, threading.Lock()
        origin = target.removesuffix("/v1")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                fault = None
                if method == "POST" and json.loads(body or b"{}").get("prompt") != PROBE_PROMPT:
                    proxy.last_request = time.monotonic()
                    with lock:
                        down = proxy.down_after is not None and proxy.forwarded >= proxy.down_after
                        fault = "drop" if down else (proxy.faults.popleft() if proxy.faults else None)
                        if fault is not None:
                            proxy.given[fault] += 1
                        if fault in (None, "slow", "fingerprint"):
                            proxy.forwarded += 1
                            forwarded = proxy.forwarded
                    if fault in (None, "slow", "fingerprint") and proxy.on_forward is not None:
                        proxy.on_forward(forwarded)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault in ("http_429", "http_503", "http_500"):
                    status = int(fault.removeprefix("http_"))
                    self._answer(status, b'{"error":{"message":"injected"}}', {"Retry-After": "1"})
                    return
                if fault == "malformed":
                    self._answer(200, b'{"choices": [')
                    return
                try:
                    answer = httpx.request(method, origin + self.path, content=body,
                                           headers={"Content-Type": "application/json"}, timeout=300)  # fmt: skip
                except httpx.TransportError:  # nothing answers behind the proxy: no answer here either
                    self.close_connection = True
                    self.connection.close()
                    return
                content = answer.content
                if fault == "fingerprint" or (proxy.rewrite and method == "POST"):
                    data = json.loads(content)
                    data["system_fingerprint"] = OTHER_FINGERPRINT
                    content = json.dumps(data).encode()
                if proxy.text_only and method == "POST" and answer.status_code == 200:
                    data = json.loads(content)
                    data.pop("prompt_token_ids", None)
                    for choice in data.get("choices") or []:
                        for key in ("token_ids", "prompt_logprobs", "prompt_token_ids", "prompt_text"):
                            choice.pop(key, None)
                    data.pop("prompt_text", None)
                    content = json.dumps(data).encode()
                if fault == "slow":
                    time.sleep(proxy.slow_s)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    self._answer(answer.status_code, content)

            def do_GET(self) -> None:
                self._relay("GET")

            def do_POST(self) -> None:
                self._relay("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def settle(proxy: FaultProxy, quiet_s: float = 1.0, within_s: float = 30.0) -> None:
    """Wait until no completion request has come for ``quiet_s``: a stopped run's cancelled requests may still be
    on their way (cancelling a request does not unsend it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() - proxy.last_request < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
