"""The package layers of pyproject.toml's import-linter contract hold: no upward import, no cycle."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_point_down_the_pipeline() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a dev dependency (pip install -e .[dev])"
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


# Code that decides what to do by the kind of episode: its task or episode types, or whether the config or
# manifest has a world section. Only the kinds' own package may (evalrun/episodes; docs/design.md "Kinds of
# episode"); everything else asks the kind (evalrun.episodes.kind_of, kind_of_manifest, kind_of_episodes).
KIND_BRANCHES = re.compile(
    r"\bAgentTask\b|\bAgentEpisode\b"
    r"|\bisinstance\([^)]*\b(Episode|AgentEpisode|Task|AgentTask)\b"
    r"|\bworld is (not )?None\b|\.task\.world\b|\"world\"\)? is (not )?None|\"world\" in\b"
)
KINDS_HOME = ROOT / "evalrun" / "episodes"
# Where a branch on the world section is not a branch on the kind, and why.
ALLOWED = {
    "evalrun/config/settings.py": "TaskConfig checks its own sections and names the default kind (task.kind)",
    "evalrun/config/validate.py": "validation checks the files a section names, before any kind is known",
}


def test_no_code_outside_the_kinds_branches_on_the_kind_of_episode() -> None:
    found = []
    for path in sorted((ROOT / "evalrun").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_relative_to(KINDS_HOME) or rel in ALLOWED:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if KIND_BRANCHES.search(line.split("#", 1)[0]):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "ask the kind of episode (evalrun.episodes) instead:\n" + "\n".join(found)


def test_the_check_finds_a_branch_on_the_kind() -> None:
    """The pattern is not vacuous: it finds each way of branching that the kinds replaced."""
    for line in ("if config.task.world is not None:", "if isinstance(task, AgentTask):",
                 "if episodes and isinstance(episodes[0], AgentEpisode):", 'if "world" in task:',
                 'agent = _get(manifest, "task", "world") is not None', "    if header.world is None:"):  # fmt: skip
        assert KIND_BRANCHES.search(line), line
