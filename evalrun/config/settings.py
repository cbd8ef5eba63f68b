"""The settings, typed and frozen: one dataclass per config group, the one definition of each setting.

Every setting's name, type, default and valid values are written here once. Hydra composes into
mutable copies of these classes (:mod:`evalrun.config.schema`, generated from them); validation
turns the composed result into them once (:meth:`Section.from_record`), and from then on code reads
attributes (``config.decoding.temperature``), never string keys. Where a record needs a section as
data (config.yaml, the manifest, digest preimages) it takes :meth:`Section.as_record`, which gives
back exactly the dict that was composed: ``from_record(r).as_record() == r``, less a setting marked
``LEFT_OUT_WHEN_NULL`` while it is null (one added after runs were recorded: their config.yaml stays
byte for byte what it was).

Plug-in names (``engine.name``, ``cluster.name``, ``task.scorer.name``, ``task.scorer.normalize``)
are plain strings here: the registries of the packages that implement them check them, before any
model loads (:func:`evalrun.pipeline.runner.prepare`).
"""

from __future__ import annotations

import math
import re
import types
from collections import Counter
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from dataclasses import field as dataclass_field  # for a section with a setting named field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from evalrun.config.search import ConfigSources
from evalrun.errors import BadInput
from evalrun.records.seeds import MASTER_SEED_LIMIT

MISSING = "???"  # Hydra's marker of a value the config must supply
MAX_TEMPERATURE = 2.0  # vLLM's limit
NOT_A_SETTING = {"setting": False}  # field metadata: resolved by validation, not composed or recorded
# field metadata: a null value (or an empty mapping) is left out of the record, and a record without the field
# reads as the default, so records made before the setting existed are unchanged
LEFT_OUT_WHEN_NULL = {"left_out_when_null": True}
OR_AUTO = {"or_auto": True}  # field metadata: may be composed as "auto", which validation resolves to a value
AUTO = "auto"
MODEL_USER = "model"  # task.world.user: a model plays the world's simulated user
MASTER_SEED_EXPECTED = "a non-negative integer or auto (integers below 2**53)"

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
# engine.cpu_isa: the instruction set a CPU worker's kernels may use, newest first (evalrun/pipeline/cpu_isa.py)
CPU_ISA_LEVELS = ("native", "avx512", "avx2", "default")
# loglikelihood_rolling: each option a whole document scored on its own in rolling windows (lm-eval's output type)
ChoiceScoring = Literal["letter", "loglikelihood", "both", "loglikelihood_rolling"]
ChatFormatName = Literal["auto", "chat", "plain"]
ToolFormatName = Literal["auto", "json", "native"]

S = TypeVar("S", bound="Section")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit, as a hub dataset's revision is pinned by


def _fail(where: str, expected: str, got: Any) -> BadInput:
    return BadInput(where, f"expected {expected}, got {got!r}")


