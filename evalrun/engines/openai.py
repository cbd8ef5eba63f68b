"""``engine=openai``: a model behind an OpenAI-compatible server (``vllm serve``; SGLang, TGI and llama.cpp's server
give no token ids, and run with ``engine.token_ids=local``: evalrun tokenizes their replies).

evalrun renders every prompt itself (its chat formatting, the model's template, as for the offline engines) and
sends it to the completions endpoint, so a served run and an offline run of the same model send the same text;
each request carries its own seed (a 64-bit seed as the signed 64-bit integer with the same bits, which is how
the server's sampler reads it), its stop strings and token limit, asks for the chosen tokens' logprobs and the
token ids (``return_token_ids``). ``engine.api=chat`` sends a chat-formatted prompt's conversation to the chat
endpoint instead, and refuses the answer unless the server rendered the very prompt evalrun recorded.
Loglikelihood requests send the tokens of context and continuation (tokenized here, as every engine does) and
read the server's prompt logprobs (vLLM's ``prompt_logprobs``).

Every server is probed first (:func:`probe`: ``/v1/models``, ``/version``, a one-token completion, whose
``system_fingerprint`` the manifest records, and whether it gives token ids, prompt logprobs and, for
``engine.api=chat``, its chat rendering; :func:`fit` refuses what the run cannot do without them). What the server
answered about itself is kept with every response (``Completion.server``: the model it names and its fingerprint),
and the engine reports what it met to its worker (:class:`~evalrun.engines.ServedReport`), so that a backend that
changes during a run is drift. The response id, the retries and the concurrency limit are provenance: logged or
counted, never hashed.

Requests go out concurrently to the least loaded of the servers ``engine.base_url`` lists, each with its own
adaptive limit (``engine.max_concurrency``: halved on 429 and 503, the server's ``Retry-After`` honoured, grown
back by one on each success), retried with exponential backoff and jitter on timeouts, connection errors,
malformed answers and 5xx (``engine.max_retries``); a request the server refuses (4xx) is refused
(:class:`RequestRejected`), and the harness fails that episode only. ``engine.serve=true`` starts a vLLM server of
the pinned model directory itself (:mod:`evalrun.engines.server`) and stops it when the engine closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.chat import Conversation
from evalrun.engines import (
    Completion,
    EngineDown,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    RequestRejected,
    ServedReport,
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


PROBE_PROMPT = "evalrun probe"  # the one-token completion every server is asked for before a run


@dataclass(frozen=True)
class ServerIdentity:
    """What a server says about itself (``GET /v1/models``, ``GET /version`` and a one-token completion's
    ``model`` and ``system_fingerprint``), recorded in the manifest; a response naming another model or
    fingerprint is drift (docs/design.md "Worker provenance")."""

    base_url: str
    model: str
    root: str | None
    max_model_len: int | None
    version: str | None
    system_fingerprint: str | None = None
    # what of evalrun's record the server gives: the reply's token ids (vLLM's return_token_ids) and a prompt's
    # logprobs (vLLM's prompt_logprobs, which loglikelihood requests read)
    token_ids: bool = True
    prompt_logprobs: bool = True
    # the chat endpoint's rendering of the messages (vLLM's return_prompt_text); None: not asked (engine.api is not
    # chat)
    prompt_text: bool | None = None

    def as_record(self) -> dict[str, Any]:
        chat = {} if self.prompt_text is None else {"prompt_text": self.prompt_text}
        return {"base_url": self.base_url, "model": self.model, "root": self.root,
                "max_model_len": self.max_model_len, "version": self.version,
                "system_fingerprint": self.system_fingerprint, "token_ids": self.token_ids,
                "prompt_logprobs": self.prompt_logprobs, **chat}  # fmt: skip

    def named(self) -> str:
        """The server as an error message names it: its URL, version and model."""
        return f"{self.base_url} (server {self.version + ' ' if self.version else ''}of {self.model!r})"


def base_urls(settings: dict[str, Any]) -> list[str]:
    """``engine.base_url`` as a list of URLs without a trailing slash (one, or several servers of the model)."""
    given = settings.get("base_url")
    return [str(u).rstrip("/") for u in ([given] if isinstance(given, str) else given or [])]


def probe(base_url: str, model: str, api_key: str | None, timeout_s: float = 30.0,
          chat: bool = False) -> ServerIdentity:  # fmt: skip
    """The server at ``base_url`` serves ``model``: its identity, what of evalrun's record it gives (token ids,
    prompt logprobs, and with ``chat`` its chat endpoint's rendering: :func:`fit` decides whether that is
    enough), or a BadInput naming the field that is wrong
    (nothing listens there, it is not an OpenAI-compatible server, or it serves other models)."""
    import httpx

    headers = _headers(api_key)
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
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    try:
        reply = httpx.post(f"{base_url}/completions", json=body, headers=headers, timeout=timeout_s)
        completion = reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise BadInput("engine.base_url", f"{base_url}/completions: no completion ({type(exc).__name__}: "
                                          f"{exc})") from exc  # fmt: skip
    if not isinstance(completion, dict):
        raise BadInput("engine.base_url", f"{base_url}/completions answered {reply.status_code}: "
                                          f"{_error_message(reply)}")  # fmt: skip
    choice = (completion.get("choices") or [{}])[0]
    token_ids = isinstance(choice, dict) and isinstance(choice.get("token_ids"), list)
    # a prompt's logprobs, as a loglikelihood request reads them (a server that refuses the field has none)
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
    try:
        reply = httpx.post(f"{base_url}/completions", json=body, headers=headers, timeout=timeout_s)
        scored = reply.json() if reply.status_code == 200 else {}
        prompt_logprobs = isinstance(((scored.get("choices") or [{}])[0] or {}).get("prompt_logprobs"), list)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        prompt_logprobs = False
    prompt_text = None
    if chat:  # the chat endpoint says how it rendered the messages (evalrun checks that against its record)
        body = {"model": model, "messages": [{"role": "user", "content": PROBE_PROMPT}], "max_tokens": 1,
                "temperature": 0.0, "return_prompt_text": True}  # fmt: skip
        try:
            reply = httpx.post(f"{base_url}/chat/completions", json=body, headers=headers, timeout=timeout_s)
            prompt_text = reply.status_code == 200 and isinstance(reply.json().get("prompt_text"), str)
        except (httpx.HTTPError, ValueError, AttributeError):
            prompt_text = False
    entry = listed[model]
    max_len = entry.get("max_model_len")
    fingerprint = completion.get("system_fingerprint")
    return ServerIdentity(base_url, str(completion.get("model") or model), entry.get("root"),
                          max_len if isinstance(max_len, int) else None, version,
                          None if fingerprint is None else str(fingerprint), token_ids, prompt_logprobs,
                          prompt_text)  # fmt: skip


def fit(identities: list[ServerIdentity], settings: dict[str, Any], needs: frozenset[str] = frozenset()) -> None:
    """The servers give what the run records and needs, or a BadInput naming the server and what it lacks: token
    ids (unless ``engine.token_ids=local``: evalrun tokenizes the replies itself) and, for a run that scores by
    loglikelihood (``needs``), a prompt's logprobs."""
    for identity in identities:
        if not identity.token_ids and settings.get("token_ids") != "local":
            raise BadInput("engine.base_url", f"{identity.named()} gives no token ids with a completion (vLLM's "
                                              "return_token_ids): set engine.token_ids=local to have evalrun "
                                              "tokenize its replies with the model's tokenizer")  # fmt: skip
        if identity.prompt_text is False:
            raise BadInput("engine.api", f"{identity.named()} does not say how its chat endpoint rendered the "
                                         "messages (vLLM's return_prompt_text), which evalrun checks against the "
                                         "prompt it records: use engine.api=completions")  # fmt: skip
        if "loglikelihood_rolling" in needs:
            raise BadInput("engine", f"the run scores whole documents by rolling loglikelihood (lm-eval's "
                                     f"loglikelihood_rolling), in token windows a server is not sent: use "
                                     f"engine=vllm or engine=hf, not {identity.named()}")  # fmt: skip
        if "loglikelihood" in needs and not identity.prompt_logprobs:
            raise BadInput("engine.base_url", f"{identity.named()} gives no prompt logprobs (vLLM's "
                                              "prompt_logprobs), and the run scores by loglikelihood (multiple "
                                              "choice by task.choices.scoring, or a rubric's judges): score by "
                                              "letter, or use a vLLM server")  # fmt: skip


