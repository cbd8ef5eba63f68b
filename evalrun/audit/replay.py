"""``evalrun replay``: re-execute the harness with the engine replaced by the recorded responses.

The plan is rebuilt from the run's resolved config (config.yaml, plus any ``KEY=VALUE``
overrides) with the current code: templates are rendered again, requests built again, chains
recorded again by :func:`evalrun.pipeline.harness.run_episodes`, outputs scored again. Only the model is
not asked: :class:`evalrun.engines.replay.ReplayEngine` answers each call from the log, matched
by (episode, call) and checked by request hash. Each episode's header reuses the recorded
generator, so an unchanged run reproduces its heads at any later commit.

A schedule whose ``format`` this code does not know is refused (BadInput, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from evalrun.config import load_stored, validate
from evalrun.engines.replay import Divergence, RecordedCall, ReplayEngine
from evalrun.pipeline import encode
from evalrun.pipeline.harness import EpisodeResult, run_episodes
from evalrun.pipeline.plan import Episode, build_plan
from evalrun.records.canonical import Canonical, canonical_json
from evalrun.records.chain import link
from evalrun.records.merkle import merkle_root
from evalrun.rundir import layout
from evalrun.rundir.reader import iter_chains, load_record, open_run, part_pairs
from evalrun.scoring import ScoringContext, score_outputs
from evalrun.tasks import load_task


@dataclass(frozen=True)
class Recorded:
    lines: tuple[str, ...]
    head: str
    generator: Canonical


@dataclass(frozen=True)
class ReplayReport:
    episodes: int
    reproduced: int  # episodes whose every line, and so head, came out identical
    divergences: tuple[Divergence, ...]  # the first per diverging episode, in episode id order
    root_matches: bool
    scores_identical: bool | None  # None when some episode diverged (scores not compared)


def load_recording(run: layout.RunDir) -> tuple[dict[str, Recorded], dict[tuple[str, int], RecordedCall]]:
    record = load_record(run)
    recorded: dict[str, Recorded] = {}
    calls: dict[tuple[str, int], RecordedCall] = {}
    prompt_tokens = dict(zip(*run.read_outputs(["episode_id", "prompt_tokens"]).to_pydict().values(), strict=True))
    for log_rel, _out_rel in part_pairs(run, record):
        for eid, entries, lines, head, _start in iter_chains(run.path / log_rel, log_rel, known_format_only=True):
            generator = Canonical(canonical_json(entries[0]["generator"]))
            recorded[eid] = Recorded(lines=tuple(lines), head=head, generator=generator)
            for entry in entries:
                if entry["kind"] == "model":
                    calls[(eid, entry["call"])] = RecordedCall(
                        episode_id=eid, seq=entry["seq"], call=entry["call"], request=entry["request"],
                        request_hash=entry["request_hash"], response=entry["response"],
                        prompt_tokens=prompt_tokens.get(eid, 0),
                    )  # fmt: skip
    return recorded, calls


def replay_config(run: layout.RunDir, overrides: list[str]) -> Any:
    """The run's resolved config over the current schema, with overrides; the model is not needed."""
    cfg = load_stored(run.config, overrides)
    cfg.model.path = None  # replay serves recorded responses: the weights need not be here
    if cfg.judge_model is not None:
        cfg.judge_model.path = None
    return validate(cfg)


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
    recorded, calls = load_recording(run)
    config = replay_config(run, overrides)
    task = load_task(config)
    config = config.with_decoding(task.pack.decoding)
    episodes = build_plan(task, config.section("decoding"), config.section("seeds"))
    engine = ReplayEngine(calls)
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
    record = run.read_json(layout.RECORD)
    scores_identical = None
    if not divergences:
        provenance = encode.Provenance(worker="replay", hardware="{}", batch_size=1, latency_s=0.0)
        context = ScoringContext.recorded(run.read_json(layout.MANIFEST), task.rubric)
        scores = score_outputs(encode.output_rows(results, provenance), config.section("task")["scorer"], context)
        recorded_scores = pq.read_table(run.scores)
        scores_identical = recorded_scores.schema.equals(scores.schema) and recorded_scores.equals(scores)
    return ReplayReport(
        episodes=len(recorded), reproduced=len(results), divergences=tuple(divergences),
        root_matches=not divergences and merkle_root(heads.items()) == record["merkle_root"],
        scores_identical=scores_identical,
    )  # fmt: skip
