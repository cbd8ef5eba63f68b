"""Engine.loglikelihood on vLLM and hf: ranking answers, engine agreement, agreement with generate, boundaries."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from evalrun.config import BUILTIN_TASKS, MODELS_DIR, load
from evalrun.engines import LoglikelihoodRequest, SamplingSpec, loglikelihood_tokens, split_at_word_boundary

pytestmark = pytest.mark.e2e

MODEL = MODELS_DIR / "tiny-adder"
HF_SETTINGS = {"name": "hf", "dtype": None, "max_num_seqs": 64, "device": "cpu", "seed": 0}
TASK = BUILTIN_TASKS / "addition"
GREEDY = SamplingSpec(temperature=0.0, top_p=1.0, top_k=0, max_tokens=8, stop=("\n",), seed=0, logprobs=True)


def prompt(question: str) -> str:
    """The addition task's template (template.jinja), rendered."""
    return f"Q: {question}\nA:"


ITEMS = [json.loads(line) for line in (TASK / "test.jsonl").read_text().splitlines()[:10]]
# Per item: the correct answer first, then three near misses.
CANDIDATES = [
    [LoglikelihoodRequest(prompt(it["question"]), f" {int(it['answer']) + d}") for d in (0, 1, -10, 10)] for it in ITEMS
]
REQUESTS = [r for group in CANDIDATES for r in group]


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[Any]:
    """One in-process vLLM engine on the default (pinned) model and engine settings, as a worker builds it."""
    from evalrun.engines.pins import resolve_model
    from evalrun.pipeline import determinism

    config = load([])
    m, settings = config.model, config.engine
    model = resolve_model(
        model_id=m.id, path=m.path, revision=m.revision, pins=dict(m.sha256), pinned=m.pinned,
        cache_dir=m.cache_dir,
    )  # fmt: skip
    determinism.apply(config.determinism.as_record(), seed=settings.seed)  # before vLLM is imported
    from evalrun.engines.vllm import VLLMEngine

    engine = VLLMEngine(model.path, m.dtype, settings.as_record())
    yield engine
    engine.llm.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def hf_engine() -> Any:
    from evalrun.engines.hf import HFEngine

    return HFEngine(MODEL, "float32", HF_SETTINGS)


@pytest.fixture(scope="module")
def vllm_scores(vllm_engine) -> list[Any]:
    return vllm_engine.loglikelihood(REQUESTS)


@pytest.fixture(scope="module")
def hf_scores(hf_engine) -> list[Any]:
    return hf_engine.loglikelihood(REQUESTS)


class WithBos:
    """A tokenizer that adds a BOS token (the pinned one adds none), delegating everything else."""

    def __init__(self, tokenizer: Any, bos: int) -> None:
        self.tokenizer, self.bos = tokenizer, bos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return [self.bos, *ids] if add_special_tokens else ids

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


class Merging:
    """A longest-match tokenizer whose "ab" is one token, so "a" + "b" does not split at the boundary."""

    VOCAB: ClassVar[dict[str, int]] = {"ab": 10, "a": 1, "b": 2, "c": 3}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            piece = text[i : i + 2] if text[i : i + 2] in self.VOCAB else text[i]
            ids.append(self.VOCAB[piece])
            i += len(piece)
        return ids


def test_the_correct_answer_is_the_most_likely_candidate_on_vllm(vllm_scores) -> None:
    assert len(vllm_scores) == len(REQUESTS)
    groups = [vllm_scores[i : i + 4] for i in range(0, len(vllm_scores), 4)]
    best = [max(range(4), key=lambda k, g=g: g[k].logprob) for g in groups]
    assert sum(b == 0 for b in best) >= 9, [[round(s.logprob, 3) for s in g] for g in groups]
    for request, score in zip(REQUESTS, vllm_scores, strict=True):
        assert math.isfinite(score.logprob) and score.logprob <= 0
        assert len(score.token_ids) == len(request.continuation)  # character tokenizer
        assert score.prompt_tokens == len(request.context) + len(request.continuation)  # no BOS
    # a correct answer the model is sure of is greedy; a wrong one (off by one in the last digit) is not
    assert sum(g[0].greedy for g in groups) >= 9 and not any(g[1].greedy for g in groups)


def test_vllm_and_hf_agree(vllm_scores, hf_scores) -> None:
    assert [s.token_ids for s in vllm_scores] == [s.token_ids for s in hf_scores]
    assert [s.greedy for s in vllm_scores] == [s.greedy for s in hf_scores]
    assert [s.prompt_tokens for s in vllm_scores] == [s.prompt_tokens for s in hf_scores]
    gaps = [abs(v.logprob - h.logprob) for v, h in zip(vllm_scores, hf_scores, strict=True)]
    assert max(gaps) < 1e-3, max(gaps)


def test_hf_batches_and_padding_do_not_change_scores(hf_engine, hf_scores, monkeypatch) -> None:
    monkeypatch.setattr(hf_engine, "batch_size", 3)  # rows of different lengths, several batches
    small = hf_engine.loglikelihood(REQUESTS)
    alone = [hf_engine.loglikelihood([r])[0] for r in REQUESTS[:8]]
    for got in (small, alone):
        assert [s.token_ids for s in got] == [s.token_ids for s in hf_scores[: len(got)]]
        assert [s.greedy for s in got] == [s.greedy for s in hf_scores[: len(got)]]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got, hf_scores, strict=False)) < 1e-4


