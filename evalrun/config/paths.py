"""Where evalrun's own files are: everything a run needs ships in the package (its Hydra config groups, the
built-in tasks, models and references), found through the package wherever it is installed, never through a
checkout. The checkout, when there is one (an editable install), matters only to the manifest's ``git``."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def _package_dir() -> Path:
    root = resources.files("evalrun")
    if not isinstance(root, Path):  # a zip import: vLLM and Hydra's file reads need the files on disk
        raise ImportError(f"evalrun must be installed as files on disk, not imported from {root}")
    return root


PACKAGE_DIR = _package_dir()
CONF_MODULE = "evalrun.conf"  # Hydra's primary config source, pkg://evalrun.conf
CONF_DIR = PACKAGE_DIR / "conf"  # the same directory, for reading one group's file (evalrun.config.compose)
MODELS_DIR = PACKAGE_DIR / "models"  # the embedded models the built-in model configs name (${evalrun.root:}/models)
REFERENCES_DIR = PACKAGE_DIR / "references"  # the frozen references of the built-in worlds and tasks
BUILTIN_TASKS = PACKAGE_DIR / "tasks" / "builtin"


def checkout() -> Path | None:
    """The git checkout this package runs from (an editable install), or None when it was installed from a
    wheel: a package inside some other repository (a virtual environment in a project) is not a checkout."""
    root = PACKAGE_DIR.parent
    return root if (root / ".git").exists() and (root / "pyproject.toml").is_file() else None


def cache_root() -> Path:
    """evalrun's cache of what scripts build outside the package (models/NAME): ``$EVALRUN_CACHE``, else
    ``~/.cache/evalrun``; absolute. Read at each call, so that a changed environment takes effect."""
    return Path(os.environ.get("EVALRUN_CACHE") or "~/.cache/evalrun").expanduser().absolute()
