"""The one build step pyproject.toml cannot declare: a wheel records the commit it was built from.

evalrun's runs name the code that made them (the manifest's ``git``, every chain header's ``generator``); from a
checkout that is the checkout's commit, read live. An installed wheel has no checkout, so the build writes
``evalrun/build.json`` (``{"commit", "dirty"}``, both null when built outside a git checkout) into the wheel, and
a run from the wheel names the same commit as a run from the checkout it was built from (docs/design.md
"Installed package"). An editable install writes nothing: it reads the checkout itself.
"""

import json
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or not (ROOT / ".git").exists():
            return
        commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--untracked-files=no")
        record = {"commit": commit, "dirty": bool(status) if commit is not None and status is not None else None}
        (Path(self.build_lib) / "evalrun" / "build.json").write_text(json.dumps(record, sort_keys=True) + "\n")


setup(cmdclass={"build_py": BuildPy})