@pytest.mark.parametrize("name", ["vllm", "hf"])
def test_loglikelihood_is_the_sum_of_greedy_generation_logprobs(name, request) -> None:
    from evalrun.engines import GenerationRequest

    engine = request.getfixturevalue(f"{name}_engine")
    completions = engine.generate([GenerationRequest(prompt(it["question"]), GREEDY) for it in ITEMS])
    right = [(it, c) for it, c in zip(ITEMS, completions, strict=True) if c.text == f" {it['answer']}"]
    assert len(right) >= 8
    scores = engine.loglikelihood([LoglikelihoodRequest(prompt(it["question"]), c.text) for it, c in right])
    for (_, completion), score in zip(right, scores, strict=True):
        n = len(score.token_ids)
        assert score.token_ids == completion.token_ids[:n] and completion.token_ids[n] == 2  # then EOS
        assert score.greedy
        assert abs(score.logprob - sum(completion.logprobs[:n])) < 1e-4, (score, completion)


@pytest.mark.parametrize("name", ["vllm", "hf"])
def test_empty_continuation_and_empty_context(name, request) -> None:
    engine = request.getfixturevalue(f"{name}_engine")
    context = prompt("12+34")
    mixed = [
        LoglikelihoodRequest(context, " 46"),
        LoglikelihoodRequest(context, ""),  # nothing to score: the empty sum, in its place in the batch
        LoglikelihoodRequest(context, " 47"),
    ]
    first, empty, last = engine.loglikelihood(mixed)
    assert (empty.logprob, empty.token_ids, empty.greedy, empty.prompt_tokens) == (0.0, (), True, len(context))
    assert len(first.token_ids) == len(last.token_ids) == 3 and first.greedy and not last.greedy
    assert engine.loglikelihood([]) == []
    # The pinned tokenizer adds no BOS: an empty context leaves the first token unconditioned.
    with pytest.raises(ValueError, match="no BOS"):
        engine.loglikelihood([mixed[0], LoglikelihoodRequest("", "Q: 1+1")])


def test_empty_context_is_scored_after_a_bos(vllm_engine, hf_engine, monkeypatch) -> None:
    bos = hf_engine.tokenizer.bos_token_id
    assert bos == 1
    monkeypatch.setattr(hf_engine, "tokenizer", WithBos(hf_engine.tokenizer, bos))
    vllm_tokenizer = WithBos(vllm_engine.llm.get_tokenizer(), bos)
    monkeypatch.setattr(vllm_engine.llm, "get_tokenizer", lambda: vllm_tokenizer)
    requests = [
        LoglikelihoodRequest("", "Q: 12+34"),
        LoglikelihoodRequest("Q:", " 12+34"),
        LoglikelihoodRequest("", "Q:"),
    ]
    v, h = vllm_engine.loglikelihood(requests), hf_engine.loglikelihood(requests)
    plain = list(hf_engine.tokenizer.encode("Q: 12+34", add_special_tokens=False))
    assert v[0].token_ids == h[0].token_ids == tuple(plain)  # every character scored, the BOS not
    assert v[0].prompt_tokens == h[0].prompt_tokens == len(plain) + 1
    assert v[1].prompt_tokens == len(plain) + 1 and v[1].token_ids == tuple(plain[2:])
    for a, b in zip(v, h, strict=True):
        assert math.isfinite(a.logprob) and abs(a.logprob - b.logprob) < 1e-3 and a.greedy == b.greedy
    # the chain rule: P("Q: 12+34" | BOS) = P("Q:" | BOS) * P(" 12+34" | BOS "Q:")
    assert abs(v[0].logprob - (v[2].logprob + v[1].logprob)) < 1e-4
    assert v[2].token_ids == tuple(plain[:2]) and v[2].logprob < 0


def test_tokenization_boundary() -> None:
    merging = Merging()
    # split where the whole starts with the context's tokens
    assert loglikelihood_tokens(merging, LoglikelihoodRequest("ab", "c")) == ([10, 3], 1)
    # "a" + "bc" tokenizes as [ab, c]: no boundary after "a", so the continuation is tokenized alone
    assert loglikelihood_tokens(merging, LoglikelihoodRequest("a", "bc")) == ([1, 2, 3], 2)
    assert loglikelihood_tokens(merging, LoglikelihoodRequest("a", "")) == ([1], 0)
    with pytest.raises(ValueError, match="no BOS"):
        loglikelihood_tokens(merging, LoglikelihoodRequest("", "a"))
    assert loglikelihood_tokens(WithBos(merging, 0), LoglikelihoodRequest("", "abc")) == ([0, 10, 3], 2)


def test_a_contexts_trailing_whitespace_is_scored_with_the_continuation_as_lm_eval_scores_it() -> None:
    """lm-eval's ``_encode_pair``: a chat prompt ends in its generation prompt's newline, and the choice after it
    is scored as newline + choice after the context without it (its logprob then counts the newline's token)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODELS_DIR / "tiny-adder")
    chat_like = loglikelihood_tokens(tokenizer, LoglikelihoodRequest("Q: 3+83\nA:\n", "86"))
    moved = loglikelihood_tokens(tokenizer, LoglikelihoodRequest("Q: 3+83\nA:", "\n86"))
    assert chat_like == moved and chat_like[1] == len(tokenizer.encode("\n86", add_special_tokens=False))
    assert split_at_word_boundary("A: \n", "86") == ("A:", " \n86")
    assert split_at_word_boundary("A:\n", "") == ("A:\n", "")  # an empty continuation is still 0
    assert split_at_word_boundary("  ", "86") == ("  ", "86")  # nothing would be left to condition on
