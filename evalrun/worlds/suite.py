"""World suites: which world, families, seed ranges and held-out split a run evaluates, from config.

A suite is declared in config (the ``world`` section of ``conf/task/invoice_desk.yaml``)::

    name: invoice-desk
    version: "1"
    family: [duplicates, price-differences]
    seeds: {train: [0, 1000], test: [1000, 1100]}   # half-open ranges [a, b)
    split: test
    start: "2024-03-15T09:00:00Z"
    tick: 1.0

and :func:`world_tasks` turns it into the run's tasks: for each seed of the chosen split's range in
order, each family in the order given. The splits' ranges may not overlap, so a held-out split
never shares a world with the split a model is trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalrun.errors import BadInput
from evalrun.worlds.base import WORLDS, WorldTask, parse_start, world_key


@dataclass(frozen=True)
class SeedRange:
    """Seeds ``start`` (included) to ``stop`` (excluded)."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def overlaps(self, other: SeedRange) -> bool:
        return self.start < other.stop and other.start < self.stop


@dataclass(frozen=True)
class WorldSuite:
    world: str
    version: str
    families: tuple[str, ...]
    seeds: Mapping[str, SeedRange]
    split: str
    start: str = "2024-03-15T09:00:00Z"
    tick: float = 1.0


KEYS = ("name", "version", "family", "seeds", "split", "start", "tick")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(where, f"expected an integer, got {value!r}")
    return value


def suite_from_mapping(data: Mapping[str, Any], where: str = "world") -> WorldSuite:
    """The suite a config section declares; BadInput naming ``where.field`` for any bad value."""
    if not isinstance(data, Mapping):
        raise BadInput(where, f"expected a mapping with {KEYS}, got {data!r}")
    if unknown := sorted(set(data) - set(KEYS)):
        raise BadInput(f"{where}.{unknown[0]}", f"unknown key; expected some of {KEYS}")
    for key in ("name", "version", "family", "seeds", "split"):
        if key not in data:
            raise BadInput(f"{where}.{key}", "missing")
    name, version = data["name"], data["version"]
    if not isinstance(name, str):
        raise BadInput(f"{where}.name", f"expected a world name, got {name!r}")
    if isinstance(version, bool) or not isinstance(version, str | int):
        raise BadInput(f"{where}.version", f'expected a version such as "1", got {version!r}')
    version = str(version)
    cls = WORLDS.get(world_key(name, version), field=f"{where}.name/version")
    families = data["family"]
    if isinstance(families, str):
        families = [families]
    if not _is_list(families) or not families:
        raise BadInput(f"{where}.family", f"expected a list of families out of {cls.families}, got {families!r}")
    for family in families:
        if family not in cls.families:
            raise BadInput(f"{where}.family", f"expected families out of {cls.families}, got {family!r}")
    if len(set(families)) != len(families):
        raise BadInput(f"{where}.family", f"a family is listed twice: {families!r}")
    seeds = _seed_ranges(data["seeds"], f"{where}.seeds")
    split = data["split"]
    if split not in seeds:
        raise BadInput(f"{where}.split", f"expected one of the seed splits {sorted(seeds)}, got {split!r}")
    start = data.get("start", WorldSuite.start)
    if not isinstance(start, str):
        raise BadInput(f"{where}.start", f"expected an ISO 8601 date-time text, got {start!r}")
    parse_start(start, f"{where}.start")
    tick = data.get("tick", WorldSuite.tick)
    if isinstance(tick, bool) or not isinstance(tick, int | float) or not 0 <= tick < float("inf"):
        raise BadInput(f"{where}.tick", f"expected seconds per clock read, >= 0, got {tick!r}")
    return WorldSuite(name, version, tuple(families), seeds, split, start, float(tick))


def _is_list(value: Any) -> bool:
    """A list in config: a list, tuple or Hydra's ListConfig (any sequence but text)."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _seed_ranges(value: Any, where: str) -> dict[str, SeedRange]:
    if not isinstance(value, Mapping) or not value:
        raise BadInput(
            where, f"expected splits with seed ranges, e.g. {{train: [0, 1000], test: [1000, 1100]}}, got {value!r}"
        )
    ranges: dict[str, SeedRange] = {}
    for split, bounds in value.items():
        here = f"{where}.{split}"
        if not _is_list(bounds) or len(bounds) != 2:
            raise BadInput(here, f"expected a range [first, stop), got {bounds!r}")
        first, stop = _int(bounds[0], f"{here}[0]"), _int(bounds[1], f"{here}[1]")
        if not 0 <= first < stop:
            raise BadInput(here, f"expected 0 <= first < stop, got [{first}, {stop})")
        ranges[str(split)] = SeedRange(first, stop)
    names = sorted(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if ranges[a].overlaps(ranges[b]):
                raise BadInput(where, f"splits {a} and {b} share seeds: a held-out split must not overlap another")
    return ranges


def world_tasks(suite: WorldSuite) -> list[WorldTask]:
    """The suite's tasks, deterministic: seeds ascending, and for each seed the families in the order
    given (so the first N tasks, ``limit=N``, cover every family)."""
    seeds = suite.seeds[suite.split]
    return [
        WorldTask(
            world=suite.world,
            version=suite.version,
            family=family,
            seed=seed,
            item_id=f"{family}-{seed}",
            start=suite.start,
            tick=suite.tick,
            split=suite.split,
        )
        for seed in range(seeds.start, seeds.stop)
        for family in suite.families
    ]
