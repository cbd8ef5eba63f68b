"""``engine=openai``: a model behind an OpenAI-compatible server (``vllm serve``, SGLang, TGI, llama.cpp's server).

evalrun renders every prompt itself (its chat formatting, the model's template, as for the offline engines) and
sends it to the completions endpoint, so a served run and an offline run of the same model send the same text;
each request carries its own seed (a 64-bit seed as the signed 64-bit integer with the same bits, which is how
the server's sampler reads it), its stop strings and token limit, asks for the chosen tokens' logprobs and, from a
vLLM server, the token ids (``return_token_ids``). Loglikelihood requests send the tokens of context and
continuation (tokenized here, as every engine does) and read the server's prompt logprobs (vLLM's
``prompt_logprobs``); a server without them is refused before the run starts.

What the server answered about itself is kept with every response (``Completion.server``: the model it names and
its ``system_fingerprint``), so a backend that changes during a run is in the record. The response id, the
retries and the concurrency limit are provenance: logged, never hashed.

Requests go out concurrently (``engine.max_concurrency``, adaptive: halved on 429 and 503, the server's
``Retry-After`` honoured, grown back by one on each success), retried with exponential backoff and jitter on
timeouts, connection errors and 5xx (``engine.max_retries``); a request the server refuses (4xx) is refused
(:class:`RequestRejected`), and the harness fails that episode only. ``engine.serve=true`` starts a vLLM server of
the pinned model directory itself (:mod:`evalrun.engines.server`) and stops it when the engine closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.engines import (
    Completion,
    EngineDown,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    RequestRejected,
    continuation_logprob,
    engine,
    loglikelihood_tokens,
)
from evalrun.engines.server import VLLMServer
from evalrun.errors import BadInput

log = logging.getLogger("evalrun.engines.openai")

DEFAULT_CONCURRENCY = 64
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_RETRIES = 5
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_SLOW_DOWN = {429, 503}
_INT64 = 2**63


def signed_seed(seed: int) -> int:
    """A 64-bit seed as the server's API takes it (a signed 64-bit integer), with the same bits: the sampler's
    ``torch.Generator.manual_seed`` reads a negative seed as ``2**64 + seed``, so the generator state is the
    offline engine's for the same unsigned seed."""
    return seed - 2**64 if seed >= _INT64 else seed


@dataclass(frozen=True)
class ServerIdentity:
    """What a server says about itself (``GET /v1/models`` and ``GET /version``), recorded in the manifest."""

    base_url: str
    model: str
    root: str | None
    max_model_len: int | None
    version: str | None

    def as_record(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model, "root": self.root,
                "max_model_len": self.max_model_len, "version": self.version}  # fmt: skip


