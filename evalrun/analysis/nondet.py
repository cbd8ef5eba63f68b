"""``evalrun nondet RUN RUN ...``: measured nondeterminism over runs with equal digests.

The runs asked the model the same questions with the same seeds (equal digests, matched by
episode id), so any difference between their outputs comes from what differs between them:
batch size, engine, dtype, hardware, determinism flags. Definitions (after Atil et al., "LLM
Stability: A detailed analysis with some surprises", 2024), over N runs:

- TARr@N: share of items whose N raw outputs are all identical (every episode of the item);
- TARa@N: the same on parsed answers (the scorer's ``extracted`` value);
- distinct completions: the number of different raw outputs an episode got over the N runs;
- first divergent token: the first position where the N token sequences are not all equal;
- max |logprob difference| before divergence: over positions where all N chose the same token;
- accuracy per run (mean of per-item means); best/worst = max/min over runs, spread = best - worst;
  best/worst possible: an episode counts its best (any run right) / worst (all runs right) value.

Beside them, per run, each worker's batch-invariance canary as its manifest records it
(docs/nondeterminism.md "Canary"): whether the engine was batch-invariant when the worker started. For agent
episodes, whose output rows hold no text, the agent's and a model-played simulated user's calls are read from the
chains and measured apart (:mod:`evalrun.analysis.sides`): per side, episodes and items whose replies are
identical over the runs, and the side each diverging episode diverged on first.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from evalrun.analysis.compare import manifest_diff
from evalrun.analysis.runs import Run, load_run, pick_metric
from evalrun.analysis.sides import SideAgreement, match_by_episode, read_conversations, side_agreement
from evalrun.episodes import kind_of_manifest
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash
from evalrun.records.formats import NONDET_FORMAT

SETTING_CATEGORIES = ("engine", "determinism", "hardware", "software", "dispatch")
OUTPUT_COLUMNS = ["episode_id", "task", "item_id", "output", "token_ids", "token_logprobs", "batch_size"]


@dataclass(frozen=True)
class EpisodeOutputs:
    """One episode as recorded by each of the N runs."""

    task: str
    item_id: str
    outputs: tuple[str, ...]
    answers: tuple[str | None, ...]
    values: tuple[float, ...]
    token_ids: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float | None, ...], ...]


@dataclass(frozen=True)
class EpisodeNondet:
    identical_raw: bool
    identical_answer: bool
    distinct: int
    first_divergence: int | None  # None: all N token sequences equal
    max_abs_logprob_diff: float | None  # None: no position with a logprob from every run


@dataclass(frozen=True)
class ItemNondet:
    task: str
    item_id: str
    episodes: int
    identical_raw: bool
    identical_answer: bool
    distinct: int  # most distinct completions of any of its episodes
    first_divergence: int | None
    max_abs_logprob_diff: float | None


@dataclass(frozen=True)
class SettingDiff:
    category: str
    field: str
    values: tuple[Any, ...]  # one per run, in run order


@dataclass(frozen=True)
class WorkerCanary:
    """One worker's canary as a run's manifest records it."""

    run: int  # index in the report's runs
    worker: str
    status: str  # "invariant", "not invariant", "not run" (disabled or not possible: see the run's
    # determinism notes) or "not recorded" (a run made before the canary existed)
    max_abs_logprob_diff: float | None
    batch_sizes: tuple[int, ...]
    first_mismatch: dict[str, Any] | None


def worker_canaries(index: int, manifest: dict[str, Any]) -> tuple[WorkerCanary, ...]:
    """The canaries of one run's workers (its manifest's ``workers[].canary``)."""
    found = []
    for w in manifest.get("workers") or []:
        name = str(w.get("worker"))
        if "canary" not in w:
            found.append(WorkerCanary(index, name, "not recorded", None, (), None))
            continue
        c = w["canary"]
        if c is None:
            found.append(WorkerCanary(index, name, "not run", None, (), None))
            continue
        status = "invariant" if c["invariant"] else "not invariant"
        found.append(WorkerCanary(index, name, status, c["max_abs_logprob_diff"], tuple(c["batch_sizes"]),
                                  c["first_mismatch"]))  # fmt: skip
    return tuple(found)


@dataclass(frozen=True)
class NondetReport:
    runs: tuple[str, ...]
    metric: str
    n_runs: int
    items: int
    episodes: int
    unmatched_episodes: int  # in some runs but not all: left out
    tarr: float
    tara: float
    distinct_mean: float
    distinct_max: int
    distinct_histogram: dict[str, int]  # distinct completions -> episodes
    diverged_episodes: int
    first_divergence_min: int | None
    first_divergence_median: float | None
    max_abs_logprob_diff: float | None
    median_max_abs_logprob_diff: float | None
    accuracy: tuple[float, ...]  # per run
    accuracy_best: float
    accuracy_worst: float
    accuracy_spread: float
    accuracy_best_possible: float
    accuracy_worst_possible: float
    batch_sizes: tuple[tuple[int, ...], ...]  # per run: the dispatch batch sizes its rows came in
    settings: tuple[SettingDiff, ...]
    per_item: tuple[ItemNondet, ...]
    canaries: tuple[WorkerCanary, ...] = ()  # every worker of every run, in run order
    # agent episodes: the agent's and a model-played user's calls measured apart, from the chains (None: not agent
    # episodes, whose output rows say it all)
    sides: dict[str, SideAgreement] | None = None
    # a held repeat beside its original: by run, the side held fixed and the digest of the run it was served from
    held: dict[str, dict[str, str]] | None = None

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        if record["held"] is None:  # left out otherwise: the records of runs with equal digests are as before
            del record["held"]
        return {"format": NONDET_FORMAT, **record}


@dataclass(frozen=True)
class TokenAgreement:
    first_divergence: int | None  # None: all N token sequences equal
    max_abs_logprob_diff: float | None  # None: no position before it with a logprob from every run


def token_agreement(
    token_ids: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float | None]]
) -> TokenAgreement:  # fmt: skip
    """N token sequences of one generation (one per run) and their logprobs: the first position where
    they are not all equal (the shorter length when one is a prefix of another) and the largest
    |logprob difference| over the positions before it where every run has a logprob."""
    shortest = min(len(s) for s in token_ids)
    first = next((j for j in range(shortest) if len({s[j] for s in token_ids}) > 1), None)
    if first is None and len({len(s) for s in token_ids}) > 1:
        first = shortest
    agree = shortest if first is None else first
    worst: float | None = None
    for j in range(agree):
        column = [lp[j] for lp in logprobs if j < len(lp)]
        if len(column) == len(logprobs) and all(v is not None for v in column):
            finite = [float(v) for v in column if v is not None]
            gap = max(finite) - min(finite)
            worst = gap if worst is None else max(worst, gap)
    return TokenAgreement(first, worst)


def agreement_rate(identical_by_item: Mapping[Any, Sequence[bool]]) -> float:
    """TAR: the share of items all of whose episodes are identical over the N runs."""
    return sum(all(flags) for flags in identical_by_item.values()) / len(identical_by_item)


def episode_nondet(e: EpisodeOutputs) -> EpisodeNondet:
    tokens = token_agreement(e.token_ids, e.logprobs)
    return EpisodeNondet(
        identical_raw=len(set(e.outputs)) == 1,
        identical_answer=len(set(e.answers)) == 1,
        distinct=len(set(e.outputs)),
        first_divergence=tokens.first_divergence,
        max_abs_logprob_diff=tokens.max_abs_logprob_diff,
    )


def _max_optional(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min_optional(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _item_mean_accuracy(episodes: list[EpisodeOutputs], pick: Any) -> float:
    by_item: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in episodes:
        by_item[(e.task, e.item_id)].append(pick(e.values))
    return math.fsum(math.fsum(v) / len(v) for v in by_item.values()) / len(by_item)


def analyse(
    episodes: list[EpisodeOutputs], runs: tuple[str, ...], metric: str, unmatched: int = 0,
    settings: tuple[SettingDiff, ...] = (), batch_sizes: tuple[tuple[int, ...], ...] = (),
    canaries: tuple[WorkerCanary, ...] = (),
) -> NondetReport:  # fmt: skip
    """The report over episodes matched across N runs (pure: no files)."""
    if not episodes:
        raise ValueError("no episode is in every run")
    n = len(runs)
    per_episode = [(e, episode_nondet(e)) for e in episodes]
    by_item: dict[tuple[str, str], list[EpisodeNondet]] = defaultdict(list)
    for e, nd in per_episode:
        by_item[(e.task, e.item_id)].append(nd)
    items = tuple(
        ItemNondet(
            task=task,
            item_id=item,
            episodes=len(nds),
            identical_raw=all(nd.identical_raw for nd in nds),
            identical_answer=all(nd.identical_answer for nd in nds),
            distinct=max(nd.distinct for nd in nds),
            first_divergence=_min_optional([nd.first_divergence for nd in nds]),
            max_abs_logprob_diff=_max_optional([nd.max_abs_logprob_diff for nd in nds]),
        )
        for (task, item), nds in sorted(by_item.items())
    )
    nds = [nd for _, nd in per_episode]
    divergences = [nd.first_divergence for nd in nds if nd.first_divergence is not None]
    gaps = [nd.max_abs_logprob_diff for nd in nds if nd.max_abs_logprob_diff is not None]
    accuracy = tuple(_item_mean_accuracy(episodes, lambda v, k=k: v[k]) for k in range(n))
    return NondetReport(
        runs=runs,
        metric=metric,
        n_runs=n,
        items=len(items),
        episodes=len(episodes),
        unmatched_episodes=unmatched,
        tarr=agreement_rate({k: [nd.identical_raw for nd in v] for k, v in by_item.items()}),
        tara=agreement_rate({k: [nd.identical_answer for nd in v] for k, v in by_item.items()}),
        distinct_mean=math.fsum(nd.distinct for nd in nds) / len(nds),
        distinct_max=max(nd.distinct for nd in nds),
        distinct_histogram={str(k): v for k, v in sorted(Counter(nd.distinct for nd in nds).items())},
        diverged_episodes=len(divergences),
        first_divergence_min=min(divergences) if divergences else None,
        first_divergence_median=float(statistics.median(divergences)) if divergences else None,
        max_abs_logprob_diff=max(gaps) if gaps else None,
        median_max_abs_logprob_diff=float(statistics.median(gaps)) if gaps else None,
        accuracy=accuracy,
        accuracy_best=max(accuracy),
        accuracy_worst=min(accuracy),
        accuracy_spread=max(accuracy) - min(accuracy),
        accuracy_best_possible=_item_mean_accuracy(episodes, max),
        accuracy_worst_possible=_item_mean_accuracy(episodes, min),
        batch_sizes=batch_sizes,
        settings=settings,
        per_item=items,
        canaries=canaries,
    )


def setting_diffs(runs: list[Run]) -> tuple[SettingDiff, ...]:
    """Recorded settings (engine, determinism, hardware, software, dispatch) that differ between runs."""
    fields: dict[str, str] = {}
    for other in runs[1:]:
        for d in manifest_diff(runs[0].manifest, other.manifest):
            if d.category in SETTING_CATEGORIES:
                fields[d.field] = d.category
    diffs = []
    for field, category in sorted(fields.items(), key=lambda kv: (SETTING_CATEGORIES.index(kv[1]), kv[0])):
        values = []
        for run in runs:
            value: Any = run.manifest
            for part in field.split("."):
                if isinstance(value, list) and part.isdigit() and int(part) < len(value):
                    value = value[int(part)]
                else:
                    value = value.get(part) if isinstance(value, dict) else None
            values.append(value)
        diffs.append(SettingDiff(category, field, tuple(values)))
    return tuple(diffs)


def _check_digests(runs: list[Run]) -> dict[str, dict[str, str]] | None:
    """Every run has the first's digest, or differs from it only by a side held fixed (``task.world.held``): a held
    repeat beside its original, or two repeats holding the same run (a BadInput names the parts that differ).
    The held runs, by path, with the side held and the digest of the run it was served from (None: no run held)."""
    first = runs[0]
    held: dict[str, dict[str, str]] = {}
    for run in runs[1:]:
        if run.digest["digest"] == first.digest["digest"]:
            continue
        if not _only_the_held_side_differs(first, run):
            parts = [p for p in ("prompt_pack", "seed_set", "scoring") if run.digest[p] != first.digest[p]]
            raise BadInput(
                str(run.path),
                f"digest {run.digest['digest'][:12]} differs from {first.path}'s {first.digest['digest'][:12]} "
                f"({', '.join(parts)}): nondet compares runs of the same prompts, seeds and scorer only (or a held "
                "repeat beside the run it held)",
            )
        for one in (first, run):
            side = _held(one)
            if side is not None:
                held[str(one.path)] = {"side": str(side["side"]), "from_digest": str(side["digest"])}
    return held or None


def _held(run: Run) -> dict[str, Any] | None:
    """The side a run held fixed, as its prompt-pack digest part records it (``world.held``), or None."""
    world = ((run.manifest.get("digest_inputs") or {}).get("prompt_pack") or {}).get("world")
    held = world.get("held") if isinstance(world, dict) else None
    return held if isinstance(held, dict) else None


def _without_held(run: Run) -> str | None:
    """The run's prompt-pack digest part as it would be had it held nothing."""
    inputs = (run.manifest.get("digest_inputs") or {}).get("prompt_pack")
    if not isinstance(inputs, dict) or not isinstance(inputs.get("world"), dict):
        return None
    return canonical_hash({**inputs, "world": {k: v for k, v in inputs["world"].items() if k != "held"}})


