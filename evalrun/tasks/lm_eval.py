"""lm-evaluation-harness task YAMLs, read as they are: what lm-eval 0.4 builds from one, reproduced exactly.

A task YAML (lm-eval's format, its ``include:`` and ``!function`` tags) is read into :class:`LmEvalTask`: the
resolved settings (includes merged as lm-eval merges them, shallowly, the including file's keys winning), the
functions it names (each a Python file beside the YAML that declares it, loaded and hashed), the documents of its
splits, and for each evaluated document the prompt lm-eval would send (:meth:`LmEvalTask.contexts`): the
description, the few-shot examples lm-eval's sampler draws (``random.Random(1234)`` shared by the documents in
order; the document itself left out when the examples come from the split under evaluation), each example's text,
target delimiter, answer and few-shot delimiter, then the document's text; for ``multiple_choice`` the target
delimiter and each choice as the continuations scored, for ``loglikelihood`` the target as it is.
``loglikelihood_rolling`` (whole-document perplexity) is not implemented and is refused. Every key evalrun does not
implement is refused by name (file and key), never ignored: the reader says what it reads (:data:`SUPPORTED`).

What lm-eval's definitions are, with its source's places, is in docs/design.md "lm-eval tasks".
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import os
import random
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import yaml
from jinja2 import BaseLoader, Environment, StrictUndefined, Template
from jinja2.exceptions import TemplateError

from evalrun.chat import ChatFormat, Conversation
from evalrun.config import ChoicesConfig
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, file_sha256
from evalrun.tasks import Item, Task
from evalrun.tasks.pack import PromptPack

LM_EVAL_VERSION = "0.4.13"  # the lm-eval whose definitions are reproduced (and the agreement was measured on)
FEWSHOT_SEED = 1234  # lm-eval's default few-shot seed (simple_evaluate's fewshot_random_seed)
OUTPUT_TYPES = ("generate_until", "multiple_choice", "loglikelihood")
GENERATION_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k")
# fewshot_config: the sampler and split, and what formats an example where it differs from the document's
FEWSHOT_KEYS = ("sampler", "split", "process_docs", "doc_to_text", "doc_to_target", "doc_to_choice", "gen_prefix",
                "target_delimiter", "fewshot_delimiter")  # fmt: skip
FORMATS = ("json", "csv", "parquet")

# every TaskConfig key evalrun reads; any other key of a task YAML is refused by name
SUPPORTED = frozenset({
    "task", "task_alias", "tag", "dataset_path", "dataset_name", "dataset_kwargs", "training_split",
    "validation_split", "test_split", "fewshot_split", "output_type", "doc_to_text", "doc_to_target",
    "doc_to_choice", "description", "target_delimiter", "fewshot_delimiter", "num_fewshot", "fewshot_config",
    "generation_kwargs", "filter_list", "metric_list", "metadata", "repeats", "include", "process_docs", "gen_prefix",
})  # fmt: skip


def _regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    return re.sub(pattern, repl, string, count=count)


# lm-eval's template environment (lm_eval/utils.py): strict, trailing newlines kept, its one extra filter
_JINJA = Environment(loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True)
_JINJA.filters["regex_replace"] = _regex_replace


@lru_cache(maxsize=256)
def _template(text: str) -> Template:
    return _JINJA.from_string(text)


@dataclass(frozen=True)
class LmEvalFunction:
    """A ``!function module.name`` reference: the Python file it is read from (relative to the YAML declaring it,
    as lm-eval resolves it), the source's sha256 (in the digest, as scorer sources are) and the function."""

    reference: str
    path: Path
    sha256: str
    function: Callable[..., Any] = field(compare=False, repr=False)

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    def as_record(self) -> dict[str, str]:
        return {"function": self.reference, "file": self.path.name, "sha256": self.sha256}


@dataclass(frozen=True)
class DataSplit:
    """One split of the task's dataset: its files (each with its sha256) and its documents, in file order (after
    the task's ``process_docs``, when it has one: ``rows_sha256`` stays the hash of the rows as read)."""

    name: str
    files: tuple[tuple[Path, str], ...]
    docs: tuple[Mapping[str, Any], ...]
    # a hub dataset's: its id, config, the commit read (from the local cache) and whether the YAML pinned it
    source: Mapping[str, Any] | None = None
    rows_sha256: str = ""  # the canonical hash of the rows as read; computed from ``docs`` when not given
    processed_by: str | None = None  # the process_docs function the documents went through

    def __post_init__(self) -> None:
        if not self.rows_sha256:
            object.__setattr__(self, "rows_sha256", canonical_hash([dict(d) for d in self.docs]))

    @cached_property
    def columns(self) -> tuple[str, ...]:
        """The split's column names (lm-eval's ``features``), in first-seen order."""
        seen: dict[str, None] = {}
        for doc in self.docs:
            seen.update(dict.fromkeys(doc))
        return tuple(seen)

    @cached_property
    def docs_sha256(self) -> str:
        """The canonical hash of the documents (``rows_sha256`` until a ``process_docs`` changes them)."""
        return self.rows_sha256 if self.processed_by is None else canonical_hash([dict(d) for d in self.docs])

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"name": self.name, "files": [{"file": p.name, "sha256": s} for p, s in self.files],
                                  "docs": len(self.docs), "rows_sha256": self.rows_sha256}  # fmt: skip
        if self.processed_by is not None:  # what the prompts were made from: the documents process_docs returned
            record["process_docs"] = {"function": self.processed_by, "docs_sha256": self.docs_sha256}
        return record if self.source is None else {**record, "hub": dict(self.source)}

    def processed(self, function: LmEvalFunction, where: str) -> DataSplit:
        """The split's documents through ``process_docs``, as lm-eval passes them: the split as a
        ``datasets.Dataset`` (built from the rows read), the function's result read back row by row."""
        import datasets

        datasets.disable_progress_bars()  # a per-split "Map" bar on stderr, over the run's own progress
        try:
            dataset = datasets.Dataset.from_list([dict(d) for d in self.docs])
        except Exception as exc:  # pyarrow's type errors: rows whose fields do not make one table
            raise BadInput(where, f"split {self.name!r} is not one table for process_docs "
                                  f"({type(exc).__name__}: {exc})") from exc  # fmt: skip
        try:
            result = function(dataset)
        except Exception as exc:
            raise BadInput(where, f"failed on split {self.name!r} ({type(exc).__name__}: {exc})") from exc
        rows = result.to_list() if isinstance(result, datasets.Dataset) else result
        if not isinstance(rows, list | tuple) or not all(isinstance(r, Mapping) for r in rows):
            raise BadInput(where, f"returned {type(result).__name__} for split {self.name!r}: expected a "
                                  "datasets.Dataset (or a list of documents)")  # fmt: skip
        return replace(self, docs=tuple(rows), processed_by=function.reference)


@dataclass(frozen=True)
class Requests:
    """What lm-eval sends for one document: the context, and for multiple choice the continuations scored."""

    context: str
    continuations: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()  # the few-shot examples shown, SPLIT:INDEX in the few-shot split
    conversation: Conversation | None = None  # a chat-formatted context's chat, for an engine that takes chats


