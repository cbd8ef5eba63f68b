"""The scorer and normaliser registries: ``@scorer("name", version=...)`` and ``@normalizer("name")``.

A scorer is registered as a factory: given the ``task.scorer`` settings and the scoring context it
returns a function from one output row (the columns it declares) to its scores. Its version
changes whenever what it computes changes; the scoring hash covers name, version and parameters
(:mod:`evalrun.scoring.digest`). A normaliser is a function ``str -> str``; scorers apply the
``task.scorer.normalize`` chain to output and target alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.config.registry import Registry
from evalrun.scoring.context import ScoringContext
from evalrun.stats.summary import Aggregation

IDENTITY_COLUMNS = ("episode_id", "task", "item_id", "seed", "repeat")  # copied into every score row
READ_COLUMNS = ("output", "target")  # what every scorer reads of an output row

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Score:
    metric: str
    value: float
    extracted: str | None


RowScorer = Callable[[Row], list[Score]]
ScorerFactory = Callable[[ScorerConfig, ScoringContext], RowScorer]
# a scorer's corpus metrics (by metric name) and their aggregations (evalrun.stats.summary): a metric aggregated
# over the whole set (corpus BLEU, F1), whose score rows' ``extracted`` hold each document's input as JSON
AggregationsFactory = Callable[[ScorerConfig, ScoringContext], Mapping[str, Aggregation]]
Normalizer = Callable[[str], str]


@dataclass(frozen=True)
class Scorer:
    """A registered scorer: its factory, version, and the output columns its rows carry."""

    name: str
    version: str
    reads: tuple[str, ...]  # the output columns a row given to the scorer has
    factory: ScorerFactory
    aggregations: AggregationsFactory | None = None  # a scorer with corpus metrics: what aggregates them

    @property
    def columns(self) -> tuple[str, ...]:
        """The output columns scoring needs: the episode's identity and what the scorer reads."""
        return (*IDENTITY_COLUMNS, *self.reads)

    def build(self, spec: ScorerConfig, context: ScoringContext) -> RowScorer:
        return self.factory(spec, context)

    def corpus(self, spec: ScorerConfig, context: ScoringContext) -> Mapping[str, Aggregation]:
        """The corpus metrics of this scorer under ``spec`` and ``context`` and their aggregations (most have none)."""
        return {} if self.aggregations is None else self.aggregations(spec, context)


SCORERS: Registry[Scorer] = Registry("scorer", field="task.scorer.name")
NORMALIZERS: Registry[Normalizer] = Registry("normaliser", field="task.scorer.normalize")


def scorer(name: str, *, version: str, columns: Sequence[str] = (),
           aggregations: AggregationsFactory | None = None) -> Callable[[ScorerFactory], ScorerFactory]:  # fmt: skip
    """Register a scorer factory as ``name``; ``columns``: the output columns it reads beyond output and target;
    ``aggregations``: its corpus metrics' aggregations, for a scorer that has them."""

    def register(factory: ScorerFactory) -> ScorerFactory:
        SCORERS.add(name, Scorer(name, version, (*READ_COLUMNS, *columns), factory, aggregations))
        return factory

    return register


def normalizer(name: str) -> Callable[[Normalizer], Normalizer]:
    """Register a ``str -> str`` function as the normaliser ``name``."""
    return NORMALIZERS.register(name)


def normalizer_chain(names: Sequence[str]) -> Normalizer:
    """The normalisers ``names`` applied in order (a BadInput names an unknown one)."""
    steps = [NORMALIZERS.get(n) for n in names]

    def apply(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return apply
