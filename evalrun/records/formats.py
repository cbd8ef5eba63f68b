"""Every JSON document evalrun writes or reads, defined once and typed (docs/design.md "Record formats").

The models are pydantic v2 models: pydantic is the project's choice for typed records (a declared
dependency, also used for the config), for its strict validation of untrusted input with errors
that name the field. Every record model is frozen, forbids unknown fields and is strict (no
coercion: a ``"1"`` is not an int, a ``1`` is not a bool, no NaN or infinity), so what parses is
exactly what evalrun could have written. A model's :meth:`RecordModel.as_record` is the JSON
object as written; ``canonical_json(model.as_record())`` is its canonical text.

Absent versus null: a field that has the default ``None`` is *left out* when it is None, never
written as null (and an explicit null for it is refused on input), so optional fields stay absent
as they always were; a required field whose type allows None is written as null.

Chain entries are in :mod:`evalrun.records.entries`, output and score rows in
:mod:`evalrun.records.outputs`; every ``*_FORMAT`` name of a written record is here.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    model_serializer,
    model_validator,
)

from evalrun.records.canonical import MAX_SAFE_INTEGER, canonical_hash

SCHEDULE_FORMAT = "evalrun.schedule/1"  # an episode chain's header (the schedule the chain follows)
RECORD_FORMAT = "evalrun.record/1"  # record.json
SEAL_FORMAT = "evalrun.seal/1"  # the preimage of record.json's seal, for records made before seal_format
SEAL_FORMAT_ALL = "evalrun.seal/2"  # the preimage of a record's seal that covers every field (new runs')
MANIFEST_FORMAT = "evalrun.manifest/1"  # manifest.json
SUMMARY_FORMAT = "evalrun.summary/5"  # summary.json, as new runs write it
# /1: clustered normal interval; /2: bounded for 0/1; /3: /2 and pass^k over repeats; /4: /3 and perplexity; /5: /4
# and a corpus metric's aggregate (lm-eval's aggregation over every document)
SUMMARY_FORMATS = ("evalrun.summary/1", "evalrun.summary/2", "evalrun.summary/3", "evalrun.summary/4",
                   "evalrun.summary/5")  # fmt: skip
PROOF_FORMAT = "evalrun.proof/1"  # evalrun prove
COMPARE_FORMAT = "evalrun.compare/1"  # evalrun compare --json
NONDET_FORMAT = "evalrun.nondet/1"  # evalrun nondet --json
VERIFY_FORMAT = "evalrun.verify/1"  # evalrun verify --json
RESCORE_FORMAT = "evalrun.rescore/1"  # evalrun rescore --json
REPLAY_FORMAT = "evalrun.replay/1"  # evalrun replay --json
LEDGER_FORMAT = "evalrun.ledger/1"  # one line of an anchor ledger (evalrun anchor)
CHECKPOINT_FORMAT = "evalrun.checkpoint/1"  # RUN_DIR/checkpoints/checkpoint-SEQ.json, committed during a run
CHECKPOINT_PAYLOAD_TYPE = "application/vnd.evalrun.checkpoint+json"  # what a checkpoint's signature signs
REBASELINE_FORMAT = "evalrun.rebaseline/1"  # RUN_DIR/rebaseline.json (evalrun rebaseline)
CHECK_FORMAT = "evalrun.check/1"  # evalrun check --json
HELD_FORMAT = "evalrun.held/1"  # evalrun replay --live --json: repeats with one side of a conversation held fixed
CANARY_FORMAT = "evalrun.canary/1"  # a worker's batch-invariance canary (manifest workers[].canary, evalrun canary)
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"  # attestation.intoto.json
PREDICATE_TYPE = "https://evalrun.dev/attestation/run/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # DSSE payload type of a signed attestation

Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest: 64 lowercase hex digits."""

DecimalString = Annotated[str, StringConstraints(pattern=r"^[0-9]+$")]
"""An unsigned integer written as a decimal string (64-bit seeds: JSON numbers stop at 2**53)."""

