"""Release gate on frozen digests: ``evalrun digest RUN_DIR`` and ``evalrun gate CANDIDATE BASELINE``.

The digest record has six fields: candidate name, model checkpoint hash, prompt pack hash, seed
set hash, scoring code hash, digest. The gate passes only when the two runs' digests are equal
(same prompts, decoding, seeds and scorer), they scored the same items, and the candidate's mean
exceeds the baseline's by more than the margin. Margin rules:

- ``range`` (default): ``factor`` (2) x the pooled range over the recorded seeds. Each run's
  per-trial (seed, repeat) means are taken as deviations from that run's own mean; the pooled
  range is max - min over both runs' deviations. It needs at least two trials per run.
- ``paired``: the distance from the paired difference to the lower end of its 95% interval
  (clustered over items, or the item bootstrap); passing means that lower end is above 0.

A baseline re-run under a new digest carries rebaseline.json (``evalrun rebaseline``): the decision
cites it (both digests, the reason, what changed). Blocked on differing digests, the reason says
how to re-baseline, or that the candidate was run under the digest the baseline replaced.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalrun.analysis.runs import OVERALL, Run, digest_record, load_run, pick_metric
from evalrun.errors import CheckFailed
from evalrun.records.formats import Rebaseline
from evalrun.records.seeds import derive_seed
from evalrun.rundir import layout
from evalrun.rundir.reader import read_rebaseline
from evalrun.stats.estimates import PairedEstimate, item_means, paired, trial_means

RULES = ("range", "paired")
DIGEST_PARTS = ("prompt_pack", "seed_set", "scoring")


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reason: str
    rule: str
    margin_rule: str
    metric: str
    candidate_mean: float | None
    baseline_mean: float | None
    delta: float | None
    margin: float | None
    candidate: dict[str, str]
    baseline: dict[str, str]
    paired: PairedEstimate | None
    rebaseline: dict[str, Any] | None = None  # the baseline's rebaseline.json, when it has one

    def as_record(self) -> dict[str, Any]:
        return {"format": "evalrun.gate/1", **asdict(self)}


def pooled_range(candidate: list[float], baseline: list[float]) -> float:
    """max - min over both runs' per-trial means taken as deviations from their own run's mean."""
    deviations = [v - math.fsum(vs) / len(vs) for vs in (candidate, baseline) for v in vs]
    return max(deviations) - min(deviations)


def gate(
    cand: Run, base: Run, rule: str = "range", metric: str | None = None, factor: float = 2.0,
    interval: str = "clustered",
) -> GateDecision:  # fmt: skip
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}")
    metric = pick_metric([cand, base], metric)
    rec_c, rec_b = digest_record(cand), digest_record(base)
    obs_c, obs_b = cand.observations()[(OVERALL, metric)], base.observations()[(OVERALL, metric)]
    means_c, means_b = item_means(obs_c), item_means(obs_b)
    if rule == "range":
        margin_rule = f"range: margin = {factor:g} x pooled range of per-seed means (deviations from each run's mean)"
    else:
        margin_rule = f"paired: margin = distance from delta to the lower end of its paired 95% CI ({interval})"

    rebaseline = baseline_rebaseline(base)

    def decide(passed: bool, reason: str, margin: float | None, est: PairedEstimate | None = None) -> GateDecision:
        mean_c, mean_b = (est.mean_b, est.mean_a) if est else (_mean(means_c), _mean(means_b))
        delta = est.diff if est else mean_c - mean_b
        cited = rebaseline.as_record() if rebaseline is not None else None
        return GateDecision(passed, reason, rule, margin_rule, metric, mean_c, mean_b, delta, margin, rec_c, rec_b, est,
                            cited)  # fmt: skip

    differing = [p for p in DIGEST_PARTS if rec_c[p] != rec_b[p]]
    if rec_c["digest"] != rec_b["digest"]:
        return decide(False, _digests_differ(differing, rec_c["digest"], rebaseline), None)
    if set(means_c) != set(means_b):
        only_c, only_b = len(set(means_c) - set(means_b)), len(set(means_b) - set(means_c))
        return decide(False, f"the runs scored different items ({only_c} only in candidate, {only_b} only in "
                             "baseline): same digest, different dataset or limit", None)  # fmt: skip
    est = paired(means_b, means_c, derive_seed(base.master_seed, "bootstrap", OVERALL, metric))
    if rule == "range":
        trials_c, trials_b = list(trial_means(obs_c).values()), list(trial_means(obs_b).values())
        if len(trials_c) < 2 or len(trials_b) < 2:
            return decide(False, f"the range rule needs at least 2 recorded seeds per run (candidate has "
                                 f"{len(trials_c)}, baseline {len(trials_b)}): run with seeds=five, or use "
                                 "--rule paired", None, est)  # fmt: skip
        spread = pooled_range(trials_c, trials_b)
        margin = factor * spread
        margin_rule += f" = {factor:g} x {spread:.4f} = {margin:.4f}"
    else:
        ci = est.ci95_paired_bootstrap if interval == "bootstrap" else est.ci95_paired
        if ci is None:
            return decide(False, "the paired rule needs at least 2 items", None, est)
        margin = est.diff - ci[0]
        margin_rule += f" = {margin:.4f} (CI [{ci[0]:+.4f}, {ci[1]:+.4f}])"
    if est.diff > margin:
        return decide(True, f"candidate exceeds baseline by {est.diff:+.4f} > margin {margin:.4f}", margin, est)
    reason = f"candidate exceeds baseline by {est.diff:+.4f}, not more than the margin {margin:.4f}"
    return decide(False, reason, margin, est)


def baseline_rebaseline(base: Run) -> Rebaseline | None:
    """The baseline's rebaseline.json, when it has one whose new side is the baseline (CheckFailed otherwise:
    a record of another run's re-baseline is not cited; ``evalrun verify`` names what differs)."""
    recorded = read_rebaseline(layout.RunDir(base.path))
    if recorded is not None and recorded.new.digest.digest != base.digest["digest"]:
        raise CheckFailed(f"{base.path / layout.REBASELINE}: re-baselines to digest {recorded.new.digest.digest}, "
                          f"the baseline's digest is {base.digest['digest']}")  # fmt: skip
    return recorded


def _digests_differ(differing: list[str], candidate_digest: str, rebaseline: Rebaseline | None) -> str:
    parts = ", ".join(differing) or "digest"
    if rebaseline is not None and candidate_digest == rebaseline.old.digest.digest:
        return (f"digests differ ({parts}): the candidate was run under the digest the baseline replaced (the "
                f"baseline re-baselined {rebaseline.old.run}: {rebaseline.reason}); run the candidate under the "
                "baseline's prompt pack, seed set and scorer")  # fmt: skip
    return (f"digests differ ({parts}): the runs are not comparable; if the prompt pack, seed set or scorer changed "
            "on purpose, re-run the baseline under the candidate's, record it with `evalrun rebaseline OLD_BASELINE "
            "NEW_BASELINE --reason TEXT` and gate against the new baseline")  # fmt: skip


def _mean(means: dict[Any, float]) -> float:
    return math.fsum(means.values()) / len(means)


def gate_paths(candidate: Path, baseline: Path, **kwargs: Any) -> GateDecision:
    return gate(load_run(candidate), load_run(baseline), **kwargs)
