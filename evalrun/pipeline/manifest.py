"""The run manifest and its three-part digest (docs/design.md "Manifest").

digest = sha256(prompt_pack_hash + seed_set_hash + scoring_hash): each part changes only when
what it covers changes, so two manifests can be compared field by field. The exact record each
part hashes is kept in the manifest as ``digest_inputs``, so ``evalrun verify`` can recompute every
part and check it against the rest of the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from evalrun.config import EvalConfig, SeedsConfig
from evalrun.engines.pins import ResolvedModel
from evalrun.episodes import EpisodeKind, model_identity
from evalrun.pipeline.environment import (
    evalrun_version,
    git_state,
    hardware_fingerprint,
    install_provenance,
    library_versions,
    python_version,
)
from evalrun.pipeline.provenance import Drift, worker_record
from evalrun.records.canonical import canonical_hash, combine
from evalrun.records.formats import MANIFEST_FORMAT, Manifest
from evalrun.scoring import ScoringContext, scoring_record

DIGEST_PARTS = ("prompt_pack", "seed_set", "scoring")


@dataclass(frozen=True)
class Digest:
    prompt_pack: str
    seed_set: str
    scoring: str
    # part -> the exact record its hash covers (None for a digest made from hashes alone)
    inputs: dict[str, dict[str, Any]] | None = field(default=None, compare=False)

    @classmethod
    def of_inputs(cls, inputs: dict[str, dict[str, Any]]) -> Digest:
        return cls(*(canonical_hash(inputs[part]) for part in DIGEST_PARTS), inputs=inputs)

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


def seed_set_record(seeds: dict[str, Any]) -> dict[str, Any]:
    """What ``digest.seed_set`` hashes: ``master``, ``set``, ``repeats``, and ``fewshot`` only when it
    differs from the master seed (then the prompts differ; otherwise the digest is the one of a run
    without it). ``seeds`` is the config's seeds record or a manifest's ``seeds``."""
    record = {"master": seeds["master"], "set": list(seeds["set"]), "repeats": seeds["repeats"]}
    if seeds.get("fewshot") is not None and seeds["fewshot"] != seeds["master"]:
        record["fewshot"] = seeds["fewshot"]
    return record


def seeds_identity(seeds: SeedsConfig) -> dict[str, Any]:
    """The seeds as the manifest's ``identity`` records them: ``fewshot`` only when given, so the
    records of runs without it are as before."""
    record = seeds.as_record()
    if seeds.fewshot is None:
        del record["fewshot"]
    return record


def seeds_section(seeds: SeedsConfig) -> dict[str, Any]:
    """The manifest's ``seeds``: the identity's, and ``master_generated: true`` when evalrun generated
    the master seed (``seeds.master=auto``). Not part of the identity: config.yaml holds the number,
    and ``resume`` reloads it as a given seed."""
    return {**seeds_identity(seeds), **({"master_generated": True} if seeds.master_generated else {})}


def seed_set_hash(seeds: dict[str, Any]) -> str:
    return canonical_hash(seed_set_record(seeds))


def scoring_context(kind: EpisodeKind, config: EvalConfig, task: Any, model: ResolvedModel,
                    judge_model: ResolvedModel | None = None) -> ScoringContext:  # fmt: skip
    """What the scorer of ``kind``'s ``task`` needs beyond its settings (the judges' model is ``judge_model``, or
    the run's own model when there is none)."""
    return kind.scoring_context(config, task, model, judge_model)


