"""Chain entries: every kind of line an episode's hash chain holds, defined once and typed.

See docs/design.md "Chain entries". Each entry is one canonical JSON line (the pydantic
models of :mod:`evalrun.records.formats`: frozen, strict, no unknown fields, optional fields
absent rather than null). Every entry has the link fields ``episode`` (its episode id), ``seq``
(0, 1, 2, ... within the chain), ``kind`` and ``prev`` (the hash before it; see
:mod:`evalrun.records.chain`).

Kinds written today (their names and fields are fixed by the runs already recorded):

* ``header`` (seq 0): the schedule format, the generator, the episode's task, item, seed, repeat
  and seeds; ``fewshot`` (ids of the few-shot examples) and ``shuffle_order`` (shown position ->
  original option) only when the episode has them.
* ``model``, in three typed forms told apart by their fields:
  :class:`ModelEntry` a generation call; :class:`LoglikelihoodEntry` a loglikelihood call (its
  request has ``op: "loglikelihood"``; ``option`` is the original option it scores);
  :class:`JudgeEntry` a judge's call (``role: "judge"``, ``criterion``, ``judge``,
  ``shuffle_order``, and for loglikelihood judging ``option``/``position``). Every one has
  ``call`` (the episode's model calls numbered from 0), ``request``, ``request_hash`` (sha256 of
  the request's canonical JSON, what a replay matches) and ``response``.
* ``end``: the number of model calls and the status (``ok``; ``error`` with the reason in ``error``).
* A ``model`` line with ``error`` instead of ``response`` (:class:`FailedCallEntry`): a call the
  engine refused, or that was refused before it (a prompt longer than the model's context); ``role: "user"``
  when it was a simulated person's turn.
* A simulated person's turn played by a model (:class:`UserEntry`, ``role: "user"``): a generation call made
  during the agent's tool call ``tool`` that spoke to the person; its response is the person's reply.

Kinds for agent episodes, defined here so that their encoding is fixed before they are written.
An *effect* is anything from outside the episode that a replay must serve from the record: each
effect entry has ``call`` (that kind's calls in the episode, numbered from 0), ``tool`` when it
was read during a tool call (that call's number: a replay serves the k-th read of a kind during
tool call n from the k-th such entry, so concurrent calls are served alike), ``request`` and
``request_hash`` (as for model entries: recomputed by verify, matched by replay) and, unless
noted, ``response``:

* ``tool``: the episode calls a tool (``request``: name and JSON arguments); no response: the
  result comes back as an ``observation`` entry with the same ``call``, possibly after other entries.
* ``observation``: a tool call's result (``call`` of the tool entry; ``status`` ok | error;
  ``content``, any JSON value).
* ``clock``: a clock reading (``request.clock`` wall | monotonic; ``response.seconds``).
* ``random``: random bits from outside the seeded streams (``request``: purpose and bits;
  ``response.value`` as a decimal string).
* ``uuid``: a generated UUID (``request.version``; ``response.uuid``).
* ``env``: an environment variable read (``request.name``; ``response.value``, null when unset).
* ``join``: the episode waited for several tool calls at once (``calls``, in the order their
  observations were recorded); not an effect, it records the order concurrent results were taken.

The fast encoder (:func:`evalrun.episodes.harness.record_episode`) and verify's fast path write and
read the common three-line chain as string templates; the tests check them byte for byte against
:func:`entry_line` of these models.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Protocol, Union

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError, model_validator

from evalrun.errors import KeepsFields
from evalrun.records.canonical import Canonical, canonical_json, sha256_hex
from evalrun.records.formats import (
    SCHEDULE_FORMAT,
    Count,
    DecimalString,
    Generator,
    Hex64,
    Json,
    JsonInt,
    OptionalFields,
    RecordModel,
    first_error,
)

# --- what calls record: requests and responses -------------------------------------------------


class SamplingRecord(RecordModel):
    """How a generation samples; the 64-bit seed as a decimal string."""

    temperature: float
    top_p: float
    top_k: JsonInt
    max_tokens: Count
    stop: list[str]
    seed: DecimalString
    logprobs: bool


class SamplingSource(Protocol):
    def as_record(self) -> dict[str, Any]: ...


class GenerationRequestRecord(RecordModel):
    prompt: str
    prompt_sha256: Hex64
    sampling: SamplingRecord


class LoglikelihoodRequestRecord(RecordModel):
    """How likely ``continuation`` is after ``prompt`` (``loglikelihood_rolling``: the continuation a whole document,
    the prompt empty, scored in lm-eval's rolling windows of the model's context)."""

    continuation: str
    op: Literal["loglikelihood", "loglikelihood_rolling"] = "loglikelihood"
    prompt: str
    prompt_sha256: Hex64


class ServedBy(RecordModel):
    """What a server said of itself in a response (engine=openai): the model it names and its
    ``system_fingerprint`` (vLLM: its version and a hash of its configuration). The response id, which differs
    between identical requests, is provenance and not here."""

    model: str
    system_fingerprint: str


class CompletionResponse(OptionalFields):
    # A reply split by a reasoning parser (task.reasoning_parser; both absent when not split): the answer after
    # the thinking (what the output row's ``output`` is), and the thinking when the parser found any
    content: str | None = None
    finish_reason: str
    logprobs: list[float | None]  # of the chosen tokens (null: not finite); empty when not requested
    reasoning: str | None = None
    server: ServedBy | None = None  # a served model's response: the server's model and fingerprint
    text: str  # what the tokens decode to, thinking included
    token_ids: list[JsonInt]

    @model_validator(mode="after")
    def _split_has_content(self) -> CompletionResponse:
        if self.reasoning is not None and self.content is None:
            raise ValueError("a response with reasoning has its content beside it")
        return self

    @property
    def output(self) -> str:
        """What the episode's output row holds: the content when the reply was split, else the text."""
        return self.text if self.content is None else self.content


