"""evalrun as an installed tool: the wheel, installed into an environment of its own, run from an empty directory.

The environment reuses the locked dependencies of the test session's (a ``.pth`` line naming its site-packages,
so none of its ``.pth`` hooks run: not the checkout's editable finder) and holds evalrun only from the wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.checkout import CHECKOUT

from evalrun.pipeline.environment import git_state
from evalrun.rundir import layout
from evalrun.rundir.reader import load_record

pytestmark = pytest.mark.e2e

WHEEL_LIMIT_BYTES = 20_000_000  # the code, configs, tasks, references and the five embedded tiny models (~16 MB)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    prefix: Path  # the environment the wheel is installed in
    package: Path  # its site-packages/evalrun

    def evalrun(self, cwd: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("EVALRUN_CONFIG_PATH", "PYTHONPATH")}
        return subprocess.run([str(self.prefix / "bin" / "evalrun"), *args], capture_output=True, text=True,
                              timeout=600, cwd=cwd, env={**env, **environ})  # fmt: skip


def _source_tree(destination: Path) -> Path:
    """This checkout as a fresh clone of it would be, with its changes (tracked files, new ones not ignored, and
    .git, for the commit the build records): the wheel is built from it, never from a checkout with build/ or
    egg-info left by an earlier build."""
    shutil.copytree(CHECKOUT / ".git", destination / ".git")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=CHECKOUT,
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = CHECKOUT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source = _source_tree(work / "source")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(work / "dist"),
                    str(source)], check=True)  # fmt: skip
    (wheel,) = (work / "dist").glob("evalrun-*.whl")
    prefix = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["purelib"])
    (site / "locked_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(prefix / "bin" / "python"), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True)  # fmt: skip
    return Installed(wheel, prefix, site / "evalrun")


def _listing(directory: Path) -> dict[str, int]:
    return {p.relative_to(directory).as_posix(): p.stat().st_size for p in directory.rglob("*")}


def test_the_wheel_ships_everything_a_run_needs_and_nothing_else(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "evalrun"], cwd=CHECKOUT, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    assert set(tracked) <= names, sorted(set(tracked) - names)[:5]  # every file of the package, data included
    needed = ["evalrun/conf/config.yaml", "evalrun/conf/model/tiny_adder.yaml",
              "evalrun/models/tiny-adder/model.safetensors", "evalrun/references/addition/1/index.json"]  # fmt: skip
    assert set(needed) <= names
    strays = [n for n in names if n.startswith(("tests/", "runs/", "scripts/", "build/")) or "__pycache__" in n
              or n.endswith((".pyc", ".log")) or ".cache" in n.split("/")]  # fmt: skip
    assert not strays
    assert installed.wheel.stat().st_size < WHEEL_LIMIT_BYTES


def test_the_default_run_from_an_empty_directory_has_the_checkouts_merkle_root(
    installed: Installed, run_eval, tmp_path: Path
) -> None:
    before = _listing(installed.package)
    work = tmp_path / "empty"
    work.mkdir()
    done = installed.evalrun(work, "run", "limit=5")  # the default: the embedded model, a built-in task, local Ray
    assert done.returncode == 0, done.stderr[-3000:]
    run = work / done.stdout.strip().splitlines()[-1]
    assert run.parent == work / "runs"  # runs/ under the working directory, printed as it is named there
    manifest = json.loads((run / layout.MANIFEST).read_text())
    assert manifest["model"]["path"] == str(installed.package / "models" / "tiny-adder")  # the wheel's own model
    assert manifest["config"]["search_path"] == ["pkg://evalrun.conf"]
    assert manifest["git"] == git_state()  # the commit the wheel was built from, the checkout's
    assert json.loads((installed.package / "build.json").read_text()) == git_state()
    checkout_run = run_eval("limit=5")
    assert load_record(layout.RunDir(run)).merkle_root == load_record(layout.RunDir(checkout_run)).merkle_root
    assert _listing(installed.package) == before  # nothing written into site-packages


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_users_config_directories_are_searched_first_and_recorded(installed: Installed, tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    pinned = installed.evalrun(work, "pin", str(installed.package / "models" / "tiny-adder"), "--name", "mine",
                               "--id", "my-org/mine", "-o", "mine/model/mine.yaml")  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr
    # a second directory, searched after the first: its model/mine.yaml is hidden by the first one's
    shared = work / "shared"
    (shared / "model").mkdir(parents=True)
    (shared / "model" / "mine.yaml").write_text("name: mine\nid: not-this-one\npath: /nowhere\n")
    (shared / "task").mkdir()
    (shared / "task" / "sums.yaml").write_text(
        "name: sums\ndataset: data/sums.jsonl\ntemplate: data/sum.jinja\nid_field: id\ntarget_field: answer\n"
        "scorer:\n  name: exact_match\n  normalize: [strip]\n"
    )
    (work / "data").mkdir()  # relative paths: from the working directory, as always
    (work / "data" / "sums.jsonl").write_text("".join(
        json.dumps({"id": f"s{i}", "question": f"{i}+{i + 1}", "answer": str(2 * i + 1)}) + "\n" for i in range(10, 14)
    ))  # fmt: skip
    (work / "data" / "sum.jinja").write_text("Q: {{ question }}\nA:")

    missing = installed.evalrun(work, "run", "--config-dir", "nope", "model=mine")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "--config-dir nope" in missing.stderr
    missing = installed.evalrun(work, "run", "model=mine", EVALRUN_CONFIG_PATH="nope")
    assert missing.returncode == 2 and f"EVALRUN_CONFIG_PATH: nope: {work / 'nope'} does not exist" in missing.stderr

    done = installed.evalrun(work, "run", "-cd", "mine", "model=mine", "task=sums", "cluster=inline", "report=false",
                             EVALRUN_CONFIG_PATH="shared")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((work / done.stdout.strip().splitlines()[-1] / layout.MANIFEST).read_text())
    assert manifest["model"]["id"] == "my-org/mine" and manifest["task"]["name"] == "sums"
    assert manifest["task"]["dataset"]["path"] == str(work / "data" / "sums.jsonl")
    record = manifest["config"]
    assert record["search_path"] == [str(work / "mine"), str(shared), "pkg://evalrun.conf"]
    files = record["files"]
    assert files["model/mine.yaml"] == {"source": str(work / "mine"), "sha256": _sha256(work / "mine/model/mine.yaml")}
    assert files["task/sums.yaml"] == {"source": str(shared), "sha256": _sha256(shared / "task" / "sums.yaml")}
    builtin = installed.package / "conf" / "config.yaml"
    assert files["config.yaml"] == {"source": "pkg://evalrun.conf", "sha256": _sha256(builtin)}
