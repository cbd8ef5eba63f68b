"""The run manifest and its three-part digest (DESIGN.md "Manifest and digest").

digest = sha256(prompt_pack_hash + seed_set_hash + scoring_hash): each part changes only when
what it covers changes, so two manifests can be compared field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from evalrun.config import EvalConfig
from evalrun.config.model import ResolvedModel
from evalrun.pipeline.environment import (
    evalrun_version,
    git_state,
    hardware_fingerprint,
    library_versions,
    python_version,
)
from evalrun.records.canonical import canonical_hash, combine
from evalrun.scoring import ScoringContext, scoring_hash
from evalrun.tasks import Task

MANIFEST_FORMAT = "evalrun.manifest/1"


@dataclass(frozen=True)
class Digest:
    prompt_pack: str
    seed_set: str
    scoring: str

    @property
    def digest(self) -> str:
        return combine([self.prompt_pack, self.seed_set, self.scoring])

    def as_record(self) -> dict[str, str]:
        return {
            "prompt_pack": self.prompt_pack,
            "seed_set": self.seed_set,
            "scoring": self.scoring,
            "digest": self.digest,
        }


def prompt_pack_hash(task: Task, decoding: dict[str, Any]) -> str:
    """The pack (templates by content, few-shot pool and settings, effective decoding settings) and,
    for multiple choice, how options are shown (shuffled or not, the cannot-assess option)."""
    record = task.pack.as_record(decoding)
    if task.multiple_choice:
        record["choices"] = {k: task.choices[k] for k in ("field", "cannot_assess", "shuffle")}
    return canonical_hash(record)


def seed_set_hash(seeds: dict[str, Any]) -> str:
    return canonical_hash({"master": seeds["master"], "set": list(seeds["set"]), "repeats": seeds["repeats"]})


def scoring_context(config: EvalConfig, task: Task, model: ResolvedModel,
                    judge_model: ResolvedModel | None = None) -> ScoringContext:  # fmt: skip
    """The judges' model is ``judge_model``, or the run's own model when there is none."""
    return ScoringContext.of(config.section("task"), task.rubric, (judge_model or model).files)


def compute_digest(config: EvalConfig, task: Task, model: ResolvedModel,
                   judge_model: ResolvedModel | None = None) -> Digest:  # fmt: skip
    return Digest(
        prompt_pack=prompt_pack_hash(task, config.section("decoding")),
        seed_set=seed_set_hash(config.section("seeds")),
        scoring=scoring_hash(config.section("task")["scorer"], scoring_context(config, task, model, judge_model)),
    )


def generator_info() -> dict[str, Any]:
    """Who wrote the chains; part of every episode header."""
    return {"name": "evalrun", "version": evalrun_version(), "git_commit": git_state()["commit"]}


def _model_identity(model: ResolvedModel | None) -> dict[str, Any] | None:
    if model is None:
        return None
    return {"id": model.id, "revision": model.revision, "files": model.files, "pinned": model.pinned}


def run_identity(config: EvalConfig, task: Task, model: ResolvedModel, digest: Digest, episodes: int,
                 judge_model: ResolvedModel | None = None) -> dict[str, Any]:  # fmt: skip
    """Everything that decides what a run computes, and nothing that legitimately varies (paths,
    times, workers, hardware). ``evalrun resume`` refuses a run whose identity would change."""
    return {
        "digest": digest.as_record(),
        "task": {
            "name": task.name,
            "dataset_sha256": task.dataset_sha256,
            "items": len(task.items),
            "prompt_pack": task.pack.as_record(config.section("decoding")),
            "choices": task.choices,
            "rubric": task.rubric.as_record() if task.rubric is not None else None,
            "scorer": config.section("task")["scorer"],
        },
        "limit": config.raw["limit"],
        "episodes": episodes,
        "model": _model_identity(model),
        "judge_model": _model_identity(judge_model),
        "engine": config.section("engine"),
        "decoding": config.section("decoding"),
        "seeds": config.section("seeds"),
        "determinism": config.section("determinism"),
        "generator": generator_info(),
    }


def build_manifest(
    config: EvalConfig,
    task: Task,
    model: ResolvedModel,
    digest: Digest,
    workers: list[dict[str, Any]],
    episodes: int,
    judge_model: ResolvedModel | None = None,
) -> dict[str, Any]:
    honoured = []
    for w in workers:
        if w["determinism"]["honoured"] not in honoured:
            honoured.append(w["determinism"]["honoured"])
    return {
        "format": MANIFEST_FORMAT,
        "identity": run_identity(config, task, model, digest, episodes, judge_model),
        "digest": digest.as_record(),
        "task": {
            "name": task.name,
            "dataset": {"path": str(task.dataset_path), "sha256": task.dataset_sha256, "items": len(task.items)},
            "prompt_pack": {"path": str(task.pack.path), **task.pack.as_record(config.section("decoding"))},
            "choices": task.choices,
            "rubric": None if task.rubric is None else {"path": str(task.rubric.path), **task.rubric.as_record()},
            "scorer": config.section("task")["scorer"],
        },
        "limit": config.raw["limit"],
        "episodes": episodes,
        "model": model.as_record(),
        "judge_model": judge_model.as_record() if judge_model is not None else None,
        "engine": workers[0]["engine"],
        "decoding": config.section("decoding"),
        "seeds": config.section("seeds"),
        "determinism": {
            "asked": workers[0]["determinism"]["asked"],
            "honoured": honoured,
            "notes": sorted({n for w in workers for n in w["determinism"]["notes"]}),
        },
        "cluster": config.section("cluster"),
        "workers": [{"worker": w["worker"], "hardware": w["hardware"]} for w in workers],
        "generator": generator_info(),
        "libraries": library_versions(),
        "python": python_version(),
        "git": git_state(),
        "hardware": hardware_fingerprint(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