def _only_the_held_side_differs(a: Run, b: Run) -> bool:
    """The two runs differ by a held side only: the same seeds and scoring, the same prompts but for what was held,
    and what was held recorded by a run of this very plan (the other run, or the run both held)."""
    if any(a.digest[p] != b.digest[p] for p in ("seed_set", "scoring")):
        return False
    held_a, held_b = _held(a), _held(b)
    if held_a is None and held_b is None:
        return False
    unheld = _without_held(a)
    if unheld is None or unheld != _without_held(b):
        return False
    if held_a is not None and held_b is not None:
        return held_a["digest"] == held_b["digest"] and held_a["side"] == held_b["side"]
    held, other = (held_a, b) if held_a is not None else (held_b, a)
    assert held is not None
    return held["digest"] == other.digest["digest"]


def nondet_runs(runs: list[Run], metric: str | None = None) -> NondetReport:
    if len(runs) < 2:
        raise BadInput("RUN", "nondet needs two or more runs")
    held = _check_digests(runs)
    metric = pick_metric(runs, metric)
    tables = []
    for run in runs:
        out = run.read_outputs(OUTPUT_COLUMNS).to_pydict()
        scores = run.scores.filter([m == metric for m in run.scores.column("metric").to_pylist()])
        score_by = dict(zip(scores.column("episode_id").to_pylist(),
                            zip(scores.column("value").to_pylist(), scores.column("extracted").to_pylist(),
                                strict=True), strict=True))  # fmt: skip
        rows = {}
        for i, eid in enumerate(out["episode_id"]):
            rows[eid] = (out["task"][i], out["item_id"][i], out["output"][i], tuple(out["token_ids"][i]),
                         tuple(out["token_logprobs"][i]), score_by[eid])  # fmt: skip
        tables.append((rows, tuple(sorted(set(out["batch_size"])))))
    common = set.intersection(*(set(rows) for rows, _ in tables))
    everywhere = set.union(*(set(rows) for rows, _ in tables))
    episodes = []
    for eid in sorted(common):
        recs = [rows[eid] for rows, _ in tables]
        episodes.append(EpisodeOutputs(
            task=recs[0][0], item_id=recs[0][1],
            outputs=tuple(r[2] for r in recs), answers=tuple(r[5][1] for r in recs),
            values=tuple(r[5][0] for r in recs), token_ids=tuple(r[3] for r in recs),
            logprobs=tuple(r[4] for r in recs),
        ))  # fmt: skip
    report = analyse(
        episodes, tuple(str(r.path) for r in runs), metric, unmatched=len(everywhere - common),
        settings=setting_diffs(runs), batch_sizes=tuple(b for _, b in tables),
        canaries=tuple(c for k, run in enumerate(runs) for c in worker_canaries(k, run.manifest)),
    )  # fmt: skip
    if kind_of_manifest(runs[0].manifest).transcribed:  # agent episodes: their calls are in the chains, not the rows
        report = replace(report, sides=side_agreement(match_by_episode([read_conversations(r.path) for r in runs])))
    return replace(report, held=held) if held is not None else report


def nondet_paths(paths: list[Path], metric: str | None = None) -> NondetReport:
    return nondet_runs([load_run(p) for p in paths], metric)
