"""``evalrun replay``: re-execute the harness with the engine replaced by the recorded responses.

The plan is rebuilt from the run's resolved config (config.yaml, plus any ``KEY=VALUE``
overrides) with the current code: templates are rendered again, requests built again, chains
recorded again by :func:`evalrun.episodes.harness.run_episodes`, outputs scored again. Only the model is
not asked: :class:`evalrun.engines.replay.ReplayEngine` answers each call from the log, matched
by (episode, call) and checked by request hash. Each episode's header reuses the recorded
generator, so an unchanged run reproduces its heads at any later commit.

Only the code that recorded a run can *reproduce* it. The report compares the generators the run
recorded (each chain header's and the manifest's ``generator``, with the manifest's git dirty
flag) with the code replaying it (:func:`evalrun.pipeline.manifest.generator_info`), and its
verdict says which it was: "reproduced with the recording code", or "replayed with different
code ...: this tests the new code, it is not a reproduction". Overrides likewise make a replay a
test of the changed config.

A schedule whose ``format`` this code does not know is refused (BadInput, exit 2).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from evalrun.chat import ModelChat
from evalrun.config import EvalConfig, load_stored, validate, without_recorded_sources
from evalrun.engines.replay import Divergence, RecordedCall, ReplayEngine
from evalrun.episodes import Engines, ModelFiles, Provenance, kind_of, replay_episodes
from evalrun.errors import CheckFailed
from evalrun.pipeline.environment import git_state
from evalrun.pipeline.manifest import generator_info
from evalrun.records.canonical import Canonical, canonical_json
from evalrun.records.entries import FailedCallEntry
from evalrun.records.merkle import merkle_root
from evalrun.records.outputs import same_scores
from evalrun.records.view import ChainView
from evalrun.rundir import layout
from evalrun.rundir.reader import (
    iter_chains,
    load_record,
    open_run,
    part_pairs,
    read_manifest,
    read_outputs,
    read_scores,
)
from evalrun.rundir.writer import tokenizer_hashes
from evalrun.scoring import score_outputs


@dataclass(frozen=True)
class Recorded:
    lines: tuple[str, ...]
    head: str
    generator: Canonical


@dataclass(frozen=True)
class CodeIdentity:
    """Who recorded the run and who replays it."""

    recorded: tuple[dict[str, Any], ...]  # distinct generators: chain headers' and the manifest's
    recorded_dirty: bool | None  # the manifest's git.dirty (None: not recorded)
    current: dict[str, Any]  # generator_info() of the code replaying
    current_dirty: bool | None

    @property
    def same_code(self) -> bool:
        """One recorded generator, equal to the current one, both at a known commit with no uncommitted changes."""
        return (
            list(self.recorded) == [self.current]
            and self.current.get("git_commit") is not None
            and self.recorded_dirty is False
            and self.current_dirty is False
        )

    def describe(self) -> str:
        recorded = ", ".join(_describe(g, self.recorded_dirty) for g in self.recorded) or "no generator"
        if self.same_code:
            return recorded
        return f"recorded {recorded}, now {_describe(self.current, self.current_dirty)}"


def _describe(generator: dict[str, Any], dirty: bool | None) -> str:
    commit = generator.get("git_commit") or "unknown commit"
    state = {True: " with uncommitted changes", None: " (working tree state unknown)"}.get(dirty, "")
    return f"{commit}/{generator.get('version')}{state}"


@dataclass(frozen=True)
class ReplayReport:
    episodes: int
    reproduced: int  # episodes whose every line, and so head, came out identical
    divergences: tuple[Divergence, ...]  # the first per diverging episode, in episode id order
    root_matches: bool
    scores_identical: bool | None  # None when some episode diverged (scores not compared)
    code: CodeIdentity
    overrides: tuple[str, ...] = ()

    @property
    def same_code(self) -> bool:
        return self.code.same_code

    @property
    def matches(self) -> bool:
        """Every head, the Merkle root and the scores came out as recorded."""
        return not self.divergences and self.root_matches and self.scores_identical is True

    @property
    def verdict(self) -> str:
        if self.matches:
            outcome = "every head, the Merkle root and the scores came out as recorded"
        elif self.divergences:
            outcome = f"{len(self.divergences)} of {self.episodes} episodes diverge"
        else:
            root = "matches" if self.root_matches else "differs"
            scores = "are identical" if self.scores_identical else "differ"
            outcome = f"every head came out as recorded, but the Merkle root {root} and the scores {scores}"
        overrides = f" with overrides ({' '.join(self.overrides)})" if self.overrides else ""
        if not self.same_code:
            return (f"replayed with different code ({self.code.describe()}){overrides}: {outcome}; "
                    "this tests the new code, it is not a reproduction")  # fmt: skip
        if self.overrides:
            return (f"replayed with the recording code ({self.code.describe()}){overrides}: {outcome}; "
                    "this tests the changed config, it is not a reproduction")  # fmt: skip
        if self.matches:
            return f"reproduced with the recording code ({self.code.describe()}): {outcome}"
        return f"not reproduced with the recording code ({self.code.describe()}): {outcome}"

    def as_record(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "same_code": self.same_code,
            "matches": self.matches,
            "episodes": self.episodes,
            "reproduced": self.reproduced,
            "root_matches": self.root_matches,
            "scores_identical": self.scores_identical,
            "divergences": [
                {"episode": d.episode, "seq": d.seq, "expected": d.expected, "got": d.got} for d in self.divergences
            ],
            "code": {**asdict(self.code), "recorded": list(self.code.recorded)},
            "overrides": list(self.overrides),
        }


def code_identity(manifest: dict[str, Any], recorded: dict[str, Recorded]) -> CodeIdentity:
    """The generators the run recorded against the code running now."""
    generators = {r.generator for r in recorded.values()}
    if isinstance(manifest.get("generator"), dict):
        generators.add(Canonical(canonical_json(manifest["generator"])))
    git = manifest.get("git") if isinstance(manifest.get("git"), dict) else {}
    dirty = git.get("dirty")
    return CodeIdentity(
        recorded=tuple(json.loads(g) for g in sorted(generators)),
        recorded_dirty=dirty if isinstance(dirty, bool) else None,
        current=generator_info(),
        current_dirty=git_state()["dirty"],
    )


def load_recording(
    run: layout.RunDir,
) -> tuple[dict[str, Recorded], dict[tuple[str, int], RecordedCall], dict[str, str]]:
    """The recorded chains, model calls, and failed episodes (episode -> reason)."""
    record = load_record(run)
    recorded: dict[str, Recorded] = {}
    calls: dict[tuple[str, int], RecordedCall] = {}
    failed: dict[str, str] = {}
    prompt_tokens = dict(zip(*read_outputs(run, ["episode_id", "prompt_tokens"]).to_pydict().values(), strict=True))
    for log_rel, _out_rel in part_pairs(run, record):
        for eid, entries, lines, head, _start in iter_chains(run.path / log_rel, log_rel, known_format_only=True):
            chain = ChainView.of(entries)
            generator = Canonical(canonical_json(chain.header.generator.as_record()))
            recorded[eid] = Recorded(lines=tuple(lines), head=head, generator=generator)
            for entry in chain.model_calls:
                refused = isinstance(entry, FailedCallEntry)
                calls[(eid, entry.call)] = RecordedCall(
                    episode_id=eid, seq=entry.seq, call=entry.call, request=entry.request.as_record(),
                    request_hash=entry.request_hash, response=None if refused else entry.response.as_record(),
                    prompt_tokens=0 if refused else prompt_tokens.get(eid, 0),
                    error=entry.error if refused else None,
                )  # fmt: skip
            if chain.failure is not None:
                failed[eid] = chain.failure
    return recorded, calls, failed


def replay_config(run: layout.RunDir, overrides: list[str]) -> EvalConfig:
    """The run's resolved config over the current schema, with overrides; the model is not needed."""
    cfg = load_stored(run.config, overrides)
    without_recorded_sources(cfg)
    return validate(cfg)


