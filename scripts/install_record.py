"""The record scripts/setup.sh writes to .venv/evalrun-install.json: what it installs (docs/design.md
"Locked installs"). Standard library only: setup.sh runs it with the system Python, before .venv exists,
to decide whether there is anything to do. evalrun reads it back (evalrun.pipeline.environment.installed_lock)
into every manifest's ``install.lock``.

    python3 scripts/install_record.py EXTRA LOCK     # LOCK: a lock file, or "none" for an unlocked install
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install_record(extra: str, lock: str, pyproject: Path = Path("pyproject.toml")) -> dict[str, object]:
    return {
        "extra": extra,
        "lock": None if lock == "none" else {"path": lock, "sha256": sha256(Path(lock))},
        "pyproject_sha256": sha256(pyproject),
    }


if __name__ == "__main__":
    extra, lock = sys.argv[1:]
    print(json.dumps(install_record(extra, lock), sort_keys=True))