@dataclass(frozen=True)
class Turn:
    """One turn of a prompt (lm-eval's ``Message``): as plain text its content and then its delimiter, as a chat
    message its role and content."""

    role: str  # system, user or assistant
    content: str
    delimiter: str = ""


@dataclass(frozen=True)
class LmEvalTask:
    name: str
    path: Path  # the task's YAML
    settings: Mapping[str, Any]  # the resolved settings: includes merged, functions as LmEvalFunction
    splits: Mapping[str, DataSplit]
    # the few-shot split as fewshot_config.process_docs made it (None: as the task's process_docs did)
    fewshot_docs: DataSplit | None = None

    @property
    def output_type(self) -> str:
        return str(self.settings.get("output_type") or "generate_until")

    @property
    def eval_split(self) -> DataSplit:
        """The split evaluated: ``test_split``, else ``validation_split`` (lm-eval's order)."""
        name = self.settings.get("test_split") or self.settings.get("validation_split")
        return self.splits[str(name)]

    @property
    def target_delimiter(self) -> str:
        return str(self.settings.get("target_delimiter", " "))

    def choice_delimiter(self, chat: bool) -> str:
        """What a multiple-choice continuation puts before the choice: the target delimiter, or under a chat template
        nothing (the choice follows the generation prompt) unless a ``gen_prefix`` that does not end in whitespace
        ends the prompt (lm-eval's rule, on the YAML's ``gen_prefix`` as written)."""
        prefix = str(self.settings.get("gen_prefix") or "")
        return self.target_delimiter if not chat or (prefix and not prefix[-1].isspace()) else ""

    @property
    def fewshot_delimiter(self) -> str:
        return str(self.settings.get("fewshot_delimiter", "\n\n"))

    @property
    def repeats(self) -> int:
        """How many times each document's request is sampled, the replies filtered together (``majority_vote``)."""
        return int(self.settings.get("repeats") or 1)

    @property
    def num_fewshot(self) -> int:
        return int(self.settings.get("num_fewshot") or 0)

    @property
    def filters(self) -> tuple[FilterPipeline, ...]:
        return filters(self.settings.get("filter_list"), self.path)

    @property
    def metrics(self) -> tuple[MetricSpec, ...]:
        return metrics(self.settings.get("metric_list"), self.output_type, self.path)

    def generation(self) -> dict[str, Any]:
        """``generation_kwargs`` as lm-eval completes them: without any, greedy, 256 tokens, stopping at the few-shot
        delimiter; ``until`` defaults to the few-shot delimiter."""
        given = self.settings.get("generation_kwargs")
        if given is None:
            return {"until": [self.fewshot_delimiter], "do_sample": False, "temperature": 0.0, "max_gen_toks": 256}
        kwargs = dict(given)
        until = kwargs.get("until", [self.fewshot_delimiter])
        kwargs["until"] = [until] if isinstance(until, str) else list(until)
        if "temperature" in kwargs:
            kwargs["temperature"] = float(kwargs["temperature"])
        return kwargs

    # --- a document's fields, as lm-eval's doc_to_* read them ---

    def text(self, doc: Mapping[str, Any], example: bool = False) -> Any:
        return self._field(doc, "doc_to_text", example)

    def target(self, doc: Mapping[str, Any], example: bool = False) -> Any:
        return self._field(doc, "doc_to_target", example)

    def gen_prefix(self, doc: Mapping[str, Any], example: bool = False) -> str:
        """What starts the model's answer (lm-eval's ``gen_prefix``: a field's value or a Jinja template; empty
        when unset); ``example``: a few-shot example's, ``fewshot_config.gen_prefix`` where given."""
        spec = self._spec("gen_prefix", example)
        if not spec:
            return ""
        if spec in doc:
            return str(doc[spec])
        return self._render(str(spec), doc, "gen_prefix")

    def _spec(self, key: str, example: bool = False) -> Any:
        """A formatting setting: a few-shot example's ``fewshot_config.KEY`` where given, else the task's ``KEY``."""
        config = self.settings.get("fewshot_config") or {}
        if example and config.get(key) is not None:
            return config[key]
        return self.settings.get(key)

    def choices(self, doc: Mapping[str, Any], example: bool = False) -> list[Any] | None:
        spec = self._spec("doc_to_choice", example)
        if spec is None:
            return None
        if isinstance(spec, str):
            if spec in self._columns:
                return list(doc[spec])
            rendered = self._render(spec, doc, "doc_to_choice")
            try:
                value = ast.literal_eval(rendered)
            except (SyntaxError, ValueError) as exc:
                raise BadInput(f"{self.path}: doc_to_choice", f"rendered {rendered!r}, not a list literal") from exc
            return list(value)
        if isinstance(spec, dict):
            return list(spec.values())
        if isinstance(spec, list):
            return list(spec)
        return list(spec(doc))

    def continuation(self, doc: Mapping[str, Any]) -> str:
        """A loglikelihood document's continuation: its target's text, scored after the prompt as it is."""
        target = self.target(doc)
        self._must_be_text(target, "doc_to_target", doc)
        return str(target)

    def gold(self, doc: Mapping[str, Any]) -> int:
        """A multiple-choice document's right choice: the target's index (lm-eval's -100 when out of range or
        not a choice)."""
        choices, gold = self.choices(doc) or [], self.target(doc)
        if isinstance(gold, int) and not isinstance(gold, bool):
            return gold if gold < len(choices) else -100
        if isinstance(gold, str):
            return choices.index(gold) if gold in choices else -100
        raise BadInput(f"{self.path}: doc_to_target", f"a choice's index or text for multiple_choice, got {gold!r}")

    def reference(self, doc: Mapping[str, Any]) -> str:
        """A generation document's gold text: the target (with ``doc_to_choice``, the choice it indexes), as text."""
        gold = self.target(doc)
        choices = self.choices(doc)
        if choices is not None:
            gold = choices[gold]
        if isinstance(gold, list):
            raise BadInput(f"{self.path}: doc_to_target", "several targets per document are not supported yet")
        return gold if isinstance(gold, str) else str(gold)

    @property
    def _columns(self) -> tuple[str, ...]:
        return self.eval_split.columns

    def _field(self, doc: Mapping[str, Any], key: str, example: bool = False) -> Any:
        spec = self._spec(key, example)
        if spec is None:
            raise BadInput(f"{self.path}: {key}", "missing: lm-eval needs it to build a prompt")
        if isinstance(spec, int) and not isinstance(spec, bool):
            return spec
        if isinstance(spec, str):
            if spec in self._columns:
                return doc[spec]
            rendered = self._render(spec, doc, key)
            if rendered.isdigit() and self._spec("doc_to_choice", example) is not None:
                return ast.literal_eval(rendered)
            if key == "doc_to_target" and len(rendered) >= 2 and rendered[0] == "[" and rendered[-1] == "]":
                try:
                    return ast.literal_eval(rendered)
                except (SyntaxError, ValueError):
                    return rendered
            return rendered
        if isinstance(spec, list) and key == "doc_to_target":
            return spec
        if isinstance(spec, LmEvalFunction):
            return spec(doc)
        raise BadInput(f"{self.path}: {key}", f"a field name, a Jinja template or a !function, got {spec!r}")

    def _render(self, template: str, doc: Mapping[str, Any], key: str) -> str:
        try:
            return _template(template).render(**doc)
        except TemplateError as exc:
            raise BadInput(f"{self.path}: {key}", f"template {template!r}: {exc}") from exc

    def _description(self, doc: Mapping[str, Any]) -> str:
        description = self.settings.get("description")
        if not description:
            return ""
        return str(doc[description]) if description in doc else self._render(str(description), doc, "description")

    # --- prompts ---

    def fewshot_split(self) -> DataSplit:
        """Where the examples come from (as ``fewshot_config.process_docs`` made it, where given):
        ``fewshot_config.split`` or ``fewshot_split``, else the training, the validation and the test split, the
        first the task has (lm-eval's order)."""
        if self.fewshot_docs is not None:
            return self.fewshot_docs
        config = self.settings.get("fewshot_config") or {}
        name = config.get("split") or self.settings.get("fewshot_split")
        for candidate in (name, self.settings.get("training_split"), self.settings.get("validation_split"),
                          self.settings.get("test_split")):  # fmt: skip
            if candidate:
                return self.splits[str(candidate)]
        raise BadInput(f"{self.path}: fewshot_split", "num_fewshot > 0 needs a split to draw examples from")

    def fewshot(self, seed: int = FEWSHOT_SEED) -> Iterator[list[int]]:
        """Each evaluated document's examples (their indices in the few-shot split), in document order, as
        lm-eval's sampler draws them: one ``random.Random(seed)`` for the task, so a document's examples depend on
        the documents before it (``random.sample`` draws positions alike whatever the population holds)."""
        n = self.num_fewshot
        docs = self.eval_split.docs
        if n == 0:
            yield from ([] for _ in docs)
            return
        config = self.settings.get("fewshot_config") or {}
        sampler = config.get("sampler", "default")
        split = self.fewshot_split()
        pool = split.docs
        same_split = (config.get("split") or self.settings.get("fewshot_split")) == self.settings.get("test_split")
        if len(pool) - (1 if same_split else 0) < n:
            raise BadInput(f"{self.path}: num_fewshot", f"{n} examples from split {split.name!r}, which has "
                                                        f"{len(pool)} documents")  # fmt: skip
        rnd = random.Random(seed)
        everything = range(len(pool))
        for doc in docs:
            if sampler == "first_n":
                yield list(itertools.islice((i for i in everything if not same_split or pool[i] != doc), n))
            elif not same_split:
                yield rnd.sample(everything, n)
            else:
                chosen = [i for i in rnd.sample(everything, n + 1) if pool[i] != doc][:n]
                if len(chosen) < n:  # the document is in the pool more than once
                    chosen = rnd.sample([i for i in everything if pool[i] != doc], n)
                yield chosen

    def requests(self, seed: int = FEWSHOT_SEED, chat: ChatFormat | None = None, system_instruction: str | None = None,
                 multiturn: bool = True) -> Iterator[Requests]:  # fmt: skip
        """Every evaluated document's requests, in document order: plain text, or (``chat``, lm-eval's
        ``--apply_chat_template``) the turns as chat messages through the template with the generation prompt
        added, each example a user turn and an assistant turn (``multiturn``, lm-eval's ``fewshot_as_multiturn``,
        its default then) or all but the system turn joined as one user turn; a multiple-choice continuation then
        has no target delimiter (lm-eval's, without a ``gen_prefix``). ``system_instruction`` is lm-eval's
        ``--system_instruction``."""
        split = self.fewshot_split() if self.num_fewshot else None
        delimiter = self.choice_delimiter(chat is not None)
        for doc, chosen in zip(self.eval_split.docs, self.fewshot(seed), strict=True):
            examples = [split.docs[i] for i in chosen] if split is not None else []
            turns = self.turns(doc, examples, system_instruction)
            conversation = None
            if chat is None:
                context = _text(turns)
            else:
                turns = turns if multiturn else _single_turn(turns)
                messages = [{"role": t.role, "content": t.content} for t in turns]
                continued = turns[-1].role == "assistant"  # a gen_prefix the model continues
                context = chat.render(messages, continue_final=continued)
                conversation = chat.conversation(messages, continue_final=continued)
            ids = tuple(f"{split.name}:{i}" for i in chosen) if split is not None else ()
            if self.output_type == "multiple_choice":
                continuations = tuple(f"{delimiter}{c}" for c in self.choices(doc) or [])
                yield Requests(context, continuations, ids)
            elif self.output_type == "loglikelihood":  # the target as it is, no delimiter (lm-eval's)
                yield Requests(context, (self.continuation(doc),), ids)
            else:
                yield Requests(context, examples=ids, conversation=conversation)

    def turns(self, doc: Mapping[str, Any], examples: Sequence[Mapping[str, Any]],
              system_instruction: str | None = None) -> list[Turn]:  # fmt: skip
        """A document's prompt as lm-eval's ``fewshot_context`` builds it: the system instruction and the
        description as a system turn (joined by the few-shot delimiter unless whitespace meets there), each
        example a user turn (its text, then the target delimiter) and an assistant turn (its answer, then the
        few-shot delimiter), formatted by ``fewshot_config`` where it says, then the document's text as a user turn;
        a ``gen_prefix`` starts each answer and, as an assistant turn, the model's (:meth:`_qa_turns`)."""
        system = _joined(system_instruction or "", self._description(doc), self.fewshot_delimiter)
        turns = [Turn("system", system)] if system else []
        for example in examples:
            answer = self.target(example, True)
            choices = self.choices(example, True)
            if choices and isinstance(answer, int) and not isinstance(answer, bool):
                answer = choices[answer]
            elif isinstance(answer, list):
                answer = answer[0]
            turns += self._qa_turns(example, self.text(example, True), answer, self.gen_prefix(example, True),
                                    str(self._spec("target_delimiter", True) or self.target_delimiter),
                                    str(self._spec("fewshot_delimiter", True) or self.fewshot_delimiter))  # fmt: skip
        return [*turns, *self._qa_turns(doc, self.text(doc), None, self.gen_prefix(doc), self.target_delimiter, "")]

    def _qa_turns(self, doc: Mapping[str, Any], question: Any, answer: Any, prefix: str, target_delimiter: str,
                  fewshot_delimiter: str) -> list[Turn]:  # fmt: skip
        """One question's turns (lm-eval's ``build_qa_turn``): the user's, followed by the target delimiter when an
        answer comes and no prefix, or when a prefix comes and no whitespace meets it; then the answer, the prefix
        before it (a space between unless whitespace meets there), or, without an answer, the prefix alone."""
        self._must_be_text(question, "doc_to_text", doc)
        has_answer = answer is not None and answer != ""
        meets = bool(prefix) and bool(question) and not (question[-1].isspace() or prefix[0].isspace())
        delimiter = target_delimiter if (has_answer and not prefix) or meets else ""
        turns = [Turn("user", question, delimiter)]
        if has_answer:
            self._must_be_text(answer, "doc_to_target", doc)
            turns.append(Turn("assistant", _joined(prefix, answer, " "), fewshot_delimiter))
        elif prefix:
            turns.append(Turn("assistant", prefix))
        return turns

    def _must_be_text(self, value: Any, key: str, doc: Mapping[str, Any]) -> None:
        if not isinstance(value, str):
            raise BadInput(f"{self.path}: {key}", f"gave {value!r} for {dict(doc)!r}: a prompt's text is a string")

    def as_record(self) -> dict[str, Any]:
        """What the digest covers of the task as lm-eval defines it: the resolved settings, each function by its
        source's hash, and each split's files and rows by their hashes."""
        return {"lm_eval": LM_EVAL_VERSION, "name": self.name, "settings": _record(self.settings),
                "splits": {name: s.as_record() for name, s in sorted(self.splits.items())}}  # fmt: skip

    def prompt_record(self) -> dict[str, Any]:
        """The digest's prompt-pack part: the resolved settings without the filters and metrics (the scoring part),
        each function by its source's hash, and the split the few-shot examples come from (its files and rows by
        their hashes; None without examples), as a prompt pack's few-shot pool is. The evaluated split is the run's
        dataset (:meth:`splits_record`), as a dataset task's file is: in its identity, not in the digest."""
        record = self.as_record()
        del record["splits"]
        record["settings"] = {k: v for k, v in record["settings"].items() if k not in SCORING_KEYS}
        record["fewshot"] = self.fewshot_split().as_record() if self.num_fewshot > 0 else None
        return record

    def splits_record(self) -> dict[str, Any]:
        """Each split's files and rows by their hashes (the manifest's ``task.dataset.splits``)."""
        return {name: split.as_record() for name, split in sorted(self.splits.items())}

    def scoring_record(self) -> dict[str, Any]:
        """The digest's scoring part of the task: its output type, filter pipelines and metrics as read."""
        return {"output_type": self.output_type, "filter_list": [f.as_record() for f in self.filters],
                "metric_list": [m.as_record() for m in self.metrics]}  # fmt: skip

    def decoding(self) -> dict[str, Any]:
        """The generation settings as evalrun's decoding section takes them (over the decoding group, as a prompt
        pack's): ``until`` as stop strings, ``max_gen_toks`` as the token limit, greedy unless ``do_sample`` (or,
        without it, a temperature above 0; sampling without a temperature is at 1.0, transformers' default)."""
        if self.output_type != "generate_until":
            return {}
        kwargs = self.generation()
        temperature = kwargs.get("temperature")
        sampled = kwargs.get("do_sample")
        if sampled is None:
            sampled = temperature is not None and temperature > 0
        decoding: dict[str, Any] = {
            "stop": list(kwargs["until"]),
            "max_tokens": int(kwargs.get("max_gen_toks", 256)),
            "temperature": (1.0 if temperature is None else temperature) if sampled else 0.0,
        }
        for key in ("top_p", "top_k"):
            if key in kwargs:
                decoding[key] = kwargs[key]
        return decoding