class LoglikelihoodResponse(OptionalFields):
    greedy: bool  # every continuation token was the model's argmax
    logprob: float  # the sum over the continuation's tokens
    prompt_tokens: Count  # tokens of prompt + continuation
    server: ServedBy | None = None  # as a CompletionResponse's
    token_ids: list[JsonInt]  # the continuation's tokens


class ToolRequest(RecordModel):
    name: str
    arguments: dict[str, Json]


class ClockRequest(RecordModel):
    clock: Literal["wall", "monotonic"]


class ClockReading(RecordModel):
    seconds: float  # wall: since the Unix epoch; monotonic: since an arbitrary origin


class RandomRequest(RecordModel):
    purpose: str
    bits: int = Field(ge=1, le=64)


class RandomDraw(RecordModel):
    value: DecimalString


class UuidRequest(RecordModel):
    version: JsonInt


class UuidValue(RecordModel):
    uuid: Annotated[str, Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]


class EnvRequest(RecordModel):
    name: str


class EnvValue(RecordModel):
    value: str | None  # null: the variable is not set


class EpisodeSeeds(RecordModel):
    sampling: DecimalString


class WorldHeader(RecordModel):
    """An agent episode's world: what ran (name and versions, the tools' hash), which task of it
    (family, world seed), the generated world's hash, and the agent that acted."""

    agent: str  # model | scripted
    family: str
    name: str
    start: str  # the simulated date-time the world's clock starts at (ISO 8601)
    task_text: str  # what the agent is asked, as the world's reset gave it
    tick: float  # simulated seconds the clock advances per read
    tools: str  # the tool set's version
    tools_hash: Hex64
    verifier: str  # the verifier's version
    world: str  # the world's version
    world_hash: Hex64
    world_seed: JsonInt


# --- entries -----------------------------------------------------------------------------------


class Entry(RecordModel):
    """The link fields every chain entry has."""

    episode: str
    seq: Count
    prev: Hex64


class HeaderEntry(Entry, OptionalFields):
    kind: Literal["header"] = "header"
    format: Literal["evalrun.schedule/1"] = SCHEDULE_FORMAT
    generator: Generator
    task: str
    item: str
    seed: JsonInt
    repeat: JsonInt
    seeds: EpisodeSeeds
    fewshot: list[str] | None = None  # few-shot example ids, when the episode has them
    shuffle_order: list[Count] | None = None  # multiple choice: shown position -> original option
    world: WorldHeader | None = None  # agent episodes


class ModelEntry(Entry):
    """The policy's generation call."""

    kind: Literal["model"] = "model"
    call: Count
    request: GenerationRequestRecord
    request_hash: Hex64
    response: CompletionResponse


class LoglikelihoodEntry(Entry):
    """The policy's loglikelihood of one option (multiple choice scored by loglikelihood)."""

    kind: Literal["model"] = "model"
    call: Count
    option: Count  # the original option index scored
    request: LoglikelihoodRequestRecord
    request_hash: Hex64
    response: LoglikelihoodResponse