JsonInt = Annotated[int, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
"""An integer canonical JSON can hold exactly (RFC 8785 numbers are IEEE doubles)."""

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]

Text = Annotated[str, StringConstraints(min_length=1)]
"""A string that says something: not empty."""
PINNED_IMAGE_PATTERN = r"^[^\s@]+@sha256:[0-9a-f]{64}$"
PinnedImage = Annotated[str, StringConstraints(pattern=PINNED_IMAGE_PATTERN)]
"""A container image reference pinned by digest: ``NAME@sha256:<64 hex digits>``."""


def _read_as_jcs(value: Any) -> Any:
    """An untyped JSON value as RFC 8785 reads it: every number is a double, so an integer literal
    beyond 2**53 (how canonical JSON writes a large integral double, 1e20 as 100000000000000000000)
    is that double."""
    if type(value) is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        try:
            return float(value)
        except OverflowError:
            raise ValueError("a number beyond the range of JSON numbers") from None
    if type(value) is list:
        return [_read_as_jcs(v) for v in value]
    if type(value) is dict:
        return {k: _read_as_jcs(v) for k, v in value.items()}
    return value


Json = Annotated[JsonValue, AfterValidator(_read_as_jcs)]
"""Any JSON value (tool arguments and results), its numbers read as canonical JSON writes them."""


