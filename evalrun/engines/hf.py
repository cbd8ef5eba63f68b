"""transformers engine (``engine=hf``): ``model.generate`` on the same pinned weights, CPU or CUDA.

It exists so that vLLM-vs-transformers differences can be measured, and so that machines without
vLLM (the GPU check machine) can run evalrun. It mirrors :class:`evalrun.engines.vllm.VLLMEngine`:

- requests run in batches of ``engine.max_num_seqs``, left-padded, in request order;
- every request samples with its own ``torch.Generator`` seeded from ``SamplingSpec.seed``
  (``generate`` has one global RNG, so the choice of each next token is made here, per row, in a
  logits processor that hands ``generate`` a one-hot distribution); greedy is the argmax;
- temperature, top-k and top-p are applied per request, in that order, as vLLM does;
- recorded logprobs are of the chosen token under the raw model distribution (vLLM's default
  ``raw_logprobs``), in float32;
- ``loglikelihood`` tokenizes as vLLM does (:func:`evalrun.engines.loglikelihood_tokens`) and
  scores, in batches of ``engine.max_num_seqs``, each sequence less its last token left-padded (position
  ids from the attention mask), so every row's continuation is predicted by the batch's last columns;
  logprobs are the float32 log_softmax of the logits, greedy means no token has a higher logprob;
- finish reasons: ``"stop"`` on an end-of-sequence token (kept in ``token_ids``, not in the text)
  or on a stop string (the text is cut before it; the token that completed it is kept), else
  ``"length"`` at ``max_tokens``.
"""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing is downloaded

from transformers import LogitsProcessor, StoppingCriteria

from evalrun.engines import (
    Completion,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    SamplingSpec,
    check_fits,
    checked_logprob,
    engine,
    joined,
    scored_windows,
)

# Determinism settings that act on vLLM only; recorded as not applicable to this engine.
NOT_APPLICABLE = ("batch_invariant", "disable_v1_multiprocessing")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _choose(logits: Any, spec: SamplingSpec, generator: Any) -> int:
    """The next token for one request from its float32 logits (temperature 0: argmax)."""
    import torch

    if spec.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / spec.temperature
    if 0 < spec.top_k < logits.numel():
        kth = torch.topk(logits, spec.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if spec.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs > spec.top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))


class _PerRequestChooser(LogitsProcessor):
    """A ``LogitsProcessor``: picks each row's token with its own generator, records its logprob."""

    def __init__(self, specs: list[SamplingSpec], device: Any) -> None:
        import torch

        self.specs = specs
        self.generators = [torch.Generator(device=device).manual_seed(s.seed) for s in specs]
        self.chosen: list[list[int]] = [[] for _ in specs]
        self.logprobs: list[list[float]] = [[] for _ in specs]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        logits = scores.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        forced = torch.full_like(scores, float("-inf"))
        for row, spec in enumerate(self.specs):
            token = _choose(logits[row], spec, self.generators[row])
            self.chosen[row].append(token)
            self.logprobs[row].append(float(logprobs[row, token]))
            forced[row, token] = 0.0
        return forced


