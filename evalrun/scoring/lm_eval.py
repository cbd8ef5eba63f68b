"""The ``lm_eval`` scorer: an lm-eval task's replies scored by lm-eval itself, one document at a time: its filter
pipelines (``filter_list``), then ``process_results`` (the task's own function, or lm-eval's per output type with
the task's metrics), as lm-eval's evaluator calls them (:class:`evalrun.tasks.lm_eval.ScoringTask`).

A score's metric is lm-eval's ``METRIC,FILTER`` written ``METRIC/FILTER`` (the filter after a slash, as a
rubric's criteria are), lm-eval's default pipeline ``none`` left out; its ``extracted`` is the filtered answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.tasks.lm_eval import metric_value, read_doc_target, scoring_task


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


@scorer("lm_eval", version="2", columns=("option_logprobs", "option_greedy", "replies"))
def lm_eval(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """An lm-eval task's metrics of each document, by lm-eval: generate_until, every reply (lm-eval's repeats)
    through each filter pipeline and the task's metrics against its document; multiple_choice and loglikelihood,
    each request's ``(logprob, is_greedy)``."""
    record, path = context.lm_eval, context.lm_eval_path
    if record is None or path is None:
        raise BadInput("task.scorer.name", "the lm_eval scorer scores lm-eval tasks only (task=lm_eval)")
    task = scoring_task(Path(path), record)
    generation = record.get("output_type") == "generate_until"

    def score(row: Row) -> list[Score]:
        _, doc = read_doc_target(row["target"])
        if generation:
            results: list[Any] = [list(row["replies"] or [row["output"]])]
        else:
            logprobs, greedy = row["option_logprobs"], row["option_greedy"]
            if not logprobs or not greedy:
                raise ValueError("the row holds no loglikelihood of its requests (option_logprobs, option_greedy)")
            results = [[(float(lp), bool(g))] for lp, g in zip(logprobs, greedy, strict=True)]
        return [Score(metric_name(metric, pipeline), metric_value(metric, value), _shown(answer))
                for metric, pipeline, value, answer in task.score(doc, results)]  # fmt: skip

    return score
