"""The instruction set a CPU worker's kernels may use (``engine.cpu_isa``; docs/nondeterminism.md "Instruction sets").

The same pinned model computes different numbers with different CPU kernels, and which kernels run is chosen
from the processor when each library first needs them. So a worker capped to an older instruction set
stands in for an older machine: a mixed cluster's numerics can be measured on one machine. The levers, each
read once per process, before its library's first use:

- ``ATEN_CPU_CAPABILITY``: PyTorch's ATen CPU kernels (softmax, activations, reductions); torch reports what it
  chose (``torch.backends.cpu.get_cpu_capability()``), and that is what is recorded;
- ``ONEDNN_MAX_CPU_ISA``: oneDNN (torch's bfloat16 matmuls, vLLM's CPU GEMMs);
- ``MKL_ENABLE_INSTRUCTIONS`` and ``MKL_CBWR``: MKL (torch's float32 matmuls). On AMD processors MKL ignores
  the first and takes its generic path; its conditional-reproducibility mode (``MKL_CBWR``) is the lever that
  acts there;
- vLLM's kernel library (``vllm._C``, ``_C_AVX512`` or ``_C_AVX2``), picked from what torch says the processor
  has; a capped worker tells vLLM (through those two functions) what its instruction set has, before any engine
  is built, and records the library the process actually loaded.

``native`` sets nothing. Because each lever acts once per process, a capped worker needs a process started for
it (a Ray actor, whose environment Ray sets before Python starts): the config check refuses it inline.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from evalrun.config import CPU_ISA_LEVELS
from evalrun.errors import BadInput

NATIVE = "native"
# what each capped level sets, oldest last; "default" is ATen's portable kernels (and vLLM's AVX2 build, its oldest)
ENVIRONMENT: dict[str, dict[str, str]] = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512", "MKL_CBWR": "AVX512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "MKL_CBWR": "COMPATIBLE"},
}  # fmt: skip
LEVELS = CPU_ISA_LEVELS  # NATIVE and ENVIRONMENT's, as the config accepts them
# vLLM's kernel libraries (vllm/platforms/cpu.py import_kernels: a capped level loads _C_AVX512 or _C_AVX2), and
# what torch reports at each level
VLLM_LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")  # _C: AVX-512 with BF16 (and AMX where present)
ATEN_CAPABILITY = {"avx512": "AVX512", "avx2": "AVX2", "default": "DEFAULT"}
VARIABLES = tuple(ENVIRONMENT["avx2"])
# the processor flags that decide which kernels can run (a subset of /proc/cpuinfo's)
RELEVANT_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512.*|amx.*|avx_vnni.*)$")
_VLLM_LIBRARY = re.compile(rf"/vllm/({'|'.join(VLLM_LIBRARIES)})\.abi3\.so$")


def for_worker(levels: tuple[str, ...], index: int) -> str:
    """The level of worker ``index`` (``EngineConfig.cpu_isa_levels()``: one for all, or one per worker in turn)."""
    return levels[index % len(levels)]


def environment(level: str) -> dict[str, str]:
    """The variables a worker process of ``level`` starts with (none for native)."""
    return dict(ENVIRONMENT.get(level, {}))


def cpu_flags(cpuinfo: str) -> list[str]:
    """The instruction-set flags of the first processor in ``/proc/cpuinfo``'s text, sorted."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return sorted({f for f in line.split(":", 1)[1].split() if RELEVANT_FLAGS.match(f)})
    return []


def runs_here() -> tuple[str, ...]:
    """The levels this machine's processor runs. torch takes ATEN_CPU_CAPABILITY at its word: AVX-512 kernels
    asked for on a processor without them die of SIGILL at the first softmax, so the processor is asked first
    (cpuinfo's answer, which no variable changes)."""
    import torch

    has = {"avx512": torch.cpu._is_avx512_supported, "avx2": torch.cpu._is_avx2_supported}
    return tuple(level for level in LEVELS if level not in has or has[level]())


def check_runs_here(levels: tuple[str, ...]) -> None:
    """BadInput naming ``engine.cpu_isa`` when a level is one this machine's processor does not run (workers on
    this machine: checked before any engine loads; a Ray cluster's node checks its own as its worker starts)."""
    here = runs_here()
    missing = [level for level in levels if level not in here]
    if missing:
        raise BadInput("engine.cpu_isa", f"this machine's processor has no {missing[0].upper()}: expected one of "
                                         f"the levels it runs ({' | '.join(here)})")  # fmt: skip


def apply(level: str) -> None:
    """Cap this process at ``level`` before torch's first kernel and before any vLLM engine: the variables set (a
    Ray actor already has them), and vLLM told the instruction set has no AVX-512 (or no AVX-512 BF16 and AMX).

    Raises RuntimeError when the processor lacks the level, or torch's kernels here are not the ones asked for
    (chosen already in this process)."""
    if level == NATIVE:
        return
    import torch

    here = runs_here()
    if level not in here:
        raise RuntimeError(f"engine.cpu_isa={level}: this processor has no {level.upper()} (the levels it runs: "
                           f"{', '.join(here)})")  # fmt: skip
    os.environ.update(environment(level))

    found = torch.backends.cpu.get_cpu_capability()
    if found != ATEN_CAPABILITY[level]:
        raise RuntimeError(
            f"engine.cpu_isa={level}: torch's CPU kernels in this process are {found}, not "
            f"{ATEN_CAPABILITY[level]} (chosen before the setting was made)"
        )
    if level == "default":
        # Inductor (torch.compile's CPU code, which vLLM uses even with enforce_eager for its logprob ranks) takes
        # ATEN_CPU_CAPABILITY=default as "no vector ISA", and its scalar C++ for reductions does not build there
        # (torch 2.13: 'at::vec' has not been declared): its code is generated for AVX2, the oldest vector ISA, as
        # vLLM's oldest kernel library is
        from torch._inductor import config as inductor

        inductor.cpp.simdlen = 256
    torch.cpu._is_amx_tile_supported = _absent  # type: ignore[attr-defined]
    torch.cpu._is_avx512_bf16_supported = _absent  # type: ignore[attr-defined]
    if level != "avx512":
        torch.cpu._is_avx512_supported = _absent  # type: ignore[attr-defined]


def _absent() -> bool:
    """What a capped worker's torch answers when asked whether the processor has an instruction set above it."""
    return False


def vllm_kernels(maps: str) -> str | None:
    """The vLLM kernel library a process has loaded, from its ``/proc/self/maps`` text (None: none; several,
    joined by ``+``, when a process loaded more than one)."""
    found = sorted({m.group(1) for line in maps.splitlines() if (m := _VLLM_LIBRARY.search(line.strip()))})
    return "+".join(found) if found else None


def in_effect(level: str, uses_vllm: bool) -> dict[str, Any]:
    """What this process's kernels run with, read back after its engine was built: the level asked for, torch's
    ATen capability, vLLM's kernel library (None: the engine is not vLLM's) and the variables as the process
    has them."""
    import torch

    maps = ""
    if uses_vllm:
        with contextlib.suppress(OSError):
            maps = Path("/proc/self/maps").read_text()
    return {
        "asked": level,
        "aten": torch.backends.cpu.get_cpu_capability(),
        "vllm_kernels": vllm_kernels(maps),
        "environment": {name: os.environ[name] for name in VARIABLES if name in os.environ},
    }