def _single_turn(turns: Sequence[Turn]) -> list[Turn]:
    """lm-eval's ``multiturn_to_singleturn``: every turn after the system's joined as text into one user turn, the
    last of them without its delimiter; a final assistant turn (a gen_prefix) stays a turn of its own."""
    system = [t for t in turns[:1] if t.role == "system"]
    rest = list(turns[len(system) :])
    answer = [rest.pop()] if rest[-1].role == "assistant" else []
    rest[-1] = replace(rest[-1], delimiter="")
    return [*system, Turn("user", _text(rest)), *answer]


def _text(turns: Sequence[Turn]) -> str:
    """Turns as plain text: each one's content, then its delimiter (lm-eval's ``Message.to_text``)."""
    return "".join(t.content + t.delimiter for t in turns)


def _joined(prefix: str, suffix: str, delimiter: str) -> str:
    """``prefix`` and ``suffix`` with ``delimiter`` between them unless whitespace meets there (lm-eval's
    ``maybe_delimit``)."""
    if not prefix or not suffix:
        return prefix or suffix
    return prefix + suffix if prefix[-1].isspace() or suffix[0].isspace() else prefix + delimiter + suffix


def _record(value: Any) -> Any:
    if isinstance(value, LmEvalFunction):
        return value.as_record()
    if isinstance(value, Mapping):
        return {str(k): _record(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_record(v) for v in value]
    return value


SCORING_KEYS = ("filter_list", "metric_list")  # the task's settings in the digest's scoring part


@dataclass(frozen=True)
class LmEvalPack(PromptPack):
    """An lm-eval task's prompts, made as lm-eval makes them (:meth:`LmEvalTask.requests`), by item id; its record
    is the task's (:meth:`LmEvalTask.prompt_record`) with the effective decoding settings."""

    prompts: Mapping[str, str] = field(default_factory=dict)
    examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # by item id: its few-shot examples
    record: Mapping[str, Any] = field(default_factory=dict)
    splits: Mapping[str, Any] = field(default_factory=dict)  # LmEvalTask.splits_record(): the data, not the pack
    repeats: int = 1  # LmEvalTask.repeats: each episode's generations
    conversations: Mapping[str, Conversation] = field(default_factory=dict)  # by item id: a chat prompt's chat

    def prompt_of(self, item_id: str) -> str | None:
        return self.prompts[item_id]

    def examples_of(self, item_id: str) -> tuple[str, ...] | None:
        return self.examples[item_id]

    def conversation_of(self, item_id: str) -> Conversation | None:
        return self.conversations.get(item_id)

    def as_record(self, decoding: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.record, "decoding": {k: v for k, v in decoding.items() if k != "name"}}


def as_task(task: LmEvalTask, limit: int | None = None, seed: int = FEWSHOT_SEED, chat: ChatFormat | None = None,
            system_instruction: str | None = None, multiturn: bool = True) -> Task:  # fmt: skip
    """The lm-eval task as evalrun runs it: an item per evaluated document (its id the document's index, as
    lm-eval's ``doc_id``), the first ``limit`` of them, each prompt made with the few-shot examples lm-eval draws
    for it from ``seed`` (drawn over every document before it, so a limit keeps the prompts of the full run). A
    generation item's target is its gold text; a multiple-choice item's options are its choices (in order, not
    shuffled, scored by loglikelihood as lm-eval does) and its target names the gold choice and every choice's
    text (what acc_norm divides by); a loglikelihood item's one option and target are its continuation (scored
    after the prompt with no delimiter, as lm-eval scores it). With ``chat``, the prompts are chat-formatted as
    lm-eval's ``--apply_chat_template`` makes them, and ``system_instruction`` and ``multiturn`` are its
    ``--system_instruction`` and ``--fewshot_as_multiturn`` (:meth:`LmEvalTask.requests`; in the prompt-pack
    record when given)."""
    multiple_choice = task.output_type == "multiple_choice"
    loglikelihood = task.output_type == "loglikelihood"
    items, prompts, examples, conversations = [], {}, {}, {}
    made = task.requests(seed, chat, system_instruction, multiturn)
    for index, (doc, requests) in enumerate(zip(task.eval_split.docs, made, strict=True)):
        if limit is not None and index >= limit:
            break
        item_id = str(index)
        if multiple_choice:
            choices = [str(c) for c in task.choices(doc) or []]
            target = json.dumps({"gold": task.gold(doc), "choices": choices}, ensure_ascii=False)
            items.append(Item(item_id, doc, target, tuple(choices)))
        elif loglikelihood:  # one option, the continuation, its likelihood scored (and whether it is greedy)
            items.append(Item(item_id, doc, requests.continuations[0], requests.continuations))
        else:
            items.append(Item(item_id, doc, task.reference(doc)))
        prompts[item_id], examples[item_id] = requests.context, requests.examples
        if requests.conversation is not None:
            conversations[item_id] = requests.conversation
    metadata = task.settings.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    pack = LmEvalPack(task.name, None if version is None else str(version), task.path, "", "", None, task.decoding(),
                      prompts=prompts, examples=examples, record=_with_options(task.prompt_record(),
                                                                               system_instruction, multiturn),
                      splits=task.splits_record(), repeats=task.repeats, conversations=conversations)  # fmt: skip
    split = task.eval_split
    delimiter: str | None = task.choice_delimiter(chat is not None)
    delimiter = None if delimiter == " " else delimiter  # lm-eval's default: recorded as before delimiters were
    if multiple_choice:
        choices = ChoicesConfig(field="doc_to_choice", shuffle=False, scoring="loglikelihood", delimiter=delimiter)
    elif loglikelihood:
        choices = ChoicesConfig(field="doc_to_target", shuffle=False, scoring="loglikelihood", delimiter="")
    else:
        choices = ChoicesConfig()
    return Task(name=task.name, items=tuple(items), pack=pack, dataset_path=split.files[0][0],
                dataset_sha256=split.rows_sha256, choices=choices, chat=chat,
                scoring=task.scoring_record())  # fmt: skip


def _with_options(record: dict[str, Any], system_instruction: str | None, multiturn: bool) -> dict[str, Any]:
    """The prompt-pack record with lm-eval's prompt options that are not its defaults (records made before the
    options existed stay as they were)."""
    options = {"system_instruction": system_instruction} if system_instruction is not None else {}
    return {**record, **options, **({"fewshot_as_multiturn": False} if not multiturn else {})}


def find_task(path: Path, name: str | None, allow_unpinned: bool = False) -> LmEvalTask:
    """The task ``path`` defines (a YAML), or the task named ``name`` among the YAMLs under the directory ``path``
    (as lm-eval's ``--include_path``); a name that is not there is a BadInput listing the ones that are."""
    if path.is_file():
        task = load_task(path, allow_unpinned)
        if name is not None and name != task.name:
            raise BadInput("task.name", f"{path} defines task {task.name!r}, not {name!r}")
        return task
    found = index(path)
    if name not in found.tasks:
        raise BadInput("task.name", f"name the task to run from {path}: {found.listing()}")
    return load_task(found.tasks[name], allow_unpinned)


@dataclass(frozen=True)
class TaskIndex:
    """What a directory of lm-eval YAMLs defines, as lm-eval's ``TaskIndex`` registers it: each task's YAML (a YAML
    with ``task`` and no ``group``), each group's (a YAML with ``group``), and each tag's tasks (a task YAML's
    ``tag``, one name or a list); the first file of a name wins, the files in path order."""

    tasks: Mapping[str, Path]
    groups: Mapping[str, Path]
    tags: Mapping[str, tuple[str, ...]]

    def listing(self) -> str:
        kinds = (("tasks", self.tasks), ("groups", self.groups), ("tags", self.tags))
        named = [f"{kind} {', '.join(sorted(names))}" for kind, names in kinds if names]
        return "one of the " + "; ".join(named) if named else "it has no lm-eval YAML"


def index(directory: Path) -> TaskIndex:
    """The tasks, groups and tags of the YAMLs under ``directory`` (see :class:`TaskIndex`)."""
    tasks: dict[str, Path] = {}
    groups: dict[str, Path] = {}
    tags: dict[str, list[str]] = {}
    for candidate in sorted(directory.rglob("*.yaml"), key=lambda p: p.as_posix()):
        settings, _ = read_yaml(candidate)
        if isinstance(settings.get("group"), str):
            groups.setdefault(settings["group"], candidate)
        elif isinstance(settings.get("task"), str) and settings["task"] not in tasks:
            tasks[settings["task"]] = candidate
            tagged = settings.get("tag")
            for tag in [tagged] if isinstance(tagged, str) else tagged if isinstance(tagged, list) else []:
                tags.setdefault(str(tag), []).append(settings["task"])
    return TaskIndex(tasks, groups, {tag: tuple(sorted(names)) for tag, names in tags.items()})


# --- filters and metrics, as the YAML names them (evalrun.scoring.lm_eval computes them) ---

# filter functions and the arguments each takes (lm-eval's filters of those names)
FILTER_FUNCTIONS: Mapping[str, tuple[str, ...]] = {
    "regex": ("regex_pattern", "group_select", "fallback"), "take_first": (), "remove_whitespace": (),
    "lowercase": (), "uppercase": (), "majority_vote": (),
}  # fmt: skip
# metrics, the output types they score and the arguments each takes
METRICS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "exact_match": (("generate_until",), ("ignore_case", "ignore_punctuation", "regexes_to_ignore", "ignore_numbers")),
    "acc": (("multiple_choice", "loglikelihood"), ()),  # loglikelihood: the target is the greedy continuation
    "acc_norm": (("multiple_choice",), ()),
    "perplexity": (("loglikelihood",), ()),  # a document's value is its loglikelihood; the aggregate exp(-mean)
}
DEFAULT_METRICS = {"generate_until": ("exact_match",), "multiple_choice": ("acc", "acc_norm"),
                   "loglikelihood": ("perplexity", "acc")}  # fmt: skip