def settings_fields(cls: type) -> list[Field[Any]]:
    """The fields of a section that are settings (composed by Hydra, recorded in config.yaml)."""
    return [f for f in fields(cls) if f.metadata.get("setting", True)]


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None``; None for any other type."""
    if get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return None


def _alternatives(tp: Any) -> list[Any]:
    """The types of ``A | B | None`` with two or more alternatives besides None; empty for any other type."""
    if get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) > 1:
            return inner
    return []


_SCALARS: dict[type, tuple[str, tuple[type, ...]]] = {
    bool: ("true or false", (bool,)),
    int: ("an integer", (int,)),
    float: ("a number", (int, float)),
    str: ("a string", (str,)),
}


def _typed(tp: Any, value: Any, where: str) -> Any:
    """``value`` as type ``tp``: sections built, lists made tuples, literals and scalar types checked.
    Scalars are kept as given (an integer stays an integer), so the record comes back unchanged."""
    alternatives = _alternatives(tp)
    if alternatives:  # ``A | B | None``: the first alternative the value is (a URL or a list of them)
        if value is None:
            return None
        for alternative in alternatives[:-1]:
            try:
                return _typed(alternative, value, where)
            except BadInput:
                continue
        return _typed(alternatives[-1], value, where)
    inner = _optional_inner(tp)
    if inner is not None:
        if value is None:
            return None
        if get_origin(inner) is Literal and value not in get_args(inner):
            raise _fail(where, f"one of {get_args(inner)} or null", value)
        return _typed(inner, value, where)
    origin = get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, Section):
        if not isinstance(value, Mapping):
            raise _fail(where, "a mapping of settings", value)
        return tp.from_record(value, where)
    if origin is Literal:
        if value not in get_args(tp):
            raise _fail(where, f"one of {get_args(tp)}", value)
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _fail(where, "a list", value)
        return tuple(_typed(get_args(tp)[0], v, f"{where}.{i}") for i, v in enumerate(value))
    if origin in (dict, Mapping) and get_args(tp)[1] is Any:
        if not (isinstance(value, Mapping) and all(isinstance(k, str) and _json_scalar(v) for k, v in value.items())):
            raise _fail(where, "a mapping of names to strings, numbers, true/false or null", value)
        return dict(value)
    if origin in (dict, Mapping):
        if not (isinstance(value, Mapping) and all(isinstance(x, str) for kv in value.items() for x in kv)):
            raise _fail(where, "a mapping of strings to strings", value)
        return dict(value)
    expected, accepted = _SCALARS[tp]
    if not isinstance(value, accepted) or (tp is not bool and isinstance(value, bool)):
        raise _fail(where, expected, value)
    return value


def _null_or_empty(value: Any) -> bool:
    """A null value, an empty mapping, or a section whose every setting is left out (a record without it)."""
    if isinstance(value, Section):
        value = value.as_record()
    return value is None or (isinstance(value, dict) and not value)


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value))


def _record(value: Any) -> Any:
    if isinstance(value, Section):
        return value.as_record()
    if isinstance(value, tuple):
        return [_record(v) for v in value]
    if isinstance(value, dict):
        return {k: _record(v) for k, v in value.items()}
    return value


class Section:
    """A group of settings: built from its record once, given back as the same record."""

    where: ClassVar[str] = ""  # the section's dotted name in the config, for error messages

    @classmethod
    def from_record(cls: type[S], record: Mapping[str, Any], where: str | None = None) -> S:
        """The section of a composed record; a BadInput names the first field that is missing,
        unknown or of the wrong type or value."""
        where = cls.where if where is None else where
        names = [f.name for f in settings_fields(cls)]
        unknown = sorted(set(record) - set(names))
        if unknown:
            raise BadInput(_join(where, str(unknown[0])), "not a setting")
        values = {}
        optional = {f.name for f in settings_fields(cls) if f.metadata.get("left_out_when_null")}
        for name in names:
            if name not in record and name in optional:
                continue
            if name not in record:
                raise BadInput(_join(where, name), "missing")
            values[name] = _typed(_hints(cls)[name], record[name], _join(where, name))
        return cls(**values)

    def as_record(self) -> dict[str, Any]:
        """The settings as plain data (lists, dicts), exactly as they were composed."""
        return {
            f.name: _record(getattr(self, f.name))
            for f in settings_fields(type(self))
            if not (f.metadata.get("left_out_when_null") and _null_or_empty(getattr(self, f.name)))
        }


@dataclass(frozen=True)
class ModelConfig(Section):
    where: ClassVar[str] = "model"

    name: str = MISSING
    id: str = MISSING
    path: str | None = None
    revision: str | None = None
    cache_dir: str | None = None  # hub cache to resolve id + revision in (None: Hugging Face's default)
    pinned: bool = True
    dtype: Dtype = "float32"
    sha256: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig(Section):
    where: ClassVar[str] = "engine"

    name: str = "vllm"  # a registered engine (evalrun.engines.ENGINES)
    dtype: Dtype | None = None  # None: the model's dtype
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.85
    cpu_kvcache_gib: int = 1
    seed: int = 0
    device: str | None = None  # engine=hf only: cpu | cuda | cuda:N (None: cuda where available, else cpu)
    # engine=vllm or hf on CPU: the instruction set the worker's kernels may use (CPU_ISA_LEVELS), or a list, one per
    # worker in turn (a mixed cluster on one machine); null: native, what the processor has
    cpu_isa: str | tuple[str, ...] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # engine=vllm: false prefills every prompt whole (vLLM's token budget per step then the context), which vLLM on
    # the CPU needs to sample with a seed once a batch's prompts exceed its budget (it cannot rewind a CPU sampler
    # across a chunk); null: vLLM's default (on)
    chunked_prefill: bool | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # engine=openai only (evalrun/engines/openai.py), each left out of the record while null:
    # http://HOST:PORT/v1, or a list of servers of the same model (each request to the least loaded)
    base_url: str | tuple[str, ...] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    served_model: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # the server's name of the model
    api_key_env: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # the variable holding the key
    serve: bool | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # true: start a vLLM server of the model
    max_concurrency: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # requests in flight (64)
    timeout_s: float | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # per request (300)
    max_retries: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # per request (5)
    # completions (evalrun's rendered prompt, as text) or chat (the messages it was rendered from, which the server
    # renders with its template and must render alike); null: completions
    api: Literal["completions", "chat"] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # where a reply's token ids come from: the server (vLLM's return_token_ids), or, for a server that gives none
    # (SGLang, TGI, llama.cpp), evalrun's tokenization of the reply's text; null: server
    token_ids: Literal["server", "local"] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)

    # how requests reach a served model, not what it computes (the server's answers are checked for drift): a run
    # resumes through another URL or at another concurrency, as it resumes on other workers or batch sizes
    TRANSPORT: ClassVar[tuple[str, ...]] = ("base_url", "api_key_env", "max_concurrency", "timeout_s", "max_retries")

    def identity_record(self) -> dict[str, Any]:
        """The settings as a run's identity holds them: :meth:`as_record` without the transport's."""
        return {k: v for k, v in self.as_record().items() if k not in self.TRANSPORT}

    def check(self, where: str = "engine") -> None:
        """``where``: the section's name in the config (``engine``, or ``judge_engine`` for the judges' engine)."""
        for key in ("max_num_seqs", "tensor_parallel_size", "cpu_kvcache_gib"):
            if getattr(self, key) < 1:
                raise _fail(f"{where}.{key}", "an integer >= 1", getattr(self, key))
        if self.name == "hf" and (self.tensor_parallel_size != 1 or self.enable_prefix_caching):
            raise BadInput(where, "engine=hf supports tensor_parallel_size=1 and enable_prefix_caching=false only")
        if self.device is not None and (self.name != "hf" or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device)):
            raise _fail(f"{where}.device", "null, or cpu | cuda | cuda:N with engine=hf", self.device)
        self._check_cpu_isa(where)
        if self.chunked_prefill is not None and self.name != "vllm":
            raise BadInput(f"{where}.chunked_prefill", f"a setting of engine=vllm, and the engine is {self.name}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise _fail(f"{where}.gpu_memory_utilization", "a number in (0, 1]", self.gpu_memory_utilization)
        served = ("base_url", "served_model", "api_key_env", "serve", "max_concurrency", "timeout_s", "max_retries",
                  "api", "token_ids")  # fmt: skip
        given = [key for key in served if getattr(self, key) is not None]
        if given and self.name != "openai":
            raise BadInput(f"{where}.{given[0]}", f"a setting of engine=openai, and the engine is {self.name}")
        if self.name == "openai" and not self.serve and not self.base_url:
            raise BadInput(f"{where}.base_url", "engine=openai needs the server's URL (http://HOST:PORT/v1), or "
                                              "engine.serve=true to start a vLLM server of the model")  # fmt: skip
        for key in ("max_concurrency", "max_retries"):
            value = getattr(self, key)
            if value is not None and value < (1 if key == "max_concurrency" else 0):
                raise _fail(f"{where}.{key}", "an integer >= 1" if key == "max_concurrency" else "an integer >= 0",
                            value)  # fmt: skip
        urls = (self.base_url,) if isinstance(self.base_url, str) else self.base_url or ()
        for i, url in enumerate(urls):
            if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", url):
                raise _fail(f"{where}.base_url" + (f".{i}" if not isinstance(self.base_url, str) else ""),
                            "a server's URL, http://HOST:PORT/v1", url)  # fmt: skip
        if self.base_url is not None and not urls:
            raise _fail(f"{where}.base_url", "a server's URL or a list of them", [])
        if self.serve and self.base_url is not None:
            raise BadInput(f"{where}.base_url", "engine.serve=true starts its own server: give one or the other")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise _fail(f"{where}.timeout_s", "a number of seconds > 0", self.timeout_s)

    def cpu_isa_levels(self) -> tuple[str, ...]:
        """The levels ``cpu_isa`` names, in order (one, or one per worker in turn)."""
        if self.cpu_isa is None:
            return ("native",)
        return (self.cpu_isa,) if isinstance(self.cpu_isa, str) else tuple(self.cpu_isa)

    def capped(self) -> bool:
        """Whether some worker's kernels are capped below what the processor has (``cpu_isa`` not all native)."""
        return any(level != "native" for level in self.cpu_isa_levels())

    def _check_cpu_isa(self, where: str) -> None:
        levels = self.cpu_isa_levels()
        if not levels:
            raise _fail(f"{where}.cpu_isa", f"a level ({' | '.join(CPU_ISA_LEVELS)}) or a list of them", [])
        for i, level in enumerate(levels):
            if level not in CPU_ISA_LEVELS:
                at = "" if isinstance(self.cpu_isa, str) else f".{i}"
                raise _fail(f"{where}.cpu_isa{at}", " | ".join(CPU_ISA_LEVELS), level)
        if self.capped() and (self.name not in ("vllm", "hf") or self.serve):
            raise BadInput(
                f"{where}.cpu_isa",
                f"caps the kernels of an engine in the worker's process (vllm or hf), "
                f"and the engine is {self.name}" + (" serving" if self.serve else ""),
            )
        if self.capped() and self.device not in (None, "cpu"):
            raise BadInput(f"{where}.cpu_isa", f"caps CPU kernels, and engine.device is {self.device}")


