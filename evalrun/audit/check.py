"""``evalrun check RUN_DIR``: is this run reproducible here? The three reproducibility checks as one
verdict (docs/design.md "Audit", "check").

1. **replay**: the recorded actions (model replies, tool results) against a fresh harness and fresh
   worlds (:func:`evalrun.audit.replay.replay_run`): every line, head, the root and the scores.
2. **rescore**: the stored outputs and final states scored again with the run's own scorer
   (:func:`evalrun.audit.rescore.rescore_recorded`): the same values, bit for bit.
3. **repeat**: a seeded subsample of the run's items run again, live, with the run's recorded config
   (every episode of those items: seeds x repeats, with the original episode ids), then per episode
   agreement with the original (:func:`evalrun.analysis.nondet.token_agreement`), TARr/TARa, and whether
   the repeat's mean lies inside the original's 95% interval over the same items. The repeat is a real
   run directory, made in a temporary directory and removed afterwards (or kept under ``keep``),
   never inside the run checked.

What passes the repeat: under ``determinism.enabled`` (the ``strict`` profile, the default) every
repeated episode must be identical in tokens, every model call's token ids equal (greedy and seeded
sampling alike: a seeded sampler on the same platform must draw the same tokens); logprob
differences are reported, not failed. Without it, tokens may differ and are reported; only the
means must lie inside the intervals. Either way every mean must lie inside its interval and every
original episode of the chosen items must be in the current plan. The settings that differ between
the original's manifest and the repeat's (engine, determinism honoured, hardware, software,
dispatch) are reported beside the verdict.

This module sits above audit and analysis (it combines both, and they must not import each other).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from evalrun.analysis.nondet import SettingDiff, agreement_rate, setting_diffs, token_agreement
from evalrun.analysis.runs import OVERALL, load_run
from evalrun.analysis.sides import Call, Conversation, SideAgreement, conversation_calls, side_agreement, side_of
from evalrun.audit.replay import ReplayReport, replay_run
from evalrun.audit.rescore import RescoreReport, rescore_recorded
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import Prepared, check_destination, execute, load_run_config, prepare
from evalrun.records.entries import CompletionResponse, FailedCallEntry, LoglikelihoodResponse
from evalrun.records.formats import CHECK_FORMAT
from evalrun.records.seeds import derive_rng
from evalrun.records.view import ChainView, ModelCall
from evalrun.rundir import layout
from evalrun.rundir.reader import (
    iter_chains,
    load_record,
    open_finished,
    part_pairs,
    read_outputs,
    read_scores,
)
from evalrun.stats.estimates import estimate

DEFAULT_REPEAT_ITEMS = 8
REPEAT_PURPOSE = "check-repeat"  # derive_rng(master, REPEAT_PURPOSE, task): which items are repeated
CHECKS = ("replay", "rescore", "repeat")


# --- the sample ------------------------------------------------------------------------------------


def sample_items(item_ids: Sequence[str], n: int, master: int, task: str) -> tuple[str, ...]:
    """``n`` of the run's items (all when it has fewer), drawn from the master seed alone, sorted.

    The distinct ids are sorted, shuffled by ``derive_rng(master, "check-repeat", task)`` and the first
    ``n`` taken: a larger ``n`` repeats a superset of a smaller one's items."""
    order = sorted(set(item_ids))
    derive_rng(master, REPEAT_PURPOSE, task).shuffle(order)
    return tuple(sorted(order[:n]))


