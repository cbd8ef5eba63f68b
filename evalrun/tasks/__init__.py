"""Tasks: a hashed JSON Lines dataset, a prompt pack, optionally options or a rubric, and a scorer.

Templates are Jinja rendered with strict undefined variables: a field the item lacks is an
error, never an empty string. A template sees every field of the item, and also:

- ``examples``: the item's few-shot examples (records of the pack's pool), in prompt order;
- ``choices`` and ``letters``: a multiple-choice item's options in shown (shuffled) order and
  their letters (``A``, ``B``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.exceptions import UndefinedError

from evalrun.chat import ChatFormat, Conversation, ModelFiles, chat_format
from evalrun.chat.reasoning import ReasoningParser, reasoning_parser
from evalrun.config import ChoicesConfig, EvalConfig
from evalrun.config.jsonl import objects
from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256
from evalrun.rundir import references
from evalrun.tasks.pack import PromptPack, load_pack, template_pack
from evalrun.tasks.rubric import Rubric, load_rubric
from evalrun.tasks.selection import LETTERS


@dataclass(frozen=True)
class Item:
    id: str
    fields: Mapping[str, Any]
    target: str
    options: tuple[str, ...] = ()  # multiple choice: the options in original order
    # an option's own context, one per option (lm-eval's multiple-input tasks: winogrande); empty: the prompt's
    contexts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    name: str
    items: tuple[Item, ...]
    pack: PromptPack
    dataset_path: Path
    dataset_sha256: str
    choices: ChoicesConfig
    rubric: Rubric | None = None
    references: dict[str, str] | None = None  # the frozen answer set scored against: name, version, index hash
    chat: ChatFormat | None = None  # prompts as chat messages through this template; None: plain text
    reasoning: ReasoningParser | None = None  # replies split into thinking and answer; None: taken whole
    judge_chat: ChatFormat | None = None  # a rubric's judge prompts as chat messages (the judges' model's template)
    # a task format that defines its own scoring (an lm-eval task's filters and metrics, as its scoring record);
    # None: the task.scorer settings
    scoring: Mapping[str, Any] | None = None

    def pack_record(self, decoding: Mapping[str, Any]) -> dict[str, Any]:
        """What the prompt pack hash covers, with the chat format when prompts are chat-formatted and the
        reasoning parser when replies are split (each left out otherwise: older records keep their digests)."""
        record = self.pack.as_record(decoding)
        if self.chat is not None:
            record = {**record, "chat": self.chat.as_record()}
        if self.reasoning is not None:
            record = {**record, "reasoning": self.reasoning.as_record()}
        if self.judge_chat is not None:
            record = {**record, "judge_chat": self.judge_chat.as_record()}
        return record

    @property
    def multiple_choice(self) -> bool:
        return self.choices.field is not None

    def options(self, item: Item) -> tuple[str, ...]:
        """An item's options in original order, the cannot-assess option last when the task has one."""
        extra = self.choices.cannot_assess
        return (*item.options, extra) if extra is not None else item.options


def load_task(config: EvalConfig, model: ModelFiles | None = None) -> Task:
    """Read the dataset (already checked by config.validate), prompt pack and rubric of ``config``'s task; its
    prompts are chat-formatted as ``task.chat_format`` asks, through ``model``'s chat template, its replies split
    by ``task.reasoning_parser`` over ``model``'s tokenizer, and its judges' prompts chat-formatted as the
    rubric's ``chat_format`` asks, through the judges' model's template."""
    spec = config.task
    model = model or ModelFiles(None, None)
    choices_field = spec.choices.field
    items = []
    for _where, record in objects(config.dataset_path):
        options = tuple(record[choices_field]) if choices_field is not None else ()
        items.append(Item(str(record[spec.id_field]), record, str(record[spec.target_field]), options))
    answers = None
    if spec.references is not None:
        answers, items = frozen_answers(spec.references, items)
    if config.limit is not None:
        items = items[: config.limit]
    pack = load_pack(config.prompt_path) if spec.prompt_pack is not None else template_pack(config.prompt_path)
    rubric = load_rubric(config.rubric_path) if config.rubric_path is not None else None
    judges = model.judges
    return Task(
        name=spec.name,
        items=tuple(items),
        pack=pack,
        dataset_path=config.dataset_path,
        dataset_sha256=file_sha256(config.dataset_path),
        choices=spec.choices,
        rubric=rubric,
        references=answers,
        chat=chat_format(
            spec.chat_format, model.chat, config.chat_template_path, spec.chat_template_kwargs, model.where
        ),
        reasoning=reasoning_parser(spec.reasoning_parser, model.directory, model.where, spec.chat_template_kwargs),
        judge_chat=chat_format(rubric.chat_format, judges.chat, None, None, judges.where) if rubric else None,
    )


def frozen_answers(name_version: str, items: list[Item]) -> tuple[dict[str, str], list[Item]]:
    """The items with their answers from the frozen set ``NAME@VERSION`` (docs/design.md "Frozen
    references"), and the set's record. Every item must have one, equal to the dataset's own answer:
    a dataset whose answers drifted from the frozen set is refused (BadInput naming the item)."""
    name, version = references.parse_set_name(name_version, "task.references")
    index, answers = references.load_answers(name, version)
    where = str(index.path(references.ANSWERS))
    for item in items:
        if item.id not in answers:
            raise BadInput(where, f"no frozen answer for item {item.id!r} (another dataset than the set's? "
                                  "task.references=null scores against the dataset's own answers)")  # fmt: skip
        if answers[item.id] != item.target:
            raise BadInput(where, f"item {item.id!r}: the frozen answer is {answers[item.id]!r}, the dataset says "
                                  f"{item.target!r}: a changed answer needs a new reference version")  # fmt: skip
    return index.record(), items


def render_prompt(pack: PromptPack, item_id: str, variables: Mapping[str, Any],
                  chat: ChatFormat | None = None) -> tuple[str, Conversation | None]:  # fmt: skip
    """One prompt, plain or (``chat``) chat-formatted, and the chat it was rendered from (None: plain); a template
    variable the item lacks is a BadInput naming the template and item. A pack whose prompts are made otherwise
    than from its templates (an lm-eval task's, built as lm-eval builds them) gives them itself."""
    given = pack.prompt_of(item_id)
    if given is not None:
        return given, pack.conversation_of(item_id)
    try:
        if chat is None:
            return pack.render(variables), None
        messages = pack.messages(variables)
        return chat.render(messages), chat.conversation(messages)
    except UndefinedError as exc:
        raise BadInput(str(pack.path), f"item {item_id!r}: {exc.message}") from exc


def prompt_variables(item: Item, examples: list[Mapping[str, Any]], shown: tuple[str, ...]) -> dict[str, Any]:
    return {**item.fields, "examples": examples, "choices": list(shown), "letters": list(LETTERS[: len(shown)])}


def freeze_answers(config: EvalConfig, root: Path | None = None) -> references.ReferenceIndex:
    """Freeze the dataset task's answers (its ``target_field``, by item id) as the set its
    ``task.references`` names: ``evalrun references build task=NAME`` for a dataset task."""
    spec = config.task
    if spec.references is None:
        raise BadInput("task.references", "name the set to freeze the answers as: task.references=NAME@VERSION")
    name, version = references.parse_set_name(spec.references, "task.references")
    answers = {str(r[spec.id_field]): str(r[spec.target_field]) for _where, r in objects(config.dataset_path)}
    return references.write_answers(name, version, answers, root)