class RecordModel(BaseModel):
    """A record evalrun writes: frozen, strict, no unknown fields. A record with optional fields
    derives from :class:`OptionalFields` (checked when the class is made)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    absent_when_none: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        absent = frozenset(
            field.serialization_alias or field.alias or name
            for name, field in cls.model_fields.items()
            if not field.is_required() and field.default is None
        )
        if absent and not issubclass(cls, OptionalFields):
            raise TypeError(f"{cls.__name__} has optional fields {sorted(absent)}: derive it from OptionalFields")
        cls.absent_when_none = absent

    def as_record(self) -> dict[str, Any]:
        """The JSON object as written (pass it to ``canonical_json``)."""
        return self.model_dump(by_alias=True)


class OptionalFields(RecordModel):
    """A record with optional fields (default None): left out when None, and an explicit null refused.

    Only such records pay for the two Python hooks below; the others validate and dump in pydantic-core alone.
    """

    @model_validator(mode="before")
    @classmethod
    def _refuse_null_for_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in cls.absent_when_none:
                if key in data and data[key] is None:
                    raise ValueError(f"{key!r} is left out when it has no value, never written as null")
        return data

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self.absent_when_none:
            if key in data and data[key] is None:
                del data[key]
        return data


def first_error(exc: ValidationError, tags: Collection[str] = ()) -> tuple[str, str]:
    """(dotted field path, message) of a validation error's first problem, for BadInput/CheckFailed;
    a leading union tag in ``tags`` is left out of the path."""
    error = exc.errors(include_url=False)[0]
    loc = error["loc"][1:] if error["loc"] and error["loc"][0] in tags else error["loc"]
    where = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "missing":
        return where, "missing"
    return where, error["msg"]


class Generator(RecordModel):
    """Who wrote a run: in every chain header and in the manifest."""

    name: str
    version: str
    git_commit: str | None


# --- record.json -------------------------------------------------------------------------------


class EpisodeCounts(RecordModel):
    planned: Count
    written: Count


PROVENANCE_FIELDS = ("dispatch", "ended_at", "timings", "logs")
"""record.json's fields that legitimately differ between identical runs; under the seal of a record whose
``seal_format`` is evalrun.seal/2 (every run made since), outside it in earlier records."""


class Record(OptionalFields):
    """record.json, written last: a run directory without it is not a result."""

    format: Literal["evalrun.record/1"] = RECORD_FORMAT
    episodes: EpisodeCounts
    parts: Count
    output_tokens: Count | None = None
    merkle_root: Hex64
    digest: Hex64
    manifest_sha256: Hex64
    files: dict[str, Hex64]  # relative path -> sha256, for every file of the run but record.json itself
    dispatch: dict[str, Any] | None = None  # retries, restarts, events, resumed, kept_parts
    ended_at: str | None = None  # ISO 8601, UTC
    timings: dict[str, Any] | None = None  # seconds per phase of the invocation that finished the run
    logs: dict[str, Any] | None = None  # files: the logs/ files written; failed: log name -> why it is missing
    # what the seal covers: evalrun.seal/2, every field (absent: evalrun.seal/1, all but the provenance fields)
    seal_format: Literal["evalrun.seal/2"] | None = None
    seal: Hex64 | None = None  # :func:`seal_of` this record: the one value to keep elsewhere

    def claims(self) -> dict[str, Any]:
        """What the seal covers: every field but the seal; in a record without ``seal_format`` (made before it)
        not the provenance either (dispatch, ended_at, timings, logs)."""
        left_out = ("seal",) if self.seal_format == SEAL_FORMAT_ALL else ("seal", *PROVENANCE_FIELDS)
        return {k: v for k, v in self.as_record().items() if k not in left_out}


def seal_of(record: Record) -> str:
    """The run's seal: sha256 of the canonical JSON of ``{"format": SEAL_FORMAT..., "claims": ...}``.

    The claims hold the Merkle root over the episodes' heads, the digest, the counts, the sha256 of every file of
    the run (config, manifest, every part, scores, summary, checkpoints) and, under evalrun.seal/2, the
    provenance too (the workers, drift, retries and restarts in ``dispatch``, times, logs): a forger who rewrites
    any of it changes the seal. See docs/design.md "Record".
    """
    version = SEAL_FORMAT_ALL if record.seal_format == SEAL_FORMAT_ALL else SEAL_FORMAT
    return canonical_hash({"format": version, "claims": record.claims()})


# --- summary.json ------------------------------------------------------------------------------


class SummaryEstimate(OptionalFields):
    """One metric's estimate over items (see :mod:`evalrun.stats.estimates`)."""

    mean: float
    se: float | None
    ci95: list[float] | None  # [low, high]
    interval: str | None = None  # which interval ci95 is (evalrun.summary/2 names it; /1 does not)
    spread: float
    n_items: Count
    trials_per_item: float
    n_observations: Count
    errors: Count | None = None  # observations of failed episodes (scored 0); left out when there are none
    pass_all_trials: float | None = None  # pass^k over items (0/1 metrics, k > 1 trials each); else left out
    # a perplexity metric's (its values loglikelihoods, lm-eval's): exp(-mean); else, or where it overflows or an
    # episode failed (scored 0, no loglikelihood), left out
    perplexity: float | None = None
    # a corpus metric's (evalrun.summary/5; lm-eval's bleu, f1, ...: a metric aggregated over the whole set, not
    # by its mean): the aggregation's name, and its value over every document's input (left out where an episode
    # failed or it is not a finite number)
    aggregation: str | None = None
    aggregate: float | None = None


class Summary(RecordModel):
    """summary.json: per task and overall, every metric's estimate. ``format`` (one of
    :data:`SUMMARY_FORMATS`) and ``method`` say how the estimates and intervals were computed."""

    format: str
    method: str
    tasks: dict[str, dict[str, SummaryEstimate]]
    overall: dict[str, SummaryEstimate]


# --- manifest.json -----------------------------------------------------------------------------


class DigestRecord(RecordModel):
    """The run's digest and its three parts (docs/design.md "Manifest")."""

    prompt_pack: Hex64
    seed_set: Hex64
    scoring: Hex64
    digest: Hex64  # sha256(prompt_pack + seed_set + scoring)


class InstalledLock(RecordModel):
    """The lock file scripts/setup.sh installed the environment from (docs/design.md "Locked installs")."""

    extra: str  # cpu or gpu
    path: str  # as setup.sh was given it, relative to the checkout: requirements/cpu.lock
    sha256: Hex64  # of the lock file when it was installed


class ComposedFile(RecordModel):
    source: str  # the config search path's entry it was read from: a user's directory, or pkg://evalrun.conf
    sha256: Hex64


