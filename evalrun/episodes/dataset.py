"""The ``dataset`` kind: one episode per dataset item x seed x repeat, a prompt rendered from the task's
prompt pack, one generation (or several staged calls: option scores, judges), its output scored.

Planning is :mod:`evalrun.episodes.plan` (with :mod:`evalrun.episodes.context` for prompts that do not fit
the model's context), running and recording :mod:`evalrun.episodes.harness`, rows
:mod:`evalrun.episodes.encode`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.config import TRUNCATE_LEFT, EvalConfig
from evalrun.engines.pins import ResolvedModel
from evalrun.episodes import EncodedPart, Engines, FreezeOptions, ModelFiles, Provenance, episode_kind
from evalrun.episodes.context import apply_context_limit
from evalrun.episodes.encode import encode_part, output_rows
from evalrun.episodes.harness import EpisodeResult, run_batches, run_episodes
from evalrun.episodes.plan import Episode, build_plan
from evalrun.episodes.recorded import as_dict, manifest_failure, section, without
from evalrun.errors import BadInput
from evalrun.records.canonical import Canonical, canonical_hash
from evalrun.records.entries import (
    GenerationRequestRecord,
    JudgeEntry,
    LoglikelihoodResponse,
)
from evalrun.records.outputs import FAILED_FINISH_REASON, first_mismatch
from evalrun.records.view import ChainView
from evalrun.scoring import ScoringContext
from evalrun.scoring.parts import PartScorer
from evalrun.tasks import Task, freeze_answers, load_task
from evalrun.tasks.rubric import Rubric

CHOICE_DISPLAY = ("field", "cannot_assess", "shuffle")  # how options are shown: part of the prompt pack


def prompt_pack_record(pack: dict[str, Any], choices: dict[str, Any], on_overlong: str | None = None) -> dict[str, Any]:
    """What ``digest.prompt_pack`` hashes: the pack's record (templates by content, few-shot pool and
    settings, effective decoding settings), for multiple choice how options are shown (shuffled
    or not, the cannot-assess option), and ``on_overlong`` when it is ``truncate_left``, the one
    setting that changes what the model is shown (the others only decide what happens to a prompt
    that is never sent, so runs made before the setting existed keep their digest)."""
    record = dict(pack)
    if choices["field"] is not None:
        record["choices"] = {k: choices[k] for k in CHOICE_DISPLAY}
    if on_overlong == TRUNCATE_LEFT:
        record["on_overlong"] = on_overlong
    return record


def _references(task: Task) -> dict[str, Any]:
    """The frozen answer set a dataset task is scored against, when it has one (left out otherwise,
    so the records of tasks without are as before)."""
    return {"references": task.references} if task.references is not None else {}


@dataclass(frozen=True)
class FrozenAnswers:
    """A dataset task's answers frozen as the set its ``task.references`` names."""

    name: str
    record: dict[str, str]
    directory: Path
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {"references": self.record, "directory": str(self.directory)}

    def message(self) -> str:
        return f"froze the answers of {self.name} in {self.directory}; index sha256 {self.sha256}"


