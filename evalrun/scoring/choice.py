"""Multiple choice: the option a model named by its letter, or the likeliest option by loglikelihood."""

from __future__ import annotations

import re
from collections.abc import Sequence

from evalrun.config import ScorerConfig
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.tasks.selection import LETTERS

_LETTER = re.compile(r"\b([A-Z])\b")


def parse_letter(text: str, order: Sequence[int]) -> int | None:
    """The original index of the option whose letter the text names first; None if it names none."""
    for match in _LETTER.finditer(text):
        position = LETTERS.index(match.group(1))
        if position < len(order):
            return order[position]
    return None


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; ties go to the lowest index."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


@scorer("choice", version="1", columns=("shuffle_order", "option_logprobs"))
def choice(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """``choice_letter`` and/or ``choice_loglikelihood`` (``task.choices.scoring``): 1 for the right option."""
    mode = context.choice_scoring

    def score(row: Row) -> list[Score]:
        target = int(row["target"])
        scores = []
        if mode in ("letter", "both"):
            picked = parse_letter(row["output"], row["shuffle_order"])
            scores.append(Score("choice_letter", float(picked == target), None if picked is None else str(picked)))
        if mode in ("loglikelihood", "both") and row["option_logprobs"] is not None:
            picked = argmax(row["option_logprobs"])
            scores.append(Score("choice_loglikelihood", float(picked == target), str(picked)))
        return scores

    return score
