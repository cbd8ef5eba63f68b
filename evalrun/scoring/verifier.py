"""The ``verifier`` scorer: an agent episode scored by its world's verifier from its stored final
state (docs/design.md "Agent episodes"), with no model and no world run."""

from __future__ import annotations

import json

from evalrun.config import ScorerConfig
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.worlds import score_final_state


@scorer("verifier", version="1", columns=("final_state",))
def verifier(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    def score(row: Row) -> list[Score]:
        if row["final_state"] is None:
            raise ValueError("the episode has no final state")
        metrics = score_final_state(json.loads(row["final_state"]))
        return [Score(metric, float(value), None) for metric, value in metrics.items()]

    return score
