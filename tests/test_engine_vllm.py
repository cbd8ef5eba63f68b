"""evalrun's vLLM adapter on the real engine: what it returns is what raw ``LLM.generate`` returns, while it
spares vLLM the work evalrun never reads (docs/design.md "Ray's crossings")."""

from __future__ import annotations

import pytest

from evalrun.config import load
from evalrun.engines import GenerationRequest
from evalrun.pipeline.dispatch import InlineDispatcher
from evalrun.pipeline.runner import prepare

pytestmark = pytest.mark.e2e


def test_the_adapter_returns_what_raw_vllm_returns_without_decoding_logprob_text(
    inline_dispatcher: InlineDispatcher,
) -> None:
    from vllm import SamplingParams

    engine = inline_dispatcher.worker.engine
    episodes = list(prepare(load(["limit=8", "seeds.set=[0,1]", "decoding=sample"])).episodes)
    requests = [GenerationRequest(prompt=e.prompt, sampling=e.sampling, episode_id=e.episode_id) for e in episodes]

    ids = engine.submit(requests)
    states = engine.llm.llm_engine.output_processor.request_states.values()
    assert len(states) == len(requests)
    # the saving is in force: a vLLM that renamed what it decodes with would show here, not only in a benchmark
    assert all(state.logprobs_processor.tokenizer is None for state in states)
    ours = engine.collect(ids)

    raw = engine.llm.generate(
        [e.prompt for e in episodes],
        [SamplingParams(temperature=e.sampling.temperature, top_p=e.sampling.top_p, max_tokens=e.sampling.max_tokens,
                        stop=list(e.sampling.stop), seed=e.sampling.seed, logprobs=0) for e in episodes],
        use_tqdm=False,
    )  # fmt: skip
    for mine, out in zip(ours, raw, strict=True):
        choice = out.outputs[0]
        assert mine.text == choice.text and mine.finish_reason == str(choice.finish_reason)
        assert mine.token_ids == tuple(choice.token_ids)
        steps = [step[token] for step, token in zip(choice.logprobs, choice.token_ids, strict=True)]
        assert mine.logprobs == tuple(step.logprob for step in steps)
        assert all(step.decoded_token is not None for step in steps)  # raw vLLM decodes each; the adapter does not
    assert any(len(c.token_ids) > 1 for c in ours)  # more than one step of logprobs compared
    assert engine.generate(requests) == ours