@dataclass(frozen=True)
class DecodingConfig(Section):
    where: ClassVar[str] = "decoding"

    name: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    logprobs: bool = True

    def with_overrides(self, overrides: Mapping[str, Any]) -> DecodingConfig:
        """These settings with ``overrides`` (a prompt pack's decoding settings) over them, checked."""
        decoding = DecodingConfig.from_record({**self.as_record(), **overrides})
        decoding.check()
        return decoding

    def check(self) -> None:
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise _fail("decoding.temperature", f"a number in [0, {MAX_TEMPERATURE}]", self.temperature)
        if not 0 < self.top_p <= 1:
            raise _fail("decoding.top_p", "a number in (0, 1]", self.top_p)
        if self.top_k < 0:
            raise _fail("decoding.top_k", "an integer >= 0 (0 disables top-k)", self.top_k)
        if self.max_tokens < 1:
            raise _fail("decoding.max_tokens", "an integer >= 1", self.max_tokens)
        if any(not s for s in self.stop):
            raise _fail("decoding.stop", "non-empty stop strings", list(self.stop))


def check_master_seed(value: Any) -> None:
    """A master seed as given (``auto`` resolved by then): an integer in ``[0, 2**53)``, as records hold it."""
    if type(value) is not int or not 0 <= value < MASTER_SEED_LIMIT:
        raise _fail("seeds.master", MASTER_SEED_EXPECTED, value)


