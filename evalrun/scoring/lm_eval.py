"""The ``lm_eval`` scorer: an lm-eval task's replies scored by lm-eval itself, one document at a time: its filter
pipelines (``filter_list``), then ``process_results`` (the task's own function, or lm-eval's per output type with
the task's metrics), as lm-eval's evaluator calls them (:class:`evalrun.tasks.lm_eval.ScoringTask`).

A score's metric is lm-eval's ``METRIC,FILTER`` written ``METRIC/FILTER`` (the filter after a slash, as a
rubric's criteria are), lm-eval's default pipeline ``none`` left out; its ``extracted`` is the filtered answer.

A corpus metric (one lm-eval aggregates otherwise than by its mean: bleu, chrf, ter, f1, mcc, a task's own
aggregation function) has no per-document value in lm-eval: its ``process_results`` gives each document's input to
the aggregation (BLEU's reference and prediction). Its score's ``extracted`` is that input as canonical JSON, from
which the summary computes lm-eval's aggregate over every document (:mod:`evalrun.stats.summary`); its ``value``
is the aggregation over the document alone (its sentence BLEU, its own F1), the per-document figure evalrun's
item-level statistics (intervals, paired comparisons) need, and 0 where that is not a finite number.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_json
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.stats.summary import Aggregation
from evalrun.tasks.lm_eval import ScoringTask, jsonable, metric_value, read_doc_target, scoring_task


def metric_name(metric: str, pipeline: str) -> str:
    """A score's metric name: lm-eval's ``exact_match,get-answer`` as ``exact_match/get-answer`` (the filter named
    after a slash, as a rubric's criteria are); lm-eval's default pipeline, ``none``, is left out."""
    return metric if pipeline == "none" else f"{metric}/{pipeline}"


def _shown(answer: Any) -> str | None:
    """A filtered answer as the score row shows it (a loglikelihood's is lm-eval's ``(logprob, is_greedy)``)."""
    if answer is None:
        return None
    if isinstance(answer, str):
        return answer
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], bool):
        return None  # a loglikelihood result: the row's option_logprobs and option_greedy hold it
    return json.dumps(answer, ensure_ascii=False, default=str) if isinstance(answer, list | dict) else str(answer)


def _task(context: ScoringContext) -> ScoringTask:
    """The task's scoring, from the definition the context carries (a run's, wherever it scores) or the YAML at
    its path (a finished run's: rescore, verify)."""
    record, path = context.lm_eval, context.lm_eval_path
    if record is None or path is None:
        raise BadInput("task.scorer.name", "the lm_eval scorer scores lm-eval tasks only (task=lm_eval)")
    carried = context.lm_eval_files
    return scoring_task(carried.materialized() if carried is not None else Path(path), record)


def corpus(spec: ScorerConfig, context: ScoringContext) -> Mapping[str, Aggregation]:
    """The task's corpus metrics and lm-eval's aggregation of each."""
    return _task(context).corpus


def alone(aggregation: Aggregation, document: Any) -> float:
    """A corpus metric's aggregation over one document's input: its per-document value (0 where that is not a
    finite number: an aggregation undefined for a set of one)."""
    try:
        with warnings.catch_warnings():  # scikit-learn's "ill-defined" warnings, for a set of one, on every row
            warnings.simplefilter("ignore")
            value = aggregation([document])
    except Exception:  # a task's own aggregation, written for a whole set: whatever it raises on one document
        return 0.0
    value = value.item() if hasattr(value, "item") else value
    return float(value) if isinstance(value, bool | int | float) and math.isfinite(value) else 0.0


@scorer("lm_eval", version="2", columns=("option_logprobs", "option_greedy", "replies"), aggregations=corpus)
def lm_eval(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """An lm-eval task's metrics of each document, by lm-eval: generate_until, every reply (lm-eval's repeats)
    through each filter pipeline and the task's metrics against its document; multiple_choice and loglikelihood,
    each request's ``(logprob, is_greedy)``; a corpus metric's input kept for its aggregate."""
    task = _task(context)
    generation = (context.lm_eval or {}).get("output_type") == "generate_until"
    rolling = (context.lm_eval or {}).get("output_type") == "loglikelihood_rolling"
    aggregations = task.corpus

    def scored(metric: str, pipeline: str, value: Any, answer: Any) -> Score:
        name = metric_name(metric, pipeline)
        if metric not in aggregations:
            return Score(name, metric_value(metric, value), _shown(answer))
        document = json.loads(extracted := canonical_json(jsonable(value)))  # as the summary reads it back
        return Score(name, alone(aggregations[metric], document), extracted)

    def score(row: Row) -> list[Score]:
        _, doc = read_doc_target(row["target"])
        if generation:
            results: list[Any] = [list(row["replies"] or [row["output"]])]
        else:
            logprobs, greedy = row["option_logprobs"], row["option_greedy"]
            if not logprobs or not greedy:
                raise ValueError("the row holds no loglikelihood of its requests (option_logprobs, option_greedy)")
            results = ([[float(lp)] for lp in logprobs] if rolling  # lm-eval's rolling result: the loglikelihood alone
                       else [[(float(lp), bool(g))] for lp, g in zip(logprobs, greedy, strict=True)])  # fmt: skip
        return [scored(*result) for result in task.score(doc, results)]

    return score