# a metric's aggregation over documents and its direction, where they are not the mean and higher (lm-eval's)
AGGREGATIONS: Mapping[str, tuple[str, bool]] = {"perplexity": ("perplexity", False)}


@dataclass(frozen=True)
class FilterPipeline:
    """One ``filter_list`` entry: its name (the metrics' suffix, ``exact_match,NAME``) and its steps in order,
    each a filter function's name and arguments."""

    name: str
    steps: tuple[tuple[str, Mapping[str, Any]], ...]

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "filter": [{"function": f, **dict(kw)} for f, kw in self.steps]}


@dataclass(frozen=True)
class MetricSpec:
    metric: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    aggregation: str = "mean"
    higher_is_better: bool = True

    def as_record(self) -> dict[str, Any]:
        return {"metric": self.metric, "aggregation": self.aggregation, "higher_is_better": self.higher_is_better,
                **dict(self.kwargs)}  # fmt: skip


def filters(spec: Any, where: Path | None = None) -> tuple[FilterPipeline, ...]:
    """``filter_list`` as pipelines; without one, lm-eval's single ``none`` pipeline (take the first reply)."""
    if spec is None:
        return (FilterPipeline("none", (("take_first", {}),)),)
    if not isinstance(spec, list) or not spec:
        raise BadInput(f"{where}: filter_list", f"a list of {{name, filter: [...]}} entries, got {spec!r}")
    pipelines = []
    for i, entry in enumerate(spec):
        at = f"{where}: filter_list.{i}"
        if not isinstance(entry, dict) or set(entry) - {"name", "filter"} or not isinstance(entry.get("name"), str):
            raise BadInput(at, f"a mapping of name and filter, got {entry!r}")
        steps = []
        for j, step in enumerate(entry.get("filter") or []):
            function = step.get("function") if isinstance(step, dict) else None
            if function not in FILTER_FUNCTIONS:
                raise BadInput(f"{at}.filter.{j}.function", f"one of {', '.join(FILTER_FUNCTIONS)} (the filters "
                                                            f"evalrun implements), got {function!r}")  # fmt: skip
            kwargs = {k: v for k, v in step.items() if k != "function"}
            unknown = sorted(set(kwargs) - set(FILTER_FUNCTIONS[function]))
            if unknown:
                raise BadInput(f"{at}.filter.{j}.{unknown[0]}", f"not an argument of the {function} filter")
            if function == "regex":
                try:
                    re.compile(str(kwargs.get("regex_pattern", REGEX_DEFAULT)))
                except re.error as exc:
                    raise BadInput(f"{at}.filter.{j}.regex_pattern", f"not a regular expression ({exc})") from exc
            steps.append((str(function), kwargs))
        pipelines.append(FilterPipeline(entry["name"], tuple(steps)))
    return tuple(pipelines)


