"""lm-evaluation-harness's own shipped task YAMLs, unmodified, from the installed lm_eval/tasks: read, prompted and
scored through lm-eval's library on small data written for the project in each hub dataset's real schema, read
from a local hub cache at the commit ``task.dataset_revision`` pins (no YAML edited). They cover every output type
evalrun serves, multiple inputs (winogrande), process_docs (hellaswag), process_results (truthfulqa_mc2), few-shot
examples and several filter pipelines (gsm8k), and a decontamination query (most of them)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.forgery import reseal
from helpers.hub import write_hub_dataset
from helpers.shipped import CASES, CORPUS
from lm_eval.api.metrics import bleu as lm_eval_bleu
from lm_eval.api.metrics import weighted_perplexity
from sacrebleu.metrics import BLEU as CorpusBleu

from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import ScorerConfig
from evalrun.errors import CheckFailed
from evalrun.records.canonical import sha256_hex
from evalrun.scoring import ScoringContext, corpus_aggregations, score_outputs
from evalrun.stats.summary import summarize
from evalrun.tasks.lm_eval import ScoringTask, doc_target, load_task
from evalrun.tasks.lm_eval_catalog import library_dir


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    cache = tmp_path_factory.mktemp("hub")
    pins = {repo: write_hub_dataset(cache, repo, config, splits) for _, repo, config, splits in CASES.values()}
    return cache, pins


@pytest.fixture
def pinned(hub_cache: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    cache, pins = hub_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return pins


@pytest.mark.parametrize("name", sorted(set(CASES) - set(CORPUS)))
def test_a_shipped_yaml_reads_prompts_and_scores_unmodified(name: str, pinned: dict[str, str]) -> None:
    relative, repo, _, splits = CASES[name]
    path = library_dir() / relative
    task = load_task(path, revision=pinned)
    assert task.name == name and task.splits[task.eval_split.name].source["revision"] == pinned[repo]
    made = task.requests()
    evaluated = splits[task.eval_split.name]
    rolling = task.output_type == "loglikelihood_rolling"  # a whole document, no context
    assert len(made) == len(evaluated) and all(bool(r.context) != rolling for r in made)
    scoring = ScoringTask(task.definition)
    first = made[0]
    if task.output_type == "generate_until":
        assert len(first.examples) == task.num_fewshot == 5  # gsm8k: five worked examples from train
        assert first.context.count("Question:") == 6 and first.context.endswith("Answer:")
        answer = evaluated[0]["answer"].split("#### ")[-1]
        scores = {(m, f): v for m, f, v, _ in scoring.score(first.doc, [[f" The answer is {answer}.\n#### {answer}"]])}
        assert scores == {("exact_match", "strict-match"): 1.0, ("exact_match", "flexible-extract"): 1.0}
    elif task.output_type == "loglikelihood":
        (continuation,) = first.continuations
        assert first.context + continuation == evaluated[0]["text"]
        scores = {m: v for m, _, v, _ in scoring.score(first.doc, [[(-2.5, True)]])}
        assert scores == {"perplexity": -2.5, "acc": 1}
    elif task.output_type == "loglikelihood_rolling":  # wikitext: the detokenized page, scored from its start
        (page,) = first.continuations
        assert first.context == "" and page.startswith(" = Adder =\nThe adder adds two numbers.")
        scores = {m: v for m, _, v, _ in scoring.score(first.doc, [[-50.0]])}
        original = evaluated[0]["page"]  # wikitext counts the page's words and bytes before its detokenizer
        words, size = len(re.split(r"\s+", original)), len(original.encode())
        assert scores == {"word_perplexity": (-50.0, words), "byte_perplexity": (-50.0, size),
                          "bits_per_byte": (-50.0, size)}  # fmt: skip
    else:
        gold = task.task.doc_to_target(first.doc)
        n = len(first.continuations)
        results = [[(-1.0 if i == (gold if isinstance(gold, int) else 0) else -9.0, False)] for i in range(n)]
        scores = {m: v for m, _, v, _ in scoring.score(first.doc, results)}
        # truthfulqa_mc2's process_results: the probability mass on its true answers (the first two of three)
        true_mass = (math.exp(-1) + math.exp(-9)) / (math.exp(-1) + 2 * math.exp(-9))
        assert scores["acc"] == pytest.approx(true_mass if name == "truthfulqa_mc2" else 1.0)
    if name == "winogrande":  # one context per choice, the same continuation
        assert len(set(first.contexts)) == 2 and len(set(first.continuations)) == 1
    if name == "hellaswag":  # process_docs made the prompts: the [title] artifact removed
        assert all("[title]" not in c for c in first.continuations)
        assert set(task.processed_docs_sha256) == {"validation"}  # zero-shot: the evaluated split's only


def _scored_by_evalrun_and_lm_eval(name: str, pinned: dict[str, str], replies: list[Any]) -> tuple[Any, ...]:
    """Each document of a shipped corpus-metric task scored by evalrun's lm_eval scorer, summarised, and the inputs
    lm-eval's evaluator would collect for each metric (its ``process_results``, unserialised), aggregated by
    lm-eval's own aggregation functions."""
    task = load_task(library_dir() / CASES[name][0], revision=pinned)
    made = task.requests()
    context = ScoringContext(lm_eval=task.scoring_record(), lm_eval_path=str(task.definition.path))
    spec = ScorerConfig.from_record({**ScorerConfig().as_record(), "name": "lm_eval"})
    generation = task.output_type == "generate_until"
    outputs = pa.table({
        "episode_id": [sha256_hex(str(i).encode()) for i in range(len(made))], "task": [name] * len(made),
        "item_id": [str(i) for i in range(len(made))], "seed": [0] * len(made), "repeat": [0] * len(made),
        "output": [r if generation else "" for r in replies], "target": [doc_target(i, r.doc) for i, r in
                                                                          enumerate(made)],
        "option_logprobs": [None if generation else [lp for lp, _ in r] for r in replies],
        "option_greedy": [None if generation else [g for _, g in r] for r in replies],
        "replies": [[r] if generation else None for r in replies],
    })  # fmt: skip
    scores = score_outputs(outputs, spec, context)
    summary = summarize(scores, aggregations=corpus_aggregations(spec, context))
    lm_eval_task = ScoringTask(task.definition)._built(made[0].doc)
    collected: dict[str, list[Any]] = {}
    for request, reply in zip(made, replies, strict=True):
        results = [reply] if generation else [(lp, g) for lp, g in reply]
        for metric, value in lm_eval_task.process_results(request.doc, results).items():
            collected.setdefault(metric, []).append(value)
    expected = {m: lm_eval_task.aggregation()[m](items) for m, items in collected.items()}
    return scores, summary, expected


