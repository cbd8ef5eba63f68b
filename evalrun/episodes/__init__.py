"""Kinds of episode: one contract for every path an episode takes from config to record and back.

A kind of episode (``dataset``: one prompt per item, with its option scores and judges; ``world``: an
agent acting over many turns in a seeded offline world) owns everything that differs between kinds:
loading its task from config, planning its episodes, running a batch of them on an engine, their
output rows, the manifest's task sections and the digest's prompt-pack part, replaying one episode
from its recorded chain, and the checks verify makes of its records. The runner, the workers, replay,
verify, rescore and the CLI ask the kind and never which kind it is (docs/design.md "Kinds of
episode"; tests/test_architecture.py checks that no code outside the kinds' modules branches on one).

A kind is a class registered by name with ``@episode_kind("NAME")``, in the style of the engine
registry; ``task.kind`` selects one (null: ``world`` when the task has a ``task.world`` section, else
``dataset``, so configs and records made before kinds existed are read as they were).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import pyarrow as pa

from evalrun.chat import ModelFiles
from evalrun.config import EvalConfig
from evalrun.config.registry import Registry
from evalrun.engines import Engine
from evalrun.engines.pins import ResolvedModel
from evalrun.engines.replay import Divergence, first_divergence
from evalrun.records.canonical import Canonical
from evalrun.records.heads import PackedHeads
from evalrun.records.view import ChainView
from evalrun.rundir.writer import PartFiles
from evalrun.scoring import ScoringContext
from evalrun.scoring.parts import PartScorer, ScoredPart
from evalrun.tasks.rubric import Rubric


def model_files(model: ResolvedModel, judge: ResolvedModel | None = None,
                user: ResolvedModel | None = None) -> ModelFiles:  # fmt: skip
    """What planning reads of the run's resolved model (and of its judges' model and of the model playing a world's
    simulated user, when they are others)."""
    judges = ModelFiles(judge.path, judge.chat, f"judge_model.path {judge.path}") if judge is not None else None
    users = None
    if user is not None:
        users = ModelFiles(user.path, user.chat, f"user_model.path {user.path}", pins=model_identity(user))
    return ModelFiles(model.path, model.chat, f"model.path {model.path}", judges, users)


def model_identity(model: ResolvedModel) -> dict[str, Any]:
    """What a run's identity records of a model: its id, revision, files by sha256, and whether they are pinned."""
    return {"id": model.id, "revision": model.revision, "files": model.files, "pinned": model.pinned}


@dataclass(frozen=True)
class Provenance:
    """What an output row records of where and how its episode ran: never hashed (docs/design.md "Output rows")."""

    worker: str
    hardware: str  # canonical JSON of the worker's hardware fingerprint
    batch_size: int
    latency_s: float


@dataclass(frozen=True)
class EncodedPart:
    """A batch's results as the bytes of its log part and output part: the message a worker sends the driver.

    Encoded where the results are (a worker), so the driver only commits bytes to disk
    (:class:`evalrun.rundir.writer.PartWriter`) and never does per-episode work; a Ray worker scores the rows
    too (``scored``), and an inline one hands over the rows themselves (``rows``, never pickled), so the driver
    never decodes its own parts.
    """

    log: bytes
    table: bytes
    heads: PackedHeads  # (episode_id, head) of each episode, packed and hashed where they were made
    output_tokens: int
    scored: ScoredPart | None = None  # the rows scored where they were made (a Ray worker)
    rows: pa.Table | None = field(default=None, compare=False, repr=False)  # what ``table`` encodes, in this process

    def written(self, files: PartFiles) -> WrittenPart:
        """What the driver is sent of this part once its worker committed it as ``files``."""
        return WrittenPart(files, self.heads, self.output_tokens, self.scored)


@dataclass(frozen=True)
class WrittenPart:
    """A batch's part committed into the run directory by the worker that made it (``run.part_writes=workers``):
    the message it sends the driver instead of the part's bytes, what the driver's commit needs (docs/design.md
    "Workers write, the driver commits"): the files' names, sha256s and sizes, the episodes' heads, the output
    tokens and the scored rows."""

    files: PartFiles
    heads: PackedHeads
    output_tokens: int
    scored: ScoredPart | None = None
    rows: None = None  # never in this process: the driver reads the part back if it must score it itself