REGEX_DEFAULT = r"#### (\-?[0-9\.\,]+)"  # lm-eval's regex filter default (GSM8K's answer line)


def metrics(spec: Any, output_type: str, where: Path | None = None) -> tuple[MetricSpec, ...]:
    """``metric_list`` as metrics; without one, lm-eval's defaults for the output type."""
    if spec is None:
        return tuple(MetricSpec(m, {}, *AGGREGATIONS.get(m, ("mean", True))) for m in DEFAULT_METRICS[output_type])
    if not isinstance(spec, list) or not spec:
        raise BadInput(f"{where}: metric_list", f"a list of {{metric: NAME, ...}} entries, got {spec!r}")
    found = []
    for i, entry in enumerate(spec):
        at = f"{where}: metric_list.{i}"
        name = entry.get("metric") if isinstance(entry, dict) else None
        if name not in METRICS:
            raise BadInput(f"{at}.metric", f"one of {', '.join(METRICS)} (the metrics evalrun implements), "
                                           f"got {name!r}")  # fmt: skip
        types, arguments = METRICS[name]
        if output_type not in types:
            raise BadInput(f"{at}.metric", f"{name} scores {', '.join(types)}, and the task is {output_type}")
        kwargs = {k: v for k, v in entry.items() if k not in ("metric", "aggregation", "higher_is_better")}
        unknown = sorted(set(kwargs) - set(arguments))
        if unknown:
            raise BadInput(
                f"{at}.{unknown[0]}", f"not an argument of {name} (it takes {', '.join(arguments) or 'none'})"
            )
        aggregation, higher = AGGREGATIONS.get(name, ("mean", True))
        if entry.get("aggregation", aggregation) != aggregation:
            raise BadInput(f"{at}.aggregation", f"{aggregation} (the aggregation evalrun implements for {name}), "
                                                f"got {entry['aggregation']!r}")  # fmt: skip
        found.append(MetricSpec(name, kwargs, aggregation, bool(entry.get("higher_is_better", higher))))
    return tuple(found)


