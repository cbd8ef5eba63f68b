"""Rubric scores: judges' verdicts per criterion, aggregated, then weighted over the criteria.

The rubric itself (criteria, options, weights, judges) is read by :mod:`evalrun.tasks.rubric`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.scoring.choice import argmax, parse_letter
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.tasks.rubric import Criterion, Rubric


def aggregate(criterion: Criterion, verdicts: Sequence[int | None], aggregation: str) -> float | None:
    """One criterion's value from its judges' verdicts (original option indices; None: no verdict).

    Verdicts of no option and of the cannot-assess option are left out; with none left the
    criterion is not assessed (None). Majority ties go to the lowest option index.
    """
    chosen = [v for v in verdicts if v is not None and criterion.values[v] is not None]
    if not chosen:
        return None
    if aggregation == "majority":
        counts = Counter(chosen)
        best = max(counts.values())
        return criterion.values[min(v for v, n in counts.items() if n == best)]
    values = [criterion.values[v] for v in chosen]
    return float(statistics.fmean(values) if aggregation == "mean" else statistics.median(values))  # type: ignore[arg-type]


def rubric_score(rubric: Rubric, criterion_values: Mapping[str, float | None]) -> float | None:
    """Weighted mean over the assessed criteria (weights renormalised); None if none was assessed."""
    assessed = [(c.weight, criterion_values[c.id]) for c in rubric.criteria if criterion_values.get(c.id) is not None]
    if not assessed:
        return None
    return sum(w * v for w, v in assessed) / sum(w for w, _ in assessed)  # type: ignore[operator]


def verdict(judgement: Mapping[str, Any], scoring: str) -> int | None:
    """The original option index a judge chose: the letter it wrote, or its likeliest option."""
    if scoring == "letter":
        return parse_letter(judgement["output"] or "", judgement["shuffle_order"])
    logprobs = judgement["option_logprobs"]
    return argmax(logprobs) if logprobs else None


@scorer("rubric", version="1", columns=("judgements",))
def rubric(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """``rubric/<criterion>`` per assessed criterion, ``rubric`` (weighted), ``rubric_assessed`` (share)."""
    graded = context.rubric
    if graded is None:
        raise ValueError("the rubric scorer needs the task's rubric")

    def score(row: Row) -> list[Score]:
        verdicts: dict[str, list[int | None]] = {}
        for judgement in row["judgements"]:
            verdicts.setdefault(judgement["criterion"], []).append(verdict(judgement, graded.scoring))
        values = {c.id: aggregate(c, verdicts.get(c.id, []), graded.aggregation) for c in graded.criteria}
        scores = [
            Score(f"rubric/{c.id}", v, ",".join("-" if x is None else str(x) for x in verdicts.get(c.id, [])))
            for c in graded.criteria
            if (v := values[c.id]) is not None
        ]
        total = rubric_score(graded, values)
        if total is not None:
            scores.append(Score("rubric", total, None))
        scores.append(Score("rubric_assessed", sum(v is not None for v in values.values()) / len(values), None))
        return scores

    return score
