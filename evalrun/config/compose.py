"""Composition: a config from command-line overrides (Hydra), or from a run's stored config.yaml."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evalrun.config.overrides import Override, apply_overrides, integer_lists, parse_overrides, stop_overrides
from evalrun.config.paths import CONF_DIR
from evalrun.config.schema import Schema
from evalrun.config.settings import EvalConfig
from evalrun.config.validate import validate
from evalrun.errors import BadInput


def expand_multirun(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper expansion: ``a=1,2 b=x,y`` gives the four jobs' override lists."""
    parsed = parse_overrides(overrides)
    try:
        (jobs,) = BasicSweeper.split_arguments([o.hydra for o in parsed], None)
    except HydraException as exc:
        raise BadInput("overrides", str(exc)) from exc
    return jobs


def compose_config(overrides: list[str], config_dir: Path = CONF_DIR) -> DictConfig:
    """Compose ``config.yaml`` with Hydra overrides; composition errors become :class:`BadInput`."""
    parsed = parse_overrides(overrides)
    lists = integer_lists(parsed)  # Hydra composes with each one empty (its key checked), and they are set after it
    composed = [f"{o.key}=[]" if o in lists else o.text for o in parsed]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=composed)
        apply_overrides(cfg, lists)
        apply_overrides(cfg, stop_overrides(parsed))  # Hydra keeps "\n" as typed: set the strings it means
        return cfg
    except (HydraException, OmegaConfBaseException) as exc:
        where = next((o.key for o in parsed if o.key in str(exc)), "overrides")
        raise BadInput(where, str(exc).strip().splitlines()[0]) from exc
    finally:
        GlobalHydra.instance().clear()


def load_stored(path: Path, overrides: list[str], groups: Collection[str] = ()) -> DictConfig:
    """A run's resolved ``config.yaml`` over the current schema, then ``KEY=VALUE`` overrides.

    ``GROUP=NAME`` for a group in ``groups`` (``cluster=inline``) replaces that section with the group's
    file, as composing a run would; as in Hydra, group choices are applied before the other overrides.
    Not yet validated: callers adjust it (replay drops the model path) and then call :func:`validate`.
    """
    parsed = parse_overrides(overrides, plain=True)
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Schema), OmegaConf.load(path))
    except (OSError, ValueError, OmegaConfBaseException) as exc:
        raise BadInput(str(path), f"expected a resolved evalrun config ({str(exc).splitlines()[0]})") from exc
    assert isinstance(cfg, DictConfig)
    for choice in (o for o in parsed if o.key in groups):
        cfg[choice.key] = _group_section(choice)
    apply_overrides(cfg, [o for o in parsed if o.key not in groups])
    return cfg


def _group_section(choice: Override) -> DictConfig:
    """The section a group choice (``GROUP=NAME``) selects: ``conf/GROUP/NAME.yaml`` over the schema's."""
    group = CONF_DIR / choice.key
    options = sorted(p.stem for p in group.glob("*.yaml"))
    if not isinstance(choice.value, str) or choice.value not in options:
        raise BadInput(choice.text, f"expected {choice.key}=NAME with NAME one of {options}")
    try:
        section = OmegaConf.merge(
            OmegaConf.structured(Schema)[choice.key], OmegaConf.load(group / f"{choice.value}.yaml")
        )
    except (OSError, ValueError, OmegaConfBaseException) as exc:
        raise BadInput(choice.text, str(exc).strip().splitlines()[0]) from exc
    assert isinstance(section, DictConfig)
    return section


def load(overrides: list[str]) -> EvalConfig:
    return validate(compose_config(overrides))


def to_yaml(config: EvalConfig) -> str:
    """config.yaml: the settings as composed (and with a prompt pack's decoding settings applied)."""
    return yaml.safe_dump(config.as_record(), sort_keys=True, allow_unicode=True)
