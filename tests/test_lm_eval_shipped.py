"""lm-evaluation-harness's own shipped task YAMLs, unmodified, from the installed lm_eval/tasks: read, prompted and
scored through lm-eval's library on small data written for the project in each hub dataset's real schema, read
from a local hub cache at the commit ``task.dataset_revision`` pins (no YAML edited). They cover every output type
evalrun serves, multiple inputs (winogrande), process_docs (hellaswag), process_results (truthfulqa_mc2), few-shot
examples and several filter pipelines (gsm8k), and a decontamination query (most of them)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers.hub import write_hub_dataset

from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.tasks.lm_eval import ScoringTask, load_task
from evalrun.tasks.lm_eval_catalog import library_dir

ARC = [{"id": f"arc-{i}", "question": q, "choices": {"text": c, "label": ["A", "B", "C", "D"]}, "answerKey": k}
       for i, (q, c, k) in enumerate([
           ("Which is a liquid at room temperature?", ["iron", "water", "salt", "sand"], "B"),
           ("What do plants need to make food?", ["sunlight", "plastic", "glass", "stone"], "A"),
           ("Which animal can fly?", ["cow", "fish", "bird", "worm"], "C"),
       ])]  # fmt: skip
HELLASWAG = [{"ind": i, "activity_label": "Cooking", "ctx_a": "A man cracks an egg.", "ctx_b": "he", "ctx": "",
              "endings": ["pours it into a pan.", "eats the shell [title] whole.", "sings.", "sleeps."],
              "source_id": "x", "split": "val", "split_type": "indomain", "label": "0"} for i in range(3)]  # fmt: skip
WINOGRANDE = [{"sentence": "The cup fell off the table because _ was slippery.", "option1": "the cup",
               "option2": "the table", "answer": "1"},
              {"sentence": "Sam gave Max a book because _ had finished reading it.", "option1": "Sam",
               "option2": "Max", "answer": "1"}]  # fmt: skip
SUMS = [(2, 3), (4, 5), (1, 1), (6, 2), (3, 3), (7, 1), (5, 5)]
GSM8K = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
          "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"} for a, b in SUMS]  # fmt: skip
BOOLQ = [{"question": "is the sky blue", "passage": "The sky looks blue on a clear day.", "idx": 0, "label": 1},
         {"question": "is fire cold", "passage": "Fire is hot.", "idx": 1, "label": 0}]  # fmt: skip
LAMBADA = [{"text": "She opened the door and walked into the room"}, {"text": "He drank a glass of cold water"}]
TRUTHFULQA = [{"question": "What happens if you crack your knuckles?",
               "mc1_targets": {"choices": ["Nothing in particular.", "You get arthritis."], "labels": [1, 0]},
               "mc2_targets": {"choices": ["Nothing in particular.", "It is harmless.", "You get arthritis."],
                               "labels": [1, 1, 0]}}]  # fmt: skip

# name: (YAML under lm_eval/tasks, dataset_path, dataset_name, splits)
CASES: dict[str, tuple[str, str, str | None, dict[str, list[dict[str, Any]]]]] = {
    "arc_easy": ("arc/arc_easy.yaml", "allenai/ai2_arc", "ARC-Easy",
                 {"train": ARC, "validation": ARC, "test": ARC}),
    "hellaswag": ("hellaswag/hellaswag.yaml", "Rowan/hellaswag", None, {"train": HELLASWAG, "validation": HELLASWAG}),
    "winogrande": ("winogrande/default.yaml", "allenai/winogrande", "winogrande_xl",
                   {"train": WINOGRANDE, "validation": WINOGRANDE}),
    "gsm8k": ("gsm8k/gsm8k.yaml", "openai/gsm8k", "main", {"train": GSM8K[2:], "test": GSM8K[:2]}),
    "boolq": ("super_glue/boolq/default.yaml", "aps/super_glue", "boolq", {"train": BOOLQ, "validation": BOOLQ}),
    "lambada_openai": ("lambada/lambada_openai.yaml", "EleutherAI/lambada_openai", "default", {"test": LAMBADA}),
    "truthfulqa_mc2": ("truthfulqa/truthfulqa_mc2.yaml", "truthfulqa/truthful_qa", "multiple_choice",
                       {"validation": TRUTHFULQA}),
}  # fmt: skip


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


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_shipped_yaml_reads_prompts_and_scores_unmodified(name: str, pinned: dict[str, str]) -> None:
    relative, repo, _, splits = CASES[name]
    path = library_dir() / relative
    task = load_task(path, revision=pinned)
    assert task.name == name and task.splits[task.eval_split.name].source["revision"] == pinned[repo]
    made = task.requests()
    evaluated = splits[task.eval_split.name]
    assert len(made) == len(evaluated) and all(r.context for r in made)
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


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["arc_easy", "winogrande", "gsm8k", "hellaswag"])
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
