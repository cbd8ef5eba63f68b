"""The part of Inspect AI's eval log format that ``evalrun export --format inspect`` writes.

Inspect's format, not evalrun's: the field names and shapes are those of Inspect AI's log schema
(``inspect_ai.log``: EvalLog, EvalSpec, EvalSample, EvalSampleSummary, ChatMessage, ModelOutput,
Score, EvalResults), log format version 2, as read by ``inspect_ai.log.read_eval_log``. Only the
fields evalrun fills are here; every other field of Inspect's schema has a default there. Typed
as evalrun's records are (frozen, strict, no unknown fields), so that a misspelt field fails here
rather than being dropped silently by Inspect's reader; a field set to None is left out of the
file (Inspect reads it as its default).
See docs/design.md "Export".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

LOG_FORMAT_VERSION = 2  # Inspect's EvalLog.version this module writes


class _Inspect(BaseModel):
    """An object of Inspect's log format."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    def as_record(self) -> dict[str, Any]:
        """The JSON object as written: fields set to None left out."""
        return self.model_dump(exclude_none=True)


# --- messages ----------------------------------------------------------------------------------


class ToolCall(_Inspect):
    id: str
    function: str
    arguments: dict[str, Any]
    type: Literal["function"] = "function"


class ToolCallError(_Inspect):
    type: Literal["parsing", "unknown"]  # parsing: the reply was not a valid tool-call reply
    message: str


class UserMessage(_Inspect):
    role: Literal["user"] = "user"
    id: str
    content: str
    source: Literal["input", "generate"] | None = None  # generate: a simulated user's turn played by a model
    metadata: dict[str, Any] | None = None


class ContentReasoning(_Inspect):
    """A reasoning model's thinking (evalrun: the reply's ``reasoning``, split by ``task.reasoning_parser``)."""

    type: Literal["reasoning"] = "reasoning"
    reasoning: str


class ContentText(_Inspect):
    type: Literal["text"] = "text"
    text: str


class AssistantMessage(_Inspect):
    role: Literal["assistant"] = "assistant"
    id: str
    content: str | list[ContentReasoning | ContentText]  # a list: the thinking, then the answer
    source: Literal["generate"] | None = None  # left out for a scripted agent's turn (no model call)
    model: str | None = None
    tool_calls: list[ToolCall] | None = None
    metadata: dict[str, Any] | None = None


class ToolMessage(_Inspect):
    role: Literal["tool"] = "tool"
    id: str
    content: str
    tool_call_id: str | None = None  # None: the message answers an unparseable reply, not a call
    function: str | None = None
    error: ToolCallError | None = None
    metadata: dict[str, Any] | None = None


ChatMessage = Annotated[Union[UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]  # noqa: UP007


# --- a sample ----------------------------------------------------------------------------------


class ModelUsage(_Inspect):
    input_tokens: int
    output_tokens: int
    total_tokens: int


StopReason = Literal["stop", "max_tokens", "unknown"]


class ChatCompletionChoice(_Inspect):
    message: AssistantMessage
    stop_reason: StopReason


class ModelOutput(_Inspect):
    model: str
    choices: list[ChatCompletionChoice]
    completion: str
    usage: ModelUsage | None = None
    metadata: dict[str, Any] | None = None
    error: str | None = None


class Score(_Inspect):
    value: float
    answer: str | None = None
    explanation: str | None = None
    metadata: dict[str, Any] | None = None


class EvalError(_Inspect):
    message: str
    traceback: str
    traceback_ansi: str


class EvalSample(_Inspect):
    id: str
    epoch: int
    input: str | list[ChatMessage]
    target: str
    messages: list[ChatMessage]
    output: ModelOutput
    scores: dict[str, Score]
    metadata: dict[str, Any]
    model_usage: dict[str, ModelUsage]
    uuid: str
    error: EvalError | None = None


class EvalSampleSummary(_Inspect):
    """What Inspect's viewer lists a sample by (``summaries.json`` of a ``.eval`` file)."""

    id: str
    epoch: int
    input: str | list[ChatMessage]
    target: str
    metadata: dict[str, Any]
    scores: dict[str, Score]
    model_usage: dict[str, ModelUsage]
    uuid: str
    error: str | None = None
    completed: bool
    message_count: int


# --- the log's header --------------------------------------------------------------------------


class EvalDataset(_Inspect):
    name: str
    location: str | None = None
    samples: int
    sample_ids: list[str]
    shuffled: bool


class EvalConfig(_Inspect):
    limit: int | None = None
    epochs: int
    log_samples: bool


class GenerateConfig(_Inspect):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_seqs: list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None


class EvalRevision(_Inspect):
    type: Literal["git"] = "git"
    origin: str
    commit: str
    dirty: bool | None = None


class EvalSpec(_Inspect):
    eval_id: str
    run_id: str
    created: str  # ISO 8601
    task: str
    task_id: str
    dataset: EvalDataset
    model: str
    model_generate_config: GenerateConfig
    model_args: dict[str, Any]
    config: EvalConfig
    revision: EvalRevision | None = None
    packages: dict[str, str]
    metadata: dict[str, Any]


class EvalPlanStep(_Inspect):
    solver: str
    params: dict[str, Any]


class EvalPlan(_Inspect):
    name: Literal["plan"] = "plan"
    steps: list[EvalPlanStep]
    config: GenerateConfig


class EvalMetric(_Inspect):
    name: str
    value: float


class EvalScore(_Inspect):
    name: str
    scorer: str
    scored_samples: int
    unscored_samples: int
    params: dict[str, Any]
    metrics: dict[str, EvalMetric]
    metadata: dict[str, Any]


class EvalResults(_Inspect):
    total_samples: int
    completed_samples: int
    scores: list[EvalScore]


class EvalStats(_Inspect):
    started_at: str
    completed_at: str
    model_usage: dict[str, ModelUsage]


class EvalLogHeader(_Inspect):
    """The log without its samples: ``header.json`` of a ``.eval`` file."""

    version: Literal[2] = LOG_FORMAT_VERSION
    status: Literal["success"] = "success"  # evalrun exports complete runs only
    eval: EvalSpec
    plan: EvalPlan
    results: EvalResults
    stats: EvalStats
