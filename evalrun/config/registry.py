"""Registries of plug-ins: engines, dispatchers, scorers, normalisers, each found by its config name.

In the style of Inspect AI's ``@scorer`` and ``@modelapi``: a plug-in is registered by a decorator
where it is defined (``@engine("vllm")``, ``@dispatcher("inline")``, ``@scorer("exact_match",
version="1")``, ``@normalizer("strip")``), and the valid names of a config field are the names its
registry holds. Each package keeps its own registry (:data:`evalrun.engines.ENGINES`,
:data:`evalrun.scoring.SCORERS`, ...); this module is the mechanism they share.

A plug-in whose module is costly to import (an engine that needs vLLM or transformers) is
*declared*: its registry knows the name and the module that registers it, and imports that module
only when the plug-in is first asked for, so listing or checking names imports nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from evalrun.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    """Plug-ins of one kind by name; ``field`` is the config field that selects one (for errors)."""

    def __init__(self, kind: str, field: str) -> None:
        self.kind = kind
        self.field = field
        self._plugins: dict[str, T] = {}
        self._declared: dict[str, str] = {}  # name -> module that registers it when imported

    def add(self, name: str, plugin: T) -> T:
        if self._plugins.get(name, plugin) is not plugin:
            raise ValueError(f"two {self.kind}s are registered as {name!r}")
        self._plugins[name] = plugin
        return plugin

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator: the decorated class or function is the plug-in ``name``."""

        def decorate(plugin: T) -> T:
            return self.add(name, plugin)

        return decorate

    def declare(self, name: str, module: str) -> None:
        """``name`` is registered by ``module``, imported the first time the plug-in is asked for."""
        self._declared[name] = module

    def names(self) -> tuple[str, ...]:
        return tuple(sorted({*self._plugins, *self._declared}))

    def __contains__(self, name: object) -> bool:
        return name in self._plugins or name in self._declared

    def check(self, name: str, field: str | None = None) -> None:
        """BadInput naming the config field unless ``name`` is registered or declared (nothing is imported)."""
        if name not in self:
            raise BadInput(field or self.field, f"expected one of {self.names()}, got {name!r}")

    def get(self, name: str, field: str | None = None) -> T:
        """The plug-in ``name``, importing its declaring module if need be."""
        self.check(name, field)
        if name not in self._plugins:
            importlib.import_module(self._declared[name])
            if name not in self._plugins:
                raise RuntimeError(f"{self._declared[name]} is declared to register {self.kind} {name!r} and did not")
        return self._plugins[name]