# --- reading a task YAML ---


def load_task(path: Path, allow_unpinned: bool = False) -> LmEvalTask:
    """The lm-eval task of the YAML at ``path``; a BadInput names the file and key at fault (a key evalrun does
    not implement, an include or function that is not there, a split the dataset does not have)."""
    settings, origins = read_yaml(path)
    if "group" in settings:
        raise BadInput(f"{path}: group", f"a group's YAML, not a task's: it runs as task.path={path} (or its "
                                         f"directory with task.name={settings['group']})")  # fmt: skip
    for key in settings:
        if key not in SUPPORTED:
            raise BadInput(f"{origins[key]}: {key}", f"an lm-eval key evalrun does not implement (it reads "
                                                     f"{', '.join(sorted(SUPPORTED - {'include'}))})")  # fmt: skip
    _check(settings, origins)
    name = settings.get("task")
    if not isinstance(name, str) or not name:
        raise BadInput(f"{path}: task", "the task's name (a string) is missing")
    local = settings.get("dataset_path") in FORMATS
    splits = _splits(settings, origins) if local else _hub_splits(settings, origins, allow_unpinned)
    _check_splits(settings, origins, splits)
    read = splits
    process = settings.get("process_docs")
    if process is not None:  # lm-eval applies it to every split it reads documents from, few-shot ones too
        where = f"{origins['process_docs']}: process_docs"
        if not isinstance(process, LmEvalFunction):
            raise BadInput(where, f"a !function reference (module.function), got {process!r}")
        splits = {name: split.processed(process, where) for name, split in splits.items()}
    fewshot = settings.get("fewshot_config") or {}
    fewshot_docs = None
    if fewshot.get("process_docs") is not None:  # instead of the task's, on the split the examples come from
        where = f"{origins['fewshot_config']}: fewshot_config.process_docs"
        named = fewshot.get("split") or settings.get("fewshot_split")
        if not isinstance(fewshot["process_docs"], LmEvalFunction):
            raise BadInput(where, f"a !function reference (module.function), got {fewshot['process_docs']!r}")
        if not named:
            raise BadInput(where, "needs the split it processes named (fewshot_split or fewshot_config.split): "
                                  "lm-eval applies it there only")  # fmt: skip
        fewshot_docs = read[str(named)].processed(fewshot["process_docs"], where)
    return LmEvalTask(name, path, settings, splits, fewshot_docs)


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, Path]]:
    """A task YAML's settings with its includes merged (each include in order, later over earlier, then the
    file's own keys over them; shallow, as lm-eval merges), and the file each key came from."""
    path = path.resolve()
    if path in seen:
        raise BadInput(f"{seen[-1]}: include", f"{path} includes itself (through {' -> '.join(map(str, seen))})")
    if not path.is_file():
        where = f"{seen[-1]}: include" if seen else "task.path"
        raise BadInput(where, f"{path} does not exist or is not a file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"{path}:{mark.line + 1}" if mark else str(path), f"not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise BadInput(str(path), "an lm-eval task YAML is a mapping of keys")
    merged: dict[str, Any] = {}
    origins: dict[str, Path] = {}
    includes = data.pop("include", None)
    for include in [includes] if isinstance(includes, str) else includes or []:
        settings, where = read_yaml(path.parent / str(include), (*seen, path))
        settings.pop("task_list", None)
        merged.update(settings)
        origins.update(where)
    merged.update(data)
    origins.update(dict.fromkeys(data, path))
    return merged, origins


def _loader(path: Path) -> type[yaml.SafeLoader]:
    """A SafeLoader that reads ``!function module.name`` relative to the directory of ``path``."""

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> LmEvalFunction:
        reference = str(loader.construct_scalar(node))  # type: ignore[arg-type]
        return import_function(reference, path)

    Loader.add_constructor("!function", function)
    return Loader


def import_function(reference: str, declared_in: Path) -> LmEvalFunction:
    """``module.sub.name`` as lm-eval resolves it: the file ``module/sub.py`` beside the YAML that declares it.
    (lm-eval falls back to importing an installed module; evalrun does not, since it hashes what it runs.)"""
    module, _, name = reference.rpartition(".")
    source = declared_in.parent / f"{module.replace('.', '/')}.py"
    where = f"{declared_in}: !function {reference}"
    if not module or not source.is_file():
        raise BadInput(where, f"no file {source} beside the YAML (a !function is read from a Python file there)")
    spec = importlib.util.spec_from_file_location(f"evalrun_lm_eval.{source.with_suffix('')}", source)
    if spec is None or spec.loader is None:
        raise BadInput(where, f"{source} is not a Python module")
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except Exception as exc:
        raise BadInput(where, f"{source} does not import ({type(exc).__name__}: {exc})") from exc
    sys.modules.setdefault(spec.name, loaded)
    fn = getattr(loaded, name, None)
    if not callable(fn):
        raise BadInput(where, f"{source} has no function {name!r}")
    return LmEvalFunction(reference, source, file_sha256(source), fn)


def _check(settings: Mapping[str, Any], origins: Mapping[str, Path]) -> None:
    def fail(key: str, expected: str) -> BadInput:
        return BadInput(f"{origins[key.split('.')[0]]}: {key}", expected)

    output_type = settings.get("output_type", "generate_until")
    if output_type not in OUTPUT_TYPES:
        raise fail("output_type", f"one of {', '.join(OUTPUT_TYPES)} (evalrun does not implement "
                                  f"{output_type!r} yet), got {output_type!r}")  # fmt: skip
    if output_type == "multiple_choice" and settings.get("doc_to_choice") is None:
        raise fail("output_type", "multiple_choice needs doc_to_choice")
    if output_type == "loglikelihood" and settings.get("doc_to_choice") is not None:
        raise fail("doc_to_choice", "no choices for loglikelihood (it scores doc_to_target after the prompt); "
                                    "multiple_choice scores choices")  # fmt: skip
    repeats = settings.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise fail("repeats", f"an integer >= 1 (samples of each document's request, filtered together), got "
                              f"{repeats!r}")  # fmt: skip
    if repeats > 1 and output_type != "generate_until":
        raise fail("repeats", f"1 for {output_type} (a loglikelihood is the same every time); repeats samples "
                              "generate_until's requests")  # fmt: skip
    for key in ("description", "target_delimiter", "fewshot_delimiter", "gen_prefix"):
        if key in settings and not isinstance(settings[key], str):
            raise fail(key, f"a string, got {settings[key]!r}")
    shots = settings.get("num_fewshot")
    if shots is not None and (not isinstance(shots, int) or isinstance(shots, bool) or shots < 0):
        raise fail("num_fewshot", f"an integer >= 0, got {shots!r}")

    def mapping(key: str, keys: tuple[str, ...]) -> dict[str, Any]:
        value = settings.get(key) or {}
        if not isinstance(value, dict):
            raise fail(key, f"a mapping, got {value!r}")
        for name in value:
            if name not in keys:
                raise fail(f"{key}.{name}", f"not implemented by evalrun (it reads {', '.join(keys)})")
        return value

    fewshot = mapping("fewshot_config", FEWSHOT_KEYS)
    for key in ("target_delimiter", "fewshot_delimiter", "gen_prefix"):
        if fewshot.get(key) is not None and not isinstance(fewshot[key], str):
            raise fail(f"fewshot_config.{key}", f"a string, got {fewshot[key]!r}")
    if fewshot.get("sampler", "default") not in ("default", "first_n"):
        raise fail("fewshot_config.sampler", f"default or first_n, got {fewshot.get('sampler')!r}")
    mapping("generation_kwargs", GENERATION_KEYS)
    filters(settings.get("filter_list"), origins.get("filter_list"))
    metrics(settings.get("metric_list"), output_type, origins.get("metric_list"))


def _splits(settings: Mapping[str, Any], origins: Mapping[str, Path]) -> dict[str, DataSplit]:
    """The dataset's splits from local files (``dataset_path: json|csv|parquet``, ``dataset_kwargs.data_files``),
    each file's path relative to the YAML that names it, else to the working directory (where lm-eval's
    ``datasets.load_dataset`` reads it from); every split the settings name must be there."""
    kind = settings.get("dataset_path")
    where = origins.get("dataset_path")
    if settings.get("dataset_name") is not None:
        raise BadInput(f"{origins['dataset_name']}: dataset_name", "a local json/csv/parquet dataset has no config "
                                                                   "name: expected null")  # fmt: skip
    kwargs = settings.get("dataset_kwargs") or {}
    kwargs_from = origins.get("dataset_kwargs", where)
    unknown = sorted(set(kwargs) - {"data_files"})
    if unknown:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.{unknown[0]}", "not implemented by evalrun (it reads "
                                                                      "data_files)")  # fmt: skip
    files = kwargs.get("data_files")
    if isinstance(files, str | list):
        files = {"train": files}  # datasets' default split for unnamed files
    if not isinstance(files, dict) or not files:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.data_files", "the split files, {SPLIT: FILE or [FILES]}")
    base = Path(kwargs_from).parent if kwargs_from else Path()
    splits = {}
    for split, names in files.items():
        paths = [_data_file(base, str(n), f"{kwargs_from}: dataset_kwargs.data_files.{split}")
                 for n in ([names] if isinstance(names, str) else names)]  # fmt: skip
        docs = tuple(doc for p in paths for doc in _rows(p, str(kind)))
        splits[str(split)] = DataSplit(str(split), tuple((p, file_sha256(p)) for p in paths), docs)
    return splits


def _check_splits(settings: Mapping[str, Any], origins: Mapping[str, Path], splits: Mapping[str, DataSplit]) -> None:
    for key in ("test_split", "validation_split", "training_split", "fewshot_split"):
        split = settings.get(key)
        if split is not None and str(split) not in splits:
            raise BadInput(f"{origins[key]}: {key}", f"the dataset has no split {split!r} (it has "
                                                     f"{', '.join(sorted(splits))})")  # fmt: skip
    fewshot_from = (settings.get("fewshot_config") or {}).get("split")
    if fewshot_from is not None and str(fewshot_from) not in splits:
        raise BadInput(
            f"{origins['fewshot_config']}: fewshot_config.split", f"the dataset has no split {fewshot_from!r}"
        )
    if not (settings.get("test_split") or settings.get("validation_split")):
        raise BadInput(f"{origins['task']}: test_split", "the split to evaluate (test_split or validation_split)")


COMMIT = re.compile(r"[0-9a-f]{40}")
DATA_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def _hub_splits(settings: Mapping[str, Any], origins: Mapping[str, Path],
                allow_unpinned: bool) -> dict[str, DataSplit]:  # fmt: skip
    """A Hugging Face hub dataset's splits, read from the local hub cache (``HF_HUB_CACHE``; nothing is downloaded)
    at the commit ``dataset_kwargs.revision`` names: a branch or no revision is refused unless ``allow_unpinned``
    (then the commit the cache holds for it is read, and recorded as unpinned). The files of each split the task
    names are the ones the dataset card's ``configs`` give for ``dataset_name`` (else ``default``), or else
    those named after the split (``test-00000-of-00001.parquet``, ``test/...``) under the config's directory."""
    from huggingface_hub import constants, snapshot_download

    repo = str(settings["dataset_path"])
    where = f"{origins['dataset_path']}: dataset_path"
    kwargs = settings.get("dataset_kwargs") or {}
    kwargs_from = origins.get("dataset_kwargs", origins["dataset_path"])
    unknown = sorted(set(kwargs) - {"revision"})
    if unknown:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.{unknown[0]}", "not implemented by evalrun for a hub dataset "
                                                                      "(it reads revision)")  # fmt: skip
    revision = kwargs.get("revision")
    pinned = isinstance(revision, str) and COMMIT.fullmatch(revision) is not None
    if not pinned and not allow_unpinned:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.revision", f"the commit (40 hex digits) of {repo} to read, "
                       f"got {revision!r}: a branch or no revision may change under the same name "
                       "(task.allow_unpinned_dataset=true reads what the cache has, recorded as unpinned)")  # fmt: skip
    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    try:
        snapshot = Path(snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True,
                                          cache_dir=cache))  # fmt: skip
    except Exception as exc:  # huggingface_hub's not-in-cache errors, and a repo id it refuses
        raise BadInput(
            where,
            f"{repo}@{revision or 'main'} is not in the local Hugging Face cache ({cache}); "
            "nothing is downloaded at run time: fetch it first (huggingface-cli download "
            f"--repo-type dataset {repo} --revision COMMIT) ({type(exc).__name__})",
        ) from exc
    config = settings.get("dataset_name")
    patterns = _card_configs(snapshot).get(str(config or "default"))
    base = snapshot / str(config) if config and (snapshot / str(config)).is_dir() else snapshot
    script = _script_note(snapshot, repo)
    if config and patterns is None and base == snapshot:
        raise BadInput(
            f"{origins['dataset_name']}: dataset_name",
            f"{repo} has no config {config!r} (its card's configs, or a directory of that name){script}",
        )
    source = {"id": repo, "config": config, "revision": snapshot.name, "pinned": pinned}
    splits = {}
    for key in ("test_split", "validation_split", "training_split", "fewshot_split"):
        split = settings.get(key)
        if split is None or str(split) in splits:
            continue
        globs = (patterns or {}).get(str(split))
        found = (sorted({f for g in globs for f in snapshot.glob(g) if f.is_file()}) if globs is not None
                 else _split_files(base, str(split)))  # fmt: skip
        if not found:
            raise BadInput(f"{origins[key]}: {key}",
                           f"{repo}@{snapshot.name} has no files for split {split!r}{script}")  # fmt: skip
        docs = tuple(doc for f in found for doc in _rows(f, _format_of(f, repo)))
        splits[str(split)] = DataSplit(str(split), tuple((f, file_sha256(f)) for f in found), docs, source)
    return splits


