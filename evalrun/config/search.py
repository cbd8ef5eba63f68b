"""Where configs are found: the user's own config directories first, then evalrun's built-in ones.

A user's directory has the built-in layout (``DIR/model/mine.yaml``, ``DIR/task/my_task.yaml``, ...), so
``model=mine`` finds the user's pin and a user's file of a built-in's name overrides it. Directories come from
``--config-dir``/``-cd`` (each command that composes a config, in the order given), then ``EVALRUN_CONFIG_PATH``
(``DIR1:DIR2``, the ``os.pathsep``-separated list); the package's ``pkg://evalrun.conf`` is searched last. What a
run composed from is recorded (:class:`ConfigSources`): the directories searched, and the sha256 of each file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.config.paths import CONF_DIR, CONF_MODULE
from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256

CONFIG_PATH_VARIABLE = "EVALRUN_CONFIG_PATH"
CONFIG_DIR_OPTION = "--config-dir"
BUILTIN_SOURCE = f"pkg://{CONF_MODULE}"
PRIMARY_CONFIG = "config"

# The directories given on this command's line (--config-dir): set by the CLI for the command's duration.
_given_dirs: ContextVar[tuple[Path, ...]] = ContextVar("evalrun_config_dirs", default=())


@dataclass(frozen=True)
class ConfigSearchPath:
    """The user's directories, searched in order before the built-in configs (``pkg://evalrun.conf``)."""

    user_dirs: tuple[Path, ...] = ()

    @property
    def dirs(self) -> tuple[Path, ...]:
        return (*self.user_dirs, CONF_DIR)

    def sources(self) -> list[str]:
        """The search path as recorded: each user directory (absolute), then ``pkg://evalrun.conf``."""
        return [*(str(d) for d in self.user_dirs), BUILTIN_SOURCE]

    def _source(self, directory: Path) -> str:
        return BUILTIN_SOURCE if directory == CONF_DIR else str(directory)

    def find(self, relative: str) -> tuple[str, Path] | None:
        """The first directory holding ``relative`` (``model/mine.yaml``): its source name and the file."""
        for directory in self.dirs:
            if (directory / relative).is_file():
                return self._source(directory), directory / relative
        return None

    def options(self, group: str) -> list[str]:
        """Every option of a group (``cluster``) across the search path, sorted."""
        return sorted({p.stem for d in self.dirs for p in (d / group).glob("*.yaml")})

    def composed_from(self, choices: Mapping[str, Any]) -> ConfigSources:
        """What a composition read, from Hydra's choices (``{"model": "mine", "model@judge_model": ...}``): the
        primary ``config.yaml`` and each chosen group's file, found as Hydra finds them (first match)."""
        wanted = [f"{PRIMARY_CONFIG}.yaml"]
        for key, option in choices.items():
            if option is not None and not key.startswith("hydra/"):
                wanted.append(f"{key.split('@')[0]}/{option}.yaml")
        files = {}
        for relative in sorted(set(wanted)):
            found = self.find(relative)
            if found is not None:
                source, path = found
                files[relative] = ConfigFile(source, file_sha256(path))
        return ConfigSources(tuple(self.sources()), files)


@dataclass(frozen=True)
class ConfigFile:
    source: str  # the search-path entry it was read from (a user directory, or pkg://evalrun.conf)
    sha256: str


@dataclass(frozen=True)
class ConfigSources:
    """The manifest's ``config``: the search path of the composition, and each file composed (provenance)."""

    search_path: tuple[str, ...]
    files: Mapping[str, ConfigFile]

    def as_record(self) -> dict[str, Any]:
        return {
            "search_path": list(self.search_path),
            "files": {name: {"source": f.source, "sha256": f.sha256} for name, f in sorted(self.files.items())},
        }


def _user_dir(entry: str, where: str) -> Path:
    path = Path(entry).expanduser().absolute()
    if not path.is_dir():
        state = "is not a directory" if path.exists() else "does not exist"
        raise BadInput(f"{where} {entry}", f"{path} {state}; expected a directory of config groups "
                                           "(model/NAME.yaml, task/NAME.yaml, ...)")  # fmt: skip
    return path


def check_config_dirs(entries: Sequence[str]) -> tuple[Path, ...]:
    """``--config-dir`` values as absolute directories (relative ones from the working directory), each checked."""
    return tuple(_user_dir(entry, CONFIG_DIR_OPTION) for entry in entries)


@contextlib.contextmanager
def config_dirs(entries: Sequence[str]) -> Iterator[None]:
    """Search ``entries`` (``--config-dir``) first in every composition inside the block."""
    token = _given_dirs.set(check_config_dirs(entries))
    try:
        yield
    finally:
        _given_dirs.reset(token)


def search_path(environ: Mapping[str, str] = os.environ) -> ConfigSearchPath:
    """The search path now: ``--config-dir`` directories, then ``EVALRUN_CONFIG_PATH``'s, each checked to exist."""
    listed = [entry for entry in environ.get(CONFIG_PATH_VARIABLE, "").split(os.pathsep) if entry]
    from_environment = tuple(_user_dir(entry, f"{CONFIG_PATH_VARIABLE}:") for entry in listed)
    return ConfigSearchPath((*_given_dirs.get(), *from_environment))
