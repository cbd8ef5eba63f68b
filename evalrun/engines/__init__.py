"""Engines turn generation requests into completions. The harness sees only :class:`Engine`.

An engine is a class registered by name with ``@engine("NAME")``; ``engine.name`` in the config
selects one (:func:`build_engine`). vLLM and transformers are imported only when their engine is
built, so the built-in engines are *declared* here (name -> the module that registers it) and their
modules are imported on first use: checking or listing engine names imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from evalrun.chat import Conversation
from evalrun.config.registry import Registry


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: tuple[str, ...]
    seed: int
    logprobs: bool

    def as_record(self) -> dict[str, Any]:
        """JSON-safe form (the 64-bit seed as a decimal string, since JSON numbers stop at 2**53)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "seed": str(self.seed),
            "logprobs": self.logprobs,
        }


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    sampling: SamplingSpec
    # Which episode and which of its model calls this is: a live engine ignores them, a replay engine
    # uses them to find the recorded response.
    episode_id: str | None = None
    call: int = 0
    # Whether the tokenizer adds its special tokens (a BOS) to the prompt, as for a text prompt; False for a
    # prompt a chat template rendered, which writes them itself (vLLM's chat endpoint tokenizes it so too):
    # a Llama 3 prompt would otherwise start with two BOS tokens.
    add_special_tokens: bool = True
    # The conversation ``prompt`` was rendered from (None: a text prompt): an engine that takes conversations
    # (engine=openai engine.api=chat) sends it and checks that the server rendered ``prompt``; the others, and
    # that one for a text prompt, read ``prompt``.
    conversation: Conversation | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]  # of the chosen tokens (None: not finite); empty when not requested
    finish_reason: str
    prompt_tokens: int
    # A reasoning model's reply taken apart (evalrun.chat.reasoning; None: not split): the answer after the
    # thinking, and the thinking (None: there was none). ``text`` stays what the tokens decode to.
    content: str | None = None
    reasoning: str | None = None
    # A served model's response: what the server said of itself (the model it names, its system_fingerprint);
    # None from an engine in this process
    server: Mapping[str, str] | None = None

    @property
    def output(self) -> str:
        """What the episode's output is: the answer after any thinking (the whole text when not split)."""
        return self.text if self.content is None else self.content


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """How likely ``continuation`` is after ``context`` (lm-evaluation-harness's loglikelihood request)."""

    context: str
    continuation: str
    episode_id: str | None = None
    call: int = 0
    add_special_tokens: bool = True  # as GenerationRequest's: False for a context a chat template rendered
    # lm-eval's loglikelihood_rolling: ``continuation`` a whole document (``context`` empty), scored in rolling
    # windows of the model's context (:func:`scored_windows`)
    rolling: bool = False


@dataclass(frozen=True)
class Loglikelihood:
    logprob: float  # the sum over the continuation's tokens
    token_ids: tuple[int, ...]  # the continuation's tokens (those of context + continuation after the context's)
    greedy: bool  # every continuation token was the model's argmax
    prompt_tokens: int  # tokens of context + continuation
    server: Mapping[str, str] | None = None  # as Completion.server


def loglikelihood_tokens(tokenizer: Any, request: LoglikelihoodRequest) -> tuple[list[int], int]:
    """The tokens to feed for ``request`` and how many of them, at the end, are the continuation's.

    Shared by every engine so that they score the same tokens. As lm-evaluation-harness does,
    ``context + continuation`` is tokenized as a whole and the continuation's tokens are those after
    the tokens of ``context`` alone, the context's trailing whitespace moved to the continuation
    (:func:`split_at_word_boundary`) (both with the tokenizer's special tokens, e.g. a BOS, unless the request
    is chat-formatted: ``add_special_tokens``); where
    that split fails (the whole does not start with the context's tokens, or nothing follows them)
    the continuation is tokenized on its own and appended to the context's tokens. An empty
    continuation has no tokens (its logprob is 0). The first continuation token needs a token
    before it: an empty context is allowed only when the tokenizer adds one (a BOS).
    """
    special = request.add_special_tokens
    context, continuation = split_at_word_boundary(request.context, request.continuation)
    ctx_ids = [int(t) for t in tokenizer.encode(context, add_special_tokens=special)]
    if not ctx_ids:
        raise RequestRejected(
            f"loglikelihood request with context {request.context!r}: the context has no tokens and the "
            "tokenizer adds no BOS token, so there is nothing to condition the continuation's first token on"
        )
    whole_ids = [int(t) for t in tokenizer.encode(context + continuation, add_special_tokens=special)]
    if len(whole_ids) > len(ctx_ids) and whole_ids[: len(ctx_ids)] == ctx_ids:
        return whole_ids, len(whole_ids) - len(ctx_ids)
    cont_ids = [int(t) for t in tokenizer.encode(continuation, add_special_tokens=False)]
    return ctx_ids + cont_ids, len(cont_ids)


ROLLING_MARGIN = 2  # a rolling window's tokens: the model's context less its first token's and vLLM's generated one


