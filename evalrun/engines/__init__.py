"""Engines turn generation requests into completions. The harness sees only :class:`Engine`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]  # of the chosen tokens (None: not finite); empty when not requested
    finish_reason: str
    prompt_tokens: int


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """How likely ``continuation`` is after ``context`` (lm-evaluation-harness's loglikelihood request)."""

    context: str
    continuation: str
    episode_id: str | None = None
    call: int = 0


@dataclass(frozen=True)
class Loglikelihood:
    logprob: float  # the sum over the continuation's tokens
    token_ids: tuple[int, ...]  # the continuation's tokens (those of context + continuation after the context's)
    greedy: bool  # every continuation token was the model's argmax
    prompt_tokens: int  # tokens of context + continuation


class Engine(Protocol):
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, in request order."""
        ...

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        """One score per request, in request order."""
        ...

    def describe(self) -> dict[str, Any]:
        """Engine name, version and effective settings, for the manifest and output rows."""
        ...
