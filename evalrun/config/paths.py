"""Where evalrun's own files are: the checkout, its Hydra config directory, the built-in tasks."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
BUILTIN_TASKS = Path(__file__).resolve().parents[1] / "tasks" / "builtin"