@dataclass(frozen=True)
class SeedsConfig(Section):
    """docs/design.md "Seeds": the master seed, the seed set and repeats, and the few-shot seed."""

    where: ClassVar[str] = "seeds"

    master: int = field(default=1234, metadata=OR_AUTO)  # auto: evalrun generates one (recorded)
    set: tuple[int, ...] = (0,)
    repeats: int = 1
    fewshot: int | None = None  # the seed few-shot examples are drawn from; None: the master seed
    # True when evalrun generated ``master`` (seeds.master=auto); config.yaml holds the number
    master_generated: bool = field(default=False, kw_only=True, metadata=NOT_A_SETTING)

    @property
    def fewshot_seed(self) -> int:
        """The seed few-shot selection draws from: ``fewshot`` when given, else the master seed."""
        return self.master if self.fewshot is None else self.fewshot

    def check(self) -> None:
        check_master_seed(self.master)
        if not self.set:
            raise _fail("seeds.set", "at least one seed", list(self.set))
        duplicates = sorted(seed for seed, times in Counter(self.set).items() if times > 1)
        if duplicates:
            raise BadInput("seeds.set", f"expected distinct seeds, {duplicates} appear more than once")
        if any(s < 0 for s in self.set):
            raise _fail("seeds.set", "non-negative seeds", list(self.set))
        if self.repeats < 1:
            raise _fail("seeds.repeats", "an integer >= 1", self.repeats)
        if self.fewshot is not None and not 0 <= self.fewshot < MASTER_SEED_LIMIT:
            raise _fail("seeds.fewshot", "null (the master seed) or a non-negative integer below 2**53", self.fewshot)


@dataclass(frozen=True)
class ScorerConfig(Section):
    where: ClassVar[str] = "task.scorer"

    name: str = "exact_match"  # a registered scorer (evalrun.scoring.SCORERS)
    normalize: tuple[str, ...] = ("strip",)  # registered normalisers, applied in order
    pattern: str | None = None  # regex scorer: the answer is group ``group`` of the first match
    group: int = 1
    extract: Literal["first", "last"] = "first"  # number scorer: which number in the output
    tolerance: float = 0.0


@dataclass(frozen=True)
class ChoicesConfig(Section):
    where: ClassVar[str] = "task.choices"

    field: str | None = None  # the item field listing the options; None: not a multiple-choice task
    cannot_assess: str | None = None  # an option appended before shuffling ("Cannot assess", "N/A", ...)
    shuffle: bool = True
    scoring: ChoiceScoring = "letter"
    # what a loglikelihood request puts between the prompt and an option's text; null: a space, as
    # lm-evaluation-harness's default target_delimiter (an lm-eval YAML's own delimiter is set here)
    delimiter: str | None = dataclass_field(default=None, metadata=LEFT_OUT_WHEN_NULL)


@dataclass(frozen=True)
class WorldSplitsConfig(Section):
    """World seeds per split, half-open ranges ``[first, stop)``; ``test`` is the held-out split."""

    where: ClassVar[str] = "task.world.seeds"

    train: tuple[int, ...] = (0, 1000)
    test: tuple[int, ...] = (1000, 1100)


@dataclass(frozen=True)
class UserDecodingConfig(Section):
    """How a model playing a world's simulated user samples, over its prompt pack's decoding (each null: the
    pack's). Left out of every record while all are null."""

    where: ClassVar[str] = "task.world.user_decoding"

    temperature: float | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    top_p: float | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    top_k: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    max_tokens: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    stop: tuple[str, ...] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)

    def check(self) -> None:
        """The settings given, checked as ``decoding``'s are, named as this section's."""
        try:
            DecodingConfig().with_overrides(self.as_record())
        except BadInput as exc:
            raise BadInput(exc.where.replace("decoding.", f"{self.where}.", 1), exc.message) from None


@dataclass(frozen=True)
class HeldConfig(Section):
    """One side of a conversation held fixed (docs/design.md "Holding one side fixed"): ``side`` (``user``: the
    simulated user's recorded replies are served while the agent runs live; ``agent``: the converse) served from the
    finished run ``run``, episode by episode (matched by task, item, seed and repeat), reply by reply in order."""

    where: ClassVar[str] = "task.world.held"

    side: Literal["agent", "user"] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    run: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # the run directory the side is served from

    def check(self) -> None:
        if (self.side is None) != (self.run is None):
            missing = "run" if self.run is None else "side"
            raise BadInput(f"{self.where}.{missing}", "a held side names both the side (agent or user) and the run "
                                                      "its replies are served from")  # fmt: skip


