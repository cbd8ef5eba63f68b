"""Users' own config directories (--config-dir/-cd, EVALRUN_CONFIG_PATH): searched before the built-in configs, by
every command that composes a config or reads a group, and recorded with the sha256 of each file composed."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from evalrun.cli import main
from evalrun.config import CONF_DIR, MODELS_DIR, load, load_stored
from evalrun.config.search import ConfigSearchPath, config_dirs, search_path
from evalrun.errors import BadInput
from evalrun.pipeline.runner import load_config_file, prepare

GOLDEN_CONFIG = Path(__file__).resolve().parent / "golden" / "addition-v1" / "config.yaml"
MOVED = f"model.path={MODELS_DIR / 'tiny-adder'}"  # the golden run's model, where the package keeps it now


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def user_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Two directories: the first shadows the built-in tiny_adder model config, the second adds a cluster."""
    first, second = tmp_path / "first", tmp_path / "second"
    builtin = yaml.safe_load((CONF_DIR / "model" / "tiny_adder.yaml").read_text())
    (first / "model").mkdir(parents=True)
    (first / "model" / "tiny_adder.yaml").write_text(yaml.safe_dump({**builtin, "id": "users/tiny-adder"}))
    (second / "model").mkdir(parents=True)
    (second / "model" / "tiny_adder.yaml").write_text(yaml.safe_dump({**builtin, "id": "hidden-by-first"}))
    (second / "cluster").mkdir()
    (second / "cluster" / "mine.yaml").write_text("name: inline\nbatch_size: 7\n")
    return first, second


def test_a_users_file_overrides_the_built_in_one_of_its_name_and_is_recorded(
    user_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = user_dirs
    monkeypatch.setenv("EVALRUN_CONFIG_PATH", str(second))
    with config_dirs([str(first)]):
        config = load(["limit=2"])
    assert config.model.id == "users/tiny-adder"  # --config-dir's directory first, then EVALRUN_CONFIG_PATH's
    record = config.config_sources.as_record()
    assert record["search_path"] == [str(first), str(second), "pkg://evalrun.conf"]
    model_file = first / "model" / "tiny_adder.yaml"
    assert record["files"]["model/tiny_adder.yaml"] == {"source": str(first), "sha256": _sha256(model_file)}
    task_file = CONF_DIR / "task" / "addition.yaml"
    assert record["files"]["task/addition.yaml"] == {"source": "pkg://evalrun.conf", "sha256": _sha256(task_file)}
    monkeypatch.delenv("EVALRUN_CONFIG_PATH")
    assert load(["limit=2"]).model.id == "evalrun/tiny-adder"  # without them, the built-in one
    assert load(["limit=2"]).config_sources.search_path == ("pkg://evalrun.conf",)


def test_a_group_option_of_a_users_directory_is_found_by_a_stored_config_too(user_dirs: tuple[Path, Path]) -> None:
    _, second = user_dirs
    with pytest.raises(BadInput, match=r"cluster=mine: expected cluster=NAME with NAME one of \['inline', 'local'"):
        load_stored(GOLDEN_CONFIG, ["cluster=mine"], ["cluster"])
    with config_dirs([str(second)]):  # resume, check and replay read cluster=NAME through the same search path
        config = load_config_file(GOLDEN_CONFIG, ["cluster=mine", MOVED])
    assert config.cluster.name == "inline" and config.cluster.batch_size == 7
    assert config.model.path == str(MODELS_DIR / "tiny-adder")


def test_a_stored_config_takes_a_model_that_moved_still_held_to_its_pins(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"model\.path \(weights that moved\)"):
        load_config_file(GOLDEN_CONFIG, [MOVED, "model.id=other"])
    recorded = yaml.safe_load(GOLDEN_CONFIG.read_text())["model"]["sha256"]
    assert load_config_file(GOLDEN_CONFIG, [MOVED]).model.sha256 == recorded
    other = shutil.copytree(MODELS_DIR / "tiny-adder", tmp_path / "other")
    (other / "generation_config.json").write_text("{}")
    with pytest.raises(BadInput, match=r"generation_config\.json"):
        prepare(load_config_file(GOLDEN_CONFIG, [f"model.path={other}"]))


def test_every_entry_of_the_search_path_must_be_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a_file = tmp_path / "file.yaml"
    a_file.write_text("x: 1\n")
    with pytest.raises(BadInput, match=rf"--config-dir missing: {tmp_path / 'missing'} does not exist"):
        monkeypatch.chdir(tmp_path)
        with config_dirs(["missing"]):
            pass
    monkeypatch.setenv("EVALRUN_CONFIG_PATH", f"{tmp_path}:{a_file}")
    with pytest.raises(BadInput, match=rf"EVALRUN_CONFIG_PATH: {a_file}: {a_file} is not a directory"):
        search_path()
    monkeypatch.setenv("EVALRUN_CONFIG_PATH", f"{tmp_path}::")  # empty entries are skipped, as in PATH
    assert search_path() == ConfigSearchPath((tmp_path,))


@pytest.mark.parametrize(("verb", "rest"), [(["run"], ["limit=1"]), (["canary"], []), (["references", "build"], []),
                                           (["resume"], ["x"]), (["check"], ["x"]), (["replay"], ["x"]),
                                           (["rescore"], ["x"])])  # fmt: skip
def test_each_command_that_composes_takes_config_dirs_and_refuses_a_missing_one(
    verb: list[str],
    rest: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()  # a run directory's argument is checked first
    assert main([*verb, "-cd", "nope", *rest]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--config-dir nope: {tmp_path / 'nope'} does not exist" in err


def test_references_build_writes_into_an_installed_package_never(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules["evalrun.cli.main"], "checkout", lambda: None)  # as installed from a wheel
    assert main(["references", "build", "task=addition"]) == 2
    assert "--root: the built-in references ship inside the installed evalrun package" in capsys.readouterr().err