@dataclass
class Engines:
    """What a kind runs its episodes on in one worker: the run's engine, the judges' engine (the run's own
    when there is no judge model), the engine of a model playing a world's simulated user (None: the run's own),
    and a place for what a kind builds once per worker (an agent, say)."""

    engine: Engine
    judge: Engine
    built: dict[str, Any] = field(default_factory=dict)
    user: Engine | None = None

    @property
    def users(self) -> Engine:
        """The engine a simulated user played by a model runs on."""
        return self.user or self.engine

    def once(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self.built:
            self.built[key] = build()
        return self.built[key]


class Planned(Protocol):
    """An episode of a plan, as every kind's episodes are: identified, and named by its kind."""

    kind: str  # the kind's registered name (a class attribute)

    @property
    def episode_id(self) -> str: ...


@runtime_checkable
class IdentifiedPlan(Protocol):
    """A plan that gives its episodes' ids without making the episodes (:class:`~evalrun.episodes.plan.Plan`)."""

    def episode_digests(self, start: int, stop: int) -> bytes: ...


def planned_digests(plan: Sequence[Planned], start: int, stop: int) -> bytes:
    """The ids of episodes ``start`` to ``stop`` of ``plan``, each its 32 bytes, concatenated; made without the
    episodes where the plan can."""
    if isinstance(plan, IdentifiedPlan):
        return plan.episode_digests(start, stop)
    return b"".join(bytes.fromhex(episode.episode_id) for episode in plan[start:stop])


@dataclass(frozen=True)
class PlanSlice(Sequence[Any]):
    """Episodes ``start`` to ``stop`` of a plan: a batch as the runner hands it to a dispatcher. Iterating or indexing
    it makes the episodes; a dispatcher whose workers hold the plan sends them only the bounds (docs/design.md
    "Workers write, the driver commits")."""

    plan: Sequence[Planned]
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Any]:
        return iter(self.plan[self.start : self.stop])

    def __getitem__(self, index: Any) -> Any:
        positions = range(self.start, self.stop)[index]  # a position, or a range of them
        return self.plan[positions] if isinstance(positions, int) else [self.plan[i] for i in positions]


class Result(Protocol):
    """A finished episode: its chain (lines and head)."""

    @property
    def episode(self) -> Planned: ...

    @property
    def log_lines(self) -> tuple[str, ...]: ...

    @property
    def head(self) -> str: ...


@dataclass(frozen=True)
class FreezeOptions:
    """``evalrun references build``'s options: for solver-computed references, the solver's settings."""

    allow_feasible: bool = False
    max_deterministic_time: float = 10.0
    random_seed: int = 0


class Frozen(Protocol):
    """What ``evalrun references build`` froze: its JSON form and the line it prints."""

    def as_json(self) -> dict[str, Any]: ...

    def message(self) -> str: ...


