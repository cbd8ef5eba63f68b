"""Where evalrun's own files are: the checkout, its Hydra config directory, the built-in tasks, its cache."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
BUILTIN_TASKS = Path(__file__).resolve().parents[1] / "tasks" / "builtin"


def cache_root() -> Path:
    """evalrun's cache of what scripts build outside the checkout (models/NAME): ``$EVALRUN_CACHE``, else
    ``~/.cache/evalrun``; absolute. Read at each call, so that a changed environment takes effect."""
    return Path(os.environ.get("EVALRUN_CACHE") or "~/.cache/evalrun").expanduser().absolute()
