"""``evalrun replay RUN_DIR --live agent|user``: repeat a conversation run with one side held fixed
(docs/design.md "Holding one side fixed").

Run-to-run swings of a conversational benchmark mix two sources: the agent and the simulated user. A held repeat
serves one side's recorded replies (``task.world.held``: reply by reply, in order, whatever the other side says)
while the other side runs live on its engine, so the repeat's differences from the original are the live side's
alone. Each repeat is a real run directory (made by the runner, verified like any run); ``--draws N`` makes N
repeats whose live side samples with fresh seeds (master seeds drawn from the run's own, purpose ``redraw``), and
``--draws 0`` one repeat with the run's own seeds (the live side's nondeterminism on this platform: another batch
size, engine or machine).

The report pairs episodes by task, item, seed and repeat (a redraw has other episode ids) and gives, per repeat and
over all of them: the live side's replies identical to the original's (episodes, and TARr over items), the held
turns whose prompt the recording did not expect (the live side said something else, so the held reply answers a
conversation it was not made for; counted, and the episode's first divergence names it), episodes that failed
because the live side asked for more held turns than were recorded, the first divergence per episode (call, side,
turn), and the main metric's mean per run with its spread (best minus worst, the original included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalrun.analysis.runs import OVERALL, Run, load_run
from evalrun.analysis.sides import (
    Conversation,
    FirstDivergence,
    SideAgreement,
    first_divergence,
    match_by_key,
    read_conversations,
    side_agreement,
)
from evalrun.config import load_stored, validate
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import Prepared, check_destination, execute, open_for, prepare
from evalrun.records.formats import HELD_FORMAT
from evalrun.records.seeds import MASTER_SEED_LIMIT, derive_seed
from evalrun.rundir.reader import open_finished
from evalrun.stats.estimates import estimate

HELD = {"agent": "user", "user": "agent"}  # the live side -> the side held fixed
REDRAW_PURPOSE = "redraw"  # derive_seed(master, "redraw", k) % 2**53: repeat k's master seed (--draws)


def redraw_master(master: int, k: int) -> int:
    """The master seed of the ``k``-th fresh draw (k >= 1) of a run with ``master``: a seed the run never used, the
    same on every machine."""
    return derive_seed(master, REDRAW_PURPOSE, k) % MASTER_SEED_LIMIT


@dataclass(frozen=True)
class HeldEpisode:
    task: str
    item_id: str
    seed: int
    repeat: int
    original: str  # the original episode's id
    repeated: str  # the repeat's
    live_identical: bool  # the live side's replies are the original's, call for call
    live_calls: tuple[int, int]  # the live side's calls in the original and the repeat
    unexpected: int  # held turns whose prompt the original's did not match
    first_divergence: FirstDivergence | None
    values: tuple[float | None, float | None]  # the metric in the original and the repeat
    failed: str | None  # why the repeat's episode failed (the held side ran out of recorded replies)


@dataclass(frozen=True)
class RepeatSummary:
    run_dir: str
    master: int
    episodes: int
    live_identical: int
    unexpected_turns: int
    episodes_with_unexpected: int
    failed: int
    flipped: int  # episodes whose 0/1 metric changed
    mean: float | None
    per_episode: tuple[HeldEpisode, ...]


@dataclass(frozen=True)
class HeldReport:
    original: str
    live: str
    held: str
    metric: str
    overrides: tuple[str, ...]
    original_mean: float | None
    repeats: tuple[RepeatSummary, ...]
    sides: dict[str, SideAgreement]  # over the original and every repeat
    spread: float | None  # best minus worst mean, the original's included

    def as_record(self) -> dict[str, Any]:
        return {"format": HELD_FORMAT, **asdict(self)}


def _refusal(exc: BadInput, live: str) -> BadInput:
    """A config check of the held side, said as the command's option."""
    if exc.where == "task.world.held.side":
        other = "a model-played user (task.world.user=model)" if live == "agent" else "a model agent"
        return BadInput("--live", f"{live}: the run has no {HELD[live]} replies to hold: it needs {other}; "
                                  "a plain repeat (evalrun check) measures the rest")  # fmt: skip
    return exc


def plan_held(path: Path, live: str, draws: int, overrides: Sequence[str]) -> list[Prepared]:
    """Every repeat, checked and planned before any engine loads (a BadInput names what is wrong)."""
    if live not in HELD:
        raise BadInput("--live", f"expected agent or user, got {live!r}")
    if draws < 0:
        raise BadInput("--draws", f"expected an integer >= 0, got {draws}")
    run = open_finished(path)
    held = [f"task.world.held.side={HELD[live]}", f"task.world.held.run={run.path.resolve()}"]
    master = load_run(run.path).master_seed
    masters = [None] if draws == 0 else [redraw_master(master, k) for k in range(1, draws + 1)]
    plans = []
    for seed in masters:
        given = [*overrides, *held, *([f"seeds.master={seed}"] if seed is not None else [])]
        try:
            config = validate(load_stored(run.config, given, groups=("cluster",)))  # cluster=NAME, as check takes it
            check_destination(config)
            plans.append(prepare(config))
        except BadInput as exc:
            raise _refusal(exc, live) from None
    if any(p.worker_spec != plans[0].worker_spec for p in plans):
        raise BadInput("OVERRIDES", "every repeat runs on the same engines: the overrides must not differ by draw")
    return plans