# --- what one episode's model calls returned -------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """One model call's result: a generation's text, tokens and their logprobs; a loglikelihood call's
    continuation tokens with its summed logprob as the one logprob; a failed call's error; and whose call it was
    (``user``: a simulated user's turn played by a model; ``agent``: the policy's, or a judge's)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    error: str | None = None
    side: str = "agent"


def generation(entry: ModelCall) -> Generation:
    side = side_of(entry)
    if isinstance(entry, FailedCallEntry):
        return Generation("", (), (), entry.error, side)
    response = entry.response
    if isinstance(response, CompletionResponse):
        return Generation(response.text, tuple(response.token_ids), tuple(response.logprobs), side=side)
    assert isinstance(response, LoglikelihoodResponse), type(entry)
    return Generation("", tuple(response.token_ids), (response.logprob,), side=side)


@dataclass(frozen=True)
class RecordedEpisode:
    item_id: str
    seed: int
    repeat: int
    head: str
    calls: tuple[Generation, ...]  # in call order
    answer: tuple[Any, ...]  # the scorer's extracted answer per metric, and the final state (agents)
    conversation_calls: tuple[Call, ...] = ()  # the agent's and a simulated user's calls (analysis.sides)

    def conversation(self, episode_id: str) -> Conversation:
        return Conversation(episode_id, ("", self.item_id, self.seed, self.repeat), self.conversation_calls)


def recorded_episodes(run: layout.RunDir, ids: frozenset[str]) -> dict[str, RecordedEpisode]:
    """The episodes ``ids`` of a finished run, from its chains, output rows and scores."""
    calls: dict[str, tuple[Generation, ...]] = {}
    talk: dict[str, tuple[Call, ...]] = {}
    for log_rel, _out_rel in part_pairs(run, load_record(run)):
        for chain in iter_chains(run.path / log_rel, log_rel):
            if chain.episode in ids:
                view = ChainView.of(chain.entries)
                calls[chain.episode] = tuple(generation(e) for e in sorted(view.model_calls, key=lambda e: e.call))
                talk[chain.episode] = conversation_calls(view)
    answers: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for eid, metric, extracted in zip(*read_scores(run, ["episode_id", "metric", "extracted"]).to_pydict().values(),
                                      strict=True):  # fmt: skip
        if eid in ids:
            answers[eid].append((metric, extracted))
    columns = ["episode_id", "item_id", "seed", "repeat", "head", "final_state"]
    episodes = {}
    for eid, item, seed, repeat, head, final in zip(*read_outputs(run, columns).to_pydict().values(), strict=True):
        if eid in ids:
            answer = (tuple(sorted(answers[eid])), final)
            episodes[eid] = RecordedEpisode(item, seed, repeat, head, calls.get(eid, ()), answer, talk.get(eid, ()))
    return episodes


# --- agreement of one episode ----------------------------------------------------------------------


@dataclass(frozen=True)
class TokenPosition:
    """Where a repeated episode first differs: its model call, and the token within that call."""

    call: int
    token: int
    original: int | None  # the token id there (None: the sequence ended, or the call failed)
    repeat: int | None
    side: str = "agent"  # whose call: the agent's, or a simulated user's played by a model

    def describe(self) -> str:
        tokens = f" (original token {_token(self.original)}, repeat {_token(self.repeat)})"
        side = " (the simulated user's)" if self.side == "user" else ""
        return f"call {self.call}{side} token {self.token}{tokens}"


def _token(value: int | None) -> str:
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class EpisodeAgreement:
    episode_id: str
    item_id: str
    seed: int
    repeat: int
    identical_tokens: bool
    identical_raw: bool  # every model call's text equal
    identical_answer: bool  # every metric's extracted answer and the final state equal
    same_head: bool  # the whole chain equal (the generator in its header included)
    first_divergence: TokenPosition | None
    max_abs_logprob_diff: float | None  # over the positions before the first divergence
    missing: str | None = None  # why there is nothing to compare (an episode of one side only)


def episode_agreement(eid: str, original: RecordedEpisode, repeat: RecordedEpisode) -> EpisodeAgreement:
    """Call by call, up to the first call that differs: the first divergent token and the largest
    |logprob difference| before it (:func:`evalrun.analysis.nondet.token_agreement`)."""
    first: TokenPosition | None = None
    gaps: list[float] = []
    for call, (a, b) in enumerate(zip(original.calls, repeat.calls, strict=False)):
        tokens = token_agreement((a.token_ids, b.token_ids), (a.logprobs, b.logprobs))
        if tokens.max_abs_logprob_diff is not None:
            gaps.append(tokens.max_abs_logprob_diff)
        if tokens.first_divergence is not None or a.error != b.error:
            j = tokens.first_divergence if tokens.first_divergence is not None else 0
            first = TokenPosition(call, j, _at(a.token_ids, j), _at(b.token_ids, j), a.side)
            break
    if first is None and len(original.calls) != len(repeat.calls):
        shortest = min(len(original.calls), len(repeat.calls))
        longer = original.calls if len(original.calls) > shortest else repeat.calls
        first = TokenPosition(shortest, 0, None, None, longer[shortest].side)
    return EpisodeAgreement(
        episode_id=eid, item_id=original.item_id, seed=original.seed, repeat=original.repeat,
        identical_tokens=first is None,
        identical_raw=[g.text for g in original.calls] == [g.text for g in repeat.calls],
        identical_answer=original.answer == repeat.answer, same_head=original.head == repeat.head,
        first_divergence=first, max_abs_logprob_diff=max(gaps) if gaps else None,
    )  # fmt: skip


def _at(tokens: tuple[int, ...], j: int) -> int | None:
    return tokens[j] if j < len(tokens) else None


def _unmatched(eid: str, episode: RecordedEpisode, why: str) -> EpisodeAgreement:
    return EpisodeAgreement(eid, episode.item_id, episode.seed, episode.repeat, False, False, False, False,
                            TokenPosition(0, 0, None, None), None, why)  # fmt: skip


# --- the mean against the original's interval ------------------------------------------------------


@dataclass(frozen=True)
class MeanCheck:
    task: str
    metric: str
    items: int
    original_mean: float
    original_ci95: tuple[float, float] | None  # None with one item: then the means must be equal
    interval: str  # how the interval was computed (evalrun.stats.estimates.IntervalKind)
    repeat_mean: float | None  # None: the repeat has no score of this metric
    inside: bool


def mean_checks(original: Path, repeat: Path, items: frozenset[str]) -> tuple[MeanCheck, ...]:
    """Per task and metric: the repeat's mean against the original run's 95% interval over the same items
    (items as the unit, repeats averaged first: the summary's ``bounded`` method)."""
    before, after = load_run(original).observations(), load_run(repeat).observations()
    checks = []
    for (task, metric), observations in sorted(before.items()):
        if task == OVERALL:
            continue
        sample = [o for o in observations if o[0][1] in items]
        if not sample:
            continue
        old = estimate(sample, "bounded")
        repeated = after.get((task, metric))
        mean = estimate(repeated, "bounded").mean if repeated else None
        ci = old.ci95
        inside = mean is not None and (ci[0] <= mean <= ci[1] if ci is not None else mean == old.mean)
        checks.append(MeanCheck(task, metric, old.n_items, old.mean, ci, old.interval, mean, inside))
    return tuple(checks)


# --- the repeat ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatPlan:
    """The repeat, checked and planned before anything runs: the run's recorded config restricted to the
    sampled items, to be written at ``destination``."""

    prepared: Prepared
    requested: int
    items: tuple[str, ...]
    items_in_run: int
    original_ids: frozenset[str]  # the original run's episodes of those items
    destination: Path
    tokens_required: bool


def plan_repeat(run: layout.RunDir, n: int, overrides: Sequence[str], destination: Path) -> RepeatPlan:
    """Everything about the repeat that can be checked before an engine loads (a BadInput names what)."""
    config = load_run_config(run, list(overrides))
    config = replace(config, run=replace(config.run, dir=str(destination)))
    check_destination(config)
    prepared = prepare(config)
    outputs = read_outputs(run, ["episode_id", "item_id"]).to_pydict()
    items = sample_items(outputs["item_id"], n, prepared.config.seeds.master, prepared.task.name)
    chosen = frozenset(items)
    original_ids = frozenset(e for e, i in zip(outputs["episode_id"], outputs["item_id"], strict=True) if i in chosen)
    episodes = [e for e in prepared.episodes if e.item_id in chosen]  # their ids are the original's
    return RepeatPlan(
        prepared=replace(prepared, episodes=episodes), requested=n, items=items,
        items_in_run=len(set(outputs["item_id"])), original_ids=original_ids, destination=destination,
        tokens_required=prepared.config.determinism.enabled,
    )  # fmt: skip


@dataclass(frozen=True)
class RepeatReport:
    requested: int
    items: tuple[str, ...]  # the items repeated (sample_items: derive_rng(master, "check-repeat", task))
    items_in_run: int
    seed: dict[str, Any]  # how the items were drawn
    episodes: int
    identical_tokens: int  # episodes identical in tokens
    same_heads: int
    tarr: float
    tara: float
    tokens_required: bool  # determinism.enabled: identical tokens are required to pass
    first_divergence: str | None  # "episode E call C token T (...)", the first diverging episode in id order
    max_abs_logprob_diff: float | None
    means: tuple[MeanCheck, ...]
    settings: tuple[SettingDiff, ...]  # the original's value first, then the repeat's
    run_dir: str | None  # where the repeat's run directory was kept (None: removed)
    per_episode: tuple[EpisodeAgreement, ...]
    # a conversation's sides measured apart (the agent's calls, a model-played user's); None: no simulated user's
    # call in either run
    sides: dict[str, SideAgreement] | None = None

    @property
    def passed(self) -> bool:
        tokens = self.identical_tokens == self.episodes or not self.tokens_required
        complete = not any(e.missing for e in self.per_episode)
        return tokens and complete and all(m.inside for m in self.means)


def repeat_report(run: layout.RunDir, plan: RepeatPlan, repeat_dir: Path, kept: bool) -> RepeatReport:
    repeated_run = layout.RunDir(repeat_dir)
    repeat_ids = frozenset(e.episode_id for e in plan.prepared.episodes)
    original = recorded_episodes(run, plan.original_ids)
    repeated = recorded_episodes(repeated_run, repeat_ids)
    per_episode = []
    for eid in sorted(plan.original_ids | repeat_ids):
        if eid not in repeated:
            per_episode.append(_unmatched(eid, original[eid], "in the original run, not in the repeat's plan"))
        elif eid not in original:
            per_episode.append(_unmatched(eid, repeated[eid], "in the repeat's plan, not in the original run"))
        else:
            per_episode.append(episode_agreement(eid, original[eid], repeated[eid]))
    by_item: dict[str, list[EpisodeAgreement]] = defaultdict(list)
    for agreement in per_episode:
        by_item[agreement.item_id].append(agreement)
    diverged = next((e for e in per_episode if e.first_divergence is not None), None)
    first = None
    if diverged is not None:
        assert diverged.first_divergence is not None
        where = diverged.missing or diverged.first_divergence.describe()
        first = f"episode {diverged.episode_id} {where}"
    gaps = [e.max_abs_logprob_diff for e in per_episode if e.max_abs_logprob_diff is not None]
    return RepeatReport(
        requested=plan.requested, items=plan.items, items_in_run=plan.items_in_run,
        seed={"purpose": REPEAT_PURPOSE, "master": plan.prepared.config.seeds.master,
              "keys": [plan.prepared.task.name]},
        episodes=len(per_episode), identical_tokens=sum(e.identical_tokens for e in per_episode),
        same_heads=sum(e.same_head for e in per_episode),
        tarr=agreement_rate({k: [e.identical_raw for e in v] for k, v in by_item.items()}),
        tara=agreement_rate({k: [e.identical_answer for e in v] for k, v in by_item.items()}),
        tokens_required=plan.tokens_required, first_divergence=first,
        max_abs_logprob_diff=max(gaps) if gaps else None,
        means=mean_checks(run.path, repeat_dir, frozenset(plan.items)),
        settings=setting_diffs([load_run(run.path), load_run(repeat_dir)]),
        run_dir=str(repeat_dir) if kept else None, per_episode=tuple(per_episode),
        sides=_sides(original, repeated),
    )  # fmt: skip


def _sides(
    original: dict[str, RecordedEpisode], repeated: dict[str, RecordedEpisode]
) -> dict[str, SideAgreement] | None:
    """The agent's and a model-played user's calls measured apart, when a simulated user's calls are recorded."""
    if not any(g.side == "user" for e in (*original.values(), *repeated.values()) for g in e.calls):
        return None
    matched = [[e.conversation(eid) for e in (original[eid], repeated[eid])]
               for eid in sorted(original.keys() & repeated.keys())]  # fmt: skip
    return side_agreement(matched)


# --- the verdicts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    check: str  # replay | rescore | repeat
    passed: bool
    summary: str  # what was compared and how it came out, in one line
    first_divergence: str | None  # where it first differs (None: nowhere, or not known)


@dataclass(frozen=True)
class CheckReport:
    run: str
    verdicts: tuple[Verdict, ...]
    replay: ReplayReport | None  # None: the run could not be replayed (the verdict says why)
    rescore: RescoreReport | None
    repeat: RepeatReport | None

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def failure(self) -> str:
        """The failed checks and their first divergences, in one line."""
        return "; ".join(f"{v.check}: {v.first_divergence or v.summary}" for v in self.verdicts if not v.passed)

    def as_record(self) -> dict[str, Any]:
        return {
            "format": CHECK_FORMAT,
            "run": self.run,
            "passed": self.passed,
            "verdicts": [asdict(v) for v in self.verdicts],
            "replay": self.replay.as_record() if self.replay is not None else None,
            "rescore": _rescore_record(self.rescore),
            "repeat": asdict(self.repeat) if self.repeat is not None else None,
        }


def _rescore_record(report: RescoreReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    record = asdict(report)
    record["written"] = None if report.written is None else str(report.written)
    return record


def replay_verdict(path: Path) -> tuple[Verdict, ReplayReport | None]:
    try:
        report = replay_run(path, [])
    except CheckFailed as exc:
        return Verdict("replay", False, f"could not replay: {exc}", None), None
    first = None
    if report.matches:
        outcome = f"{report.reproduced} episodes: every line, head, the root and the scores as recorded"
    elif report.divergences:
        outcome = f"{len(report.divergences)} of {report.episodes} episodes diverge"
        d = report.divergences[0]
        first = f"episode {d.episode} seq {d.seq}: expected {_clip(d.expected)}; got {_clip(d.got)}"
    else:
        outcome = f"every head as recorded; the root {'matches' if report.root_matches else 'differs'}, the scores "
        outcome += "are identical" if report.scores_identical else "differ"
        first = "the scores" if report.root_matches else "the Merkle root"
    code = "the recording code" if report.same_code else "replayed with other code than the recording's"
    return Verdict("replay", report.matches, f"{outcome} ({code})", first), report


def _clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def rescore_verdict(path: Path) -> tuple[Verdict, RescoreReport | None]:
    try:
        report = rescore_recorded(path)
    except CheckFailed as exc:
        return Verdict("rescore", False, f"could not rescore: {exc}", None), None
    scorer = " (this code has the scorer at another version)" if report.scorer_changed else ""
    if report.identical:
        kind = "bit-identical values" + ("" if report.bytes_identical else " (Parquet bytes differ)")
        return Verdict("rescore", True, f"{report.rows} score rows rescored: {kind}{scorer}", None), report
    changed = sum(d.changed_episodes for d in report.diffs)
    first = report.first_difference
    where = None
    if first is not None:
        where = (
            f"episode {first.episode_id} metric {first.metric}: recorded {first.recorded}, rescored {first.rescored}"
        )
    return Verdict("rescore", False, f"{changed} score rows differ{scorer}", where), report


def repeat_verdict(report: RepeatReport) -> Verdict:
    policy = "required" if report.tokens_required else "not required: determinism off"
    outside = [f"{m.metric} {_mean(m.repeat_mean)} vs {_interval(m)}" for m in report.means if not m.inside]
    means = f"means outside the original's 95% intervals ({', '.join(outside)})" if outside else "means inside"
    summary = (f"{report.episodes} episodes ({len(report.items)} of {report.items_in_run} items): "
               f"{report.identical_tokens} identical in tokens ({policy}); {means}")  # fmt: skip
    first = report.first_divergence
    if first is None and outside:
        first = f"mean outside the original's 95% interval: {', '.join(outside)}"
    return Verdict("repeat", report.passed, summary, first)


def _mean(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def _interval(m: MeanCheck) -> str:
    return f"[{m.original_ci95[0]:.4f}, {m.original_ci95[1]:.4f}]" if m.original_ci95 else f"{m.original_mean:.4f}"


def check_run(
    path: Path,
    repeat_items: int = DEFAULT_REPEAT_ITEMS,
    overrides: Sequence[str] = (),
    keep: Path | None = None,
    dispatcher: Dispatcher | None = None,
) -> CheckReport:
    """Replay, rescore and repeat the finished run at ``path``. ``overrides``: how the repeat runs
    (``cluster=NAME``, ``cluster.*``, ``run.progress``); ``keep``: where its run directory stays (else a
    temporary directory, removed); ``dispatcher``: an open one to reuse (not closed)."""
    if repeat_items < 1:
        raise BadInput("--repeat-items", f"expected an integer >= 1, got {repeat_items}")
    run = open_finished(path)
    if keep is not None and keep.resolve().is_relative_to(path.resolve()):
        raise BadInput("--keep", f"{keep} is inside the run checked; a run directory holds nothing else")
    scratch = Path(tempfile.mkdtemp(prefix="evalrun-check-")) if keep is None else None
    try:
        plan = plan_repeat(run, repeat_items, overrides, keep or Path(str(scratch)) / "repeat")
        replay, replayed = replay_verdict(path)
        rescore, rescored = rescore_verdict(path)
        repeat_dir = execute(plan.prepared, dispatcher)
        repeated: RepeatReport | None = None
        try:
            repeated = repeat_report(run, plan, repeat_dir, kept=keep is not None)
            repeat = repeat_verdict(repeated)
        except CheckFailed as exc:  # the original's chains or rows cannot be read (verify names the damage)
            repeat = Verdict("repeat", False, f"could not compare: {exc}", None)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return CheckReport(str(path), (replay, rescore, repeat), replayed, rescored, repeated)