def probe(base_url: str, model: str, api_key: str | None, timeout_s: float = 10.0) -> ServerIdentity:
    """The server at ``base_url`` serves ``model``: its identity, or a BadInput naming the field that is wrong
    (nothing listens there, it is not an OpenAI-compatible server, or it serves other models)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise BadInput("engine.base_url", f"{base_url}: no server answers ({type(exc).__name__}: {exc})") from exc
    if response.status_code != 200:
        raise BadInput("engine.base_url", f"{base_url}/models answered {response.status_code}: not an "
                                          "OpenAI-compatible server, or a wrong key (engine.api_key_env)")  # fmt: skip
    try:
        listed = {m["id"]: m for m in response.json()["data"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput("engine.base_url", f"{base_url}/models: not an OpenAI model list ({exc})") from exc
    if model not in listed:
        raise BadInput("engine.served_model", f"{base_url} serves {sorted(listed)}, not {model!r}")
    version = None
    try:
        answer = httpx.get(f"{base_url.removesuffix('/v1')}/version", headers=headers, timeout=timeout_s)
        if answer.status_code == 200:
            version = str(answer.json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    entry = listed[model]
    max_len = entry.get("max_model_len")
    return ServerIdentity(base_url, model, entry.get("root"), max_len if isinstance(max_len, int) else None, version)


class _Limit:
    """The adaptive concurrency limit: at most ``ceiling`` requests in flight, halved when the server says it is
    overloaded, grown back by one for each success."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = ceiling
        self.in_flight = 0
        self.changes = 0
        self._free = asyncio.Condition()

    async def __aenter__(self) -> None:
        async with self._free:
            await self._free.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1

    async def __aexit__(self, *exc: object) -> None:
        async with self._free:
            self.in_flight -= 1
            self._free.notify_all()

    def slow_down(self) -> None:
        if self.limit > 1:
            self.limit = max(1, self.limit // 2)
            self.changes += 1

    async def speed_up(self) -> None:
        if self.limit < self.ceiling:
            self.limit += 1
            async with self._free:
                self._free.notify_all()


class ServerDown(EngineDown):
    """The server did not answer a request through every retry: the run stops (``evalrun resume`` finishes it)."""


@engine("openai")
class OpenAIEngine:
    def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
        self._model_path = model_path
        self._server: VLLMServer | None = None
        self.model = settings.get("served_model") or model_path.name
        self._api_key = os.environ.get(settings["api_key_env"]) if settings.get("api_key_env") else None
        self._timeout = float(settings.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self._retries = int(settings["max_retries"]) if settings.get("max_retries") is not None else DEFAULT_RETRIES
        self._limit = _Limit(int(settings.get("max_concurrency") or DEFAULT_CONCURRENCY))
        self.retried = 0  # requests sent again (provenance)
        if settings.get("serve"):
            settings_for_server = {**settings, "dtype": settings.get("dtype") or model_dtype}
            self._server = VLLMServer.start(model_path, self.model, settings_for_server)
            base_url = self._server.base_url
        elif settings.get("base_url"):
            base_url = str(settings["base_url"]).rstrip("/")
        else:
            raise BadInput("engine.base_url", "engine=openai needs the server's URL (http://HOST:PORT/v1), or "
                                              "engine.serve=true to start a vLLM server of the model")  # fmt: skip
        self.base_url = base_url
        self.identity = probe(base_url, self.model, self._api_key)
        self._tokenizer: Any = None
        # the requests' event loop runs in a thread of its own, so that submitted requests go on while the
        # harness records a batch (QueueingEngine): the server's queue never drains between batches
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="evalrun-openai", daemon=True)
        self._thread.start()
        self._client: Any = None
        self._pending: dict[str, concurrent.futures.Future[Completion]] = {}
        self._next_id = 0
        self._description = {
            "name": "openai",
            "version": self.identity.version or "unknown",
            "settings": settings,  # the key's variable name at most, never the key
            "server": self.identity.as_record(),
        }

    @classmethod
    def preflight(cls, model_path: Path, settings: dict[str, Any]) -> None:
        """A server that evalrun does not start answers and serves the model (checked before any worker starts)."""
        if settings.get("serve"):
            return
        key = os.environ.get(settings["api_key_env"]) if settings.get("api_key_env") else None
        probe(str(settings["base_url"]).rstrip("/"), settings.get("served_model") or model_path.name, key)

    def describe(self) -> dict[str, Any]:
        return self._description

    def close(self) -> None:
        """Close the connections and stop a server this engine started."""
        self.cancel()
        client, self._client = self._client, None
        if client is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(client.aclose(), self._loop).result(timeout=10)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:  # an engine dropped without close(): its server does not outlive it
            with contextlib.suppress(Exception):
                server.stop()

    # --- requests ---

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Completions in request order; :class:`RequestRejected` when the server refused one (once the others
        are done: the harness splits the batch to find it)."""
        self.cancel()
        outcomes = self.collect(self.submit(requests))
        for outcome in outcomes:
            if isinstance(outcome, str):
                raise RequestRejected(outcome)
        return outcomes  # type: ignore[return-value]

    # --- QueueingEngine: requests in flight across batches ---

    @property
    def queue_depth(self) -> int:
        """Requests to keep submitted: twice the concurrency, so the server always has the next ones."""
        return 2 * self._limit.ceiling

    def submit(self, requests: list[GenerationRequest]) -> list[str]:
        ids = []
        for r in requests:
            self._next_id += 1
            ids.append(str(self._next_id))
            self._pending[ids[-1]] = asyncio.run_coroutine_threadsafe(self._completion(r), self._loop)
        return ids

    def collect(self, ids: list[str]) -> list[Completion]:
        """The completions of submitted requests in ``ids`` order; a request the server refused (4xx) is its
        refusal's reason in its place (the harness records that episode as failed); a server that stays down
        raises :class:`ServerDown`."""
        outcomes: list[Any] = []
        for i in ids:
            future = self._pending.pop(i)
            try:
                outcomes.append(future.result())
            except RequestRejected as exc:
                outcomes.append(str(exc))
        return outcomes

    def cancel(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        if not requests:
            return []
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_path))
        return self._run([self._loglikelihood(r) for r in requests])

    def _run(self, calls: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Every call, concurrently within the limit, on the engine's loop; results in call order. A refused
        request raises :class:`RequestRejected` once the others are done."""
        if not calls:
            return []

        async def gather() -> list[Any]:
            return await asyncio.gather(*calls, return_exceptions=True)

        outcomes = asyncio.run_coroutine_threadsafe(gather(), self._loop).result()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the limit, retries and backoff; the JSON answer, or RequestRejected/ServerDown."""
        import httpx

        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=self._timeout,
                                             limits=httpx.Limits(max_connections=self._limit.ceiling))  # fmt: skip
        last = ""
        for attempt in range(self._retries + 1):
            wait = min(30.0, 0.5 * 2**attempt) * (0.5 + random.random())
            async with self._limit:
                try:
                    response = await self._client.post(path, json=body)
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    response = None
            if response is not None:
                if response.status_code == 200:
                    try:
                        answer = response.json()
                    except ValueError:
                        last = "a 200 answer that is not JSON"
                    else:
                        await self._limit.speed_up()
                        return answer
                elif response.status_code in _RETRY_STATUS:
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                    if response.status_code in _SLOW_DOWN:
                        self._limit.slow_down()
                        wait = max(wait, _retry_after(response.headers.get("retry-after")))
                else:  # the request's fault: not retried
                    raise RequestRejected(f"the server refused the request: HTTP {response.status_code}: "
                                          f"{_error_message(response)}")  # fmt: skip
            if attempt < self._retries:
                self.retried += 1
                log.warning("request to %s%s failed (%s); retry %d of %d in %.1f s", self.base_url, path, last,
                            attempt + 1, self._retries, wait)  # fmt: skip
                await asyncio.sleep(wait)
        raise ServerDown(f"{self.base_url}{path}: no answer after {self._retries + 1} tries ({last})")

    async def _completion(self, request: GenerationRequest) -> Completion:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model, "prompt": request.prompt, "max_tokens": s.max_tokens, "temperature": s.temperature,
            "top_p": s.top_p, "seed": signed_seed(s.seed), "stop": list(s.stop), "return_token_ids": True,
            "add_special_tokens": request.add_special_tokens,
        }  # fmt: skip
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.logprobs:
            body["logprobs"] = 0  # the chosen tokens' only
        answer = await self._post("/completions", body)
        choice = answer["choices"][0]
        token_ids = choice.get("token_ids")
        if token_ids is None:
            raise RequestRejected(f"{self.base_url} gave no token ids (return_token_ids): not a vLLM server")
        logprobs: tuple[float | None, ...] = ()
        if s.logprobs:
            values = (choice.get("logprobs") or {}).get("token_logprobs") or []
            logprobs = tuple(None if v is None or v <= -9999.0 else float(v) for v in values)
        return Completion(
            text=choice["text"], token_ids=tuple(int(t) for t in token_ids), logprobs=logprobs,
            finish_reason=str(choice.get("finish_reason")), prompt_tokens=int(answer["usage"]["prompt_tokens"]),
            server=_server_of(answer),
        )  # fmt: skip

    async def _loglikelihood(self, request: LoglikelihoodRequest) -> Loglikelihood:
        ids, n = loglikelihood_tokens(self._tokenizer, request)
        if n == 0:
            return Loglikelihood(logprob=0.0, token_ids=(), greedy=True, prompt_tokens=len(ids))
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        answer = await self._post("/completions", body)
        positions = answer["choices"][0].get("prompt_logprobs")
        if not isinstance(positions, list) or len(positions) != len(ids):
            raise RequestRejected(f"{self.base_url} gave no prompt logprobs (vLLM's prompt_logprobs) for a "
                                  "loglikelihood request")  # fmt: skip
        steps = ((float(positions[pos][str(ids[pos])]["logprob"]),
                  max(float(v["logprob"]) for v in positions[pos].values()))
                 for pos in range(len(ids) - n, len(ids)))  # fmt: skip
        total, greedy = continuation_logprob(request, steps)
        return Loglikelihood(logprob=total, token_ids=tuple(ids[-n:]), greedy=greedy, prompt_tokens=len(ids),
                             server=_server_of(answer))  # fmt: skip


def _server_of(answer: dict[str, Any]) -> dict[str, str]:
    """What a response says of the server that made it: the model it names and its fingerprint."""
    return {"model": str(answer.get("model")), "system_fingerprint": str(answer.get("system_fingerprint"))}


def _retry_after(value: str | None) -> float:
    try:
        return min(120.0, max(0.0, float(value))) if value is not None else 0.0
    except ValueError:
        return 0.0


def _error_message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
