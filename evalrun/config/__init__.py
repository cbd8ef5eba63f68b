"""Structured configuration: Hydra composition, schema and value checks, all before any model loads.

The schema below is registered in Hydra's ConfigStore as the first entry of ``conf/config.yaml``'s
defaults list, so every group file and every command-line override is merged into typed nodes:
an unknown key or a value of the wrong type fails at composition. :func:`validate` then checks
values and files and turns the result into an immutable :class:`EvalConfig`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evalrun.config.jsonl import objects
from evalrun.errors import BadInput

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
BUILTIN_TASKS = Path(__file__).resolve().parents[1] / "tasks" / "builtin"


# --- schema (mutable dataclasses, as Hydra's ConfigStore requires) -------------------------


@dataclass
class ModelSchema:
    name: str = "???"
    id: str = "???"
    path: str | None = None
    revision: str | None = None
    cache_dir: str | None = None  # hub cache to resolve id + revision in (None: Hugging Face's default)
    pinned: bool = True
    dtype: str = "float32"
    sha256: dict[str, str] = field(default_factory=dict)


@dataclass
class EngineSchema:
    name: str = "vllm"
    dtype: str | None = None  # None: the model's dtype
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.85
    cpu_kvcache_gib: int = 1
    seed: int = 0
    device: str | None = None  # engine=hf only: cpu | cuda | cuda:N (None: cuda where available, else cpu)


@dataclass
class DecodingSchema:
    name: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    logprobs: bool = True


@dataclass
class SeedsSchema:
    master: int = 1234
    set: list[int] = field(default_factory=lambda: [0])
    repeats: int = 1


@dataclass
class ScorerSchema:
    name: str = "exact_match"
    normalize: list[str] = field(default_factory=lambda: ["strip"])
    pattern: str | None = None  # regex scorer: the answer is group ``group`` of the first match
    group: int = 1
    extract: str = "first"  # number scorer: which number in the output (first | last)
    tolerance: float = 0.0


@dataclass
class ChoicesSchema:
    field: str | None = None  # the item field listing the options; None: not a multiple-choice task
    cannot_assess: str | None = None  # an option appended before shuffling ("Cannot assess", "N/A", ...)
    shuffle: bool = True
    scoring: str = "letter"  # letter | loglikelihood | both


@dataclass
class TaskSchema:
    name: str = "???"
    dataset: str = "???"
    template: str | None = None  # a single user template file, or:
    prompt_pack: str | None = None  # a prompt pack directory (pack.yaml; see evalrun/tasks/pack.py)
    id_field: str = "id"
    target_field: str = "answer"  # multiple choice: the original index of the right option
    choices: ChoicesSchema = field(default_factory=ChoicesSchema)
    rubric: str | None = None  # a rubric file: the output is graded by model judges
    scorer: ScorerSchema = field(default_factory=ScorerSchema)


@dataclass
class ClusterSchema:
    name: str = "local"  # local | ray | inline
    address: str | None = None
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None  # None: engine.tensor_parallel_size where GPUs exist, else 0
    batch_size: int = 256
    max_in_flight: int = 2
    max_worker_restarts: int = 3  # replacement actors per run, over all workers
    max_batch_attempts: int = 3
    worker_start_timeout_s: float = 600.0


@dataclass
class DeterminismSchema:
    name: str = "strict"
    enabled: bool = True
    batch_invariant: bool = True
    cublas_workspace_config: str = ":4096:8"
    disable_v1_multiprocessing: bool = True


@dataclass
class RunSchema:
    root: str = "runs"
    dir: str | None = None  # an exact run directory, instead of a new one under root
    progress: bool = True


@dataclass
class Schema:
    model: ModelSchema = field(default_factory=ModelSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    decoding: DecodingSchema = field(default_factory=DecodingSchema)
    seeds: SeedsSchema = field(default_factory=SeedsSchema)
    task: TaskSchema = field(default_factory=TaskSchema)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    determinism: DeterminismSchema = field(default_factory=DeterminismSchema)
    run: RunSchema = field(default_factory=RunSchema)
    limit: int | None = None
    # The model a rubric's judges run on (``+model@judge_model=NAME``); None: the run's own model.
    judge_model: ModelSchema | None = None


ConfigStore.instance().store(name="evalrun_schema", node=Schema)
if not OmegaConf.has_resolver("evalrun.root"):
    OmegaConf.register_new_resolver("evalrun.root", lambda: str(REPO_ROOT))
    OmegaConf.register_new_resolver("evalrun.builtin", lambda: str(BUILTIN_TASKS))


# --- validated, immutable config ------------------------------------------------------------

NORMALIZERS = ("strip", "lower", "collapse_whitespace", "strip_punctuation")
SCORERS = ("exact_match", "regex", "number", "choice", "rubric")
CHOICE_SCORING = ("letter", "loglikelihood", "both")
CLUSTERS = ("local", "ray", "inline")
ENGINES = ("vllm", "hf")
DTYPES = ("float32", "bfloat16", "float16", "auto")
MAX_TEMPERATURE = 2.0  # vLLM's limit


@dataclass(frozen=True)
class EvalConfig:
    """A composed and checked configuration: ``raw`` is the resolved Hydra config as plain data."""

    raw: dict[str, Any]
    dataset_path: Path
    prompt_path: Path  # the template file, or the prompt pack directory
    rubric_path: Path | None
    model_path: Path | None

    def section(self, name: str) -> dict[str, Any]:
        return self.raw[name]

    def with_decoding(self, overrides: Mapping[str, Any]) -> EvalConfig:
        """This config with a prompt pack's decoding settings over the decoding group's, checked again."""
        raw = {**self.raw, "decoding": {**self.raw["decoding"], **overrides}}
        _check_values(raw)
        return replace(self, raw=raw)


def _fail(field_name: str, expected: str, got: Any) -> BadInput:
    return BadInput(field_name, f"expected {expected}, got {got!r}")


def _resolve_path(value: str, field_name: str, *, must_be: str = "file") -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    ok = path.is_file() if must_be == "file" else path.is_dir()
    if not ok:
        raise BadInput(field_name, f"{path} does not exist or is not a {must_be}")
    return path


def _check_values(cfg: dict[str, Any]) -> None:
    dec, seeds, eng, clu, task, model = (
        cfg["decoding"], cfg["seeds"], cfg["engine"], cfg["cluster"], cfg["task"], cfg["model"],
    )  # fmt: skip
    if not 0 <= dec["temperature"] <= MAX_TEMPERATURE:
        raise _fail("decoding.temperature", f"a number in [0, {MAX_TEMPERATURE}]", dec["temperature"])
    if not 0 < dec["top_p"] <= 1:
        raise _fail("decoding.top_p", "a number in (0, 1]", dec["top_p"])
    if dec["top_k"] < 0:
        raise _fail("decoding.top_k", "an integer >= 0 (0 disables top-k)", dec["top_k"])
    if dec["max_tokens"] < 1:
        raise _fail("decoding.max_tokens", "an integer >= 1", dec["max_tokens"])
    if any(not s for s in dec["stop"]):
        raise _fail("decoding.stop", "non-empty stop strings", dec["stop"])
    if not seeds["set"]:
        raise _fail("seeds.set", "at least one seed", seeds["set"])
    duplicates = sorted({s for s in seeds["set"] if seeds["set"].count(s) > 1})
    if duplicates:
        raise BadInput("seeds.set", f"expected distinct seeds, {duplicates} appear more than once")
    if any(s < 0 for s in seeds["set"]) or seeds["master"] < 0:
        raise _fail("seeds", "non-negative seeds", {"master": seeds["master"], "set": seeds["set"]})
    if seeds["repeats"] < 1:
        raise _fail("seeds.repeats", "an integer >= 1", seeds["repeats"])
    if cfg["limit"] is not None and cfg["limit"] < 1:
        raise _fail("limit", "an integer >= 1 or null", cfg["limit"])
    if eng["name"] not in ENGINES:
        raise _fail("engine.name", f"one of {ENGINES}", eng["name"])
    for key in ("max_num_seqs", "tensor_parallel_size", "cpu_kvcache_gib"):
        if eng[key] < 1:
            raise _fail(f"engine.{key}", "an integer >= 1", eng[key])
    if eng["name"] == "hf" and (eng["tensor_parallel_size"] != 1 or eng["enable_prefix_caching"]):
        raise BadInput("engine", "engine=hf supports tensor_parallel_size=1 and enable_prefix_caching=false only")
    if eng["device"] is not None and (eng["name"] != "hf" or not re.fullmatch(r"cpu|cuda(:\d+)?", eng["device"])):
        raise _fail("engine.device", "null, or cpu | cuda | cuda:N with engine=hf", eng["device"])
    if eng["dtype"] is not None and eng["dtype"] not in DTYPES:
        raise _fail("engine.dtype", f"one of {DTYPES} or null", eng["dtype"])
    if model["dtype"] not in DTYPES:
        raise _fail("model.dtype", f"one of {DTYPES}", model["dtype"])
    if not 0 < eng["gpu_memory_utilization"] <= 1:
        raise _fail("engine.gpu_memory_utilization", "a number in (0, 1]", eng["gpu_memory_utilization"])
    if clu["name"] not in CLUSTERS:
        raise _fail("cluster.name", f"one of {CLUSTERS}", clu["name"])
    if clu["name"] == "ray" and not clu["address"]:
        raise BadInput("cluster.address", "cluster=ray needs the address of a running Ray cluster")
    for key in ("num_workers", "batch_size", "max_in_flight", "max_batch_attempts"):
        if clu[key] < 1:
            raise _fail(f"cluster.{key}", "an integer >= 1", clu[key])
    if clu["max_worker_restarts"] < 0:
        raise _fail("cluster.max_worker_restarts", "an integer >= 0", clu["max_worker_restarts"])
    if clu["worker_start_timeout_s"] <= 0:
        raise _fail("cluster.worker_start_timeout_s", "a number of seconds > 0", clu["worker_start_timeout_s"])
    scorer = task["scorer"]
    if scorer["name"] not in SCORERS:
        raise _fail("task.scorer.name", f"one of {SCORERS}", scorer["name"])
    unknown = [n for n in scorer["normalize"] if n not in NORMALIZERS]
    if unknown:
        raise _fail("task.scorer.normalize", f"names from {NORMALIZERS}", unknown)
    if scorer["name"] == "regex":
        if not scorer["pattern"]:
            raise BadInput("task.scorer.pattern", "the regex scorer needs a pattern")
        try:
            re.compile(scorer["pattern"])
        except re.error as exc:
            raise BadInput("task.scorer.pattern", f"not a valid regular expression ({exc})") from exc
    if scorer["extract"] not in ("first", "last"):
        raise _fail("task.scorer.extract", "'first' or 'last'", scorer["extract"])
    choices = task["choices"]
    if choices["scoring"] not in CHOICE_SCORING:
        raise _fail("task.choices.scoring", f"one of {CHOICE_SCORING}", choices["scoring"])
    if (scorer["name"] == "choice") != (choices["field"] is not None):
        raise BadInput("task.scorer.name", "the choice scorer goes with task.choices.field, and only with it")
    if (scorer["name"] == "rubric") != (task["rubric"] is not None):
        raise BadInput("task.scorer.name", "the rubric scorer goes with task.rubric, and only with it")
    if choices["field"] is not None and task["rubric"] is not None:
        raise BadInput("task.rubric", "a task is multiple choice or rubric-graded, not both")
    if (task["template"] is None) == (task["prompt_pack"] is None):
        raise BadInput("task", "expected exactly one of task.template (a file) and task.prompt_pack (a directory)")


def check_dataset(path: Path, id_field: str, target_field: str, choices_field: str | None = None) -> int:
    """Check a JSON Lines dataset line by line; returns the item count. Errors name file and line.

    With ``choices_field``, each item lists at least two distinct option strings there, and its
    target is the index of the right one.
    """
    seen: dict[str, str] = {}
    for where, item in objects(path):
        for key in (id_field, target_field):
            if key not in item:
                raise BadInput(where, f"missing field {key!r}")
        if choices_field is not None:
            _check_choices(item, where, choices_field, target_field)
        item_id = str(item[id_field])
        if item_id in seen:
            raise BadInput(where, f"duplicate item id {item_id!r} (first at {seen[item_id]})")
        seen[item_id] = where
    if not seen:
        raise BadInput(str(path), "the dataset has no items")
    return len(seen)


def _check_choices(item: dict[str, Any], where: str, choices_field: str, target_field: str) -> None:
    options = item.get(choices_field)
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o for o in options):
        raise BadInput(
            f"{where}: field {choices_field}", f"expected a list of at least two option strings, got {options!r}"
        )
    if len(set(options)) != len(options):
        raise BadInput(f"{where}: field {choices_field}", f"expected distinct options, got {options!r}")
    answer = item[target_field]
    if type(answer) is not int or not 0 <= answer < len(options):
        raise BadInput(f"{where}: field {target_field}",
                       f"expected the index of the right option (0 to {len(options) - 1}), got {answer!r}")  # fmt: skip


def validate(cfg: DictConfig) -> EvalConfig:
    """Resolve, check values and files; raise :class:`BadInput` naming the first problem."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise BadInput(key, f"missing or unresolvable value ({exc.msg if hasattr(exc, 'msg') else exc})") from exc
    assert isinstance(raw, dict)
    _check_values(raw)
    task = raw["task"]
    dataset_path = _resolve_path(task["dataset"], "task.dataset")
    if task["prompt_pack"] is not None:
        prompt_path = _resolve_path(task["prompt_pack"], "task.prompt_pack", must_be="dir")
    else:
        prompt_path = _resolve_path(task["template"], "task.template")
    rubric_path = _resolve_path(task["rubric"], "task.rubric") if task["rubric"] is not None else None
    check_dataset(dataset_path, task["id_field"], task["target_field"], task["choices"]["field"])
    model_path = None
    if raw["model"]["path"]:
        model_path = _resolve_path(str(Path(raw["model"]["path"])), "model.path", must_be="dir")
    if raw["judge_model"] is not None:
        if task["rubric"] is None:
            raise BadInput("judge_model", "a judge model grades a rubric: the task has no task.rubric")
        if raw["judge_model"]["path"]:
            _resolve_path(str(Path(raw["judge_model"]["path"])), "judge_model.path", must_be="dir")
    return EvalConfig(raw=raw, dataset_path=dataset_path, prompt_path=prompt_path, rubric_path=rubric_path,
                      model_path=model_path)  # fmt: skip