@dataclass(frozen=True)
class WorldConfig(Section):
    """An agent task: episodes in a seeded offline world (evalrun/worlds), one per family and world
    seed of the split, acted in by ``agent`` (docs/design.md "Agent episodes")."""

    where: ClassVar[str] = "task.world"

    name: str = "invoice-desk"  # a registered world (evalrun.worlds.WORLDS), at ``version``
    version: str = "1"
    family: tuple[str, ...] = ()
    seeds: WorldSplitsConfig = field(default_factory=WorldSplitsConfig)
    split: Literal["train", "test"] = "test"
    start: str = "2024-03-15T09:00:00Z"  # the simulated date-time every episode's clock starts at
    tick: float = 1.0  # simulated seconds the clock advances per read
    agent: str = "scripted"  # a registered agent (evalrun.episodes.agent.AGENTS): scripted, scripted_asking, model
    reply_tokens: int = 256  # decoding.max_tokens of every model reply (the task's decoding setting)
    max_steps: int = 12  # turns before an episode is stopped (scored as it stands: no report, no pass)
    max_tokens: int = 4096  # tokens the model may generate over the episode
    # every model reply's stop strings (a reply ends at the model's end of turn; [] for none); null: the
    # decoding group's, as runs recorded before this setting
    stop: tuple[str, ...] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # how a model agent sees the tools (evalrun/worlds/tool_formats.py): json (evalrun's protocol, in prose),
    # native (JSON Schema through the chat template, replies read by the vLLM tool parser ``tool_parser``);
    # auto (null): native when the model's chat template takes tools, else json
    tool_format: ToolFormatName | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    tool_parser: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # hermes, llama3_json, mistral, ...
    # who plays the world's simulated user (evalrun/episodes/users.py): scripted (the world's own code; null means
    # it) or model (the run's model, or user_model on user_engine, shown the user prompt pack)
    user: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    user_prompt: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # a user prompt pack (null: the world's)
    user_decoding: UserDecodingConfig = field(default_factory=UserDecodingConfig, metadata=LEFT_OUT_WHEN_NULL)
    held: HeldConfig = field(default_factory=HeldConfig, metadata=LEFT_OUT_WHEN_NULL)

    @property
    def model_user(self) -> bool:
        """A model plays the world's simulated user."""
        return self.user == MODEL_USER

    def check(self) -> None:
        for key in ("reply_tokens", "max_steps", "max_tokens"):
            if getattr(self, key) < 1:
                raise _fail(f"task.world.{key}", "an integer >= 1", getattr(self, key))
        if self.stop is not None and any(not s for s in self.stop):
            raise _fail("task.world.stop", "non-empty stop strings", list(self.stop))
        if not self.family:
            raise _fail("task.world.family", "at least one task family", list(self.family))
        if not self.model_user:
            for key in ("user_prompt", "user_decoding"):
                if not _null_or_empty(getattr(self, key)):
                    raise BadInput(f"task.world.{key}", "sets how a model plays the simulated user: expected "
                                                        "task.world.user=model")  # fmt: skip
        self.user_decoding.check()
        self.held.check()
        if self.held.side == "user" and not self.model_user:
            raise BadInput("task.world.held.side", "user: the simulated user's replies are held, and only a model's "
                                                   "are recorded: expected task.world.user=model")  # fmt: skip
        if self.held.side == "agent" and self.agent != "model":
            raise BadInput("task.world.held.side", "agent: the agent's replies are held, and only a model's are "
                                                   "recorded: expected task.world.agent=model")  # fmt: skip