def _script_note(snapshot: Path, repo: str) -> str:
    """What to say of a dataset defined by a loading script (``NAME.py`` at the top of the repository), whose data
    evalrun does not find as files: it runs no dataset code."""
    scripts = sorted(p.name for p in snapshot.glob("*.py"))
    if not scripts:
        return ""
    return (
        f"; {repo} is defined by a loading script ({', '.join(scripts)}), which evalrun does not run: pin the "
        "commit of its Parquet conversion (the hub's refs/convert/parquet) or of files written from it"
    )


def _card_configs(snapshot: Path) -> dict[str, dict[str, list[str]]]:
    """The dataset card's ``configs``: each config's split file patterns (the YAML front matter of README.md)."""
    card = snapshot / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    if not text.startswith("---"):
        return {}
    header = yaml.safe_load(text.split("---", 2)[1]) or {}
    configs: dict[str, dict[str, list[str]]] = {}
    for entry in header.get("configs") or []:
        files = entry.get("data_files") or []
        if isinstance(files, str | dict):
            files = [{"split": "train", "path": files}] if isinstance(files, str) else [files]
        configs[str(entry.get("config_name", "default"))] = {
            str(f["split"]): [f["path"]] if isinstance(f["path"], str) else list(f["path"]) for f in files
        }
    return configs


