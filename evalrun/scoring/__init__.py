"""Scoring: versioned scorers and normalisers, pure functions of stored outputs, found by name.

Every scorer and normaliser is registered where it is defined (``@scorer``, ``@normalizer``,
:mod:`evalrun.scoring.registry`); importing this package registers the built-in ones:

- :mod:`~evalrun.scoring.normalizers`: strip, lower, collapse_whitespace, strip_punctuation;
- :mod:`~evalrun.scoring.text`: exact_match, regex, number;
- :mod:`~evalrun.scoring.choice`: choice (letter parsing, loglikelihood);
- :mod:`~evalrun.scoring.rubric`: rubric (verdicts, aggregation, weighting);
- :mod:`~evalrun.scoring.verifier`: verifier (an agent episode's final state, by its world's verifier);
- :mod:`~evalrun.scoring.lm_eval`: lm_eval (an lm-eval task's filters and metrics, lm-eval's definitions).

All scoring code lives in this package, so the scoring hash (:mod:`evalrun.scoring.digest`)
covers it by hashing the package's files; a world's verifier lives with its world and is covered
by the verifier version the scoring context records.
"""

from __future__ import annotations

from evalrun.scoring import choice, lm_eval, normalizers, rubric, text, verifier
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.digest import scoring_hash, scoring_record
from evalrun.scoring.registry import NORMALIZERS, SCORERS, Score, Scorer, normalizer, scorer
from evalrun.scoring.table import (
    SCORES_SCHEMA,
    Scoring,
    corpus_aggregations,
    make_scorer,
    score_columns,
    score_outputs,
    scorer_version,
    stream_scores,
)

BUILTIN = (choice, lm_eval, normalizers, rubric, text, verifier)  # imported for their registrations

__all__ = [
    "NORMALIZERS",
    "SCORERS",
    "SCORES_SCHEMA",
    "Score",
    "Scorer",
    "Scoring",
    "ScoringContext",
    "corpus_aggregations",
    "make_scorer",
    "normalizer",
    "score_columns",
    "score_outputs",
    "scorer",
    "scorer_version",
    "scoring_hash",
    "scoring_record",
    "stream_scores",
]