class _StopStrings(StoppingCriteria):
    """A ``StoppingCriteria``: a row is done once its new text contains a stop string."""

    def __init__(self, tokenizer: Any, specs: list[SamplingSpec], prompt_width: int) -> None:
        self.tokenizer, self.specs, self.prompt_width = tokenizer, specs, prompt_width

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = [
            bool(spec.stop) and any(s in self._text(input_ids[row, self.prompt_width :].tolist()) for s in spec.stop)
            for row, spec in enumerate(self.specs)
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@engine("hf")
class HFEngine:
    def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self._torch = torch
        self._generation_config = GenerationConfig
        self.device = torch.device(settings.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = settings["dtype"] or model_dtype
        if self.dtype == "auto":
            self.dtype = "float32"
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(str(model_path))
        self.model = model.to(device=self.device, dtype=_torch_dtype(self.dtype)).eval()
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.batch_size = settings["max_num_seqs"]
        positions = getattr(model.config, "max_position_embeddings", None)
        self.context: int | None = settings.get("max_model_len") or positions
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self._description = {
            "name": "hf",
            "version": transformers.__version__,
            "torch": torch.__version__,
            "settings": {**settings, "dtype": self.dtype, "device": str(self.device)},
            "device": {"type": self.device.type, "gpu": gpu},
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "determinism_not_applicable": list(NOT_APPLICABLE),
        }

    def describe(self) -> dict[str, Any]:
        return self._description

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Completions in request order; :class:`RequestRejected` when a prompt is empty or does not fit
        the context, before anything runs (the harness splits the batch to find which)."""
        for ids in self._prompt_ids(requests):
            check_fits(len(ids), self.context)
        completions: list[Completion] = []
        for start in range(0, len(requests), self.batch_size):
            completions.extend(self._generate_batch(requests[start : start + self.batch_size]))
        return completions

    def _prompt_ids(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """Each prompt's tokens, with the tokenizer's special tokens where the request asks for them (one
        tokenizer call per setting)."""
        ids: list[list[int]] = [[] for _ in requests]
        for add in (True, False):
            rows = [i for i, r in enumerate(requests) if r.add_special_tokens is add]
            if rows:
                encoded = self.tokenizer([requests[i].prompt for i in rows], add_special_tokens=add)["input_ids"]
                for i, row_ids in zip(rows, encoded, strict=True):
                    ids[i] = list(row_ids)
        return ids

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Completion]:
        torch = self._torch
        specs = [r.sampling for r in requests]
        enc = self.tokenizer.pad({"input_ids": self._prompt_ids(requests)}, return_tensors="pt")
        input_ids, attention = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        width = input_ids.shape[1]
        chooser = _PerRequestChooser(specs, self.device)
        config = self._generation_config(
            max_new_tokens=max(s.max_tokens for s in specs), do_sample=False, num_beams=1,
            eos_token_id=sorted(self.eos_ids) or None, pad_token_id=self.tokenizer.pad_token_id,
        )  # fmt: skip
        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=config,
                logits_processor=[chooser], stopping_criteria=[_StopStrings(self.tokenizer, specs, width)],
            )  # fmt: skip
        prompt_tokens = attention.sum(dim=1).tolist()
        return [
            self._finish(chooser.chosen[row], chooser.logprobs[row], spec, int(prompt_tokens[row]))
            for row, spec in enumerate(specs)
        ]

    def _finish(self, chosen: list[int], logprobs: list[float], spec: SamplingSpec, prompt_tokens: int) -> Completion:
        """Cut one row's chosen tokens where vLLM would have stopped it, and decode its text."""
        tokens: list[int] = []
        reason = "length"
        for token in chosen[: spec.max_tokens]:
            tokens.append(token)
            if token in self.eos_ids:
                reason = "stop"
                break
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if any(s in text for s in spec.stop):
            # the shortest prefix of tokens whose text holds a stop string; the text ends before it
            for n in range(1, len(tokens) + 1):
                prefix = self.tokenizer.decode(tokens[:n], skip_special_tokens=True)
                found = [prefix.find(s) for s in spec.stop if s in prefix]
                if found:
                    tokens, text, reason = tokens[:n], prefix[: min(found)], "stop"
                    break
        return Completion(
            text=text,
            token_ids=tuple(tokens),
            logprobs=tuple(_finite(lp) for lp in logprobs[: len(tokens)]) if spec.logprobs else (),
            finish_reason=reason,
            prompt_tokens=prompt_tokens,
        )

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        # every window of every request (one but for a rolling request)
        owners = [(i, ids_n) for i, r in enumerate(requests)
                  for ids_n in scored_windows(self.tokenizer, r, self.context)]  # fmt: skip
        windowed, encoded = [requests[i] for i, _ in owners], [ids_n for _, ids_n in owners]
        for ids, _ in encoded:
            check_fits(len(ids) - 1, self.context)  # the last token is predicted, never fed
        results: list[Loglikelihood] = []
        for start in range(0, len(encoded), self.batch_size):
            stop = start + self.batch_size
            results.extend(self._loglikelihood_batch(windowed[start:stop], encoded[start:stop]))
        by_request: dict[int, list[Loglikelihood]] = {}
        for (i, _), result in zip(owners, results, strict=True):
            by_request.setdefault(i, []).append(result)
        return [joined(r, by_request[i]) for i, r in enumerate(requests)]

    def _loglikelihood_batch(
        self, requests: list[LoglikelihoodRequest], encoded: list[tuple[list[int], int]]
    ) -> list[Loglikelihood]:
        torch = self._torch
        scored = [row for row, (_, n) in enumerate(encoded) if n > 0]
        logprobs: dict[int, list[float]] = {}
        greedy: dict[int, bool] = {}
        if scored:
            # Feed each sequence but its last token, left-padded: the logits at the last n columns of a row
            # predict its n continuation tokens.
            inputs = [encoded[row][0][:-1] for row in scored]
            width = max(len(ids) for ids in inputs)
            pad = self.tokenizer.pad_token_id
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in inputs], device=self.device)
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in inputs], device=self.device)
            position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
            keep = max(encoded[row][1] for row in scored)
            extra = {"logits_to_keep": keep} if self._keeps_logits else {}
            with torch.inference_mode():
                logits = self.model(
                    input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False, **extra
                ).logits
                logits = logits[:, -keep:, :].float()
                for k, row in enumerate(scored):
                    ids, n = encoded[row]
                    row_logprobs = torch.log_softmax(logits[k, keep - n :], dim=-1)
                    targets = torch.tensor(ids[-n:], device=self.device)
                    chosen = row_logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
                    logprobs[row] = [float(lp) for lp in chosen.tolist()]
                    greedy[row] = bool((chosen >= row_logprobs.max(dim=-1).values).all())
        results = []
        for row, (request, (ids, n)) in enumerate(zip(requests, encoded, strict=True)):
            total = 0.0
            for lp in logprobs.get(row, []):
                total += checked_logprob(lp, request)
            results.append(
                Loglikelihood(
                    logprob=checked_logprob(total, request),
                    token_ids=tuple(ids[len(ids) - n :]),
                    greedy=greedy.get(row, True),
                    prompt_tokens=len(ids),
                )
            )
        return results
