"""engine=hf: per-request seeds, batching, stop handling; and a real sweep (vLLM x hf, batch sizes) fed to nondet."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalrun.analysis.nondet import nondet_paths
from evalrun.config import MODELS_DIR, load
from evalrun.engines import GenerationRequest, LoglikelihoodRequest, RequestRejected, SamplingSpec
from evalrun.errors import BadInput
from evalrun.pipeline.runner import execute, open_for, prepare

pytestmark = pytest.mark.e2e  # starts the engine

MODEL = MODELS_DIR / "tiny-adder"
SETTINGS = {"name": "hf", "dtype": None, "max_num_seqs": 64, "device": "cpu", "seed": 0}


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from evalrun.engines.hf import HFEngine

    yield HFEngine(MODEL, "float32", SETTINGS)


def spec(seed: int = 0, temperature: float = 0.0, max_tokens: int = 16, stop: tuple[str, ...] = ("\n",),
         top_p: float = 1.0, top_k: int = 0, logprobs: bool = True) -> SamplingSpec:  # fmt: skip
    return SamplingSpec(temperature, top_p, top_k, max_tokens, stop, seed, logprobs)


def req(prompt: str, sampling: SamplingSpec) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, sampling=sampling)


PROMPTS = [f"Q: {a}+{b}\nA:" for a, b in [(3, 83), (69, 61), (48, 41), (7, 5), (12, 34), (99, 99)]]


def test_greedy_batched_equals_one_by_one_and_stops_on_eos(engine) -> None:
    batch = engine.generate([req(p, spec()) for p in PROMPTS])
    alone = [engine.generate([req(p, spec())])[0] for p in PROMPTS]
    assert [c.token_ids for c in batch] == [c.token_ids for c in alone]
    assert batch[0].text == " 86" and batch[1].text == " 130"
    for c in batch:
        assert c.finish_reason == "stop" and c.token_ids[-1] in engine.eos_ids  # eos kept in ids, not in text
        assert len(c.logprobs) == len(c.token_ids) and all(lp is not None and lp <= 0 for lp in c.logprobs)
    assert batch[0].prompt_tokens == len(PROMPTS[0])  # character tokenizer, no BOS (as vLLM counted)
    gaps = [abs(a - b) for c, d in zip(batch, alone, strict=True) for a, b in zip(c.logprobs, d.logprobs, strict=True)]
    assert max(gaps) < 1e-4  # left padding moves logprobs by float noise at most


def test_length_stop_strings_and_no_logprobs(engine) -> None:
    (short,) = engine.generate([req(PROMPTS[1], spec(max_tokens=2))])
    assert short.finish_reason == "length" and len(short.token_ids) == 2 and short.text == " 1"
    (cut,) = engine.generate([req(PROMPTS[1], spec(stop=("3",)))])  # " 130" -> " 1", stopped by "3"
    assert cut.finish_reason == "stop" and cut.text == " 1" and len(cut.token_ids) == 3
    (plain,) = engine.generate([req(PROMPTS[0], spec(logprobs=False))])
    assert plain.logprobs == () and plain.text == " 86"


def test_each_request_samples_with_its_own_seed_whatever_the_batch(engine) -> None:
    prompts = [f"{a}+{b} =" for a, b in [(1, 2), (30, 40), (55, 5), (8, 80)]]  # unfamiliar format: entropy
    hot = [spec(seed=1000 + i, temperature=2.0, top_k=50, top_p=0.95) for i in range(len(prompts))]
    together = engine.generate([req(p, s) for p, s in zip(prompts, hot, strict=True)])
    reversed_batch = engine.generate([req(p, s) for p, s in zip(prompts[::-1], hot[::-1], strict=True)])[::-1]
    alone = [engine.generate([req(p, s)])[0] for p, s in zip(prompts, hot, strict=True)]
    assert [c.token_ids for c in together] == [c.token_ids for c in reversed_batch] == [c.token_ids for c in alone]
    others = [engine.generate([req(prompts[0], spec(seed=s, temperature=2.0))])[0].text for s in range(12)]
    assert len(set(others)) >= 2  # another seed really samples differently


def test_engine_config_is_checked_before_anything_loads() -> None:
    with pytest.raises(BadInput, match=r"engine\.device"):
        load(["engine=hf", "engine.device=tpu"])
    with pytest.raises(BadInput, match=r"engine\.device"):
        load(["engine.device=cuda"])  # vLLM chooses its own device
    with pytest.raises(BadInput, match="enable_prefix_caching"):
        load(["engine=hf", "engine.enable_prefix_caching=true"])
    assert load(["engine=hf"]).engine.max_num_seqs == 64


# --- the real sweep: vLLM max_num_seqs 1 vs 256, hf 1 vs 64, greedy and sampled ---------------------


def inline_run(root: Path, *overrides: str) -> Path:
    prepared = prepare(load([f"run.root={root}", "run.progress=false", "cluster=inline", *overrides]))
    dispatcher = open_for(prepared)
    try:
        return execute(prepared, dispatcher)
    finally:
        dispatcher.close()


@pytest.fixture(scope="module")
def sweep(dispatcher, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(engine/batch, decoding) -> run dir; one vLLM engine in a subprocess, the rest in this process."""
    root = tmp_path_factory.mktemp("sweep")
    result = subprocess.run(
        [sys.executable, "-m", "evalrun.cli", "run", "-m", "engine=vllm,hf", "engine.max_num_seqs=1",
         "decoding=greedy,sample", "limit=40", "cluster=inline", "run.progress=false", f"run.root={root / 'sub'}"],
        capture_output=True, text=True, timeout=600, cwd=root,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    vllm_g1, vllm_s1, hf_g1, hf_s1 = (Path(line) for line in result.stdout.strip().splitlines()[-4:])

    def run_eval(*overrides: str) -> Path:  # on the session's shared Ray vLLM worker (max_num_seqs 256)
        return execute(prepare(load([f"run.root={root / 'shared'}", "run.progress=false", *overrides])), dispatcher)

    return {
        ("vllm-1", "greedy"): vllm_g1, ("vllm-1", "sample"): vllm_s1,
        ("hf-1", "greedy"): hf_g1, ("hf-1", "sample"): hf_s1,
        ("vllm-256", "greedy"): run_eval("limit=40"), ("vllm-256", "sample"): run_eval("limit=40", "decoding=sample"),
        ("hf-64", "greedy"): inline_run(root / "in", "engine=hf", "limit=40"),
        ("hf-64", "sample"): inline_run(root / "in", "engine=hf", "limit=40", "decoding=sample"),
    }  # fmt: skip


def test_sweep_feeds_nondet(sweep: dict[tuple[str, str], Path]) -> None:
    manifests = {k: json.loads((p / "manifest.json").read_text()) for k, p in sweep.items()}
    assert {m["engine"]["name"] for m in manifests.values()} == {"vllm", "hf"}
    assert manifests[("hf-1", "greedy")]["engine"]["settings"]["max_num_seqs"] == 1

    greedy = nondet_paths([sweep[(k, "greedy")] for k in ("vllm-256", "vllm-1", "hf-1", "hf-64")])
    fields = {s.field for s in greedy.settings}
    assert {"engine.name", "engine.settings.max_num_seqs"} <= fields
    assert greedy.items == 40 and greedy.unmatched_episodes == 0
    # What this platform shows (CPU, float32): measured, and asserted loosely enough to hold elsewhere.
    assert greedy.tara >= 0.9 and greedy.accuracy_spread <= 0.1
    assert greedy.max_abs_logprob_diff is not None and greedy.max_abs_logprob_diff < 1e-2

    # Per-request seeds: the batch size never changes what one engine samples.
    vllm_sampled = nondet_paths([sweep[("vllm-256", "sample")], sweep[("vllm-1", "sample")]])
    assert vllm_sampled.tarr == 1.0, vllm_sampled.per_item
    hf_sampled = nondet_paths([sweep[("hf-1", "sample")], sweep[("hf-64", "sample")]])
    assert hf_sampled.tara >= 0.95


def test_a_prompt_that_does_not_fit_is_refused_as_vllm_refuses_it(engine) -> None:
    """The harness splits a refused batch; the HF engine must refuse, not crash or run past its positions."""
    long = "1+" * 80  # 160 character tokens, beyond the 128-token context
    with pytest.raises(RequestRejected, match=r"prompt \(length 160\) is longer than the maximum model length of 128"):
        engine.generate([req(PROMPTS[0], spec()), req(long, spec())])
    with pytest.raises(RequestRejected, match="cannot be empty"):
        engine.generate([req("", spec())])
    with pytest.raises(RequestRejected, match="maximum model length of 128"):
        engine.loglikelihood([LoglikelihoodRequest(long, " 1")])
    assert engine.generate([req(PROMPTS[0], spec())])[0].text == " 86"
