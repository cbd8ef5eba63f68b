"""lm-evaluation-harness tasks, read, prompted and scored by lm-eval's own library.

lm-eval (pinned exactly in the locks) owns the task's semantics: its loader reads the YAML (includes, ``!function``
helpers), its ``ConfigurableTask`` makes every document's requests (description, the few-shot examples its sampler
draws, delimiters, ``gen_prefix``, chat formatting through the template evalrun hands it, multiple inputs and
targets, ``process_docs``), and its filters, ``process_results``, metrics and aggregations score the replies
(:mod:`evalrun.scoring.lm_eval`). evalrun owns what lm-eval does not guarantee, and records it:

* the documents (:mod:`evalrun.tasks.lm_eval_data`): read from local files or the local Hugging Face cache at a
  pinned commit, hashed, and handed to the task as its ``custom_dataset`` instead of its own ``load_dataset``;
* the engine's results for every request, from evalrun's engines, seeds and chains;
* the few-shot seed (``seeds.fewshot``, lm-eval's 1234 by default) and the chat template;
* the digest: lm-eval's version, the resolved task config (functions by their module's sha256) and the documents
  ``process_docs`` made.

A metric lm-eval aggregates otherwise than by its mean (corpus BLEU, F1, a task's own aggregation function) is a
corpus metric: each document's input to the aggregation is recorded with its score, and the summary holds the
aggregation over them all (:func:`corpus_aggregations`). What evalrun's engines do not serve (images, audio,
model-written code, a Python task class that reads its own data) is refused by name, the same reasons ``evalrun
tasks check`` gives (:mod:`evalrun.tasks.lm_eval_catalog`).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from evalrun.chat import ChatFormat, Conversation
from evalrun.config import ChoicesConfig
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, canonical_json, file_sha256
from evalrun.tasks import Item, Task
from evalrun.tasks.lm_eval_catalog import (
    STRUCTURAL_KEYS,
    catalog,
    defined_task,
    lm_eval_version,
    overridable,
    quiet,
    reason_of,
    served_reasons,
)
from evalrun.tasks.lm_eval_data import FORMATS, DataSplit, hub_splits, local_splits, named_splits
from evalrun.tasks.pack import PromptPack

FEWSHOT_SEED = 1234  # lm-eval's default few-shot seed (simple_evaluate's fewshot_random_seed)
SCORING_KEYS = ("output_type", "filter_list", "metric_list", "process_results")  # the digest's scoring part


@dataclass(frozen=True)
class Helper:
    """A ``!function`` a task YAML names: its reference as written, and the source of the module lm-eval imported
    it from (a file beside the YAML, by name; an installed module, by its dotted name) with its sha256."""

    key: str  # where in the config (metric_list.0.aggregation)
    reference: str
    module: str
    sha256: str
    source: Path | None = None  # the module's file (not recorded: where it lies here)

    def as_record(self) -> dict[str, str]:
        return {"function": self.reference, "module": self.module, "sha256": self.sha256}


@dataclass(frozen=True)
class Definition:
    """A task YAML as lm-eval's loader reads it: ``raw`` with every include merged and each function as its
    reference, ``resolved`` with each function imported, and the helpers by their sources."""

    path: Path
    raw: Mapping[str, Any]
    resolved: Mapping[str, Any]
    helpers: tuple[Helper, ...]
    # settings given over the YAML's (task.overrides, a group's settings of its tasks), merged into raw and resolved
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.raw.get("task") or self.raw.get("group"))

    def settings_record(self) -> dict[str, Any]:
        """The resolved config as recorded: every key, each function replaced by its helper's record."""
        by_key = {h.key: h.as_record() for h in self.helpers}

        def walk(value: Any, key: str) -> Any:
            if key in by_key:
                return by_key[key]
            if isinstance(value, Mapping):
                return {str(k): walk(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [walk(v, f"{key}.{i}") for i, v in enumerate(value)]
            return value

        return {k: v for k, v in walk(dict(self.raw), "").items() if k not in ("metadata",) or v}


def read_definition(path: Path, overrides: Mapping[str, Any] | None = None) -> Definition:
    """``path`` read by lm-eval's YAML loader, with ``overrides`` over its settings key by key (as lm-eval's builder
    gives a group's members theirs); a YAML that does not read or a helper that does not import is a BadInput naming
    the file and lm-eval's reason (a missing package with the lm-eval extra that brings it)."""
    lm_eval_version()
    from lm_eval.tasks._yaml_loader import load_yaml

    _compile_templates_once()
    if not path.is_file():
        raise BadInput("task.path", f"{path} does not exist or is not a file")
    given = jsonable(dict(overrides or {}))
    allowed = overridable()
    for key in given:
        if key not in allowed:
            raise BadInput(f"task.overrides.{key}", f"one of lm-eval's task settings: {', '.join(sorted(allowed))}")
    with quiet():
        try:
            raw = {**load_yaml(path, resolve_func=False), **given}
            resolved = {**load_yaml(path, resolve_func=True), **given}
        except (Exception, SystemExit) as error:
            raise BadInput(str(path), f"lm-eval does not read it: {reason_of(error)}") from error
    helpers = tuple(_helpers(raw, resolved, path.parent.resolve()))
    return Definition(path.resolve(), raw, resolved, helpers, given)


def _compile_templates_once() -> None:
    """lm-eval compiles a task's Jinja templates anew for every document it renders (``lm_eval.utils.apply_template``
    calls ``env.from_string`` each time): nine tenths of the time its ``build_all_requests`` takes. Its environment's
    ``from_string`` is memoized by the template's text, once per process: a compiled template renders the same text
    for the same document, so nothing lm-eval makes changes (the request goldens check it)."""
    from lm_eval import utils

    env = utils.env
    if "from_string" in vars(env):
        return
    compile_source = env.from_string
    compiled = functools.lru_cache(maxsize=4096)(compile_source)

    def from_string(source: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(source, str):
            return compile_source(source, *args, **kwargs)
        return compiled(source)

    env.from_string = from_string


def _helpers(raw: Any, resolved: Any, base: Path, key: str = "") -> Iterator[Helper]:
    """Every place where the loader put a function for a reference, with its module's source hashed."""
    if isinstance(raw, Mapping) and isinstance(resolved, Mapping):
        for name, value in raw.items():
            yield from _helpers(value, resolved.get(name), base, f"{key}.{name}" if key else str(name))
    elif isinstance(raw, list) and isinstance(resolved, list):
        for i, (a, b) in enumerate(zip(raw, resolved, strict=False)):
            yield from _helpers(a, b, base, f"{key}.{i}")
    elif isinstance(raw, str) and callable(resolved):
        declared = Path(raw)  # the loader's unresolved form: the declaring YAML's directory / reference
        try:
            source = inspect.getsourcefile(resolved)
        except TypeError:  # a builtin, or a callable object without a source file
            source = None
        module = getattr(resolved, "__module__", "") or ""
        if source is not None and Path(source).resolve().is_relative_to(base):
            module = Path(source).resolve().relative_to(base).as_posix()
        yield Helper(
            key,
            declared.name,
            module,
            file_sha256(Path(source)) if source else "",
            Path(source).resolve() if source else None,
        )


@dataclass(frozen=True)
class Requests:
    """What lm-eval sends for one document: its context (one per choice for a multiple-input task), and the
    continuations scored (multiple choice, loglikelihood) or the generation settings (generate_until)."""

    doc_id: int
    doc: Mapping[str, Any]
    contexts: tuple[str, ...]
    continuations: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()  # the few-shot examples shown, SPLIT:INDEX in the few-shot documents
    conversation: Conversation | None = None  # a chat-formatted context's chat, for an engine that takes chats

    @property
    def context(self) -> str:
        return self.contexts[0]


@dataclass(frozen=True)
class LmEvalTask:
    """An lm-eval task as evalrun runs it: its definition, the documents evalrun read for it, and lm-eval's
    ``ConfigurableTask`` built on them."""

    definition: Definition
    splits: Mapping[str, DataSplit]
    task: Any = field(compare=False)  # lm_eval.api.task.ConfigurableTask

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def path(self) -> Path:
        return self.definition.path

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.definition.raw

    @property
    def output_type(self) -> str:
        return str(self.task.OUTPUT_TYPE)

    @property
    def repeats(self) -> int:
        return int(self.task.config.repeats or 1)

    @property
    def num_fewshot(self) -> int:
        return int(self.task.config.num_fewshot or 0)

    @property
    def eval_split(self) -> DataSplit:
        """The split evaluated (``test_split``, else ``validation_split``), as read."""
        config = self.task.config
        return self.splits[str(config.test_split or config.validation_split)]

    @property
    def filter_names(self) -> tuple[str, ...]:
        """The task's filter pipelines, by name (lm-eval's ``none`` when it names none)."""
        return tuple(str(f.name) for f in self.task._filters)

    @cached_property
    def processed_docs_sha256(self) -> dict[str, str]:
        """With ``process_docs``: the canonical hash of the documents it made, by split, for the evaluated split and
        (with examples) the few-shot one: what the prompts are made from, so a change its source's hash does not
        show (a file it reads, a library's version) is a new run. They are the documents lm-eval's task holds
        already (``task_docs``, its sampler's), not processed again."""
        task, config = self.task, self.task.config
        made = {}
        if config.process_docs is not None:
            made[self.eval_split.name] = canonical_hash([jsonable(d) for d in task.task_docs])
        sampler = getattr(task, "sampler", None)
        processed = config.process_docs is not None or task.fewshot_cfg.process_docs is not None
        if processed and sampler is not None and self.num_fewshot > 0:
            made.setdefault(self.fewshot_split_name(), canonical_hash([jsonable(d) for d in sampler.fewshot_docs()]))
        return made

    def requests(self, seed: int = FEWSHOT_SEED, chat: ChatFormat | None = None, system_instruction: str | None = None,
                 multiturn: bool = True, limit: int | None = None) -> list[Requests]:  # fmt: skip
        """The first ``limit`` documents' requests, as lm-eval's ``build_all_requests`` makes them with the few-shot
        sampler seeded by ``seed``: plain, or (``chat``: ``--apply_chat_template``) through the chat template with
        ``system_instruction`` (``--system_instruction``) and ``multiturn`` (``--fewshot_as_multiturn``)."""
        task = self.task
        task.set_fewshot_seed(seed)
        drawn: list[tuple[int, ...]] = []
        sampler = getattr(task, "sampler", None)
        if sampler is not None and (task.config.num_fewshot or 0) > 0:
            positions = {id(doc): i for i, doc in enumerate(sampler.fewshot_docs())}
            sample = sampler.sample

            def watched(*args: Any, **kwargs: Any) -> Any:
                examples = sample(*args, **kwargs)
                drawn.append(tuple(positions[id(e)] for e in examples))
                return examples

            sampler.sample = watched
        chats: dict[str, Conversation] = {}

        def template(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
            assert chat is not None
            text = chat.render(messages, continue_final=not add_generation_prompt)
            chats[text] = chat.conversation(messages, continue_final=not add_generation_prompt)
            return text

        try:
            with quiet():
                task.build_all_requests(limit=limit, apply_chat_template=chat is not None,
                                        fewshot_as_multiturn=chat is not None and multiturn,
                                        system_instruction=system_instruction,
                                        chat_template=template if chat is not None else None)  # fmt: skip
        except (Exception, SystemExit) as error:
            raise BadInput(str(self.path), f"lm-eval could not make its requests: {reason_of(error)}") from error
        finally:
            if sampler is not None:
                sampler.__dict__.pop("sample", None)
        by_doc: dict[int, list[Any]] = {}
        for instance in task.instances:
            by_doc.setdefault(int(instance.doc_id), []).append(instance)
        pool = self.fewshot_split_name()
        made = []
        for position, (doc_id, instances) in enumerate(sorted(by_doc.items())):
            instances.sort(key=lambda i: i.idx)
            arguments = [i.args for i in instances]
            if self.output_type == "loglikelihood_rolling":  # the document alone, scored from its start
                contexts, continuations = ("",), (str(arguments[0][0]),)
            elif self.output_type == "generate_until":
                contexts, continuations = (str(arguments[0][0]),), ()
            else:
                contexts = tuple(str(a[0]) for a in arguments)
                continuations = tuple(str(a[1]) for a in arguments)
            if len(set(contexts)) == 1:
                contexts = contexts[:1]
            examples = tuple(f"{pool}:{i}" for i in drawn[position]) if drawn else ()
            made.append(Requests(doc_id, instances[0].doc, contexts, continuations, examples,
                                 chats.get(contexts[0])))  # fmt: skip
        return made

    def fewshot_split_name(self) -> str:
        """Where the few-shot examples come from, as lm-eval picks it: ``fewshot_config.split``, ``fewshot_split``,
        the YAML's ``fewshot_config.samples``, else the training, validation or test split."""
        config, cfg = self.task.config, self.task.fewshot_cfg
        if cfg.split or config.fewshot_split:
            return str(cfg.split or config.fewshot_split)
        if cfg.samples is not None:
            return "samples"
        return str(config.training_split or config.validation_split or config.test_split)

    def as_record(self) -> dict[str, Any]:
        """What the digest covers of the task as lm-eval defines it: lm-eval's version, the resolved settings (each
        function by its module's sha256), and each split's files and rows by their hashes."""
        return {"lm_eval": lm_eval_version(), "name": self.name, "settings": self.definition.settings_record(),
                "splits": self.splits_record()}  # fmt: skip

    def prompt_record(self) -> dict[str, Any]:
        """The digest's prompt-pack part: the resolved settings without the scoring keys, and the split the few-shot
        examples come from (its files and rows by their hashes; None without examples). The evaluated split is the
        run's dataset (:meth:`splits_record`): in its identity, not in the digest."""
        record = self.as_record()
        del record["splits"]
        record["settings"] = {k: v for k, v in record["settings"].items() if k not in SCORING_KEYS}
        shots = int(self.task.config.num_fewshot or 0)
        pool = self.splits.get(self.fewshot_split_name())
        record["fewshot"] = pool.as_record() if shots > 0 and pool is not None else None
        return record

    def splits_record(self) -> dict[str, Any]:
        """Each split's files and rows by their hashes (the manifest's ``task.dataset.splits``)."""
        return {name: split.as_record() for name, split in sorted(self.splits.items())}

    def scoring_record(self) -> dict[str, Any]:
        """The digest's scoring part: lm-eval's version, and the settings that score (output type, filters,
        metrics, process_results; each function by its module's sha256)."""
        return {"lm_eval": lm_eval_version(), "output_type": self.output_type, **scoring_settings(self.definition)}

    def decoding(self) -> dict[str, Any]:
        """The generation settings as evalrun's decoding section takes them: ``until`` as stop strings,
        ``max_gen_toks`` as the token limit (256, lm-eval's models' default), greedy unless ``do_sample`` (or,
        without it, a temperature above 0; sampling without a temperature is at 1.0, transformers' default)."""
        if self.output_type != "generate_until":
            return {}
        kwargs = dict(self.task.config.generation_kwargs or {})
        temperature = kwargs.get("temperature")
        sampled = kwargs.get("do_sample")
        if sampled is None:
            sampled = temperature is not None and temperature > 0
        until = kwargs.get("until", [])
        decoding: dict[str, Any] = {
            "stop": [until] if isinstance(until, str) else list(until),
            "max_tokens": int(kwargs.get("max_gen_toks", 256)),
            "temperature": (1.0 if temperature is None else float(temperature)) if sampled else 0.0,
        }
        for key in ("top_p", "top_k"):
            if key in kwargs:
                decoding[key] = kwargs[key]
        return decoding


Revision = str | Mapping[str, str] | None  # task.dataset_revision: a commit, or one by dataset_path


def load_task(path: Path, allow_unpinned: bool = False, revision: Revision = None,
              overrides: Mapping[str, Any] | None = None) -> LmEvalTask:  # fmt: skip
    """The lm-eval task of the YAML at ``path`` (with ``overrides`` of its settings), built by lm-eval on the
    documents evalrun reads for it (``revision``: the hub dataset's commit, over the YAML's
    ``dataset_kwargs.revision``; a mapping gives it by ``dataset_path``). What evalrun does not run, every reason at
    once, and a split the data lacks are BadInputs naming the file."""
    definition = read_definition(path, overrides)
    raw = definition.raw
    if isinstance(revision, Mapping):
        revision = revision.get(str(raw.get("dataset_path")))
    if "group" in raw:
        raise BadInput(f"{path}: group", f"a group's YAML, not a task's: it runs as task.path={path} (or its "
                                         f"directory with task.name={raw['group']})")  # fmt: skip
    if not isinstance(raw.get("task"), str) or not raw["task"]:
        raise BadInput(f"{path}: task", "the task's name (a string) is missing")
    reasons = served_reasons(raw)
    if reasons:
        raise BadInput(str(path), "evalrun does not run it: " + "; ".join(reasons))
    origins = key_origins(definition.path)
    local = raw.get("dataset_path") in FORMATS
    if local and revision is not None:
        raise BadInput("task.dataset_revision", f"{path} reads local files ({raw['dataset_path']}): a revision pins a "
                                                "hub dataset; expected null")  # fmt: skip
    splits = local_splits(raw, origins) if local else hub_splits(raw, origins, allow_unpinned, revision)
    for key, split in named_splits(raw):
        if split not in splits:
            raise BadInput(f"{path}: {key}", f"the dataset has no split {split!r} (it has {', '.join(sorted(splits))})")
    if not (raw.get("test_split") or raw.get("validation_split")):
        raise BadInput(f"{path}: test_split", "the split to evaluate (test_split or validation_split)")
    task = build(definition, {name: split.docs for name, split in splits.items()})
    return LmEvalTask(definition, splits, task)


def build(definition: Definition, docs: Mapping[str, Sequence[Mapping[str, Any]]],
          overrides: Mapping[str, Any] | None = None) -> Any:  # fmt: skip
    """lm-eval's ``ConfigurableTask`` of ``definition`` (its config with ``overrides``) with ``docs`` as its
    dataset, by split."""
    import datasets
    from lm_eval.api.task import ConfigurableTask

    datasets.disable_progress_bars()  # a per-split "Map" bar on stderr, over the run's own progress
    try:
        dataset = datasets.DatasetDict({name: datasets.Dataset.from_list([dict(d) for d in rows])
                                        for name, rows in docs.items()})  # fmt: skip
    except Exception as error:  # pyarrow's type errors: rows whose fields do not make one table
        raise BadInput(str(definition.path), f"its documents do not make one table a split of "
                                             f"({type(error).__name__}: {error})") from error  # fmt: skip
    config = {k: v for k, v in definition.resolved.items() if k not in STRUCTURAL_KEYS}
    config.update(overrides or {})
    config["custom_dataset"] = lambda **_: dataset
    try:
        with quiet():
            return ConfigurableTask(config=config)
    except (Exception, SystemExit) as error:
        raise BadInput(str(definition.path), f"lm-eval does not build it: {reason_of(error)}") from error


def key_origins(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Path]:
    """The YAML each top-level key of ``path`` comes from, its includes merged as lm-eval's loader merges them (each
    include in order, then the file's own keys): what a relative ``data_files`` path is resolved against, and
    what a message names."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if path in seen:
        return {}
    own = load_yaml(path, resolve_func=False, recursive=False)
    origins: dict[str, Path] = {}
    includes = own.pop("include", None)
    for include in includes if isinstance(includes, list) else [] if includes is None else [includes]:
        included = Path(include) if Path(str(include)).is_absolute() else path.parent / str(include)
        origins.update(key_origins(included.resolve(), (*seen, path)))
    origins.update(dict.fromkeys(own, path))
    return _Origins(origins, path)


@dataclass(frozen=True)
class DefinitionFiles:
    """The files a task's definition is read from, carried where it is scored (a Ray worker on another machine):
    its YAML, every YAML it includes and each helper module beside them (lm-eval's loader imports a helper by its
    file; an installed module, lm-eval's own, is not carried), by their paths under the directory holding them."""

    entry: str  # the task's YAML, relative
    files: tuple[tuple[str, str], ...]  # (relative path, text), sorted

    @classmethod
    def of(cls, definition: Definition) -> DefinitionFiles:
        paths = set(_yaml_chain(definition.path))
        paths.update(h.source for h in definition.helpers
                     if h.source is not None and h.source.is_relative_to(definition.path.parent))  # fmt: skip
        root = Path(os.path.commonpath([p.parent for p in paths]))
        files = tuple(sorted((p.relative_to(root).as_posix(), p.read_text(encoding="utf-8")) for p in paths))
        return cls(definition.path.relative_to(root).as_posix(), files)

    def materialized(self) -> Path:
        """The task's YAML, written with the rest under a directory of this process's temporary directory named by
        the files' hash (once: a second scorer of the same definition reads the same copy)."""
        digest = canonical_hash({"entry": self.entry, "files": [list(f) for f in self.files]})
        target = Path(tempfile.gettempdir()) / f"evalrun-lm-eval-{digest[:16]}"
        if not target.is_dir():
            staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
            for relative, text in self.files:
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                (staging / relative).write_text(text, encoding="utf-8")
            try:
                staging.rename(target)
            except OSError:  # another process made it first: the same files
                shutil.rmtree(staging, ignore_errors=True)
        return target / self.entry


def _yaml_chain(path: Path, seen: tuple[Path, ...] = ()) -> list[Path]:
    """``path`` and every YAML it includes, recursively."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if path in seen:
        return []
    includes = load_yaml(path, resolve_func=False, recursive=False).get("include")
    chain = [path.resolve()]
    for include in includes if isinstance(includes, list) else [] if includes is None else [includes]:
        included = Path(include) if Path(str(include)).is_absolute() else path.parent / str(include)
        chain.extend(_yaml_chain(included.resolve(), (*seen, path)))
    return chain


class _Origins(dict):  # type: ignore[type-arg]
    """Key origins, the task's own YAML for a key none declares (a default)."""

    def __init__(self, origins: Mapping[str, Path], path: Path) -> None:
        super().__init__(origins)
        self.path = path

    def __missing__(self, key: str) -> Path:
        return self.path


def jsonable(value: Any) -> Any:
    """A value as JSON holds it (numpy scalars and arrays as numbers and lists, tuples as lists): a document, and a
    corpus metric's per-document input (what its aggregation is given back, at the run and every recomputation)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def doc_target(doc_id: int, doc: Mapping[str, Any]) -> str:
    """An item's target: its document as JSON (what lm-eval's ``process_results`` scores a reply against)."""
    return canonical_json({"doc_id": doc_id, "doc": jsonable(doc)})


def read_doc_target(target: str) -> tuple[int, dict[str, Any]]:
    record = json.loads(target)
    return int(record["doc_id"]), dict(record["doc"])


# --- the task as evalrun runs it -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LmEvalPack(PromptPack):
    """An lm-eval task's prompts, made by lm-eval (:meth:`LmEvalTask.requests`), by item id; its record is the
    task's (:meth:`LmEvalTask.prompt_record`) with the effective decoding settings."""

    prompts: Mapping[str, str] = field(default_factory=dict)
    examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # by item id: its few-shot examples
    record: Mapping[str, Any] = field(default_factory=dict)
    splits: Mapping[str, Any] = field(default_factory=dict)  # LmEvalTask.splits_record(): the data, not the pack
    repeats: int = 1  # LmEvalTask.repeats: each episode's generations
    conversations: Mapping[str, Conversation] = field(default_factory=dict)  # by item id: a chat prompt's chat
    processed_docs_sha256: Mapping[str, str] = field(default_factory=dict)
    files: DefinitionFiles | None = None  # the definition's files, carried to where the run scores

    def prompt_of(self, item_id: str) -> str | None:
        return self.prompts[item_id]

    def examples_of(self, item_id: str) -> tuple[str, ...] | None:
        return self.examples[item_id]

    def conversation_of(self, item_id: str) -> Conversation | None:
        return self.conversations.get(item_id)

    def as_record(self, decoding: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.record, "decoding": {k: v for k, v in decoding.items() if k != "name"}}


# the output types whose items are options scored by loglikelihood: where the options come from, and how they are scored
SCORED_BY = {"multiple_choice": ("doc_to_choice", "loglikelihood"), "loglikelihood": ("doc_to_target", "loglikelihood"),
             "loglikelihood_rolling": ("doc_to_target", "loglikelihood_rolling")}  # fmt: skip


def as_task(task: LmEvalTask, limit: int | None = None, seed: int = FEWSHOT_SEED, chat: ChatFormat | None = None,
            system_instruction: str | None = None, multiturn: bool = True) -> Task:  # fmt: skip
    """The lm-eval task as evalrun runs it: an item per evaluated document (its id lm-eval's ``doc_id``), the first
    ``limit`` of them, each prompt lm-eval's request context. Every item's target is its document
    (:func:`doc_target`), which lm-eval's ``process_results`` scores the replies against. A multiple-choice item's
    options are its requests' continuations (each choice after lm-eval's delimiter, scored by loglikelihood in
    order), a multiple-input task's with a context each; a loglikelihood item's one option is its continuation."""
    items, prompts, examples, conversations = [], {}, {}, {}
    scored = task.output_type in SCORED_BY
    for made in task.requests(seed, chat, system_instruction, multiturn, limit):
        item_id = str(made.doc_id)
        target = doc_target(made.doc_id, made.doc)
        contexts = made.contexts if len(made.contexts) > 1 else ()
        items.append(Item(item_id, made.doc, target, made.continuations if scored else (), contexts))
        prompts[item_id], examples[item_id] = made.context, made.examples
        if made.conversation is not None:
            conversations[item_id] = made.conversation
    metadata = task.settings.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    record = _with_options(task.prompt_record(), system_instruction, multiturn)
    pack = LmEvalPack(task.name, None if version is None else str(version), task.path, "", "", None, task.decoding(),
                      prompts=prompts, examples=examples, record=record, splits=task.splits_record(),
                      repeats=task.repeats, conversations=conversations,
                      processed_docs_sha256=task.processed_docs_sha256,
                      files=DefinitionFiles.of(task.definition))  # fmt: skip
    evaluated = task.eval_split
    choices = ChoicesConfig()  # generate_until
    if scored:
        options, scoring = SCORED_BY[task.output_type]
        choices = ChoicesConfig(field=options, shuffle=False, scoring=scoring, delimiter="")
    return Task(name=task.name, items=tuple(items), pack=pack, dataset_path=evaluated.files[0][0],
                dataset_sha256=evaluated.rows_sha256, choices=choices, chat=chat,
                scoring=task.scoring_record())  # fmt: skip


def _with_options(record: dict[str, Any], system_instruction: str | None, multiturn: bool) -> dict[str, Any]:
    """The prompt-pack record with lm-eval's prompt options that are not its defaults."""
    options = {"system_instruction": system_instruction} if system_instruction is not None else {}
    return {**record, **options, **({"fewshot_as_multiturn": False} if not multiturn else {})}


def find_task(path: Path, name: str | None, allow_unpinned: bool = False, revision: Revision = None,
              overrides: Mapping[str, Any] | None = None) -> LmEvalTask:  # fmt: skip
    """The task ``path`` defines (a YAML), or the task named ``name`` among the YAMLs under the directory ``path``
    (lm-eval's ``--include_path``), with ``overrides`` of its settings; a name that is not there is a BadInput
    listing the ones that are."""
    if path.is_file():
        task = load_task(path, allow_unpinned, revision, overrides)
        if name is not None and name != task.name:
            raise BadInput("task.name", f"{path} defines task {task.name!r}, not {name!r}")
        return task
    found = catalog(path)
    definition = found.definitions.get(name or "")
    if definition is None or definition.kind not in ("task", "python") or definition.path is None:
        raise BadInput("task.name", f"name the task to run from {path}: {found.listing()}")
    return load_task(definition.path, allow_unpinned, revision, overrides)


# --- scoring, as lm-eval scores ----------------------------------------------------------------------------------


class ScoringTask:
    """lm-eval's filters and ``process_results`` of one task, over one document's results at a time: the task
    built by lm-eval from its definition on the document itself (its requests need no other; ``process_docs``
    and few-shot examples made them already)."""

    def __init__(self, definition: Definition) -> None:
        self.definition = definition
        self._task: Any = None

    def _built(self, doc: Mapping[str, Any]) -> Any:
        if self._task is None:
            none = {"process_docs": None, "num_fewshot": 0, "fewshot_split": None, "fewshot_config": None,
                    "training_split": None, "validation_split": None, "test_split": "docs"}  # fmt: skip
            self._task = build(self.definition, {"docs": [doc]}, none)
        return self._task

    def score(self, doc: Mapping[str, Any], results: Sequence[Any]) -> list[tuple[str, str, Any, Any]]:
        """Each (metric, filter, value, filtered answer) of the document: ``results`` one per request, each the
        list of its replies (generate_until: every repeat's text; loglikelihood: ``(logprob, is_greedy)``)."""
        from lm_eval.api.instance import Instance

        task = self._built(doc)
        instances = [Instance(request_type=task.OUTPUT_TYPE, doc=doc, arguments=(), idx=i,
                              metadata=(self.definition.name, 0, task.config.repeats), resps=list(r))
                     for i, r in enumerate(results)]  # fmt: skip
        scores = []
        for ensemble in task._filters:  # no quiet() here: scoring runs on a thread beside the run's own output
            ensemble.apply(instances)
            filtered = [i.filtered_resps[ensemble.name] for i in instances]
            for metric, value in task.process_results(doc, filtered).items():
                scores.append((str(metric), str(ensemble.name), value, filtered[0]))
        return scores

    @cached_property
    def corpus(self) -> dict[str, Any]:
        """The task's corpus metrics and lm-eval's aggregation of each: every metric not aggregated by lm-eval's
        mean (perplexity, exp(-mean) of loglikelihoods, is the summary's own; evalrun.stats.summary)."""
        from lm_eval.api.metrics import mean, perplexity

        config = {k: v for k, v in self.definition.resolved.items() if k not in STRUCTURAL_KEYS}
        try:
            with quiet():
                task = defined_task(config)
        except (Exception, SystemExit) as error:
            raise BadInput(str(self.definition.path), f"lm-eval does not build it: {reason_of(error)}") from error
        return {str(metric): aggregation for metric, aggregation in task.aggregation().items()
                if not (aggregation is mean or (aggregation is perplexity and metric == "perplexity"))}  # fmt: skip


_SCORING: dict[str, ScoringTask] = {}


def scoring_settings(definition: Definition) -> dict[str, Any]:
    """The settings of ``definition`` that score (filters, metrics, process_results; functions by their module's
    sha256), and the settings given over its YAML's (``overrides``: what it is scored with is its YAML with them):
    the scoring record's, beside lm-eval's version and the output type."""
    settings = definition.settings_record()
    given = {"overrides": dict(definition.overrides)} if definition.overrides else {}
    return {**{k: settings[k] for k in SCORING_KEYS[1:] if k in settings}, **given}


def scoring_task(path: Path, recorded: Mapping[str, Any]) -> ScoringTask:
    """The scoring of the task YAML at ``path``, which must score as ``recorded`` says (its scoring record: the
    same lm-eval, settings and helper sources), else a BadInput saying what changed. Read and checked once per
    process for a path and record (a scorer is built for every part a run scores)."""
    key = canonical_hash({"path": str(path.resolve()), "record": dict(recorded)})
    if key not in _SCORING:
        definition = read_definition(path, recorded.get("overrides"))
        now = {"lm_eval": lm_eval_version(), **scoring_settings(definition)}
        expected = {k: v for k, v in recorded.items() if k != "output_type"}
        if now != expected:
            changed = sorted(k for k in set(now) | set(expected) if now.get(k) != expected.get(k))
            raise BadInput(str(path), f"its scoring is not what the run recorded ({', '.join(changed)} changed, or "
                                      "lm-eval's version): score it with the YAML and helpers it ran with")  # fmt: skip
        _SCORING[key] = ScoringTask(definition)
    return _SCORING[key]


def metric_value(metric: str, value: Any) -> float:
    """A per-document metric value as a number (lm-eval's are numbers or bools where the aggregation is a mean)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | float):
        return float(value)
    raise ValueError(f"metric {metric!r} gave {value!r} for a document, where a number was expected (a metric "
                     "aggregated by its mean)")  # fmt: skip
