"""``evalrun replay``: re-execute the harness with the engine replaced by the recorded responses.

The plan is rebuilt from the run's resolved config (config.yaml, plus any ``KEY=VALUE``
overrides) with the current code: templates are rendered again, requests built again, chains
recorded again by :func:`evalrun.pipeline.harness.run_episodes`, outputs scored again. Only the model is
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalrun.config import TRUNCATE_LEFT, EvalConfig, load_stored, validate
from evalrun.engines.replay import Divergence, RecordedCall, ReplayEngine
from evalrun.errors import BadInput
from evalrun.pipeline import encode
from evalrun.pipeline.agent import (
    Agent,
    ModelAgent,
    ScriptedAgent,
    agent_decoding,
    chat_template_renderer,
    load_agent_task,
    plan_agent_episodes,
    replay_agent_episodes,
)
from evalrun.pipeline.context import apply_context_limit
from evalrun.pipeline.environment import git_state
from evalrun.pipeline.harness import EpisodeResult, run_episodes
from evalrun.pipeline.manifest import generator_info
from evalrun.pipeline.plan import Episode, build_plan
from evalrun.records.canonical import Canonical, canonical_json
from evalrun.records.chain import link
from evalrun.records.entries import MODEL_CALLS, EndEntry, FailedCallEntry, HeaderEntry
from evalrun.records.merkle import merkle_root
from evalrun.records.outputs import same_scores
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
from evalrun.scoring import ScoringContext, score_outputs
from evalrun.tasks import load_task


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
            header = entries[0]
            assert isinstance(header, HeaderEntry)  # the reader starts every chain with a header
            generator = Canonical(canonical_json(header.generator.as_record()))
            recorded[eid] = Recorded(lines=tuple(lines), head=head, generator=generator)
            for entry in entries:
                if isinstance(entry, FailedCallEntry):
                    calls[(eid, entry.call)] = RecordedCall(
                        episode_id=eid, seq=entry.seq, call=entry.call, request=entry.request.as_record(),
                        request_hash=entry.request_hash, response=None, prompt_tokens=0, error=entry.error,
                    )  # fmt: skip
                elif isinstance(entry, MODEL_CALLS):
                    calls[(eid, entry.call)] = RecordedCall(
                        episode_id=eid, seq=entry.seq, call=entry.call, request=entry.request.as_record(),
                        request_hash=entry.request_hash, response=entry.response.as_record(),
                        prompt_tokens=prompt_tokens.get(eid, 0),
                    )  # fmt: skip
                elif isinstance(entry, EndEntry) and entry.status == "error":
                    failed[eid] = entry.error or ""
    return recorded, calls, failed


def replay_config(run: layout.RunDir, overrides: list[str]) -> EvalConfig:
    """The run's resolved config over the current schema, with overrides; the model is not needed."""
    cfg = load_stored(run.config, overrides)
    cfg.model.path = None  # replay serves recorded responses: the weights need not be here
    if cfg.judge_model is not None:
        cfg.judge_model.path = None
    return validate(cfg)


def _replay_agents(run: layout.RunDir, config: EvalConfig, overrides: list[str], recorded: dict[str, Recorded],
                   engine: ReplayEngine) -> ReplayReport:  # fmt: skip
    """An agent run against fresh worlds: every world rebuilt from its seed, the recorded model replies
    and effects served from the chains, every line compared (docs/design.md "Agent episodes")."""
    manifest = read_manifest(run)
    config = agent_decoding(config)
    world = config.task.world
    assert world is not None
    model_path = (manifest.get("model") or {}).get("path")
    template_dir = Path(model_path) if isinstance(model_path, str) and Path(model_path).is_dir() else None
    if world.agent == "model" and template_dir is None:
        raise BadInput("model.path", f"replaying a model agent renders its prompts with the model's chat template: "
                                     f"the recorded model directory {model_path} is not here")  # fmt: skip
    task = load_agent_task(config.task, config.limit, template_dir)
    episodes = plan_agent_episodes(task.name, task.tasks, config.decoding, config.seeds, world.agent, task.budget)
    agent: Agent = ScriptedAgent()
    if world.agent == "model":
        assert template_dir is not None
        agent = ModelAgent(engine, chat_template_renderer(str(template_dir)))
    divergences = [Divergence(eid, 0, "an episode of the current plan", "an episode the plan lacks")
                   for eid in sorted(set(recorded) - {e.episode_id for e in episodes})]  # fmt: skip
    divergences += [Divergence(e.episode_id, 0, "a recorded episode", "a newly planned episode")
                    for e in episodes if e.episode_id not in recorded]  # fmt: skip
    replayable = sorted((e for e in episodes if e.episode_id in recorded), key=lambda e: e.episode_id)
    lines = {eid: r.lines for eid, r in recorded.items()}
    results, diverged = replay_agent_episodes(replayable, lines, agent, lambda e: recorded[e.episode_id].generator)
    divergences = sorted([*divergences, *diverged], key=lambda d: d.episode)
    scores_identical = None
    if not divergences:
        provenance = encode.Provenance(worker="replay", hardware="{}", batch_size=1, latency_s=0.0)
        scores = score_outputs(encode.agent_output_rows(results, provenance), config.task.scorer,
                               ScoringContext.recorded(manifest, None))  # fmt: skip
        scores_identical = same_scores(read_scores(run), scores)
    heads = {r.episode.episode_id: r.head for r in results}
    return ReplayReport(
        episodes=len(recorded), reproduced=len(results), divergences=tuple(divergences),
        root_matches=not divergences and merkle_root(heads.items()) == load_record(run).merkle_root,
        scores_identical=scores_identical, code=code_identity(manifest, recorded), overrides=tuple(overrides),
    )  # fmt: skip