def digest_inputs(kind: EpisodeKind, config: EvalConfig, task: Any, model: ResolvedModel,
                  judge_model: ResolvedModel | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each digest part's preimage, recorded in the manifest as ``digest_inputs``."""
    return {
        "prompt_pack": kind.prompt_record(config, task),
        "seed_set": seed_set_record(config.seeds.as_record()),
        "scoring": scoring_record(config.task.scorer, scoring_context(kind, config, task, model, judge_model)),
    }


def compute_digest(kind: EpisodeKind, config: EvalConfig, task: Any, model: ResolvedModel,
                   judge_model: ResolvedModel | None = None) -> Digest:  # fmt: skip
    return Digest.of_inputs(digest_inputs(kind, config, task, model, judge_model))


def generator_info() -> dict[str, Any]:
    """Who wrote the chains; part of every episode header."""
    return {"name": "evalrun", "version": evalrun_version(), "git_commit": git_state()["commit"]}


def _model_identity(model: ResolvedModel | None) -> dict[str, Any] | None:
    return None if model is None else model_identity(model)


CANARY_SETTINGS = ("canary", "require_invariant")  # determinism settings about the canary, not the run's results


def run_identity(kind: EpisodeKind, config: EvalConfig, task: Any, model: ResolvedModel, digest: Digest,
                 episodes: int, judge_model: ResolvedModel | None = None,
                 user_model: ResolvedModel | None = None) -> dict[str, Any]:  # fmt: skip
    """Everything that decides what a run computes, and nothing that legitimately varies (paths,
    times, workers, hardware). ``evalrun resume`` refuses a run whose identity would change."""
    return {
        "digest": digest.as_record(),
        "task": kind.identity(config, task),
        "limit": config.limit,
        "episodes": episodes,
        "model": _model_identity(model),
        "judge_model": _model_identity(judge_model),
        "engine": config.engine.identity_record(),
        **({"judge_engine": config.judge_engine.identity_record()} if config.judge_engine is not None else {}),
        # the model and engine playing a world's simulated user, when they are others (left out otherwise)
        **({"user_model": model_identity(user_model)} if user_model is not None else {}),
        **({"user_engine": config.user_engine.identity_record()} if config.user_engine is not None else {}),
        "decoding": config.decoding.as_record(),
        "seeds": seeds_identity(config.seeds),
        # the canary checks the engine and changes nothing the run computes (runs made before it resume)
        "determinism": {k: v for k, v in config.determinism.as_record().items() if k not in CANARY_SETTINGS},
        "generator": generator_info(),
    }


def build_manifest(
    kind: EpisodeKind,
    config: EvalConfig,
    task: Any,
    model: ResolvedModel,
    digest: Digest,
    workers: list[dict[str, Any]],
    episodes: int,
    judge_model: ResolvedModel | None = None,
    drift: Sequence[Drift] = (),
    user_model: ResolvedModel | None = None,
) -> dict[str, Any]:
    """``drift``: the workers' drift from the first, as the runner's watch found it (run.on_drift=warn)."""
    honoured = []
    for w in workers:
        if w["determinism"]["honoured"] not in honoured:
            honoured.append(w["determinism"]["honoured"])
    manifest = {
        "format": MANIFEST_FORMAT,
        "identity": run_identity(kind, config, task, model, digest, episodes, judge_model, user_model),
        "digest": digest.as_record(),
        **({"digest_inputs": digest.inputs} if digest.inputs is not None else {}),
        "task": kind.section(config, task),
        "limit": config.limit,
        "episodes": episodes,
        "model": model.as_record(),
        "judge_model": judge_model.as_record() if judge_model is not None else None,
        "engine": workers[0]["engine"],
        **({"judge_engine": workers[0]["judge_engine"]} if workers[0].get("judge_engine") else {}),
        **({"user_model": user_model.as_record()} if user_model is not None else {}),
        **({"user_engine": workers[0]["user_engine"]} if workers[0].get("user_engine") else {}),
        "decoding": config.decoding.as_record(),
        "seeds": seeds_section(config.seeds),
        "determinism": {
            "asked": workers[0]["determinism"]["asked"],
            "honoured": honoured,
            "notes": sorted({n for w in workers for n in w["determinism"]["notes"]}),
        },
        "cluster": config.cluster.as_record(),
        **({"config": config.config_sources.as_record()} if config.config_sources is not None else {}),
        "workers": [worker_record(w) for w in workers],
        **({"drift": [d.as_record() for d in drift]} if drift else {}),
        "generator": generator_info(),
        "libraries": library_versions(),
        "python": python_version(),
        "git": git_state(),
        "hardware": hardware_fingerprint(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "install": install_provenance(),
    }
    return Manifest.model_validate(manifest).as_record()  # written through its one definition