class ConfigSourcesRecord(RecordModel):
    """Where a run's config was composed from (``evalrun run --config-dir``, ``EVALRUN_CONFIG_PATH``): provenance."""

    search_path: list[str]  # the user's directories in the order searched, then pkg://evalrun.conf
    files: dict[str, ComposedFile]  # config.yaml, model/mine.yaml, ...: each file Hydra composed


class Install(RecordModel):
    """How the run's software was installed: provenance, outside ``identity`` and the digest."""

    lock: InstalledLock | None  # null: not installed from a lock (EVALRUN_LOCK=none, or not by setup.sh)
    image: PinnedImage | None  # the container image from EVALRUN_IMAGE; null outside one


class Manifest(OptionalFields):
    """manifest.json: how a run was made. The top level is typed; config sections stay JSON objects."""

    format: Literal["evalrun.manifest/1"] = MANIFEST_FORMAT
    identity: dict[str, Any]  # what decides what the run computes; resume refuses a run whose identity changed
    digest: DigestRecord
    digest_inputs: dict[str, Any] | None = None  # part -> the exact record its hash covers
    task: dict[str, Any]
    limit: JsonInt | None
    episodes: Count
    model: dict[str, Any]
    judge_model: dict[str, Any] | None
    engine: dict[str, Any]
    judge_engine: dict[str, Any] | None = None  # the judges' engine when it is another (a judge model's)
    user_model: dict[str, Any] | None = None  # the model playing a world's simulated user, when it is another
    user_engine: dict[str, Any] | None = None  # its engine, when it is another
    decoding: dict[str, Any]
    seeds: dict[str, Any]
    determinism: dict[str, Any]
    cluster: dict[str, Any]
    config: ConfigSourcesRecord | None = None  # where the config was composed from (runs made before: absent)
    workers: list[dict[str, Any]]  # every worker at the start: name, hardware, fingerprint
    drift: list[dict[str, Any]] | None = None  # workers that differ from the first (run.on_drift=warn)
    generator: Generator
    libraries: dict[str, Any]
    python: str
    git: dict[str, Any]
    hardware: dict[str, Any]
    started_at: str  # ISO 8601, UTC
    install: Install | None = None  # absent in manifests written before locked installs


# --- attestation.intoto.json -------------------------------------------------------------------


class SubjectDigest(RecordModel):
    sha256: Hex64


class Subject(RecordModel):
    name: str
    digest: SubjectDigest


class AttestationPredicate(RecordModel):
    """What the attestation states of a run, beyond its files' digests: copied from record.json."""

    merkle_root: Hex64
    digest: Hex64
    manifest_sha256: Hex64
    episodes: EpisodeCounts
    record_format: str


class Statement(RecordModel):
    """An in-toto Statement v1 over record.json and every file it lists."""

    type_: Literal["https://in-toto.io/Statement/v1"] = Field(default=STATEMENT_TYPE, alias="_type")
    subject: list[Subject]
    predicateType: Literal["https://evalrun.dev/attestation/run/v1"] = PREDICATE_TYPE  # in-toto's name
    predicate: AttestationPredicate


class Signature(OptionalFields):
    keyid: str | None = None
    sig: str  # base64


class Envelope(RecordModel):
    """A DSSE envelope (https://github.com/secure-systems-lab/dsse) around a canonical Statement."""

    payloadType: str  # DSSE's name
    payload: str  # base64 of the canonical JSON of the Statement
    signatures: list[Signature] = Field(min_length=1)


# --- evalrun prove -----------------------------------------------------------------------------


class Proof(OptionalFields):
    """An inclusion proof: one episode against a run's Merkle root, its chain disclosed (from its header, or from
    entry ``from_seq`` on, after the chain's hash ``prev`` before it: the earlier entries stay private)."""

    format: Literal["evalrun.proof/1"] = PROOF_FORMAT
    episode_id: str
    head: Hex64
    leaf_index: Count
    tree_size: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    path: list[Hex64]  # RFC 6962 audit path, leaf to root
    root: Hex64
    lines: list[str] = []  # the episode's chain lines, from entry from_seq (0 when absent) to its end
    from_seq: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] | None = None  # absent: from the header
    prev: Hex64 | None = None  # the chain's hash before entry from_seq (with from_seq only)


