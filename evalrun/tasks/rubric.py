"""Rubrics: weighted criteria, each a question with ordinal or nominal options, graded by judges.

A rubric is a YAML file under version control::

    name: summary-quality
    version: "1"
    judge_pack: judge            # prompt pack directory (relative to this file) the judges use
    judges: [j1, j2, j3]         # each judge sees its own seeded option order
    aggregation: mean            # over a criterion's judges: mean | median | majority
    scoring: loglikelihood       # a verdict is the judge's letter (letter) or its likeliest option
    cannot_assess: Cannot assess # optional: an option appended to every criterion before shuffling
    chat_format: auto            # auto | chat | plain: judge prompts through the judges' model's chat template
    criteria:
      - id: faithful
        question: Does the summary state only what the text says?
        weight: 2
        kind: ordinal            # ordinal | nominal (nominal needs aggregation: majority)
        options:
          - {label: "no", value: 0}
          - {label: "yes", value: 1}

What the judges see (judge pack, questions, option labels, judges, scoring mode, cannot-assess
text) is the rubric's *judge-facing* part: changing it needs new judge calls, a new run. Weights,
option values and the aggregation only turn recorded verdicts into scores, so a rescore can apply
an edit of them to a finished run without any model call. Turning verdicts into scores is
scoring's (:mod:`evalrun.scoring.rubric`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash
from evalrun.tasks.pack import PromptPack, _Strict, load_pack, parse_yaml_model
from evalrun.tasks.selection import LETTERS


class _Option(_Strict):
    label: str = Field(min_length=1)
    value: float = Field(ge=0, le=1)


class _Criterion(_Strict):
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    weight: float = Field(gt=0)
    kind: Literal["ordinal", "nominal"] = "ordinal"
    options: list[_Option] = Field(min_length=2)


class _RubricSpec(_Strict):
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    judge_pack: str
    judges: list[str] = Field(min_length=1)
    aggregation: Literal["mean", "median", "majority"] = "mean"
    scoring: Literal["letter", "loglikelihood"] = "loglikelihood"
    cannot_assess: str | None = None
    criteria: list[_Criterion] = Field(min_length=1)
    # the judge prompts as chat messages through the judges' model's template (auto: when it has one)
    chat_format: Literal["auto", "chat", "plain"] = "auto"


@dataclass(frozen=True)
class Criterion:
    id: str
    question: str
    weight: float
    kind: str
    labels: tuple[str, ...]  # the options, in original order, cannot-assess last when the rubric has one
    values: tuple[float | None, ...]  # None: the cannot-assess option


@dataclass(frozen=True)
class Rubric:
    path: Path
    name: str
    version: str
    judges: tuple[str, ...]
    aggregation: str
    scoring: str
    cannot_assess: str | None
    criteria: tuple[Criterion, ...]
    judge_pack: PromptPack
    chat_format: str = "auto"  # auto | chat | plain: how the judge prompts reach the judges' model

    def criterion(self, criterion_id: str) -> Criterion:
        return next(c for c in self.criteria if c.id == criterion_id)

    def judge_facing(self) -> dict[str, Any]:
        """What the judges see; verdicts recorded under one judge-facing hash serve any rubric with it."""
        return {
            "judge_pack": self.judge_pack.hash(self.judge_pack.decoding),
            "judges": list(self.judges),
            "scoring": self.scoring,
            "criteria": [{"id": c.id, "question": c.question, "labels": list(c.labels)} for c in self.criteria],
            # another setting than auto only: the judge-facing hashes of rubrics without it are unchanged
            **({"chat_format": self.chat_format} if self.chat_format != "auto" else {}),
        }

    def judge_facing_hash(self) -> str:
        return canonical_hash(self.judge_facing())

    def as_record(self) -> dict[str, Any]:
        """The whole rubric as data (weights, values, aggregation too): what the scoring hash covers."""
        return {
            "name": self.name,
            "version": self.version,
            "aggregation": self.aggregation,
            "judge_facing": self.judge_facing(),
            "criteria": [
                {"id": c.id, "weight": c.weight, "kind": c.kind, "values": list(c.values)} for c in self.criteria
            ],
        }


def _check(path: Path, spec: _RubricSpec) -> None:
    """Checks across fields, each naming the field at fault."""

    def fail(field: str, message: str) -> BadInput:
        return BadInput(f"{path}: field {field}", message)

    ids = [c.id for c in spec.criteria]
    for i, c in enumerate(spec.criteria):
        if ids.index(c.id) != i:
            raise fail(f"criteria.{i}.id", f"expected distinct criterion ids, {c.id!r} appears twice")
        labels = [o.label for o in c.options]
        if len(set(labels)) != len(labels):
            raise fail(f"criteria.{i}.options", f"expected distinct option labels, got {labels}")
        if spec.cannot_assess in labels:
            raise fail(f"criteria.{i}.options", f"the cannot-assess option {spec.cannot_assess!r} is added already")
        if len(labels) + (spec.cannot_assess is not None) > len(LETTERS):
            raise fail(f"criteria.{i}.options", f"expected at most {len(LETTERS)} options with cannot-assess")
        if c.kind == "nominal" and spec.aggregation != "majority":
            raise fail(f"criteria.{i}.kind", f"criterion {c.id!r} is nominal: its judges can only be aggregated "
                                             f"by majority, the rubric says {spec.aggregation!r}")  # fmt: skip
    if len(set(spec.judges)) != len(spec.judges):
        raise fail("judges", f"expected distinct judge ids, got {spec.judges}")


def load_rubric(path: Path) -> Rubric:
    spec: _RubricSpec = parse_yaml_model(path, _RubricSpec)
    _check(path, spec)
    pack_dir = path.parent / spec.judge_pack
    pack = load_pack(pack_dir, f"{path}: field judge_pack")
    if pack.fewshot is not None:
        raise BadInput(f"{pack.path}: field fewshot", "a judge pack has no few-shot pool")
    criteria = []
    for c in spec.criteria:
        labels = tuple(o.label for o in c.options)
        values: tuple[float | None, ...] = tuple(o.value for o in c.options)
        if spec.cannot_assess is not None:
            labels, values = (*labels, spec.cannot_assess), (*values, None)
        criteria.append(Criterion(c.id, c.question, c.weight, c.kind, labels, values))
    return Rubric(path, spec.name, spec.version, tuple(spec.judges), spec.aggregation, spec.scoring,
                  spec.cannot_assess, tuple(criteria), pack, spec.chat_format)  # fmt: skip