def check_kept_tokenizer(run: layout.RunDir) -> None:
    """The run's copy of its tokenizer holds the files record.json lists, byte for byte (a replay renders, counts
    and parses with them; verify checks them too, with every other file)."""
    listed = {name: sha for name, sha in load_record(run).files.items() if name.startswith(f"{layout.TOKENIZER}/")}
    kept = tokenizer_hashes(run)
    for name in sorted(listed.keys() | kept.keys()):
        if name not in listed:
            raise CheckFailed(f"{name}: not a file record.json lists")
        if kept.get(name) != listed[name]:
            raise CheckFailed(f"{name}: {'missing' if name not in kept else 'sha256 differs from record.json'}")


def recorded_model_files(run: layout.RunDir, manifest: dict[str, Any]) -> ModelFiles:
    """The run's model as planning reads it: its directory when it is here, else the tokenizer files the run
    kept (``RUN/tokenizer``: rendering, token counts and tool parsing need no more), and the chat template
    and special tokens the run recorded (``model.chat``; of the directory for a run recorded before); the
    judges' model (``judge_model``) and the model playing a world's simulated user (``user_model``) likewise, from
    its directory or its recorded chat template."""
    judge, user = manifest.get("judge_model"), manifest.get("user_model")
    judges = _recorded_files(judge, "judge_model", None) if isinstance(judge, dict) else None
    users = None
    if isinstance(user, dict):
        identity = manifest.get("identity") if isinstance(manifest.get("identity"), dict) else {}
        users = replace(_recorded_files(user, "user_model", None), pins=identity.get("user_model"))
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    return replace(_recorded_files(model, "model", run), judge=judges, user=users)