def _split_files(base: Path, split: str) -> list[Path]:
    """The data files named after ``split`` under ``base``: ``SPLIT-*``, ``SPLIT.*``, ``SPLIT_*`` or in ``SPLIT/``."""
    named = re.compile(rf"{re.escape(split)}([-._ 0-9].*)?")
    return sorted(f for f in base.rglob("*") if f.is_file() and f.suffix in DATA_SUFFIXES
                  and (named.fullmatch(f.stem) or named.fullmatch(f.name) or f.parent.name == split))  # fmt: skip


def _format_of(path: Path, repo: str) -> str:
    if path.suffix not in DATA_SUFFIXES:
        raise BadInput(str(path), f"a data file of {repo} evalrun cannot read (parquet, json, jsonl, csv)")
    return DATA_SUFFIXES[path.suffix]


def _data_file(base: Path, name: str, where: str) -> Path:
    path = Path(name)
    for candidate in [path] if path.is_absolute() else [base / path, Path.cwd() / path]:
        if candidate.is_file():
            return candidate.resolve()
    raise BadInput(where, f"{name}: no such file beside the YAML ({base}) or in the working directory")


def _rows(path: Path, kind: str) -> Iterator[dict[str, Any]]:
    """A data file's rows as dictionaries: JSON Lines (or one JSON list), CSV, Parquet."""
    if kind == "json":
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            yield from json.loads(text)
            return
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BadInput(f"{path}:{number}", f"not a JSON object ({exc.msg})") from exc
    elif kind == "csv":  # types inferred, as datasets' CSV reader infers them (numbers are numbers)
        import pyarrow.csv as pcsv

        yield from pcsv.read_csv(path).to_pylist()
    else:
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