@dataclass
class _Server:
    """One base URL of the engine: its client (made on the engine's loop), its identity and its adaptive
    concurrency limit: at most ``ceiling`` requests in flight, halved when it says it is overloaded (429, 503),
    grown back by one for each success."""

    identity: ServerIdentity
    ceiling: int
    limit: int = 0
    in_flight: int = 0
    sent: int = 0
    client: Any = None

    def __post_init__(self) -> None:
        self.limit = self.ceiling

    @property
    def free(self) -> int:
        return self.limit - self.in_flight


class _Pool:
    """The engine's servers: each request goes to the one with the most free room under its limit (the least
    loaded; the one sent fewest requests among equals), waiting while every one is full."""

    def __init__(self, servers: list[_Server]) -> None:
        self.servers = servers
        self.changes = 0
        self._free: asyncio.Condition | None = None  # made on the engine's loop

    @property
    def ceiling(self) -> int:
        return sum(s.ceiling for s in self.servers)

    @contextlib.asynccontextmanager
    async def one(self) -> Any:
        if self._free is None:
            self._free = asyncio.Condition()
        async with self._free:
            await self._free.wait_for(lambda: any(s.free > 0 for s in self.servers))
            server = max(self.servers, key=lambda s: (s.free, -s.sent))
            server.in_flight += 1
            server.sent += 1
        try:
            yield server
        finally:
            async with self._free:
                server.in_flight -= 1
                self._free.notify_all()

    def slow_down(self, server: _Server) -> None:
        if server.limit > 1:
            server.limit = max(1, server.limit // 2)
            self.changes += 1

    async def speed_up(self, server: _Server) -> None:
        if server.limit < server.ceiling:
            server.limit += 1
            assert self._free is not None
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
        self._api_key = _api_key(settings)
        self._timeout = float(settings.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self._retries = int(settings["max_retries"]) if settings.get("max_retries") is not None else DEFAULT_RETRIES
        self._api = settings.get("api") or "completions"
        if settings.get("serve"):
            settings_for_server = {**settings, "dtype": settings.get("dtype") or model_dtype}
            self._server = VLLMServer.start(model_path, self.model, settings_for_server)
            urls = [self._server.base_url]
        else:
            urls = base_urls(settings)
        if not urls:
            raise BadInput("engine.base_url", "engine=openai needs the server's URL (http://HOST:PORT/v1), or "
                                              "engine.serve=true to start a vLLM server of the model")  # fmt: skip
        chat = self._api == "chat"
        identities = _same_servers([probe(url, self.model, self._api_key, chat=chat) for url in urls])
        fit(identities, settings)
        ceiling = int(settings.get("max_concurrency") or DEFAULT_CONCURRENCY)
        self._pool = _Pool([_Server(identity, ceiling) for identity in identities])
        self.identity = identities[0]
        self._tokenizer: Any = None
        # a server that gives no token ids (engine.token_ids=local): its replies are tokenized here
        self._tokenize = None if self.identity.token_ids else self._local_tokens
        # the requests' event loop runs in a thread of its own, so that submitted requests go on while the
        # harness records a batch (QueueingEngine): the server's queue never drains between batches
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="evalrun-openai", daemon=True)
        self._thread.start()
        self._pending: dict[str, concurrent.futures.Future[Completion]] = {}
        self._next_id = 0
        # what was met since take_report (ServedReport); written on the loop's thread, read on the worker's
        self._met = threading.Lock()
        self._answered: set[tuple[str, str, str]] = set()
        self._faults: Counter[str] = Counter()
        self.retried = 0  # requests sent again (provenance), since the engine started
        self._reported = (0, 0)  # retried and limit changes at the last take_report
        self._description = {
            "name": "openai",
            "version": self.identity.version or "unknown",
            "settings": settings,  # the key's variable name at most, never the key
            "servers": [i.as_record() for i in identities],
            "weights_pinned": self.weights_pinned(settings),
            "token_ids": "server" if self.identity.token_ids else "local",
        }
        if self._tokenize is not None:
            self._load_tokenizer()

    @classmethod
    def preflight(cls, model_path: Path, settings: dict[str, Any], needs: frozenset[str] = frozenset()) -> None:
        """The servers evalrun does not start answer, serve the model, agree and give what the run needs (checked
        before any worker starts; a vLLM server evalrun starts gives all of it)."""
        if not settings.get("serve"):
            name = settings.get("served_model") or model_path.name
            chat = settings.get("api") == "chat"
            identities = [probe(url, name, _api_key(settings), chat=chat) for url in base_urls(settings)]
            fit(_same_servers(identities), settings, needs)

    @classmethod
    def weights_pinned(cls, settings: dict[str, Any]) -> bool:
        """RemoteEngine: only a server evalrun started itself (``engine.serve``) serves the directory it hashed;
        another's weights are what its server says they are."""
        return bool(settings.get("serve"))

    def describe(self) -> dict[str, Any]:
        return self._description

    def take_report(self) -> ServedReport:
        """ServedEngine: the servers' answers, faults, retries and limit cuts since the last call."""
        with self._met:
            answered, faults = frozenset(self._answered), dict(sorted(self._faults.items()))
            self._answered.clear()
            self._faults.clear()
            retried, changes = self.retried, self._pool.changes
        report = ServedReport(answered, faults, retried - self._reported[0], changes - self._reported[1])
        self._reported = (retried, changes)
        return report

    def close(self) -> None:
        """Close the connections and stop a server this engine started."""
        self.cancel()
        for server in self._pool.servers:
            client, server.client = server.client, None
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
        return 2 * self._pool.ceiling

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
        if any(r.rolling for r in requests):  # refused before the run by fit(); here for any other caller
            raise RequestRejected("a rolling loglikelihood is scored in token windows: engine=vllm or engine=hf")
        self._load_tokenizer()
        return self._run([self._loglikelihood(r) for r in requests])

    def _load_tokenizer(self) -> None:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_path))

    def _local_tokens(self, text: str) -> tuple[list[int], list[str]]:
        """A reply's token ids where the server gives none: its text tokenized with the model's tokenizer (ids that
        decode to it; not necessarily the ones the model chose, which the server did not say), and each one's
        text, to place the server's logprobs by."""
        ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        return ids, [self._tokenizer.decode([i]) for i in ids]

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
        """POST to the least loaded server, with its limit, retries (to whichever server is then least loaded) and
        backoff; the JSON answer, or RequestRejected/ServerDown."""
        import httpx

        last = ""
        for attempt in range(self._retries + 1):
            wait = min(30.0, 0.5 * 2**attempt) * (0.5 + random.random())
            async with self._pool.one() as server:
                url = server.identity.base_url
                if server.client is None:
                    server.client = http_client(url, self._api_key, self._timeout, server.ceiling)
                fault = None
                try:
                    response = await server.client.post(path, json=body)
                except httpx.TimeoutException as exc:
                    fault, last, response = "timeout", f"{type(exc).__name__}: {exc}", None
                except httpx.TransportError as exc:
                    fault, last, response = "connection", f"{type(exc).__name__}: {exc}", None
                    if attempt == 0:  # most often a kept-alive connection the server closed meanwhile: at once
                        wait = 0.0
            if response is not None:
                if response.status_code == 200:
                    try:
                        answer = response.json()
                    except ValueError:
                        fault, last = "malformed", "a 200 answer that is not JSON"
                    else:
                        if isinstance(answer, dict):
                            await self._pool.speed_up(server)
                            self._answered_by(url, answer)
                            return answer
                        fault, last = "malformed", "a 200 answer that is not a JSON object"
                elif response.status_code in _RETRY_STATUS:
                    fault, last = f"http_{response.status_code}", f"HTTP {response.status_code}: {response.text[:200]}"
                    if response.status_code in _SLOW_DOWN:
                        self._pool.slow_down(server)
                        wait = max(wait, _retry_after(response.headers.get("retry-after")))
                else:  # the request's fault: not retried
                    raise RequestRejected(f"the server refused the request: HTTP {response.status_code}: "
                                          f"{_error_message(response)}")  # fmt: skip
            with self._met:
                self._faults[fault or "unknown"] += 1
                if attempt < self._retries:
                    self.retried += 1
            if attempt < self._retries:
                log.warning("request to %s%s failed (%s); retry %d of %d in %.1f s", url, path, last, attempt + 1,
                            self._retries, wait)  # fmt: skip
                await asyncio.sleep(wait)
        raise ServerDown(f"{url}{path}: no answer after {self._retries + 1} tries ({last})")

    def _answered_by(self, url: str, answer: dict[str, Any]) -> None:
        server = _server_of(answer)
        with self._met:
            self._answered.add((url, server["model"], server["system_fingerprint"]))

    async def _completion(self, request: GenerationRequest) -> Completion:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "seed": signed_seed(s.seed), "stop": list(s.stop), "return_token_ids": True,
            "add_special_tokens": request.add_special_tokens,
        }  # fmt: skip
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if self._api == "chat" and request.conversation is not None:
            return await self._chat_completion(request, request.conversation, body)
        body["prompt"] = request.prompt
        if s.logprobs:
            body["logprobs"] = 0  # the chosen tokens' only
        answer = await self._post("/completions", body)
        choice = answer["choices"][0]
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs") or [] if s.logprobs else None
        return _completion_of(answer, choice["text"], choice, values, self._tokenize, logprobs.get("tokens"))

    async def _chat_completion(self, request: GenerationRequest, chat: Conversation,
                               body: dict[str, Any]) -> Completion:  # fmt: skip
        """``engine.api=chat``: the chat the prompt was rendered from, to the chat endpoint, which renders it with
        the model's template as the server has it; the server's rendering must be evalrun's prompt (the
        record), or the request is refused. Tools go with ``tool_choice: none``: the template shows them and the
        reply comes back as text, for the agent's own tool parser (the one the run records). A text prompt (a
        task without chat formatting, the batch-invariance canary's) goes to the completions endpoint."""
        body.update(messages=api_messages(chat.messages), return_prompt_text=True)
        if chat.kwargs:
            body["chat_template_kwargs"] = dict(chat.kwargs)
        if chat.tools is not None:
            body.update(tools=list(chat.tools), tool_choice="none")
        if chat.continue_final:  # the model continues the last message (an lm-eval gen_prefix)
            body.update(add_generation_prompt=False, continue_final_message=True)
        if request.sampling.logprobs:
            body.update(logprobs=True, top_logprobs=0)
        answer = await self._post("/chat/completions", body)
        rendered = answer.get("prompt_text")
        if rendered != request.prompt:
            raise RequestRejected(f"the server rendered the chat otherwise than evalrun's chat template "
                                  f"({_first_difference(request.prompt, rendered)}): start it with the template the "
                                  "run records, or use engine.api=completions")  # fmt: skip
        choice = answer["choices"][0]
        message = choice.get("message") or {}
        if message.get("reasoning_content") or message.get("reasoning") or message.get("tool_calls"):
            raise RequestRejected("the server split the reply (a --reasoning-parser or tool parser of its own): "
                                  "evalrun takes replies whole and splits them itself (task.reasoning_parser, "
                                  "task.world.tool_format)")  # fmt: skip
        values, strings = None, None
        if request.sampling.logprobs:
            steps = (choice.get("logprobs") or {}).get("content") or []
            values, strings = [step.get("logprob") for step in steps], [step.get("token") for step in steps]
        return _completion_of(answer, message.get("content") or "", choice, values, self._tokenize, strings)

    async def _loglikelihood(self, request: LoglikelihoodRequest) -> Loglikelihood:
        ids, n = loglikelihood_tokens(self._tokenizer, request)
        if n == 0:
            return Loglikelihood(logprob=0.0, token_ids=(), greedy=True, prompt_tokens=len(ids))
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        answer = await self._post("/completions", body)
        positions = answer["choices"][0].get("prompt_logprobs")
        if not isinstance(positions, list) or len(positions) != len(ids):
            raise RequestRejected("the server gave no prompt logprobs (vLLM's prompt_logprobs) for a loglikelihood "
                                  "request")  # fmt: skip
        steps = ((float(positions[pos][str(ids[pos])]["logprob"]),
                  max(float(v["logprob"]) for v in positions[pos].values()))
                 for pos in range(len(ids) - n, len(ids)))  # fmt: skip
        total, greedy = continuation_logprob(request, steps)
        return Loglikelihood(logprob=total, token_ids=tuple(ids[-n:]), greedy=greedy, prompt_tokens=len(ids),
                             server=_server_of(answer))  # fmt: skip