@dataclass(frozen=True)
class TaskConfig(Section):
    where: ClassVar[str] = "task"

    name: str = MISSING
    dataset: str | None = None  # a JSONL file (every task but an agent task)
    template: str | None = None  # a single user template file, or:
    prompt_pack: str | None = None  # a prompt pack directory (pack.yaml; see evalrun/tasks/pack.py)
    id_field: str = "id"
    target_field: str = "answer"  # multiple choice: the original index of the right option
    choices: ChoicesConfig = field(default_factory=ChoicesConfig)
    rubric: str | None = None  # a rubric file: the output is graded by model judges
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    # A prompt longer than the model's context: error (exit 2 before the model loads, naming the items),
    # fail_episode (recorded as a failed episode, no engine call) or truncate_left (keep its last tokens).
    on_overlong: str = "fail_episode"
    world: WorldConfig | None = None  # an agent task: episodes in a world instead of dataset items
    # NAME@VERSION of the frozen answer set under references/ the items are scored against (None: the dataset's)
    references: str | None = None
    # The kind of episode (evalrun.episodes.EPISODE_KINDS); None: world with task.world, else dataset
    kind: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # How prompts reach the model (evalrun/chat): chat (messages through the chat template, generation
    # prompt added), plain (the rendered text as it is), auto (None: chat when there is a chat template)
    chat_format: ChatFormatName | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    chat_template: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)  # a file used instead of the model's
    # extra variables of the chat template (enable_thinking: false), as lm-eval's chat_template_kwargs
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, metadata=LEFT_OUT_WHEN_NULL)
    # A reasoning model's replies split into thinking and answer by this vLLM reasoning parser (deepseek_r1,
    # qwen3, ...; evalrun/chat/reasoning.py); None: replies are taken whole
    reasoning_parser: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # An lm-evaluation-harness task YAML (task.kind=lm_eval, conf/task/lm_eval.yaml), or a directory of them with
    # the task named by task.name; it defines the dataset, prompts, filters and metrics itself
    path: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # an lm-eval task's hub dataset at a branch or no revision (not a commit): read as the local cache has it,
    # recorded as unpinned; null: refused
    allow_unpinned_dataset: bool | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # an lm-eval task's hub dataset read at this commit (over its YAML's dataset_kwargs.revision): a shipped YAML
    # pinned without editing it; or, for a group, {DATASET_PATH: COMMIT} per dataset its tasks read
    dataset_revision: str | Mapping[str, str] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # an lm-eval task's --system_instruction: the system turn, before the YAML's description
    system_instruction: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # an lm-eval task's --fewshot_as_multiturn under a chat template: false puts the examples and the document in
    # one user turn; null: true, lm-eval's default with --apply_chat_template
    fewshot_as_multiturn: bool | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # an lm-eval task's settings over its YAML's, key by key, as lm-eval's builder gives a group's tasks theirs
    # (num_fewshot: 5): keys of lm-eval's TaskConfig; a group's tasks get the group's (evalrun/tasks/lm_eval_groups)
    overrides: Mapping[str, Any] = field(default_factory=dict, metadata=LEFT_OUT_WHEN_NULL)

    @property
    def episode_kind(self) -> str:
        """The registered kind of episode this task runs: ``kind``, or its default."""
        if self.kind is not None:
            return self.kind
        return "world" if self.world is not None else "dataset"

    def check(self) -> None:
        if self.path is not None or self.kind == "lm_eval":
            self._check_lm_eval()
            return
        if self.overrides:
            raise _fail("task.overrides", "{}: it is an lm-eval task's setting (task=lm_eval)", dict(self.overrides))
        for key in ("system_instruction", "fewshot_as_multiturn"):
            if getattr(self, key) is not None:
                raise _fail(f"task.{key}", "null: it is an lm-eval task's setting (task=lm_eval; a prompt pack has "
                                           "its own system template and fewshot.as_multiturn)",
                            getattr(self, key))  # fmt: skip
        for key in ("allow_unpinned_dataset", "dataset_revision"):
            if getattr(self, key) is not None:
                raise BadInput(f"task.{key}", "a setting of an lm-eval task's hub dataset (task=lm_eval): expected "
                                              "null")  # fmt: skip
        if self.world is not None:
            self.world.check()
            given = [k for k in ("dataset", "template", "prompt_pack", "rubric", "references")
                     if getattr(self, k) is not None]  # fmt: skip
            if given:
                raise BadInput(f"task.{given[0]}", "an agent task (task.world) has no dataset, template or rubric")
            if self.scorer.name != "verifier":
                raise BadInput("task.scorer.name", "an agent task is scored by its world's verifier: expected verifier")
            return
        if self.dataset is None:
            raise BadInput("task.dataset", "missing: expected a JSONL dataset file (or task.world for an agent task)")
        if self.scorer.name == "verifier":
            raise BadInput("task.scorer.name", "the verifier scorer scores agent tasks (task.world) only")
        if self.on_overlong not in ON_OVERLONG:
            raise BadInput("task.on_overlong", f"expected one of {', '.join(ON_OVERLONG)}, got {self.on_overlong!r}")
        if self.choices.scoring == "loglikelihood_rolling":  # an lm-eval output type, made by its tasks alone
            raise _fail("task.choices.scoring", "letter, loglikelihood or both (loglikelihood_rolling is an lm-eval "
                                                "task's output type: task=lm_eval)", self.choices.scoring)  # fmt: skip
        if (self.scorer.name == "choice") != (self.choices.field is not None):
            raise BadInput("task.scorer.name", "the choice scorer goes with task.choices.field, and only with it")
        if (self.scorer.name == "rubric") != (self.rubric is not None):
            raise BadInput("task.scorer.name", "the rubric scorer goes with task.rubric, and only with it")
        if self.choices.field is not None and self.rubric is not None:
            raise BadInput("task.rubric", "a task is multiple choice or rubric-graded, not both")
        if (self.template is None) == (self.prompt_pack is None):
            raise BadInput("task", "expected exactly one of task.template (a file) and task.prompt_pack (a directory)")

    def _check_lm_eval(self) -> None:
        if self.kind != "lm_eval" or self.path is None:
            raise BadInput("task.path", "an lm-eval task YAML runs as task=lm_eval task.path=FILE.yaml (task.kind="
                                        "lm_eval with task.path)")  # fmt: skip
        given = [k for k in ("dataset", "template", "prompt_pack", "rubric", "references", "world")
                 if getattr(self, k) is not None]  # fmt: skip
        if given or self.choices.field is not None:
            key = given[0] if given else "choices.field"
            raise BadInput(f"task.{key}", "an lm-eval task's YAML defines its dataset, prompts and choices: "
                                          "expected null")  # fmt: skip
        if self.scorer.name != "lm_eval":
            raise BadInput("task.scorer.name", "an lm-eval task is scored by its YAML's filters and metrics: expected "
                                               "lm_eval")  # fmt: skip
        revision = self.dataset_revision
        revisions = revision.values() if isinstance(revision, Mapping) else [] if revision is None else [revision]
        if not all(isinstance(r, str) and COMMIT.fullmatch(r) for r in revisions):
            raise _fail("task.dataset_revision", "a commit (40 lowercase hex digits), or {DATASET_PATH: COMMIT} for a "
                                                 "group's datasets", revision)  # fmt: skip
        if self.fewshot_as_multiturn is not None and self.chat_format != "chat":
            raise _fail("task.fewshot_as_multiturn", "null unless task.chat_format=chat (as lm-eval, which takes "
                                                     "--fewshot_as_multiturn only with --apply_chat_template)",
                        self.fewshot_as_multiturn)  # fmt: skip


TRUNCATE_LEFT = "truncate_left"
ON_OVERLONG = ("error", "fail_episode", TRUNCATE_LEFT)