class JudgeEntry(Entry, OptionalFields):
    """A judge's call on one criterion: a generation (letter judging) or one option's loglikelihood."""

    kind: Literal["model"] = "model"
    role: Literal["judge"] = "judge"
    call: Count
    criterion: str
    judge: str
    shuffle_order: list[Count]  # shown position -> original option, for this criterion and judge
    option: Count | None = None  # loglikelihood judging: the original option scored ...
    position: Count | None = None  # ... and where it was shown
    request: GenerationRequestRecord | LoglikelihoodRequestRecord
    request_hash: Hex64
    response: CompletionResponse | LoglikelihoodResponse

    @model_validator(mode="after")
    def _one_mode(self) -> JudgeEntry:
        scored = isinstance(self.request, LoglikelihoodRequestRecord)
        if scored != isinstance(self.response, LoglikelihoodResponse):
            raise ValueError("request and response are of different call types")
        if scored != (self.option is not None) or scored != (self.position is not None):
            raise ValueError("option and position are recorded with, and only with, a loglikelihood request")
        return self


class EndEntry(Entry, OptionalFields):
    """The chain's last entry: ``status`` ok, or error with the reason in ``error`` (left out when ok).

    Agent episodes add why the episode stopped (``stop``: done, max_steps, max_tokens), its turns
    (``steps``) and the hash of the final world state the verifier scores (``final_state_sha256``).
    """

    kind: Literal["end"] = "end"
    model_calls: Count
    status: str
    error: str | None = None
    final_state_sha256: Hex64 | None = None
    steps: Count | None = None
    stop: Literal["done", "max_steps", "max_tokens"] | None = None


class FailedCallEntry(Entry, OptionalFields):
    """A model call the engine refused (or that was refused before it, e.g. a prompt longer than the
    context): the request as it would have been sent, and the reason instead of a response. ``role`` is
    ``user`` for a simulated person's turn (with its ``tool`` call), absent for the policy's."""

    kind: Literal["model"] = "model"
    call: Count
    request: GenerationRequestRecord | LoglikelihoodRequestRecord
    request_hash: Hex64
    error: str
    role: Literal["user"] | None = None
    tool: Count | None = None

    @model_validator(mode="after")
    def _user_turn_names_its_tool_call(self) -> FailedCallEntry:
        if (self.role is None) != (self.tool is None):
            raise ValueError("a simulated person's refused turn names its tool call, and only it")
        return self


class UserEntry(Entry):
    """A simulated person's turn played by a model (``task.world.user=model``): a generation made while the
    agent's tool call ``tool`` spoke to the person (support-desk's ``send_message``); the response is the
    person's reply, which the tool's observation then carries. Numbered with the episode's other model calls."""

    kind: Literal["model"] = "model"
    role: Literal["user"] = "user"
    call: Count
    tool: Count
    request: GenerationRequestRecord
    request_hash: Hex64
    response: CompletionResponse


class ToolEntry(Entry):
    kind: Literal["tool"] = "tool"
    call: Count
    request: ToolRequest
    request_hash: Hex64


class ObservationEntry(Entry, OptionalFields):
    """What the agent is shown: a tool call's result (``call``), or why a model reply was not a valid
    tool-call reply (``reply``: that model call's number; status error)."""

    kind: Literal["observation"] = "observation"
    call: Count | None = None  # the tool call this answers
    reply: Count | None = None  # the model call whose reply could not be parsed
    status: Literal["ok", "error"]
    content: Json

    @model_validator(mode="after")
    def _answers_one(self) -> ObservationEntry:
        if (self.call is None) == (self.reply is None):
            raise ValueError("an observation answers exactly one of a tool call (call) or a model reply (reply)")
        return self


class ClockEntry(Entry, OptionalFields):
    kind: Literal["clock"] = "clock"
    call: Count
    tool: Count | None = None  # read during this tool call (absent: outside any)
    request: ClockRequest
    request_hash: Hex64
    response: ClockReading


class RandomEntry(Entry, OptionalFields):
    kind: Literal["random"] = "random"
    call: Count
    tool: Count | None = None
    request: RandomRequest
    request_hash: Hex64
    response: RandomDraw


class UuidEntry(Entry, OptionalFields):
    kind: Literal["uuid"] = "uuid"
    call: Count
    tool: Count | None = None
    request: UuidRequest
    request_hash: Hex64
    response: UuidValue


class EnvEntry(Entry, OptionalFields):
    kind: Literal["env"] = "env"
    call: Count
    tool: Count | None = None
    request: EnvRequest
    request_hash: Hex64
    response: EnvValue


class JoinEntry(Entry):
    kind: Literal["join"] = "join"
    calls: list[Count] = Field(min_length=1)  # tool calls, in the order their observations were recorded