def _completion_of(answer: dict[str, Any], text: str, choice: dict[str, Any], logprobs: list[Any] | None,
                   tokenize: Callable[[str], tuple[list[int], list[str]]] | None = None,
                   strings: list[Any] | None = None) -> Completion:  # fmt: skip
    """A completion from a server's answer: its text, the token ids (vLLM's return_token_ids; else, with
    ``tokenize``, the text's tokens here), the chosen tokens' logprobs when asked for (None: not asked; vLLM
    writes -9999.0 for minus infinity) and what the server said of itself. With local tokens the server's
    logprobs are kept only when its tokens' ``strings`` begin with the local tokens' texts, one for one (then
    they are the same tokens; a stop token the text leaves out comes after them), else none: a logprob is never
    placed on a token it may not belong to."""
    token_ids = choice.get("token_ids")
    if token_ids is None and tokenize is None:
        raise RequestRejected("the server gave no token ids (vLLM's return_token_ids)")
    if token_ids is None:
        token_ids, pieces = tokenize(text)
        aligned = strings is not None and list(strings[: len(pieces)]) == pieces and len(logprobs or ()) >= len(pieces)
        if logprobs is not None:
            logprobs = logprobs[: len(pieces)] if aligned else []
    values = () if logprobs is None else tuple(None if v is None or v <= -9999.0 else float(v) for v in logprobs)
    return Completion(
        text=text, token_ids=tuple(int(t) for t in token_ids), logprobs=values,
        finish_reason=str(choice.get("finish_reason")), prompt_tokens=int(answer["usage"]["prompt_tokens"]),
        server=_server_of(answer),
    )  # fmt: skip