@dataclass(frozen=True)
class ClusterConfig(Section):
    where: ClassVar[str] = "cluster"

    name: str = "local"  # a registered dispatcher (evalrun.pipeline.dispatch.DISPATCHERS): local | ray | inline
    address: str | None = None
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None  # None: engine.tensor_parallel_size where GPUs exist, else 0
    batch_size: int = 256
    max_in_flight: int = 2
    max_worker_restarts: int = 3  # replacement actors per run, over all workers
    max_batch_attempts: int = 3
    worker_start_timeout_s: float = 600.0  # how long a placed worker's engine may take to start
    # How long Ray may take to place the workers (a process with each one's CPUs, GPUs and resources) before the run
    # stops naming what they ask and what the cluster has; null: DEFAULT_START_TIMEOUT_S
    start_timeout_s: float | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # Start once this many workers have started; the others join when the cluster places them (null: all of them)
    min_workers: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # Ray custom resources each worker asks for, {NAME: amount} (e.g. a node label resource)
    resources_per_worker: Mapping[str, Any] = field(default_factory=dict, metadata=LEFT_OUT_WHEN_NULL)

    def worker_settings(self) -> dict[str, Any]:
        """What decides the workers (all but the batch size, which is the driver's choice)."""
        return {k: v for k, v in self.as_record().items() if k != "batch_size"}

    def check(self) -> None:
        if self.name == "ray" and not self.address:
            raise BadInput("cluster.address", "cluster=ray needs the address of a running Ray cluster")
        for key in ("num_workers", "batch_size", "max_in_flight", "max_batch_attempts"):
            if getattr(self, key) < 1:
                raise _fail(f"cluster.{key}", "an integer >= 1", getattr(self, key))
        if self.max_worker_restarts < 0:
            raise _fail("cluster.max_worker_restarts", "an integer >= 0", self.max_worker_restarts)
        for key in ("worker_start_timeout_s", "start_timeout_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise _fail(f"cluster.{key}", "a number of seconds > 0", value)
        if self.min_workers is not None and not 1 <= self.min_workers <= self.num_workers:
            raise _fail("cluster.min_workers", f"an integer from 1 to cluster.num_workers ({self.num_workers}) or null",
                        self.min_workers)  # fmt: skip
        for name, amount in self.resources_per_worker.items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
                raise _fail(f"cluster.resources_per_worker.{name}", "a number > 0", amount)

    @property
    def placement_timeout_s(self) -> float:
        return DEFAULT_START_TIMEOUT_S if self.start_timeout_s is None else self.start_timeout_s

    @property
    def workers_to_start(self) -> int:
        """How many workers must have started before the run begins (cluster.min_workers, or all)."""
        return self.num_workers if self.min_workers is None else self.min_workers


DEFAULT_START_TIMEOUT_S = 120.0  # cluster.start_timeout_s when null


@dataclass(frozen=True)
class DeterminismConfig(Section):
    where: ClassVar[str] = "determinism"

    name: str = "strict"
    enabled: bool = True
    batch_invariant: bool = True
    cublas_workspace_config: str = ":4096:8"
    disable_v1_multiprocessing: bool = True
    canary: bool = True  # the batch-invariance canary at worker start (evalrun.pipeline.canary)
    # true: a worker whose canary fails (or does not run) stops the run, exit 1, before anything is written;
    # null (as false): a strict run warns and goes on. Added after runs were recorded: left out while null.
    require_invariant: bool | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)

    def check(self) -> None:
        if self.require_invariant and not self.canary:
            raise BadInput("determinism.require_invariant", "true needs determinism.canary=true (the canary is "
                                                            "what shows the engine batch-invariant)")  # fmt: skip


@dataclass(frozen=True)
class RunConfig(Section):
    where: ClassVar[str] = "run"

    root: str = "runs"
    dir: str | None = None  # an exact run directory, instead of a new one under root
    progress: bool = True
    # A worker whose provenance differs from the first's (docs/design.md "Worker provenance"): stop
    # the run (fail) or record it and go on (warn); null: fail under determinism.enabled, else warn.
    on_drift: Literal["fail", "warn"] | None = None
    # Checkpoints (docs/design.md "Checkpoints"): while the run generates, what is durable is committed to
    # RUN_DIR/checkpoints/ every N parts and/or every T seconds of the run (null: not by that measure; both null:
    # no checkpoints). A run shorter than T writes none by time.
    checkpoint_every_parts: int | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    checkpoint_every_s: float | None = 300.0
    # An anchor ledger (`evalrun anchor`'s format) each checkpoint, and the finished run, are appended to
    ledger: str | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # Who writes the output and log parts (docs/design.md "Workers write, the driver commits"): the driver, sent each
    # part's bytes, or each engine worker itself, straight into the run directory (a shared file system or an object
    # store every node reaches), sending the driver only what its commit needs. Both give the same run directory.
    # null: workers where they run in processes of their own on a cluster (cluster=ray) or the run is on an object
    # store, the driver otherwise (inline, and local Ray on one machine); evalrun.pipeline.runner.part_writes.
    part_writes: Literal["driver", "workers"] | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)

    def check(self) -> None:
        parts = self.checkpoint_every_parts
        if parts is not None and (isinstance(parts, bool) or parts < 1):
            raise _fail("run.checkpoint_every_parts", "an integer >= 1 or null", parts)
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise _fail("run.checkpoint_every_s", "a number of seconds > 0 or null", self.checkpoint_every_s)
        if self.ledger is not None and not self.ledger.strip():
            raise _fail("run.ledger", "a ledger file's path or null", self.ledger)
        if self.part_writes not in (None, "driver", "workers"):
            raise _fail("run.part_writes", "driver, workers or null", self.part_writes)