def replay_episode(engine: ReplayEngine, episode: Episode, recorded: Recorded) -> EpisodeResult:
    """Run one episode through the harness; raise Divergence at the first line that differs."""
    (result,) = run_episodes(engine, [episode], recorded.generator)
    for seq, (want, got) in enumerate(zip(recorded.lines, result.log_lines, strict=False)):
        if want != got:
            raise Divergence(episode.episode_id, seq, f"entry hash {link('', want)}: {want[:200]}", got[:200])
    if len(result.log_lines) != len(recorded.lines):
        raise Divergence(episode.episode_id, min(len(result.log_lines), len(recorded.lines)),
                         f"{len(recorded.lines)} entries", f"{len(result.log_lines)} entries")  # fmt: skip
    return result


def replay_run(path: Path, overrides: list[str]) -> ReplayReport:
    run = open_run(path)
    recorded, calls, failed = load_recording(run)
    config = replay_config(run, overrides)
    if config.task.world is not None:
        return _replay_agents(run, config, overrides, recorded, ReplayEngine(calls, failed))
    task = load_task(config)
    config = config.with_decoding(task.pack.decoding)
    episodes = build_plan(task, config.decoding, config.seeds)
    manifest = read_manifest(run)
    model_path = (manifest.get("model") or {}).get("path")
    if config.task.on_overlong == TRUNCATE_LEFT and isinstance(model_path, str) and Path(model_path).is_dir():
        # the prompts the run sent were shortened with the model's tokenizer: shorten them again
        episodes = apply_context_limit(episodes, Path(model_path), config.engine.max_model_len, TRUNCATE_LEFT)
    engine = ReplayEngine(calls, failed)
    divergences: list[Divergence] = []
    results: list[EpisodeResult] = []
    planned = {e.episode_id for e in episodes}
    for eid in sorted(set(recorded) - planned):
        divergences.append(Divergence(eid, 0, "an episode of the current plan", "an episode the plan lacks"))
    for episode in sorted(episodes, key=lambda e: e.episode_id):
        if episode.episode_id not in recorded:
            divergences.append(Divergence(episode.episode_id, 0, "a recorded episode", "a newly planned episode"))
            continue
        try:
            results.append(replay_episode(engine, episode, recorded[episode.episode_id]))
        except Divergence as d:
            divergences.append(d)
    divergences.sort(key=lambda d: d.episode)
    heads = {r.episode.episode_id: r.head for r in results}
    record = load_record(run)
    scores_identical = None
    if not divergences:
        provenance = encode.Provenance(worker="replay", hardware="{}", batch_size=1, latency_s=0.0)
        context = ScoringContext.recorded(manifest, task.rubric)
        scores = score_outputs(encode.output_rows(results, provenance), config.task.scorer, context)
        recorded_scores = read_scores(run)
        scores_identical = same_scores(recorded_scores, scores)
    return ReplayReport(
        episodes=len(recorded), reproduced=len(results), divergences=tuple(divergences),
        root_matches=not divergences and merkle_root(heads.items()) == record.merkle_root,
        scores_identical=scores_identical, code=code_identity(manifest, recorded), overrides=tuple(overrides),
    )  # fmt: skip