# --- composition from command-line overrides -------------------------------------------------


def expand_multirun(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper expansion: ``a=1,2 b=x,y`` gives the four jobs' override lists."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
    except HydraException as exc:
        raise BadInput("overrides", str(exc)) from exc
    return jobs


def compose_config(overrides: list[str], config_dir: Path = CONF_DIR) -> DictConfig:
    """Compose ``config.yaml`` with Hydra overrides; composition errors become :class:`BadInput`."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        where = next((o.split("=", 1)[0] for o in overrides if o.split("=", 1)[0] in str(exc)), "overrides")
        raise BadInput(where, str(exc).strip().splitlines()[0]) from exc
    finally:
        GlobalHydra.instance().clear()


def load_stored(path: Path, overrides: list[str]) -> DictConfig:
    """A run's resolved ``config.yaml`` over the current schema, then ``KEY=VALUE`` overrides.

    Not yet validated: callers adjust it (replay drops the model path) and then call :func:`validate`.
    """
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Schema), OmegaConf.load(path))
    except (OSError, ValueError, OmegaConfBaseException) as exc:
        raise BadInput(str(path), f"expected a resolved evalrun config ({str(exc).splitlines()[0]})") from exc
    for override in overrides:
        if "=" not in override:
            raise BadInput(override, "expected KEY=VALUE")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))
        except (ValueError, OmegaConfBaseException) as exc:
            raise BadInput(override, str(exc).splitlines()[0]) from exc
    assert isinstance(cfg, DictConfig)
    return cfg


def load(overrides: list[str]) -> EvalConfig:
    return validate(compose_config(overrides))


def to_yaml(config: EvalConfig) -> str:
    import yaml

    return yaml.safe_dump(config.raw, sort_keys=True, allow_unicode=True)