@runtime_checkable
class EpisodeKind(Protocol):
    """One kind of episode. ``task`` is the kind's own loaded task and ``episodes`` its own episodes: only
    the kind reads them."""

    name: str
    transcribed: bool  # the report shows its episodes step by step (a world's; a dataset's are rows)

    # --- config -> plan ---
    def load(self, config: EvalConfig, model: ModelFiles) -> tuple[EvalConfig, Any]:
        """The task ``config`` names, loaded and checked (a BadInput names the field), and the config with the
        task's own decoding settings applied; prompts are rendered with ``model``'s chat template."""
        ...

    def plan(self, config: EvalConfig, task: Any, model: ModelFiles) -> Sequence[Planned]:
        """Every episode of the run, ids and seeds derived from the config alone; the same code plans a run
        and its replay (prompts that do not fit the context found with ``model``'s tokenizer, when it is here)."""
        ...

    def scoring_context(self, config: EvalConfig, task: Any, model: ResolvedModel,
                        judge_model: ResolvedModel | None) -> ScoringContext: ...  # fmt: skip

    def prompt_record(self, config: EvalConfig, task: Any) -> dict[str, Any]:
        """What the digest's ``prompt_pack`` part hashes: everything that decides what the model is shown."""
        ...

    def identity(self, config: EvalConfig, task: Any) -> dict[str, Any]:
        """The manifest's ``identity.task``: what decides what the run computes (resume refuses a change)."""
        ...

    def section(self, config: EvalConfig, task: Any) -> dict[str, Any]:
        """The manifest's ``task``: what the run evaluated, with the paths it read."""
        ...

    def recorded_identity(self, identity: dict[str, Any], config: EvalConfig) -> dict[str, Any]:
        """A recorded ``identity`` as this code would write it for ``config`` (records of older code)."""
        ...

    def recorded_task_identity(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The ``identity.task`` a recorded manifest's ``task`` section implies: the same claims without the paths
        read (verify refuses a manifest whose two records of the task disagree)."""
        ...

    # --- dispatch ---
    def run(self, engines: Engines, episodes: list[Any], generator: dict[str, Any] | Canonical) -> list[Any]:
        """A batch's results, in episode order."""
        ...

    def run_batches(self, engines: Engines, batches: Iterable[list[Any]],
                    generator: dict[str, Any] | Canonical) -> Iterator[list[Any]]:  # fmt: skip
        """:meth:`run` over each batch in order, with the same results (an engine kept busy between batches)."""
        ...

    def encode(self, results: list[Any], provenance: Provenance, scorer: PartScorer | None = None) -> EncodedPart:
        """A batch's log part and output part (:mod:`evalrun.episodes.encode`)."""
        ...

    def output_rows(self, results: list[Any], provenance: Provenance) -> pa.Table: ...

    # --- replay and audit ---
    def replay(self, engines: Engines, episode: Any, recorded: Sequence[str],
               generator: dict[str, Any] | Canonical) -> Any:  # fmt: skip
        """One episode run again with every model call and effect served from its recorded chain
        (``engines.engine`` is a replay engine); raises :class:`evalrun.engines.replay.Divergence` when the
        episode asks for something the chain does not hold."""
        ...

    def rubric(self, task: Any) -> Rubric | None:
        """The rubric the task's outputs are judged by, if any (its scoring context is recorded with it)."""
        ...

    def recorded_scoring_context(self, manifest: Mapping[str, Any], rubric: Rubric | None) -> ScoringContext:
        """The context a finished run was scored with, from its manifest (``rubric`` read again)."""
        ...

    def recorded_prompt_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """What the digest's ``prompt_pack`` part must hash, rebuilt from the rest of the manifest (CheckFailed
        naming the field of a malformed section)."""
        ...

    def prompt_source(self, key: str) -> str:
        """The manifest section a key of the ``prompt_pack`` preimage comes from (for verify's message)."""
        ...

    def recorded_scoring_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """The scoring context record (:meth:`ScoringContext.as_record`) the manifest implies, rubric as recorded."""
        ...

    def row_mismatch(self, row: dict[str, Any], chain: ChainView) -> str | None:
        """The first output column of ``row`` that disagrees with its ``chain`` (verify's row check), or None."""
        ...

    def freeze(self, config: EvalConfig, root: Path | None, options: FreezeOptions) -> Frozen:
        """``evalrun references build``: freeze the answers or references the task is scored against."""
        ...


EPISODE_KINDS: Registry[EpisodeKind] = Registry("episode kind", "task.kind")
EPISODE_KINDS.declare("dataset", "evalrun.episodes.dataset")
EPISODE_KINDS.declare("world", "evalrun.episodes.world")
EPISODE_KINDS.declare("lm_eval", "evalrun.episodes.lm_eval")

K = TypeVar("K")


def episode_kind(name: str) -> Callable[[type[K]], type[K]]:
    """Register a kind of episode: ``@episode_kind("NAME")`` on a class implementing :class:`EpisodeKind`
    (one instance of it serves every run)."""

    def register(cls: type[K]) -> type[K]:
        instance = cls()
        if not isinstance(instance, EpisodeKind):
            raise TypeError(f"{cls.__qualname__} does not implement EpisodeKind")
        EPISODE_KINDS.add(name, instance)
        return cls

    return register


def kind_of(config: EvalConfig) -> EpisodeKind:
    """The kind ``task.kind`` names (a BadInput names the field when no kind is registered under it)."""
    return EPISODE_KINDS.get(config.task.episode_kind)


def kind_named(name: str) -> EpisodeKind:
    return EPISODE_KINDS.get(name)


def kind_of_episodes(episodes: Sequence[Planned]) -> EpisodeKind:
    """The kind of a batch's episodes (every episode of a batch is of the run's kind)."""
    return EPISODE_KINDS.get(episodes[0].kind)


def replay_episodes(
    kind: EpisodeKind,
    engines: Engines,
    episodes: Iterable[Planned],
    recorded: Mapping[str, Sequence[str]],
    generator: Callable[[Planned], dict[str, Any] | Canonical],
) -> tuple[list[Any], list[Divergence]]:
    """Replay each of ``episodes`` (every one recorded) through ``kind.replay``, one at a time so that a
    divergence in one stops no other, and compare its new chain with the recorded lines: the results of the
    episodes that came out line for line as recorded, and the first divergence of each of the others.
    ``generator``: the generator each episode's header recorded. The one replay loop of every kind."""
    results: list[Any] = []
    divergences: list[Divergence] = []
    for episode in episodes:
        lines = recorded[episode.episode_id]
        try:
            result = kind.replay(engines, episode, lines, generator(episode))
        except Divergence as divergence:
            divergences.append(divergence)
            continue
        difference = first_divergence(episode.episode_id, lines, result.log_lines)
        if difference is None:
            results.append(result)
        else:
            divergences.append(difference)
    return results, divergences


def kind_of_manifest(manifest: Mapping[str, Any]) -> EpisodeKind:
    """The kind a run's manifest records: its ``task.kind``, or for records of the two first kinds, which do
    not name theirs, ``world`` when its task has a ``world`` section, else ``dataset``."""
    task = manifest.get("task")
    task = task if isinstance(task, Mapping) else {}
    name = task.get("kind")
    if not isinstance(name, str):
        name = "world" if isinstance(task.get("world"), Mapping) else "dataset"
    return EPISODE_KINDS.get(name)