def _recorded_files(model: dict[str, Any], section: str, run: layout.RunDir | None) -> ModelFiles:
    """A manifest model section's files; ``run``: whose kept tokenizer stands in for a directory not here."""
    path = model.get("path")
    directory = Path(path) if isinstance(path, str) and Path(path).is_dir() else None
    if directory is None and run is not None and run.tokenizer.is_dir():
        check_kept_tokenizer(run)
        directory = run.tokenizer
    if "chat" in model:
        chat = ModelChat.recorded(model["chat"], f"manifest.json: {section}.chat")
    else:
        chat = ModelChat.of_directory(directory) if directory is not None else None
    return ModelFiles(directory, chat, f"the manifest's {section}.path {path}")


def replay_run(path: Path, overrides: list[str]) -> ReplayReport:
    """Plan the run again with the code a run plans with (its kind of episode's), replay each recorded episode
    through its kind with every model call and effect served from the record, and compare every line, the
    Merkle root and the scores (docs/design.md "Replay")."""
    run = open_run(path)
    recorded, calls, failed = load_recording(run)
    manifest = read_manifest(run)
    model = recorded_model_files(run, manifest)
    config = replay_config(run, overrides)
    kind = kind_of(config)
    config, task = kind.load(config, model)
    episodes = kind.plan(config, task, model)
    engine = ReplayEngine(calls, failed)
    engines = Engines(engine, engine)
    planned = {e.episode_id for e in episodes}
    divergences = [Divergence(eid, 0, "an episode of the current plan", "an episode the plan lacks")
                   for eid in sorted(set(recorded) - planned)]  # fmt: skip
    divergences += [Divergence(e.episode_id, 0, "a recorded episode", "a newly planned episode")
                    for e in episodes if e.episode_id not in recorded]  # fmt: skip
    replayable = sorted((e for e in episodes if e.episode_id in recorded), key=lambda e: e.episode_id)
    lines = {eid: r.lines for eid, r in recorded.items()}
    results, diverged = replay_episodes(kind, engines, replayable, lines, lambda e: recorded[e.episode_id].generator)
    divergences += diverged
    divergences.sort(key=lambda d: d.episode)
    scores_identical = None
    if not divergences:
        provenance = Provenance(worker="replay", hardware="{}", batch_size=1, latency_s=0.0)
        context = kind.recorded_scoring_context(manifest, kind.rubric(task))
        scores = score_outputs(kind.output_rows(results, provenance), config.task.scorer, context)
        scores_identical = same_scores(read_scores(run), scores)
    heads = {r.episode.episode_id: r.head for r in results}
    return ReplayReport(
        episodes=len(recorded), reproduced=len(results), divergences=tuple(divergences),
        root_matches=not divergences and merkle_root(heads.items()) == load_record(run).merkle_root,
        scores_identical=scores_identical, code=code_identity(manifest, recorded), overrides=tuple(overrides),
    )  # fmt: skip
