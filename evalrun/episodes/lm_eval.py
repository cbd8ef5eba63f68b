"""The ``lm_eval`` kind: an lm-evaluation-harness task YAML run as lm-eval runs it (``task=lm_eval
task.path=TASK.yaml``).

Its episodes are a dataset's (:mod:`evalrun.episodes.dataset`: one generation, or one loglikelihood call per
choice, recorded and replayed alike); what differs is where they come from. The task and its prompts are lm-eval's
own (:mod:`evalrun.tasks.lm_eval`: its library builds them on the documents evalrun read), the scores the
``lm_eval`` scorer's (lm-eval's filters and ``process_results``, :mod:`evalrun.scoring.lm_eval`), and the digest
covers the task as lm-eval defines it: lm-eval's version, the resolved YAML with its helpers' sources and its
data's hashes in the prompt-pack part, the filters, metrics and process_results in the scoring part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from evalrun.chat import chat_format
from evalrun.config import EvalConfig
from evalrun.engines.pins import ResolvedModel
from evalrun.episodes import FreezeOptions, Frozen, ModelFiles, episode_kind
from evalrun.episodes.dataset import DatasetKind
from evalrun.episodes.plan import Episode
from evalrun.episodes.recorded import as_dict, section, without
from evalrun.errors import BadInput
from evalrun.scoring import ScoringContext
from evalrun.tasks import Task
from evalrun.tasks.lm_eval import FEWSHOT_SEED, as_task, find_task
from evalrun.tasks.rubric import Rubric

DEFAULT_NAME = "lm_eval"  # conf/task/lm_eval.yaml's: the YAML's own task name is the run's


@episode_kind("lm_eval")
class LmEvalKind(DatasetKind):
    name = "lm_eval"

    def load(self, config: EvalConfig, model: ModelFiles) -> tuple[EvalConfig, Task]:
        wanted = None if config.task.name == DEFAULT_NAME else config.task.name
        source = find_task(Path(config.prompt_path), wanted, bool(config.task.allow_unpinned_dataset),
                           config.task.dataset_revision, config.task.overrides)  # fmt: skip
        # lm-eval's few-shot seed is 1234 (simple_evaluate's fewshot_random_seed); seeds.fewshot replaces it
        # lm-eval's prompts are plain unless --apply_chat_template: task.chat_format null is plain, chat is that flag
        spec = config.task
        chat = chat_format(spec.chat_format or "plain", model.chat, config.chat_template_path,
                           spec.chat_template_kwargs, model.where)  # fmt: skip
        seed = FEWSHOT_SEED if config.seeds.fewshot is None else config.seeds.fewshot
        multiturn = spec.fewshot_as_multiturn is not False
        task = as_task(source, config.limit, seed, chat, spec.system_instruction, multiturn)
        named = replace(config, task=replace(config.task, name=source.name))
        return named.with_decoding(task.pack.decoding), task

    def plan(self, config: EvalConfig, task: Task, model: ModelFiles) -> Sequence[Episode]:
        # the examples are in the prompts already (lm-eval's sampler, seeded by seeds.fewshot or 1234)
        episodes = super().plan(replace(config, seeds=replace(config.seeds, fewshot=None)), task, model)
        repeats = int(getattr(task.pack, "repeats", 1))  # lm-eval's: one episode's request sampled that often
        return episodes if repeats == 1 else [replace(e, generations=repeats) for e in episodes]

    def scoring_context(self, config: EvalConfig, task: Task, model: ResolvedModel,
                        judge_model: ResolvedModel | None) -> ScoringContext:  # fmt: skip
        return ScoringContext(task.choices.scoring if task.multiple_choice else "", lm_eval=self._scoring_of(task),
                              lm_eval_path=str(task.pack.path),
                              lm_eval_files=getattr(task.pack, "files", None))  # fmt: skip

    def prompt_record(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return dict(task.pack_record(config.decoding.as_record()))

    def identity(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        # The documents a process_docs made, by split: a change to what it returns that its source's hash does
        # not show (a module it imports, a library's version) is a different run, caught at resume.
        processed = dict(getattr(task.pack, "processed_docs_sha256", {}))
        return {"kind": self.name, **super().identity(config, task), "lm_eval": self._scoring_of(task),
                **({"processed_docs_sha256": processed} if processed else {})}  # fmt: skip

    def section(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        recorded = super().section(config, task)
        processed = dict(getattr(task.pack, "processed_docs_sha256", {}))
        recorded["dataset"] = {**recorded["dataset"], "splits": self._splits_of(task),
                               **({"processed_docs_sha256": processed} if processed else {})}  # fmt: skip
        return {"kind": self.name, **recorded, "lm_eval": self._scoring_of(task)}

    def recorded_task_identity(self, task: Mapping[str, Any]) -> dict[str, Any]:
        processed = as_dict(as_dict(task.get("dataset")).get("processed_docs_sha256"))
        return {**super().recorded_task_identity(task), **({"processed_docs_sha256": processed} if processed else {})}

    def recorded_scoring_context(self, manifest: Mapping[str, Any], rubric: Rubric | None) -> ScoringContext:
        task = section(manifest, "task")
        choices = as_dict(task.get("choices"))
        scoring = choices.get("scoring", "") if choices.get("field") is not None else ""
        path = as_dict(task.get("prompt_pack")).get("path")
        return ScoringContext(str(scoring), lm_eval=as_dict(task.get("lm_eval")),
                              lm_eval_path=None if path is None else str(path))  # fmt: skip

    def recorded_scoring_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return self.recorded_scoring_context(manifest, None).as_record()

    def recorded_prompt_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return without(section(manifest, "task.prompt_pack"), "path")

    def freeze(self, config: EvalConfig, root: Path | None, options: FreezeOptions) -> Frozen:
        raise BadInput("task", "an lm-eval task is scored against its YAML's doc_to_target, hashed with its data "
                               "(task.dataset.splits): there is no answer set to freeze")  # fmt: skip

    @staticmethod
    def _splits_of(task: Task) -> dict[str, Any]:
        """An LmEvalPack's :meth:`~evalrun.tasks.lm_eval.LmEvalTask.splits_record`: each split's files and rows
        by their hashes."""
        return dict(getattr(task.pack, "splits", {}))

    @staticmethod
    def _scoring_of(task: Task) -> dict[str, Any]:
        if task.scoring is None:
            raise BadInput("task.kind", "task.kind=lm_eval runs an lm-eval task YAML (task=lm_eval task.path=FILE)")
        return dict(task.scoring)
