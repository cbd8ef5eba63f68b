"""The determinism layer (DESIGN.md): set before the engine is imported, and recorded.

:func:`apply` must run in the process that will import the engine (the driver for an inline
run, each Ray worker otherwise). It returns what was asked and what this platform honoured; a
setting the platform cannot honour is recorded as such, never claimed.
"""

from __future__ import annotations

import os
import random
from typing import Any

MIN_BATCH_INVARIANT_CAPABILITY = (8, 0)


def _cuda_capability() -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def apply(settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """Apply ``settings`` (the ``determinism`` config section) and report the outcome."""
    import numpy as np
    import torch

    asked = {k: v for k, v in settings.items() if k != "name"}
    honoured: dict[str, Any] = {}
    notes: list[str] = []

    if settings["disable_v1_multiprocessing"]:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    honoured["disable_v1_multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"

    capability = _cuda_capability()
    if settings["enabled"] and settings["batch_invariant"]:
        if capability is not None and capability >= MIN_BATCH_INVARIANT_CAPABILITY:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
            honoured["batch_invariant"] = True
        else:
            os.environ.pop("VLLM_BATCH_INVARIANT", None)
            honoured["batch_invariant"] = False
            notes.append(
                "VLLM_BATCH_INVARIANT needs an NVIDIA GPU of compute capability >= 8.0; "
                f"this platform has {'no GPU' if capability is None else f'capability {capability}'}"
            )
    else:
        honoured["batch_invariant"] = False

    if settings["enabled"]:
        if settings["cublas_workspace_config"]:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = settings["cublas_workspace_config"]
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
    honoured["cublas_workspace_config"] = (
        os.environ.get("CUBLAS_WORKSPACE_CONFIG", "") if capability is not None else "n/a (no CUDA)"
    )
    honoured["torch_deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    honoured["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    honoured["seeded"] = bool(settings["enabled"])
    return {"asked": asked, "honoured": honoured, "notes": notes}
