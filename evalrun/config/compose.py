"""Composition: a config from command-line overrides (Hydra), or from a run's stored config.yaml."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

import yaml
from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from evalrun.config.overrides import Override, apply_overrides, integer_lists, parse_overrides, stop_overrides
from evalrun.config.schema import Schema
from evalrun.config.search import BUILTIN_SOURCE, PRIMARY_CONFIG, ConfigSearchPath, ConfigSources, search_path
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


def _initialize_hydra(search: ConfigSearchPath) -> None:
    """Hydra's global state for composing over ``search``: the built-in configs as Hydra's primary source
    (``pkg://evalrun.conf``) and the user's directories before it. Hydra's public ``initialize_*`` take one
    directory, and ``hydra.searchpath`` only appends after the primary one; a user's file must win, so the
    search path is made here with Hydra's own functions (hydra-core is pinned exactly in the locks)."""
    config_search_path = create_config_search_path(BUILTIN_SOURCE)
    for directory in search.user_dirs:
        config_search_path.prepend(
            "evalrun user config", f"file://{directory}", anchor=SearchPathQuery(provider="main")
        )
    Hydra.create_main_hydra2(task_name="evalrun", config_search_path=config_search_path)


def compose_config(overrides: list[str], search: ConfigSearchPath | None = None) -> DictConfig:
    """Compose ``config.yaml`` with Hydra overrides: :func:`compose_sourced`'s config."""
    return compose_sourced(overrides, search)[0]


def compose_sourced(overrides: list[str], search: ConfigSearchPath | None = None) -> tuple[DictConfig, ConfigSources]:
    """Compose ``config.yaml`` with Hydra overrides over the search path (default: :func:`search_path`, the
    user's directories then the built-in ones), and say which files it composed from; composition errors
    become :class:`BadInput`."""
    search = search or search_path()
    parsed = parse_overrides(overrides)
    lists = integer_lists(parsed)  # Hydra composes with each one empty (its key checked), and they are set after it
    composed = [f"{o.key}=[]" if o in lists else o.text for o in parsed]
    GlobalHydra.instance().clear()
    try:
        _initialize_hydra(search)
        cfg = compose(config_name=PRIMARY_CONFIG, overrides=composed, return_hydra_config=True)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        apply_overrides(cfg, lists)
        apply_overrides(cfg, stop_overrides(parsed))  # Hydra keeps "\n" as typed: set the strings it means
    except (HydraException, OmegaConfBaseException) as exc:
        where = next((o.key for o in parsed if o.key in str(exc)), "overrides")
        raise BadInput(where, str(exc).strip().splitlines()[0]) from exc
    finally:
        GlobalHydra.instance().clear()
    return cfg, search.composed_from(choices)


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
    """The section a group choice (``GROUP=NAME``) selects: ``GROUP/NAME.yaml``, first found on the search path
    (the user's directories, then the built-in ones), over the schema's."""
    search = search_path()
    found = search.find(f"{choice.key}/{choice.value}.yaml") if isinstance(choice.value, str) else None
    if found is None:
        raise BadInput(choice.text, f"expected {choice.key}=NAME with NAME one of {search.options(choice.key)}")
    try:
        section = OmegaConf.merge(OmegaConf.structured(Schema)[choice.key], OmegaConf.load(found[1]))
    except (OSError, ValueError, OmegaConfBaseException) as exc:
        raise BadInput(choice.text, str(exc).strip().splitlines()[0]) from exc
    assert isinstance(section, DictConfig)
    return section


def load(overrides: list[str]) -> EvalConfig:
    """The checked config of Hydra ``overrides``, with the files it was composed from (the manifest's ``config``)."""
    cfg, sources = compose_sourced(overrides)
    return dataclasses.replace(validate(cfg), config_sources=sources)


def to_yaml(config: EvalConfig) -> str:
    """config.yaml: the settings as composed (and with a prompt pack's decoding settings applied)."""
    return yaml.safe_dump(config.as_record(), sort_keys=True, allow_unicode=True)