def api_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as the chat API takes them: a tool call's arguments as JSON text (chat templates are given
    them as objects, and the server parses the text back into the same object before its template runs)."""
    sent = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [{**c, "function": {**c["function"], "arguments": _json_text(c["function"].get("arguments"))}}
                     for c in calls]  # fmt: skip
            message = {**message, "tool_calls": calls}
        sent.append(dict(message))
    return sent


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})


def _first_difference(expected: str, found: Any) -> str:
    if not isinstance(found, str):
        return "it did not say how (no prompt_text: vLLM's return_prompt_text)"
    shorter = min(len(expected), len(found))
    at = next((i for i, (a, b) in enumerate(zip(expected, found, strict=False)) if a != b), shorter)
    return f"from character {at}: {found[at : at + 40]!r} where evalrun's has {expected[at : at + 40]!r}"


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


def http_client(base_url: str, api_key: str | None, timeout: float, connections: int) -> Any:
    """The client of one server, made on the engine's loop. Its connection pool is not capped: the engine's own limit
    (:class:`_Pool`) caps the requests in flight, and httpcore 1.0.9 can keep a pool slot for ever when a request
    waiting for a connection is cancelled just as one is made for it (encode/httpcore#1093), as ``cancel()`` does
    after a server went down; with the pool capped at the limit, every later request would then wait out its
    timeout (``PoolTimeout``) against a server that answers. ``connections`` idle ones are kept alive."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout, limits=limits)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _api_key(settings: dict[str, Any]) -> str | None:
    return os.environ.get(settings["api_key_env"]) if settings.get("api_key_env") else None


# what several servers of one run must agree in
SERVER_FIELDS = (
    "model",
    "system_fingerprint",
    "version",
    "max_model_len",
    "token_ids",
    "prompt_logprobs",
    "prompt_text",
)


def _same_servers(identities: list[ServerIdentity]) -> list[ServerIdentity]:
    """Several servers of one run serve the same thing: the same model, fingerprint and version, or a BadInput."""
    first = identities[0]
    for other in identities[1:]:
        for name in SERVER_FIELDS:
            if getattr(other, name) != getattr(first, name):
                raise BadInput("engine.base_url", f"{other.base_url} differs from {first.base_url} in {name}: "
                                                  f"{getattr(other, name)!r} instead of {getattr(first, name)!r} "
                                                  "(a run's servers must serve the same model alike)")  # fmt: skip
    return identities
