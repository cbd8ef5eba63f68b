"""What a multiple-choice or rubric scorer needs beyond the ``task.scorer`` settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalrun.config import ChoicesConfig
from evalrun.records.canonical import canonical_hash
from evalrun.tasks.lm_eval import DefinitionFiles
from evalrun.tasks.rubric import Rubric


@dataclass(frozen=True)
class ScoringContext:
    """``judge_model`` identifies the judges' model (the sha256 of its pinned files, as a hash): a
    rubric's verdicts are only as good as the model that gave them, so it is part of the scoring hash.
    """

    choice_scoring: str = ""  # letter | loglikelihood | both
    rubric: Rubric | None = None
    judge_model: str | None = None
    verifier: dict[str, Any] | None = None  # agent tasks: the world (name, version), its verifier's version, references
    references: dict[str, str] | None = None  # a dataset task's frozen answer set (name, version, index hash)
    # an lm-eval task's output type, filter pipelines and metrics (evalrun.tasks.lm_eval's scoring_record)
    lm_eval: dict[str, Any] | None = None
    # where that task's YAML is, whose helpers lm-eval imports to score (not in the record: the record's helper
    # hashes say what they must be, wherever the YAML lies)
    lm_eval_path: str | None = None
    # the YAML, its includes and helpers themselves, carried to where a run scores (a worker on another machine,
    # which need not see lm_eval_path); not in the record either: the recorded hashes check them
    lm_eval_files: DefinitionFiles | None = None

    @classmethod
    def of(cls, choices: ChoicesConfig, rubric: Rubric | None, model_files: dict[str, str],
           references: dict[str, str] | None = None) -> ScoringContext:  # fmt: skip
        """The context of a task's choices settings, its loaded rubric, the judges' pinned model files
        and the frozen answer set it is scored against."""
        choice = choices.scoring if choices.field is not None else ""
        judges = canonical_hash(model_files) if rubric is not None else None
        return cls(choice, rubric, judges, references=references)

    @classmethod
    def recorded(cls, manifest: dict[str, Any], rubric: Rubric | None) -> ScoringContext:
        """The context a finished run was scored with, from its manifest (``rubric`` read again)."""
        world = manifest.get("task", {}).get("world")
        if isinstance(world, dict):
            return cls(verifier=verifier_identity(world.get("versions") or {}, world.get("references")))
        choices = manifest.get("task", {}).get("choices") or {"field": None, "scoring": ""}
        choice = choices["scoring"] if choices["field"] is not None else ""
        answers = manifest.get("task", {}).get("references")
        if rubric is None:
            return cls(choice, references=answers)
        judges = manifest.get("judge_model") or manifest["model"]  # the run's model when no judge model
        return cls(choice, rubric, canonical_hash(judges["files"]), references=answers)

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "choice_scoring": self.choice_scoring,
            "rubric": self.rubric.as_record() if self.rubric is not None else None,
            "judge_model": self.judge_model,
        }
        if self.verifier is not None:  # left out otherwise: records made before agent tasks stay as they were
            record["verifier"] = self.verifier
        if self.references is not None:  # likewise for tasks without a frozen answer set
            record["references"] = self.references
        if self.lm_eval is not None:  # and for tasks that are not lm-eval's
            record["lm_eval"] = self.lm_eval
        return record


def verifier_identity(versions: dict[str, Any], references: Any = None) -> dict[str, Any]:
    """What decides a world's verifier's scores: the world's versions, and the frozen reference set it
    scores against (name, version, index hash; docs/design.md "Frozen references") for a world with one."""
    identity: dict[str, Any] = {key: str(versions.get(key)) for key in ("name", "world", "verifier")}
    if "verifier_source" in versions:  # its source's hash (runs made before it was recorded: left out)
        identity["verifier_source"] = str(versions["verifier_source"])
    if references is not None:  # left out otherwise: the identities of worlds without references are unchanged
        identity["references"] = references
    return identity
