"""Scorers of an output's text against the item's target: exact match, regex, number."""

from __future__ import annotations

import re

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, normalizer_chain, scorer

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


@scorer("exact_match", version="1")
def exact_match(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    norm = normalizer_chain(spec.normalize)

    def score(row: Row) -> list[Score]:
        got = norm(row["output"])
        return [Score("exact_match", float(got == norm(row["target"])), got)]

    return score


@scorer("regex", version="1")
def regex(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """The answer is group ``task.scorer.group`` of the first match of ``task.scorer.pattern``."""
    norm = normalizer_chain(spec.normalize)
    if not spec.pattern:
        raise BadInput("task.scorer.pattern", "the regex scorer needs a pattern")
    try:
        pattern = re.compile(spec.pattern)
    except re.error as exc:
        raise BadInput("task.scorer.pattern", f"not a valid regular expression ({exc})") from exc
    group = spec.group
    if not 0 <= group <= pattern.groups:
        raise BadInput("task.scorer.group", f"expected a group of the pattern (0 to {pattern.groups}), got {group}")

    def score(row: Row) -> list[Score]:
        match = pattern.search(row["output"])
        if match is None:
            return [Score("regex_match", 0.0, None)]
        got = norm(match.group(group))
        return [Score("regex_match", float(got == norm(row["target"])), got)]

    return score


@scorer("number", version="1")
def number(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """The first (or last: ``task.scorer.extract``) number in the output, within ``tolerance`` of the target."""
    pick, tolerance = spec.extract, spec.tolerance

    def score(row: Row) -> list[Score]:
        found = _NUMBER.findall(row["output"])
        if not found:
            return [Score("number_match", 0.0, None)]
        got = found[0] if pick == "first" else found[-1]
        try:
            ok = abs(float(got) - float(row["target"])) <= tolerance
        except ValueError:
            ok = False
        return [Score("number_match", float(ok), got)]

    return score
