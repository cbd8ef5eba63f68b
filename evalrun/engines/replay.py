"""The replay engine: serves the responses a run recorded, never a model.

Each request must name its episode (``GenerationRequest.episode_id``) and call index; the engine
finds that recorded model call and compares the request's hash with the recorded
``request_hash``. A mismatch raises :class:`Divergence` naming episode, seq, expected and got.
A call recorded as refused is refused again (:class:`RequestRejected` with the recorded reason), and
so is any call of an episode recorded as failed before its first call (``failed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evalrun.engines import Completion, GenerationRequest, Loglikelihood, LoglikelihoodRequest, RequestRejected
from evalrun.errors import KeepsFields
from evalrun.records.canonical import canonical_json, sha256_hex
from evalrun.records.chain import link
from evalrun.records.entries import EntryError, ObservationEntry, loglikelihood_fields, parse_line, request_fields


@dataclass(frozen=True)
class RecordedCall:
    episode_id: str
    seq: int
    call: int
    request: dict[str, Any]
    request_hash: str
    response: dict[str, Any] | None  # None: the call was refused, for the reason in ``error``
    prompt_tokens: int
    error: str | None = None


class Divergence(KeepsFields, Exception):
    """Replay and record part ways: the first differing (episode, seq, expected, got)."""

    def __init__(self, episode: str, seq: int | None, expected: str, got: str) -> None:
        super().__init__(f"episode {episode} seq {seq}: expected {expected}, got {got}")
        self.episode, self.seq, self.expected, self.got = episode, seq, expected, got


def first_divergence(episode: str, expected: Sequence[str], got: Sequence[str]) -> Divergence | None:
    """The first line where a replayed chain parts from the recorded one (or the entry count, when one chain
    is the other's beginning), None when they are equal: the one first-divergence report of every replay."""
    for seq, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return Divergence(episode, seq, _describe(want, recorded=True), _describe(have, recorded=False))
    if len(expected) != len(got):
        return Divergence(episode, min(len(expected), len(got)), f"{len(expected)} entries", f"{len(got)} entries")
    return None


def _describe(line: str, recorded: bool) -> str:
    """A chain line as a divergence shows it: a tool call's observation as its result, any other entry as its
    text (the recorded one with its entry hash, so it can be found in the log)."""
    try:
        entry = parse_line(line)
    except EntryError:
        entry = None
    if isinstance(entry, ObservationEntry) and entry.call is not None:
        return f"observation of tool call {entry.call}: {entry.status} {entry.content!r}"
    return f"entry hash {link('', line)}: {line[:200]}" if recorded else line[:200]


def first_difference(expected: Any, got: Any, where: str = "request") -> tuple[str, str, str]:
    """(field path, expected, got) of the first difference between two JSON values."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(expected.keys() | got.keys()):
            if expected.get(key) != got.get(key):
                return first_difference(expected.get(key), got.get(key), f"{where}.{key}")
    return where, repr(expected), repr(got)


def recorded_completion(response: dict[str, Any], prompt_tokens: int = 0) -> Completion:
    """A generation's recorded response (a ``CompletionResponse`` record) served again as the engine gave it."""
    return Completion(
        text=response["text"],
        token_ids=tuple(response["token_ids"]),
        logprobs=tuple(None if v is None else float(v) for v in response["logprobs"]),
        finish_reason=response["finish_reason"],
        prompt_tokens=prompt_tokens,
        server=response.get("server"),  # what the server said then: served as the text is
    )


class ReplayEngine:
    def __init__(self, calls: dict[tuple[str, int], RecordedCall], failed: dict[str, str] | None = None) -> None:
        self.calls = calls
        self.failed = failed or {}  # episode -> reason, for failed episodes that recorded no call

    def describe(self) -> dict[str, Any]:
        return {"name": "replay", "version": "1", "settings": {"recorded_calls": len(self.calls)}}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [self._serve(r) for r in requests]

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        results = []
        for request in requests:
            fields = loglikelihood_fields(request.context, request.continuation, request.rolling)
            r = self._response(self._recorded(request.episode_id, request.call, fields))
            score = Loglikelihood(float(r["logprob"]), tuple(r["token_ids"]), bool(r["greedy"]), r["prompt_tokens"],
                                  r.get("server"))  # fmt: skip
            results.append(score)
        return results

    def _recorded(self, episode_id: str | None, call: int, fields: dict[str, Any]) -> RecordedCall:
        """The recorded call (episode, call), checked to have been made with this request."""
        if episode_id is None:
            raise ValueError("a replayed request must name its episode")
        recorded = self.calls.get((episode_id, call))
        if recorded is None and episode_id in self.failed:
            raise RequestRejected(self.failed[episode_id])
        if recorded is None:
            raise Divergence(episode_id, None, f"no model call {call} recorded", "a model call")
        if sha256_hex(canonical_json(fields)) != recorded.request_hash:
            where, expected, got = first_difference(recorded.request, fields)
            raise Divergence(
                episode_id, recorded.seq, f"request_hash {recorded.request_hash} ({where} = {expected})",
                f"{where} = {got}",
            )  # fmt: skip
        return recorded

    def _serve(self, request: GenerationRequest) -> Completion:
        recorded = self._recorded(request.episode_id, request.call, request_fields(request.prompt, request.sampling))
        return recorded_completion(self._response(recorded), recorded.prompt_tokens)

    @staticmethod
    def _response(recorded: RecordedCall) -> dict[str, Any]:
        if recorded.response is None:
            raise RequestRejected(recorded.error or "refused")
        return recorded.response