# --- anchor ledgers (evalrun anchor) -----------------------------------------------------------


class LedgerEntry(RecordModel):
    """One line of an anchor ledger: an append-only file of canonical JSON lines that is itself a hash
    chain (``hash_0 = "0" * 64``, ``hash_i = sha256(hash_{i-1} + line_i)``; ``prev`` is the hash
    before the line, ``seq`` its index). See docs/design.md "Ledger"."""

    format: Literal["evalrun.ledger/1"] = LEDGER_FORMAT
    seq: Count
    prev: Hex64
    run: Text  # the run directory's name: a ledger anchors a name once
    seal: Hex64
    digest: Hex64
    merkle_root: Hex64
    anchored_at: str  # ISO 8601, UTC (provenance: when the line was appended)


# --- checkpoints (committed during a run) ------------------------------------------------------


class Checkpoint(OptionalFields):
    """What a run had committed at one moment of its generation, written while it runs: the parts durable by
    then (each file's sha256), their episodes and the Merkle root over those episodes' heads, so that a run that
    dies later has anchored evidence of what it had done. Checkpoints form a chain (``prev``: the
    :func:`checkpoint_hash` of the one before, ``"0" * 64`` for the first); ``signature`` (an Ed25519 signature
    of the DSSE pre-authentication encoding of the checkpoint without it) when ``EVALRUN_SIGNING_KEY`` is set.
    See docs/design.md "Checkpoints"."""

    format: Literal["evalrun.checkpoint/1"] = CHECKPOINT_FORMAT
    seq: Count
    prev: Hex64
    digest: Hex64  # the run's digest
    episodes: Count  # episodes in the parts listed
    parts: dict[str, Hex64]  # every part file durable by then (log/ and outputs/) -> sha256
    merkle_root: Hex64  # over the (episode id, head) of those episodes, as record.json's over all
    created_at: str  # ISO 8601, UTC (provenance: when it was committed)
    signature: Signature | None = None

    def claims(self) -> dict[str, Any]:
        """The checkpoint as hashed and signed: every field but the signature."""
        return {k: v for k, v in self.as_record().items() if k != "signature"}


def checkpoint_hash(checkpoint: Checkpoint) -> str:
    """sha256 of the canonical JSON of the checkpoint's claims: the next one's ``prev``, its ledger entry's seal."""
    return canonical_hash(checkpoint.claims())


# --- rebaseline.json (evalrun rebaseline) ------------------------------------------------------

DigestPart = Literal["prompt_pack", "seed_set", "scoring"]


class BaselineRun(RecordModel):
    """One side of a re-baseline: a run as verify found it."""

    run: Text  # the run directory's name when it was re-baselined
    digest: DigestRecord
    merkle_root: Hex64
    seal: Hex64


class FieldChange(RecordModel):
    """A recorded field that differs between the old and the new baseline (null: absent on that side)."""

    field: Text  # dotted path: digest_inputs.seed_set.master, decoding.temperature, ...
    old: Json
    new: Json


class Rebaseline(RecordModel):
    """RUN_DIR/rebaseline.json: this run is the baseline ``old`` re-run under a new digest, and why.

    Written after the run was sealed (record.json does not list it); ``evalrun verify`` checks that
    ``new`` is this run and that ``changed_parts`` are the parts in which the two digests differ.
    """

    format: Literal["evalrun.rebaseline/1"] = REBASELINE_FORMAT
    old: BaselineRun
    new: BaselineRun
    reason: Text
    changed_parts: list[DigestPart]  # the digest parts that differ, in digest order
    changes: list[FieldChange]  # what the two manifests record differently (see evalrun.audit.rebaseline)
    created_at: str  # ISO 8601, UTC (provenance)
