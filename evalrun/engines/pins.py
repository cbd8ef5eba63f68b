"""Model pinning: resolve a model directory and check its files against pinned SHA-256 hashes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from evalrun.chat import ModelChat
from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256

# Files that do not change what the model computes; never pinned, never compared.
_UNPINNED_NAMES = {"README.md", ".gitattributes"}


@dataclass(frozen=True)
class ResolvedModel:
    """A model directory on disk and what the manifest records about it."""

    id: str
    revision: str | None
    path: Path
    files: dict[str, str]  # relative file name -> sha256
    pinned: bool
    # its chat template and special tokens, recorded so that a run renders without the directory (None: not read)
    chat: ModelChat | None = None

    def as_record(self) -> dict[str, object]:
        return {
            "id": self.id,
            "revision": self.revision,
            "path": str(self.path),
            "files": dict(sorted(self.files.items())),
            "pinned": self.pinned,
            **({"chat": self.chat.as_record()} if self.chat is not None else {}),
        }


def hash_model_dir(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` that the engine may read, by relative name."""
    hashes = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if file.name in _UNPINNED_NAMES or rel.startswith("."):
            continue
        hashes[rel] = file_sha256(file)
    return hashes


def write_pins(config_file: Path, hashes: dict[str, str]) -> None:
    """Rewrite the ``sha256`` mapping of a model config file, keeping its other keys and its leading comments."""
    text = config_file.read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    data["sha256"] = dict(sorted(hashes.items()))
    lines = text.splitlines(keepends=True)
    header = "".join(lines[: next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))])
    config_file.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _hub_cache_dir(model_id: str, revision: str, cache_dir: str | None) -> Path:
    """A hub id + revision resolved from the local Hugging Face cache (nothing is downloaded)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_id, revision=revision, cache_dir=cache_dir, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several types for "not in cache"
        raise BadInput(
            "model.id", f"{model_id!r} at revision {revision!r} is not in the local hub cache ({exc})"
        ) from exc


def model_directory(*, model_id: str, path: str | None, revision: str | None, cache_dir: str | None) -> Path:
    """The model's directory, found but not hashed (a BadInput names the field when there is none).

    A relative ``path`` is relative to the working directory, as every path a user gives is (task.dataset,
    ``evalrun pin``); the built-in models' configs name theirs in the installed package (``${evalrun.root:}``).
    """
    if path:
        directory = Path(path).expanduser()
        if not directory.is_absolute():
            directory = Path.cwd() / directory
        if not directory.is_dir():
            raise BadInput("model.path", f"{directory} is not a directory")
        return directory
    if not revision:
        raise BadInput("model.revision", "a hub model id needs a revision (commit hash) to be pinned")
    return _hub_cache_dir(model_id, revision, cache_dir)


def resolve_model(
    *,
    model_id: str,
    path: str | None,
    revision: str | None,
    pins: dict[str, str],
    cache_dir: str | None = None,
    pinned: bool,
) -> ResolvedModel:
    """Find the model's files and check every pinned hash; raise BadInput naming the first mismatch."""
    directory = model_directory(model_id=model_id, path=path, revision=revision, cache_dir=cache_dir)
    actual = hash_model_dir(directory)
    if pinned:
        if not pins:
            raise BadInput("model.sha256", "no pinned hashes; pin every file or set model.pinned=false")
        for name, expected in sorted(pins.items()):
            got = actual.get(name)
            if got is None:
                raise BadInput(f"{directory / name}", f"pinned file is missing (expected sha256 {expected})")
            if got != expected:
                raise BadInput(f"{directory / name}", f"sha256 is {got}, pinned sha256 is {expected}")
        unpinned = sorted(set(actual) - set(pins))
        if unpinned:
            raise BadInput(f"{directory / unpinned[0]}", "file is not pinned in model.sha256")
    return ResolvedModel(id=model_id, revision=revision, path=directory.resolve(), files=actual, pinned=pinned,
                         chat=ModelChat.of_directory(directory))  # fmt: skip


# --- pinning a directory: the model config `evalrun pin` writes ------------------------------------------

WEIGHT_SUFFIXES = (".safetensors", ".bin")
# config.json's torch_dtype (or dtype) -> model.dtype
_DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32",
           "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "half": "float16", "fp16": "float16"}  # fmt: skip


def model_dtype(directory: Path) -> str:
    """The model's dtype as its config.json names it (``torch_dtype``, or ``dtype`` as transformers 5 writes
    it), in model.dtype's terms; float32 when it names none."""
    config_file = directory / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(str(config_file), f"not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise BadInput(str(config_file), "expected a JSON object")
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is None:
            continue
        dtype = _DTYPES.get(str(value).removeprefix("torch."))
        if dtype is None:
            raise BadInput(f"{config_file}: {key}", f"expected one of {sorted(set(_DTYPES.values()))}, got {value!r}")
        return dtype
    return "float32"


def check_loadable(directory: Path) -> None:
    """The directory is a model transformers can load offline: a directory, a config.json and a tokenizer that
    AutoConfig and AutoTokenizer read from it alone, and weight files. A BadInput names the directory and what
    is wrong; nothing is downloaded (``local_files_only``)."""
    if not directory.is_dir():
        raise BadInput(str(directory), "not a directory (expected a Hugging Face model directory)")
    if not (directory / "config.json").is_file():
        raise BadInput(str(directory), "no config.json (expected a Hugging Face model directory)")
    names = [p.name for p in directory.rglob("*") if p.is_file()]
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        raise BadInput(str(directory), f"no weight files (*{', *'.join(WEIGHT_SUFFIXES)})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer

    for what, loader in (("config", AutoConfig), ("tokenizer", AutoTokenizer)):
        try:
            loader.from_pretrained(str(directory), local_files_only=True)
        except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError, ...)
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(str(directory), f"the {what} does not load with transformers "
                                           f"{loader.__name__} ({type(exc).__name__}: {message})") from exc  # fmt: skip


def model_config_record(directory: Path, *, path: str | None = None, name: str | None = None,
                        model_id: str | None = None) -> dict[str, object]:  # fmt: skip
    """The model config (conf/model/NAME.yaml) pinning ``directory``: every file's sha256, the dtype from its
    config.json, ``path`` as given (default: the directory, absolute), name and id (default: the directory's
    name). The directory is checked first (:func:`check_loadable`)."""
    check_loadable(directory)
    name = name or directory.resolve().name
    return {
        "name": name,
        "id": model_id or name,
        "path": path if path is not None else str(directory.resolve()),
        "revision": None,
        "cache_dir": None,
        "pinned": True,
        "dtype": model_dtype(directory),
        "sha256": dict(sorted(hash_model_dir(directory).items())),
    }


def model_config_yaml(directory: Path, *, path: str | None = None, name: str | None = None,
                      model_id: str | None = None) -> str:  # fmt: skip
    """:func:`model_config_record` as a YAML file under two comment lines: the command that wrote it, and the
    model's chat template sha256 (what a run records as ``model.chat.template_sha256``) or that it has none."""
    record = model_config_record(directory, path=path, name=name, model_id=model_id)
    chat = ModelChat.of_directory(directory)
    comment = f"# chat template sha256: {chat.template_sha256}" if chat.template is not None else "# no chat template"
    header = f"# written by `evalrun pin {directory}`\n{comment}\n"
    return header + yaml.safe_dump(record, sort_keys=False)