def _check_second_engine(engine: EngineConfig, where: str, what: str) -> None:
    """A worker's second engine (the judges', the simulated user's), checked as ``where``: it shares the worker's
    process, so it cannot set an instruction set of its own."""
    engine.check(where)
    if engine.cpu_isa is not None:
        raise BadInput(f"{where}.cpu_isa", f"{what} runs in the worker's process, whose instruction set "
                                           "engine.cpu_isa sets: expected null")  # fmt: skip


@dataclass(frozen=True)
class EvalConfig(Section):
    """A composed and checked configuration: the settings, and the task files they name, resolved."""

    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    seeds: SeedsConfig = field(default_factory=SeedsConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    determinism: DeterminismConfig = field(default_factory=DeterminismConfig)
    run: RunConfig = field(default_factory=RunConfig)
    limit: int | None = None  # the first N items of the task (None: all)
    # `evalrun run` writes RUN_DIR/report.html after the run (docs/design.md "Report"); a view of the
    # run, not part of its identity or digest.
    report: bool = True
    # The model a rubric's judges run on (``+model@judge_model=NAME``); None: the run's own model.
    judge_model: ModelConfig | None = None
    # The engine a rubric's judges run on (``+engine@judge_engine=NAME``, e.g. ``openai`` with the judges' server as
    # ``judge_engine.base_url``); None: the run's engine settings (a served run's judges on a server of their own
    # model when ``judge_model`` differs).
    judge_engine: EngineConfig | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # The model that plays a world's simulated user under task.world.user=model (``+model@user_model=NAME``); None: the
    # run's own model
    user_model: ModelConfig | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)
    # The engine it runs on (``+engine@user_engine=NAME``, e.g. ``openai`` with its server as user_engine.base_url);
    # None: the run's engine settings
    user_engine: EngineConfig | None = field(default=None, metadata=LEFT_OUT_WHEN_NULL)

    # Resolved by evalrun.config.validate (absolute, checked to exist); not settings.
    dataset_path: Path = field(default=Path(), kw_only=True, metadata=NOT_A_SETTING)
    prompt_path: Path = field(default=Path(), kw_only=True, metadata=NOT_A_SETTING)  # template file or pack dir
    rubric_path: Path | None = field(default=None, kw_only=True, metadata=NOT_A_SETTING)
    chat_template_path: Path | None = field(default=None, kw_only=True, metadata=NOT_A_SETTING)
    user_prompt_path: Path | None = field(default=None, kw_only=True, metadata=NOT_A_SETTING)  # task.world.user_prompt
    held_run_path: Path | None = field(default=None, kw_only=True, metadata=NOT_A_SETTING)  # task.world.held.run
    # What Hydra composed it from (the search path, each file's sha256): the manifest's ``config``; None for a
    # config read back from a run's config.yaml
    config_sources: ConfigSources | None = field(default=None, kw_only=True, metadata=NOT_A_SETTING)

    def check(self) -> None:
        """Every check of values that needs no file: a BadInput names the first field at fault."""
        self.decoding.check()
        self.seeds.check()
        if self.limit is not None and self.limit < 1:
            raise _fail("limit", "an integer >= 1 or null", self.limit)
        self.engine.check()
        self.cluster.check()
        if self.engine.capped() and self.cluster.name == "inline":
            raise BadInput("engine.cpu_isa", "a capped instruction set is set once per process, before torch loads: it "
                                             "needs workers in processes of their own (cluster=local or ray), "
                                             "and cluster=inline runs the engine in the driver's")  # fmt: skip
        self.determinism.check()
        self.run.check()
        if self.run.part_writes == "workers" and self.cluster.name == "inline":
            raise BadInput("run.part_writes", "cluster=inline runs its worker in the driver's process, which writes "
                                              "the parts: expected driver or null")  # fmt: skip
        self.task.check()
        if self.seeds.fewshot is not None and self.task.world is not None:
            raise BadInput("seeds.fewshot", "an agent task (task.world) has no few-shot examples: expected null")
        if self.judge_model is not None and self.task.rubric is None:
            raise BadInput("judge_model", "a judge model grades a rubric: the task has no task.rubric")
        if self.judge_engine is not None:
            if self.task.rubric is None:
                raise BadInput("judge_engine", "a judge engine runs a rubric's judges: the task has no task.rubric")
            _check_second_engine(self.judge_engine, "judge_engine", "the judges' engine")
        self._check_user()

    def _check_user(self) -> None:
        """A user model and engine play a world's simulated user: only under task.world.user=model."""
        world = self.task.world
        for key in ("user_model", "user_engine"):
            if getattr(self, key) is not None and (world is None or not world.model_user):
                raise BadInput(key, "plays a world's simulated user: expected task.world.user=model")
        if self.user_engine is not None:
            _check_second_engine(self.user_engine, "user_engine", "the simulated user's engine")

    def with_decoding(self, overrides: Mapping[str, Any]) -> EvalConfig:
        """This config with a prompt pack's decoding settings over the decoding group's, checked again."""
        return replace(self, decoding=self.decoding.with_overrides(overrides))