@episode_kind("dataset")
class DatasetKind:
    name = "dataset"
    transcribed = False

    # --- config -> plan ---

    def load(self, config: EvalConfig, model: ModelFiles) -> tuple[EvalConfig, Task]:
        if config.task.world is not None:  # composed as a world task, then given another kind
            raise BadInput("task.kind", f"{config.task.kind!r} runs dataset items, and the task has a task.world "
                                        "section: expected task.kind=world (or null)")  # fmt: skip
        task = load_task(config, model)
        return config.with_decoding(task.pack.decoding), task  # a pack's decoding settings win over the group's

    def plan(self, config: EvalConfig, task: Task, model: ModelFiles) -> Sequence[Episode]:
        episodes = build_plan(task, config.decoding, config.seeds)
        if model.directory is None:  # a replay of a run whose model is not here: its prompts were sent as planned
            return episodes
        # prompts that cannot fit the context (the tokenizer is loaded, the model is not)
        return apply_context_limit(episodes, model.directory, config.engine.max_model_len, config.task.on_overlong)

    def scoring_context(self, config: EvalConfig, task: Task, model: ResolvedModel,
                        judge_model: ResolvedModel | None) -> ScoringContext:  # fmt: skip
        """The judges' model is ``judge_model``, or the run's own model when there is none."""
        return ScoringContext.of(config.task.choices, task.rubric, (judge_model or model).files, task.references)

    def prompt_record(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return prompt_pack_record(task.pack_record(config.decoding.as_record()), task.choices.as_record(),
                                  config.task.on_overlong)  # fmt: skip

    def identity(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return {
            "name": task.name,
            "dataset_sha256": task.dataset_sha256,
            "items": len(task.items),
            "prompt_pack": task.pack_record(config.decoding.as_record()),
            "choices": task.choices.as_record(),
            "rubric": task.rubric.as_record() if task.rubric is not None else None,
            "scorer": config.task.scorer.as_record(),
            "on_overlong": config.task.on_overlong,
            **_references(task),
        }

    def section(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return {
            "name": task.name,
            "dataset": {"path": str(task.dataset_path), "sha256": task.dataset_sha256, "items": len(task.items)},
            "prompt_pack": {"path": str(task.pack.path), **task.pack_record(config.decoding.as_record())},
            "choices": task.choices.as_record(),
            "rubric": None if task.rubric is None else {"path": str(task.rubric.path), **task.rubric.as_record()},
            "scorer": config.task.scorer.as_record(),
            "on_overlong": config.task.on_overlong,
            **_references(task),
        }

    def recorded_task_identity(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The section with what it read by path said as the identity says it (the dataset by its sha256 and
        items, the prompt pack and rubric without their paths); every other field as it is (a kind built on this
        one that adds a field to both keeps it)."""
        dataset = as_dict(task.get("dataset"))
        rubric = task.get("rubric")
        return {
            **{key: value for key, value in task.items() if key not in ("dataset", "prompt_pack", "rubric")},
            "dataset_sha256": dataset.get("sha256"),
            "items": dataset.get("items"),
            "prompt_pack": without(as_dict(task.get("prompt_pack")), "path"),
            "rubric": without(rubric, "path") if isinstance(rubric, dict) else rubric,
        }

    def recorded_identity(self, identity: dict[str, Any], config: EvalConfig) -> dict[str, Any]:
        task = identity.get("task")
        if isinstance(task, dict) and "on_overlong" not in task:
            # made before task.on_overlong: the default, which it matches unless a prompt was too long
            return {**identity, "task": {**task, "on_overlong": config.task.on_overlong}}
        return identity

    # --- dispatch ---

    def run(self, engines: Engines, episodes: list[Episode], generator: dict[str, Any] | Canonical) -> list[Any]:
        return run_episodes(engines.engine, episodes, generator, engines.judge)

    def run_batches(self, engines: Engines, batches: Iterable[list[Episode]],
                    generator: dict[str, Any] | Canonical) -> Iterator[list[Any]]:  # fmt: skip
        return run_batches(engines.engine, batches, generator, engines.judge)

    def encode(self, results: list[EpisodeResult], provenance: Provenance,
               scorer: PartScorer | None = None) -> EncodedPart:  # fmt: skip
        return encode_part(results, provenance, scorer)

    def output_rows(self, results: list[EpisodeResult], provenance: Provenance) -> pa.Table:
        return output_rows(results, provenance)

    # --- replay and audit ---

    def replay(self, engines: Engines, episode: Episode, recorded: Sequence[str],
               generator: dict[str, Any] | Canonical) -> EpisodeResult:  # fmt: skip
        (result,) = run_episodes(engines.engine, [episode], generator)
        return result

    def rubric(self, task: Task) -> Rubric | None:
        return task.rubric

    def recorded_scoring_context(self, manifest: Mapping[str, Any], rubric: Rubric | None) -> ScoringContext:
        return ScoringContext.recorded(dict(manifest), rubric)

    def recorded_scoring_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        task = section(manifest, "task")
        choices = as_dict(task.get("choices"))
        rubric = task.get("rubric")
        judges = as_dict(manifest.get("judge_model") or manifest.get("model"))
        context = {
            "choice_scoring": choices.get("scoring", "") if choices.get("field") is not None else "",
            "rubric": without(rubric, "path") if isinstance(rubric, dict) else None,
            "judge_model": canonical_hash(judges.get("files")) if rubric is not None else None,
        }
        if "references" in task:
            context["references"] = task["references"]
        return context

    def recorded_prompt_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        pack = without(section(manifest, "task.prompt_pack"), "path")
        choices = section(manifest, "task.choices")
        shown = {"cannot_assess", "shuffle"}
        if "field" not in choices or (choices["field"] is not None and not set(choices) >= shown):
            raise manifest_failure("task.choices lacks field, cannot_assess or shuffle")
        decoding = without(section(manifest, "decoding"), "name")
        if pack.get("decoding") != decoding:
            raise manifest_failure("task.prompt_pack.decoding differs from decoding")
        chat = pack.get("chat")
        if isinstance(chat, dict) and chat.get("origin") == "model":
            model_chat = as_dict(as_dict(manifest.get("model")).get("chat"))
            if chat.get("template_sha256") != model_chat.get("template_sha256"):
                raise manifest_failure("task.prompt_pack.chat.template_sha256 differs from model.chat's")
        on_overlong = section(manifest, "task").get("on_overlong")
        return prompt_pack_record(pack, choices, on_overlong if isinstance(on_overlong, str) else None)

    def prompt_source(self, key: str) -> str:
        return "task.choices" if key == "choices" else "task.prompt_pack"

    def row_mismatch(self, row: dict[str, Any], chain: ChainView) -> str | None:
        header = chain.header
        expected: dict[str, Any] = {"task": header.task, "item_id": header.item, "seed": header.seed,
                                    "repeat": header.repeat}  # fmt: skip
        generated, scored = chain.generations, chain.option_scores
        first = generated[0] if generated else scored[0] if scored else None
        if first is not None:
            expected.update(prompt=first.request.prompt, prompt_sha256=first.request.prompt_sha256)
        if generated:
            response = generated[0].response
            expected.update(
                output=response.output, token_ids=response.token_ids, token_logprobs=response.logprobs,
                finish_reason=response.finish_reason, output_tokens=len(response.token_ids),
            )  # fmt: skip
        elif scored:
            expected.update(output="", token_ids=[], token_logprobs=[], finish_reason="not_generated", output_tokens=0)
        if chain.failure is not None:  # a failed episode (docs/design.md "Failed episodes")
            refused = chain.refused
            if first is None and refused and isinstance(refused[0].request, GenerationRequestRecord):
                expected.update(prompt=refused[0].request.prompt, prompt_sha256=refused[0].request.prompt_sha256)
            expected.update(output="", token_ids=[], token_logprobs=[], finish_reason=FAILED_FINISH_REASON,
                            output_tokens=0)  # fmt: skip
        expected.update(
            fewshot_ids=header.fewshot or [], shuffle_order=header.shuffle_order or [],
            option_logprobs=[e.response.logprob for e in scored] if scored else None,
            option_greedy=[e.response.greedy for e in scored] if scored else None,
            replies=[e.response.output for e in generated] if len(generated) > 1 else None,
            judgements=_judgements(chain.judgements),
        )  # fmt: skip
        if (column := first_mismatch(row, expected)) is not None:
            return column
        if row["seeds"] is not None and str(row["seeds"]["sampling"]) != header.seeds.sampling:
            return "seeds"
        return None

    def freeze(self, config: EvalConfig, root: Path | None, options: FreezeOptions) -> FrozenAnswers:
        index = freeze_answers(config, root)
        return FrozenAnswers(config.task.name, index.record(), index.directory, index.sha256)


def _judgements(judges: Sequence[JudgeEntry]) -> list[dict[str, Any]]:
    """The output row's judgements as the chain's judge entries give them, in call order."""
    judged: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in judges:
        row = judged.setdefault((entry.criterion, entry.judge), {
            "criterion": entry.criterion, "judge": entry.judge, "shuffle_order": entry.shuffle_order, "output": None,
            "option_logprobs": None,
        })  # fmt: skip
        if isinstance(entry.response, LoglikelihoodResponse):
            by_option = row["option_logprobs"] = row["option_logprobs"] or [None] * len(row["shuffle_order"])
            if entry.option is not None and entry.option < len(by_option):
                by_option[entry.option] = entry.response.logprob
        else:
            row["output"] = entry.response.text
    return list(judged.values())