def held_repeats(path: Path, live: str, draws: int = 0, overrides: Sequence[str] = (), metric: str | None = None,
                 dispatcher: Dispatcher | None = None) -> HeldReport:  # fmt: skip
    """Run the held repeats of the finished conversation run at ``path`` and compare them with it."""
    plans = plan_held(path, live, draws, overrides)
    own = dispatcher is None
    dispatcher = open_for(plans[0]) if dispatcher is None else dispatcher
    try:
        dirs = [execute(p, dispatcher) for p in plans]
    finally:
        if own:
            dispatcher.close()
    return held_report(path, dirs, live, metric, tuple(overrides))


def held_report(original: Path, repeats: Sequence[Path], live: str, metric: str | None = None,
                overrides: tuple[str, ...] = ()) -> HeldReport:  # fmt: skip
    """The repeats of ``original`` with ``live``'s side live compared with it (pure over the run directories)."""
    runs = [load_run(original), *(load_run(p) for p in repeats)]
    metric = metric or ("pass" if all("pass" in r.metrics for r in runs) else None)
    if metric is None or any(metric not in r.metrics for r in runs):
        shared = sorted(set.intersection(*(set(r.metrics) for r in runs)))
        raise BadInput("--metric", f"expected one of the runs' shared metrics {shared}, got {metric!r}")
    conversations = [read_conversations(r.path) for r in runs]
    means = [_mean(r, metric) for r in runs]
    summaries = []
    for k, (run, talk) in enumerate(zip(runs[1:], conversations[1:], strict=True), start=1):
        episodes = _episodes(runs[0], run, conversations[0], talk, live, metric)
        summaries.append(RepeatSummary(
            run_dir=str(run.path), master=run.master_seed, episodes=len(episodes),
            live_identical=sum(e.live_identical for e in episodes),
            unexpected_turns=sum(e.unexpected for e in episodes),
            episodes_with_unexpected=sum(e.unexpected > 0 for e in episodes),
            failed=sum(e.failed is not None for e in episodes),
            flipped=sum(e.values[0] != e.values[1] for e in episodes if None not in e.values),
            mean=means[k], per_episode=tuple(episodes),
        ))  # fmt: skip
    present = [m for m in means if m is not None]
    return HeldReport(
        original=str(original), live=live, held=HELD[live], metric=metric, overrides=overrides,
        original_mean=means[0], repeats=tuple(summaries), sides=side_agreement(match_by_key(conversations)),
        spread=max(present) - min(present) if present else None,
    )  # fmt: skip


def _mean(run: Run, metric: str) -> float | None:
    observations = run.observations().get((OVERALL, metric))
    return estimate(observations, "bounded").mean if observations else None


def _episodes(original: Run, repeat: Run, before: dict[str, Conversation], after: dict[str, Conversation],
              live: str, metric: str) -> list[HeldEpisode]:  # fmt: skip
    values = [_values(r, metric) for r in (original, repeat)]
    failures = _failures(repeat)
    held = HELD[live]
    found = []
    for a, b in match_by_key([before, after]):
        old_live, new_live = a.side(live), b.side(live)
        unexpected = sum(x.prompt_sha256 != y.prompt_sha256 for x, y in zip(a.side(held), b.side(held), strict=False))
        task, item, seed, repeat_index = a.key
        found.append(HeldEpisode(
            task=task, item_id=item, seed=seed, repeat=repeat_index, original=a.episode_id, repeated=b.episode_id,
            live_identical=[(c.text, c.error) for c in old_live] == [(c.text, c.error) for c in new_live],
            live_calls=(len(old_live), len(new_live)), unexpected=unexpected,
            first_divergence=first_divergence([a.calls, b.calls]),
            values=(values[0].get(a.episode_id), values[1].get(b.episode_id)), failed=failures.get(b.episode_id),
        ))  # fmt: skip
    return found


def _values(run: Run, metric: str) -> dict[str, float]:
    cols = run.scores.select(["episode_id", "metric", "value"]).to_pydict()
    return {e: v for e, m, v in zip(cols["episode_id"], cols["metric"], cols["value"], strict=True) if m == metric}


def _failures(run: Run) -> dict[str, str]:
    if "error" not in run.scores.column_names:
        return {}
    cols = run.scores.select(["episode_id", "error"]).to_pydict()
    return {e: err for e, err in zip(cols["episode_id"], cols["error"], strict=True) if err}