def scored_windows(tokenizer: Any, request: LoglikelihoodRequest,
                   context: int | None) -> list[tuple[list[int], int]]:  # fmt: skip
    """The token sequences an engine scores for ``request`` and how many tokens at the end of each are scored: one
    (:func:`loglikelihood_tokens`), or for a rolling request lm-eval's own rolling windows of the document's tokens
    (``lm_eval.utils.get_rolling_token_windows`` and ``make_disjoint_window``, called, as lm-eval's backends call
    them: the first window after the tokenizer's BOS token, else its EOS, every token scored once). A window is
    :data:`ROLLING_MARGIN` tokens shorter than the model's ``context`` on every engine, so that engines score the
    same windows: the token before it and the one token vLLM generates after a prompt whose logprobs it gives must
    fit too (lm-eval's HF backend uses the whole context, its vLLM backend one token less; a document shorter than
    the window is scored the same by all)."""
    if not request.rolling:
        return [loglikelihood_tokens(tokenizer, request)]
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    if context is None:
        raise RequestRejected("a rolling loglikelihood needs the model's context length (engine.max_model_len)")
    tokens = [int(t) for t in tokenizer.encode(request.continuation, add_special_tokens=False)]
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    length = context - ROLLING_MARGIN
    windows = map(make_disjoint_window, get_rolling_token_windows(tokens, prefix, length, context_len=1))
    return [([int(t) for t in (*context, *scored)], len(scored)) for context, scored in windows]


def joined(request: LoglikelihoodRequest, windows: Sequence[Loglikelihood]) -> Loglikelihood:
    """A request's loglikelihood from its windows' (:func:`scored_windows`): their sum, greedy where every one was,
    their scored tokens in order and every token fed."""
    if len(windows) == 1:
        return windows[0]
    total = 0.0
    for window in windows:
        total += window.logprob
    return Loglikelihood(logprob=checked_logprob(total, request), greedy=all(w.greedy for w in windows),
                         token_ids=tuple(t for w in windows for t in w.token_ids),
                         prompt_tokens=sum(w.prompt_tokens for w in windows))  # fmt: skip


def split_at_word_boundary(context: str, continuation: str) -> tuple[str, str]:
    """The context's trailing whitespace moved to the front of a non-empty continuation, as lm-evaluation-harness
    does before tokenizing (``_encode_pair``): a context ending in ``"\\n"`` (a chat template's generation prompt)
    and the continuation ``"86"`` are scored as ``"\\n86"`` after the context without it, so the whitespace joins the
    token it would form with the continuation's first characters. A context that is only whitespace stays."""
    kept = context.rstrip()
    if not continuation or not kept or kept == context:
        return context, continuation
    return kept, context[len(kept) :] + continuation


def continuation_logprob(request: LoglikelihoodRequest, steps: Iterable[tuple[float, float]]) -> tuple[float, bool]:
    """The continuation's summed logprob and whether every token of it was the model's argmax, from each of its
    positions' (chosen token's logprob, best logprob there): what every engine that reads prompt logprobs
    (vLLM's, offline or served) computes alike."""
    total, greedy = 0.0, True
    for chosen, best in steps:
        total += checked_logprob(chosen, request)
        greedy = greedy and chosen >= best
    return checked_logprob(total, request), greedy


def check_fits(prompt_tokens: int, context: int | None) -> None:
    """Refuse, as vLLM does, a prompt with no tokens or one that leaves no room in the context."""
    if prompt_tokens == 0:
        raise RequestRejected("The decoder prompt cannot be empty")
    if context is not None and prompt_tokens >= context:
        raise RequestRejected(
            f"The decoder prompt (length {prompt_tokens}) is longer than the maximum model length of {context}"
        )


def checked_logprob(value: float, request: LoglikelihoodRequest) -> float:
    if not math.isfinite(value):
        raise ValueError(
            f"loglikelihood of continuation {request.continuation!r} after context {request.context!r} "
            f"is not finite ({value})"
        )
    return value


class RequestRejected(ValueError):
    """The engine refused a request (too long for the context, invalid for the tokenizer): the
    request's fault, not the engine's. Raised for a batch, it means some request in it was refused;
    the harness splits the batch to find which (docs/design.md "Failed episodes")."""


class EngineDown(RuntimeError):
    """The engine's backend stopped answering (a server down through every retry): the run stops, resumably
    (the parts committed so far are kept; ``evalrun resume`` finishes it once the backend is back)."""