ENTRY_TYPES: dict[str, type[Entry]] = {
    "header": HeaderEntry,
    "model": ModelEntry,
    "loglikelihood": LoglikelihoodEntry,
    "judge": JudgeEntry,
    "user": UserEntry,
    "failed": FailedCallEntry,
    "tool": ToolEntry,
    "observation": ObservationEntry,
    "clock": ClockEntry,
    "random": RandomEntry,
    "uuid": UuidEntry,
    "env": EnvEntry,
    "join": JoinEntry,
    "end": EndEntry,
}
"""Typed forms by tag; the tag is the ``kind`` written, except that ``model`` lines are told apart as above."""

MODEL_CALLS = (ModelEntry, LoglikelihoodEntry, JudgeEntry, UserEntry, FailedCallEntry)
"""The typed forms of ``model`` lines."""

ENTRY_KINDS = frozenset(t.model_fields["kind"].default for t in ENTRY_TYPES.values())
"""The ``kind`` values a chain line may have."""

_TAG_OF_TYPE = {entry_type: tag for tag, entry_type in ENTRY_TYPES.items()}


def entry_tag(value: Any) -> str | None:
    """The typed form of an entry (a parsed JSON object or an entry)."""
    if not isinstance(value, dict):
        return _TAG_OF_TYPE.get(type(value))
    kind = value.get("kind")
    if kind == "model":
        if "error" in value and "response" not in value:
            return "failed"
        if "role" in value:
            return "user" if value["role"] == "user" else "judge"
        request = value.get("request")
        return "loglikelihood" if isinstance(request, dict) and "op" in request else "model"
    return kind if isinstance(kind, str) else None


ChainEntry = Annotated[
    Union[tuple(Annotated[entry_type, Tag(tag)] for tag, entry_type in ENTRY_TYPES.items())],  # noqa: UP007
    Discriminator(
        entry_tag,
        custom_error_type="entry_kind",
        custom_error_message=f"kind must be one of {sorted(ENTRY_KINDS)}",
    ),
]
_ENTRY: TypeAdapter[Any] = TypeAdapter(ChainEntry)


class EntryError(KeepsFields, ValueError):
    """A JSON object that is not a chain entry; ``field`` names the first field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def parse_entry(value: dict[str, Any]) -> Entry:
    """The typed entry of a parsed chain line; EntryError naming the field otherwise."""
    try:
        return _ENTRY.validate_python(value)
    except ValidationError as exc:
        raise EntryError(*first_error(exc, ENTRY_TYPES)) from None


def parse_line(line: str) -> Entry:
    """The typed entry of a chain line; EntryError if it is not JSON or not an entry."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EntryError("(line)", f"not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise EntryError("(line)", "not a JSON object")
    return parse_entry(value)


def entry_line(entry: Entry, request_json: str | None = None) -> str:
    """The generic encoder: an entry's line is the canonical JSON of its record.

    ``request_json``, when the caller has made it already, is the canonical JSON of the entry's
    request, embedded as it is rather than made again (the same bytes; tests/test_formats.py checks).
    """
    if request_json is None:
        return canonical_json(entry.as_record())
    record = entry.model_dump(by_alias=True, exclude={"request"})
    record["request"] = Canonical(request_json)
    return canonical_json(record)


def request_text(request: RecordModel) -> str:
    """A request's canonical JSON: what ``request_hash`` hashes, and what the line holds."""
    return canonical_json(request.as_record())


def request_hash(request: RecordModel) -> str:
    """What an entry's ``request_hash`` is: sha256 of the request's canonical JSON."""
    return sha256_hex(request_text(request))


def generation_request(prompt: str, sampling: SamplingSource) -> GenerationRequestRecord:
    """What a model entry records of a generation request."""
    return GenerationRequestRecord(
        prompt=prompt, prompt_sha256=sha256_hex(prompt), sampling=SamplingRecord(**sampling.as_record())
    )


def loglikelihood_request(context: str, continuation: str, rolling: bool = False) -> LoglikelihoodRequestRecord:
    """What a model entry records of a loglikelihood request."""
    return LoglikelihoodRequestRecord(continuation=continuation, prompt=context, prompt_sha256=sha256_hex(context),
                                      op="loglikelihood_rolling" if rolling else "loglikelihood")  # fmt: skip


def request_fields(prompt: str, sampling: SamplingSource) -> dict[str, Any]:
    """:func:`generation_request` as a JSON object (its canonical JSON is hashed into ``request_hash``)."""
    return generation_request(prompt, sampling).as_record()


def loglikelihood_fields(context: str, continuation: str, rolling: bool = False) -> dict[str, Any]:
    """:func:`loglikelihood_request` as a JSON object."""
    return loglikelihood_request(context, continuation, rolling).as_record()
