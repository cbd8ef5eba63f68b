"""The determinism layer (docs/design.md "Determinism layer"): set before the engine is imported, and recorded.

:func:`apply` must run in the process that will import the engine (the driver for an inline
run, each Ray worker otherwise). It returns what was asked, what this platform honoured, and a
note giving the reason for every setting asked and not honoured; nothing is claimed that was not
done.

``enabled`` (the ``strict`` profile) means ``torch.use_deterministic_algorithms(True)`` without
``warn_only``: an operation with no deterministic implementation raises instead of running
nondeterministically. ``off`` turns the flag off.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

MIN_BATCH_INVARIANT_CAPABILITY = (8, 0)


def _cuda_capability() -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def _reset_vllm_env_cache() -> None:
    """vLLM caches its environment variables once an engine core has started
    (``vllm.envs.enable_envs_cache``): an engine built later in this process must see what is set here."""
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()


def apply(settings: dict[str, Any], seed: int, engine: str | None = None) -> dict[str, Any]:
    """Apply ``settings`` (the ``determinism`` config section) for an ``engine`` (its config name;
    None: not known) and report ``{"asked", "honoured", "notes"}``."""
    import numpy as np
    import torch

    asked = {k: v for k, v in settings.items() if k != "name"}
    enabled = bool(settings["enabled"])
    honoured: dict[str, Any] = {}
    notes: list[str] = []

    if settings["disable_v1_multiprocessing"]:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    honoured["disable_v1_multiprocessing"] = in_process

    capability = _cuda_capability()
    vllm_on_cpu = engine in (None, "vllm") and capability is None
    honoured["batch_invariant"] = False
    os.environ.pop("VLLM_BATCH_INVARIANT", None)
    if enabled and settings["batch_invariant"]:
        if engine is not None and engine != "vllm":
            notes.append(f"VLLM_BATCH_INVARIANT acts on vLLM only; this worker's engine is {engine}")
        elif capability is None or capability < MIN_BATCH_INVARIANT_CAPABILITY:
            instead = " (on CPU, vLLM's attention runs without split-KV instead: VLLM_CPU_ATTN_SPLIT_KV=0)"
            notes.append(
                "VLLM_BATCH_INVARIANT needs an NVIDIA GPU of compute capability >= 8.0; "
                f"this platform has {'no GPU' if capability is None else f'capability {capability}'}"
                f"{instead if vllm_on_cpu else ''}"
            )
        else:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
            honoured["batch_invariant"] = True
    # vLLM's CPU attention splits a sequence's keys and values over threads when the batch leaves threads
    # idle (VLLM_CPU_ATTN_SPLIT_KV, on by default), so how a sum is ordered depends on the batch: the
    # canary found it (docs/nondeterminism.md "Canary"). Off under strict; recorded (None: not vLLM on CPU).
    if enabled and settings["batch_invariant"] and vllm_on_cpu:
        os.environ["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
    honoured["cpu_attn_split_kv"] = os.environ.get("VLLM_CPU_ATTN_SPLIT_KV", "1") != "0" if vllm_on_cpu else None
    _reset_vllm_env_cache()

    if enabled and settings["cublas_workspace_config"]:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = settings["cublas_workspace_config"]
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    honoured["cublas_workspace_config"] = cublas if capability is not None else None  # None: no CUDA here
    if enabled and settings["cublas_workspace_config"] and capability is None:
        notes.append("CUBLAS_WORKSPACE_CONFIG acts on CUDA's cuBLAS only; this platform has no GPU")
    elif enabled and capability is not None and not cublas:
        notes.append("CUBLAS_WORKSPACE_CONFIG is unset on a CUDA platform: cuBLAS calls raise under "
                     "deterministic algorithms")  # fmt: skip

    torch.use_deterministic_algorithms(enabled)  # never warn_only: a nondeterministic op raises
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
    strict = torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    honoured["torch_deterministic_algorithms"] = strict
    honoured["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    honoured["cudnn_deterministic"] = bool(torch.backends.cudnn.deterministic)
    honoured["seeded"] = enabled
    if enabled and engine == "vllm" and not in_process:
        honoured["torch_deterministic_algorithms"] = honoured["seeded"] = False
        notes.append(
            "vLLM's engine core runs in a child process (VLLM_ENABLE_V1_MULTIPROCESSING is not 0): the "
            "deterministic-algorithms flag and the seeds set here are not known to reach it"
        )
    elif enabled and not strict:  # pragma: no cover - torch honours the call above
        notes.append("torch did not enable deterministic algorithms")
    return {"asked": asked, "honoured": honoured, "notes": notes}