class Engine(Protocol):
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in request order; :class:`RequestRejected` if a request is refused."""
        ...

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        """One score per request, in request order."""
        ...

    def describe(self) -> dict[str, Any]:
        """Engine name, version and effective settings, for the manifest and output rows."""
        ...


@runtime_checkable
class QueueingEngine(Engine, Protocol):
    """An engine that takes generation requests ahead of being asked for their completions, so that the
    harness can keep it busy across batch boundaries (docs/design.md "Data flow": the inline stream).

    Between :meth:`submit` and :meth:`collect` of the same requests, only ``submit``, ``collect`` and
    ``cancel`` may be called; ``generate`` and ``loglikelihood`` first drop requests left uncollected.
    """

    @property
    def queue_depth(self) -> int:
        """How many requests to keep submitted for the engine to stay fully occupied."""
        ...

    def submit(self, requests: list[GenerationRequest]) -> list[str]:
        """Queue requests; their ids. :class:`RequestRejected` if one is refused (then none stays queued)."""
        ...

    def collect(self, ids: list[str]) -> list[Completion]:
        """The completions of submitted requests, in ``ids`` order, running the engine until they are done."""
        ...

    def cancel(self) -> None:
        """Drop every submitted request not collected yet."""
        ...


@runtime_checkable
class ClosingEngine(Engine, Protocol):
    """An engine holding something outside its process (a server it started, open connections) to let go."""

    def close(self) -> None: ...


@runtime_checkable
class CheckedEngine(Protocol):
    """An engine class that checks, before any engine or worker starts, what it will need (a server that answers,
    serves the model and gives what the run ``needs``: ``loglikelihood`` for a run that scores options by it): a
    BadInput names the setting."""

    @classmethod
    def preflight(cls, model_path: Path, settings: dict[str, Any], needs: frozenset[str] = frozenset()) -> None: ...


@runtime_checkable
class RemoteEngine(Protocol):
    """An engine class whose model may compute elsewhere than from the directory evalrun hashed (a server evalrun
    did not start): the run's model is then recorded as unpinned."""

    @classmethod
    def weights_pinned(cls, settings: dict[str, Any]) -> bool: ...


@dataclass(frozen=True)
class ServedReport:
    """What a served engine met since it was last asked (:class:`ServedEngine`): provenance, never hashed.

    ``answered_by``: every (base URL, model, system_fingerprint) its responses named, which the driver checks
    against the run's servers (drift, docs/design.md "Worker provenance"); ``faults``: the failed tries by kind
    (``http_STATUS`` for 408, 409, 425, 429 and 5xx, ``timeout``, ``connection``, ``malformed``), each retried
    or, at the last try, the reason its request failed; ``retries``: requests sent again; ``limit_changes``: the
    adaptive concurrency limit's cuts. Counted per engine since its last report: a dispatcher reused after a
    stopped run reports that run's last faults with the next run's first batch."""

    answered_by: frozenset[tuple[str, str, str]] = frozenset()
    faults: Mapping[str, int] = field(default_factory=dict)
    retries: int = 0
    limit_changes: int = 0

    def __add__(self, other: ServedReport) -> ServedReport:
        faults = dict(self.faults)
        for kind, n in other.faults.items():
            faults[kind] = faults.get(kind, 0) + n
        return ServedReport(self.answered_by | other.answered_by, dict(sorted(faults.items())),
                            self.retries + other.retries, self.limit_changes + other.limit_changes)  # fmt: skip

    def __bool__(self) -> bool:
        return bool(self.answered_by or self.faults or self.retries or self.limit_changes)

    def as_record(self) -> dict[str, Any]:
        """record.json's ``dispatch.served``: the counts (the servers are the manifest's)."""
        return {"faults": dict(self.faults), "retries": self.retries, "limit_changes": self.limit_changes}


@runtime_checkable
class ServedEngine(Protocol):
    """An engine whose model runs behind a server: it says what it met of its servers."""

    def take_report(self) -> ServedReport:
        """What was met since the last call (the counts start again from zero)."""
        ...


# model directory, model dtype, the engine settings (``engine`` config section as a record)
EngineFactory = Callable[[Path, str, dict[str, Any]], Engine]

ENGINES: Registry[EngineFactory] = Registry("engine", field="engine.name")
ENGINES.declare("vllm", "evalrun.engines.vllm")
ENGINES.declare("hf", "evalrun.engines.hf")
ENGINES.declare("openai", "evalrun.engines.openai")


E = TypeVar("E", bound=EngineFactory)


def engine(name: str) -> Callable[[E], E]:
    """Register an engine class as ``name``: ``cls(model_path, model_dtype, settings)`` builds one."""

    def register(cls: E) -> E:
        ENGINES.add(name, cls)
        return cls

    return register


def build_engine(name: str, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> Engine:
    return ENGINES.get(name)(model_path, model_dtype, settings)


def weights_pinned(name: str, settings: dict[str, Any]) -> bool:
    """Whether engine ``name`` with ``settings`` computes with the model directory evalrun hashed
    (:class:`RemoteEngine`; every engine in the worker's process does)."""
    factory = ENGINES.get(name)
    return factory.weights_pinned(settings) if isinstance(factory, RemoteEngine) else True


def preflight(name: str, model_path: Path, settings: dict[str, Any], needs: frozenset[str] = frozenset()) -> None:
    """The checks engine ``name`` makes before it is built (:class:`CheckedEngine`; most make none)."""
    factory = ENGINES.get(name)
    if isinstance(factory, CheckedEngine):
        factory.preflight(model_path, settings, needs)
