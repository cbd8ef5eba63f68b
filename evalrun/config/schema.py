"""Hydra's schema: mutable copies of the typed settings, registered in Hydra's ConfigStore.

Hydra's ConfigStore and OmegaConf's merging need mutable dataclasses with types OmegaConf knows
(lists, dicts, no ``Literal``), so each frozen section of :mod:`evalrun.config.settings` gets a
mutable twin generated from it: the same fields, defaults and scalar types, a tuple as a list, a
literal as its value type, a union of several types (a URL or a list of them) and a setting that may be
``auto`` (``seeds.master``) as ``Any``, checked by validation. ``conf/config.yaml`` lists
``evalrun_schema`` first in its defaults, so every group file and command-line override is merged
into typed nodes: an unknown key or a value of the wrong type fails at composition.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, Optional, Union, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from evalrun.config.paths import BUILTIN_TASKS, PACKAGE_DIR, cache_root
from evalrun.config.settings import EvalConfig, Section, settings_fields

SCHEMA_NAME = "evalrun_schema"


def _omegaconf_type(tp: Any) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # ``A | B | None`` (a URL or a list of them): OmegaConf has no unions; validation types it
            return Any
        return Optional[_omegaconf_type(inner[0])]  # noqa: UP045 (OmegaConf reads typing.Optional)
    if isinstance(tp, type) and issubclass(tp, Section):
        return mutable_schema(tp)
    if origin is Literal:
        return type(args[0])
    if origin is tuple:
        return list[_omegaconf_type(args[0])]  # type: ignore[misc]
    if origin in (dict, Mapping):
        return dict[args[0], args[1]]  # type: ignore[misc]
    return tp


def _default(f: dataclasses.Field[Any]) -> Any:
    factory = f.default_factory
    if factory is not dataclasses.MISSING:
        if isinstance(factory, type) and issubclass(factory, Section):
            return dataclasses.field(default_factory=mutable_schema(factory))
        return dataclasses.field(default_factory=factory)
    if isinstance(f.default, tuple):
        return dataclasses.field(default_factory=lambda items=f.default: list(items))
    return dataclasses.field(default=f.default)


@cache
def mutable_schema(section: type[Section]) -> type:
    """The mutable dataclass Hydra composes for ``section``: its settings, their defaults."""
    hints = get_type_hints(section)
    specs = [(f.name, Any if f.metadata.get("or_auto") else _omegaconf_type(hints[f.name]), _default(f))
             for f in settings_fields(section)]  # fmt: skip
    name = section.__name__.removesuffix("Config") + "Schema"
    schema = dataclasses.make_dataclass(name, specs)
    schema.__module__ = __name__
    return schema


Schema = mutable_schema(EvalConfig)

ConfigStore.instance().store(name=SCHEMA_NAME, node=Schema)
if not OmegaConf.has_resolver("evalrun.root"):
    OmegaConf.register_new_resolver("evalrun.root", lambda: str(PACKAGE_DIR))  # the installed package: models/...
    OmegaConf.register_new_resolver("evalrun.builtin", lambda: str(BUILTIN_TASKS))
if not OmegaConf.has_resolver("evalrun.cache"):  # models built into the cache (scripts/build_smollm2.py)
    OmegaConf.register_new_resolver("evalrun.cache", lambda: str(cache_root()))