def test_a_corpus_metric_is_aggregated_over_the_set_as_lm_eval_aggregates_it(pinned: dict[str, str]) -> None:
    """wmt16-ro-en's bleu, ter and chrf and mrpc's f1: each document's input recorded, lm-eval's aggregate in the
    summary to the bit, and each document's own value (its sentence BLEU) for evalrun's item-level statistics."""
    replies = ["The cat sleeps on a sofa.", "Today it is raining in town.", "I bought milk."]
    scores, summary, expected = _scored_by_evalrun_and_lm_eval("wmt16-ro-en", pinned, replies)
    estimates = summary["tasks"]["wmt16-ro-en"]
    assert {m: (e["aggregation"], e["aggregate"]) for m, e in estimates.items()} == {
        m: (m, value) for m, value in expected.items()}  # fmt: skip
    assert 0 < expected["bleu"] < 100 and expected["ter"] > 0
    first = {r["metric"]: r for r in scores.to_pylist() if r["item_id"] == "0"}
    assert json.loads(first["bleu"]["extracted"]) == [" The cat sleeps on the sofa.", "The cat sleeps on a sofa."]
    assert first["bleu"]["value"] == pytest.approx(CorpusBleu().corpus_score(
        ["The cat sleeps on a sofa."], [[" The cat sleeps on the sofa."]]).score)  # fmt: skip
    # mrpc: f1 over (gold, prediction) pairs; acc stays a mean, with no aggregate
    replies_ll = [[(-1.0, False), (-0.5, True)], [(-0.5, True), (-1.0, False)], [(-2.0, False), (-0.1, True)]]
    scores, summary, expected = _scored_by_evalrun_and_lm_eval("mrpc", pinned, replies_ll)
    estimates = summary["tasks"]["mrpc"]
    assert estimates["f1"]["aggregation"] == "f1_score" and estimates["f1"]["aggregate"] == expected["f1"] == 1.0
    assert "aggregation" not in estimates["acc"] and estimates["acc"]["mean"] == 1.0


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["arc_easy", "winogrande", "gsm8k", "hellaswag", "wmt16-ro-en", "wikitext"])
def test_a_shipped_yaml_runs_verifies_and_rescores_on_the_engine(
    name: str, pinned: dict[str, str], run_eval: Callable[..., Path]
) -> None:
    relative, repo, _, _ = CASES[name]
    # the tiny model's context is 128 tokens: gsm8k's five examples are cut on the left
    run = run_eval("task=lm_eval", f"task.path={library_dir() / relative}", "task.on_overlong=truncate_left",
                   f"+task.dataset_revision={{{repo}: {pinned[repo]}}}", "decoding.max_tokens=16")  # fmt: skip
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    assert scores and all(s.get("error") is None for s in scores)
    assert verify_run(run).scores == "recomputed"
    assert rescore_run(run, []).bytes_identical
    if name in CORPUS:  # the aggregate recomputed by verify from the recorded inputs, by lm-eval's function
        summary = json.loads((run / "summary.json").read_text())
        inputs = [json.loads(s["extracted"]) for s in scores if s["metric"] == "bleu"]
        assert summary["tasks"][name]["bleu"]["aggregate"] == lm_eval_bleu(inputs)
        forged = {**summary, "tasks": {name: {**summary["tasks"][name], "bleu": {
            **summary["tasks"][name]["bleu"], "aggregate": 99.0}}}}  # fmt: skip
        (run / "summary.json").write_text(json.dumps(forged))
        reseal(run)  # every hash made to match: only the recomputed aggregate tells
        with pytest.raises(CheckFailed, match=r"summary\.json: does not match the evalrun\.summary/5 summary"):
            verify_run(run)
    if name == "wikitext":  # rolling: the long page in several windows of the 128-token context, each token once
        summary = json.loads((run / "summary.json").read_text())
        inputs = [json.loads(s["extracted"]) for s in scores if s["metric"] == "word_perplexity"]
        assert summary["tasks"][name]["word_perplexity"]["aggregate"] == pytest.approx(weighted_perplexity(inputs))
        entries = [
            json.loads(line) for part in (run / "log").glob("part-*.jsonl") for line in part.read_text().splitlines()
        ]
        calls = [e for e in entries if e["kind"] == "model"]
        assert {c["request"]["op"] for c in calls} == {"loglikelihood_rolling"}
        longest = max(calls, key=lambda c: len(c["response"]["token_ids"]))
        assert len(longest["response"]["token_ids"]) > 128 and verify_run(run).scores == "recomputed"
