"""``KEY=VALUE`` overrides: one parser, Hydra's override grammar, for every command that takes them.

``evalrun run`` composes its overrides with Hydra (group choices such as ``task=addition_mc`` and
``+model@judge_model=NAME`` too); ``resume`` and ``replay`` apply them to a run's stored config;
``rescore`` to its scorer settings. All of them parse with :func:`parse_overrides`, so a value is
read the same way everywhere: ``[strip,lower]`` is a list, ``null`` is None, ``'a b'`` a quoted
string (quote a value with brackets, commas or parentheses: ``pattern='answer is (\\d+)'``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override as HydraOverride
from hydra.core.override_parser.types import OverrideType, ValueType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evalrun.errors import BadInput


@dataclass(frozen=True)
class Override:
    text: str  # as given: what an error names
    key: str  # the dotted key (or config group) it sets
    value: Any  # parsed: str, int, float, bool, None, list, dict (a sweep: Hydra's sweep object)
    hydra: HydraOverride = field(repr=False, compare=False)

    @property
    def plain(self) -> bool:
        """``KEY=VALUE``: no ``+``/``++``/``~`` prefix, no ``@package``, no sweep."""
        h = self.hydra
        return h.type is OverrideType.CHANGE and h.package is None and not h.is_sweep_override()


# Stop strings as typed: Hydra hands ``"\n"`` over as a backslash and an ``n``, which would never match
STOP_KEYS = ("decoding.stop", "task.world.stop")
_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}


def unescape_stop(text: str) -> str:
    r"""A stop string typed on a command line with its escapes read: ``\n``, ``\t``, ``\r`` and ``\\`` are the
    newline, tab, return and backslash. Only overrides are read so; a YAML file writes its own escapes, and a
    run's stored config holds the strings it ran with."""
    return re.sub(r"\\[ntr\\]", lambda m: _ESCAPES[m.group(0)], text)


def _typed_stops(key: str, value: Any) -> Any:
    if key not in STOP_KEYS:
        return value
    if isinstance(value, str):
        return unescape_stop(value)
    if isinstance(value, list):
        return [unescape_stop(v) if isinstance(v, str) else v for v in value]
    return value


# ``KEY=[INT,...]`` with a dotted KEY, as a long seed set is given. Hydra's parser takes a time that grows with the
# square of a list's length (2,000 integers: half a second; 5,000: three, and composing parses every override
# again), so such an override is read here, into the Override Hydra's parser makes of it (tests/test_config.py checks
# that they agree); anything else, an integer Hydra reads otherwise (``007`` is a string to it) among it, is Hydra's.
_INTEGER = r"\s*-?(?:0|[1-9][0-9]*)\s*"
_INTEGER_LIST = re.compile(rf"(?P<key>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)=\[(?P<items>{_INTEGER}(?:,{_INTEGER})*)?\]")


def _integer_list(text: str) -> HydraOverride | None:
    match = _INTEGER_LIST.fullmatch(text)
    if match is None:
        return None
    values = [int(item) for item in match["items"].split(",")] if match["items"] else []
    return HydraOverride(type=OverrideType.CHANGE, key_or_group=match["key"], value_type=ValueType.ELEMENT,
                         _value=values, input_line=text)  # fmt: skip


def integer_lists(overrides: Sequence[Override]) -> list[Override]:
    """The lists of integers read without Hydra's parser that no later override of the same key follows: composing
    sets them after Hydra's (the others are Hydra's to apply, in their order)."""
    last = {o.key: i for i, o in enumerate(overrides)}
    return [o for i, o in enumerate(overrides) if last[o.key] == i and _INTEGER_LIST.fullmatch(o.text)]


def stop_overrides(overrides: Sequence[Override]) -> list[Override]:
    """The overrides that set stop strings (:data:`STOP_KEYS`), their escapes read."""
    return [o for o in overrides if o.key in STOP_KEYS and o.value is not None and not o.hydra.is_sweep_override()]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def parse_overrides(texts: Sequence[str], *, plain: bool = False) -> list[Override]:
    """Parse each ``KEY=VALUE``; a BadInput names the first override that does not parse (or, with
    ``plain``, one that is not a plain ``KEY=VALUE``)."""
    parser = OverridesParser.create()
    parsed = []
    for text in texts:
        try:
            hydra = _integer_list(text) or parser.parse_override(text)
        except HydraException as exc:
            raise BadInput(text, f"expected KEY=VALUE in Hydra's override grammar ({_first_line(exc)})") from exc
        value = None if hydra.is_delete() else _typed_stops(hydra.key_or_group, hydra.value())  # a sweep: as it is
        override = Override(text, hydra.key_or_group, value, hydra)
        if plain and not override.plain:
            raise BadInput(text, "expected KEY=VALUE (a setting, without +, ~, @ or sweeps)")
        parsed.append(override)
    return parsed


def apply_overrides(cfg: DictConfig, overrides: Sequence[Override]) -> None:
    """Set each override's value in ``cfg`` (checked against its schema); a BadInput names the override."""
    for override in overrides:
        try:
            # a dict is merged into its section; a list replaces the one there either way, and merging it wraps
            # each element twice (5,000 seeds: 0.4 s)
            merge = not isinstance(override.value, list)
            OmegaConf.update(cfg, override.key, override.value, merge=merge, force_add=False)
        except (ValueError, OmegaConfBaseException) as exc:
            raise BadInput(override.text, _first_line(exc)) from exc
