"""lm-eval's filters and metrics (lm-evaluation-harness 0.4, ``lm_eval/filters`` and ``lm_eval/api/metrics.py``),
as pure functions of one document's replies: what :mod:`evalrun.tasks.lm_eval` reads from a task YAML's
``filter_list`` and ``metric_list``, computed as lm-eval computes it.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.scoring.choice import argmax  # ties to the first index, as numpy's argmax
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import Row, RowScorer, Score, scorer
from evalrun.tasks.lm_eval import REGEX_DEFAULT, FilterPipeline, MetricSpec, filters, metrics

Replies = list[Any]  # one document's replies (lm-eval's K repeats), as a filter sees and returns them


def _regex(replies: Replies, regex_pattern: str = REGEX_DEFAULT, group_select: int = 0,
           fallback: str = "[invalid]") -> Replies:  # fmt: skip
    """Every match of the pattern (``findall``: a group's text, or the first non-empty group of several), the one
    ``group_select`` picks (negative from the end), stripped; ``fallback`` where nothing matches."""
    pattern = re.compile(regex_pattern)
    filtered = []
    for reply in replies:
        found = pattern.findall(reply if isinstance(reply, str) else "")
        if not found:
            filtered.append(fallback)
            continue
        match = found[group_select]
        if isinstance(match, tuple):
            groups = [g for g in match if g]
            match = groups[0] if groups else fallback
        filtered.append(match.strip())
    return filtered


FILTERS: Mapping[str, Callable[..., Any]] = {
    "regex": _regex,
    "take_first": lambda replies: replies[0],
    "remove_whitespace": lambda replies: [r.strip() for r in replies],  # lm-eval strips both ends
    "lowercase": lambda replies: [r.lower() for r in replies],
    "uppercase": lambda replies: [r.upper() for r in replies],
    # the most common reply, the first of those tied (Counter.most_common's order), as a list of one
    "majority_vote": lambda replies: [Counter(replies).most_common(1)[0][0]] if replies else [],
}


def apply_filters(pipeline: FilterPipeline, replies: Sequence[str]) -> Any:
    """A document's replies through the pipeline's steps in order (a pipeline that does not end in ``take_first``
    leaves a list, as lm-eval's does)."""
    value: Any = list(replies)
    for function, kwargs in pipeline.steps:
        value = FILTERS[function](value, **kwargs)
    return value


def exact_match(prediction: str, reference: str, regexes_to_ignore: Sequence[str] | None = None,
                ignore_case: bool = False, ignore_punctuation: bool = False,
                ignore_numbers: bool = False) -> float:  # fmt: skip
    """lm-eval's exact_match (its port of Hugging Face evaluate's): each ignored regex removed, then case, ASCII
    punctuation and digits as asked; whitespace is not stripped."""
    pair = [prediction, reference]
    for ignored in regexes_to_ignore or ():
        pair = [re.sub(ignored, "", x) for x in pair]
    if ignore_case:
        pair = [x.lower() for x in pair]
    if ignore_punctuation:
        pair = [x.translate(str.maketrans("", "", string.punctuation)) for x in pair]
    if ignore_numbers:
        pair = [x.translate(str.maketrans("", "", string.digits)) for x in pair]
    return float(pair[0].rstrip("\x00") == pair[1].rstrip("\x00"))  # numpy's strings drop trailing NULs


def choice_metrics(logprobs: Sequence[float], choices: Sequence[str], gold: int) -> dict[str, float]:
    """``acc``: the likeliest choice is the gold one; ``acc_norm``: the likeliest per character of the choice
    (its text without the target delimiter, lm-eval's ``len(choice)``)."""
    normalized = [lp / float(len(c)) for lp, c in zip(logprobs, choices, strict=True)]
    return {"acc": float(argmax(logprobs) == gold), "acc_norm": float(argmax(normalized) == gold)}


def score_generation(metric: MetricSpec, filtered: Any, reference: str) -> float:
    """One generate_until metric of a document's filtered answer (lm-eval casts the gold to the answer's type)."""
    return exact_match(str(filtered), reference, **dict(metric.kwargs))


def metric_name(metric: str, pipeline: str) -> str:
    """A score's metric name: lm-eval's ``exact_match,get-answer`` as ``exact_match/get-answer`` (the filter named
    after a slash, as a rubric's criteria are); lm-eval's default pipeline, ``none``, is left out."""
    return metric if pipeline == "none" else f"{metric}/{pipeline}"


def likelihood_metrics(logprob: float, greedy: bool) -> dict[str, float]:
    """A loglikelihood document's metrics (lm-eval's): ``perplexity``, the target's loglikelihood (the summary's
    aggregate is exp(-mean), :mod:`evalrun.stats.summary`); ``acc``, 1 when the target is the model's greedy
    continuation."""
    return {"perplexity": logprob, "acc": float(greedy)}


@scorer("lm_eval", version="1", columns=("option_logprobs", "option_greedy", "replies"))
def lm_eval(spec: ScorerConfig, context: ScoringContext) -> RowScorer:
    """An lm-eval task's metrics: generate_until, each metric of each filter pipeline's answer (``extracted``: the
    filtered answer) against the gold text; multiple_choice, acc and acc_norm of the choices' loglikelihoods
    against the gold choice (the row's target names it and every choice's text); loglikelihood, perplexity and
    acc of the target's loglikelihood and greediness."""
    record = context.lm_eval
    if record is None:
        raise BadInput("task.scorer.name", "the lm_eval scorer scores lm-eval tasks only (task=lm_eval)")
    output_type = str(record["output_type"])
    pipelines = filters(record["filter_list"])
    chosen = metrics(record["metric_list"], output_type)

    def generation(row: Row) -> list[Score]:
        scores = []
        for pipeline in pipelines:
            answer = apply_filters(pipeline, row["replies"] or [row["output"]])  # repeats: every reply
            for metric in chosen:
                value = score_generation(metric, answer, row["target"])
                scores.append(Score(metric_name(metric.metric, pipeline.name), value, str(answer)))
        return scores

    def choice(row: Row) -> list[Score]:
        target = json.loads(row["target"])
        logprobs = row["option_logprobs"]
        if logprobs is None:
            return [Score(m.metric, 0.0, None) for m in chosen]
        values = choice_metrics(logprobs, target["choices"], int(target["gold"]))
        picked = str(argmax(logprobs))
        return [Score(m.metric, values[m.metric], picked) for m in chosen]

    def likelihood(row: Row) -> list[Score]:
        logprobs, greedy = row["option_logprobs"], row["option_greedy"]
        if not logprobs or not greedy:
            raise ValueError("the row holds no loglikelihood of its target (option_logprobs and option_greedy)")
        values = likelihood_metrics(logprobs[0], greedy[0])
        return [Score(m.metric, values[m.metric], None) for m in chosen]

    return {"multiple_choice": choice, "loglikelihood": likelihood}.get(output_type, generation)
