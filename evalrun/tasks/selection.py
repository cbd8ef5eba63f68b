"""Seeded choices a task makes: few-shot examples per item, option orders per (item, criterion, judge).
Each draws from :func:`evalrun.records.seeds.derive_rng` with its own purpose ("fewshot", "shuffle") and
the keys that identify it, so the same config gives the same examples and orders on any machine,
in any dispatch order, with any number of workers. Reading a letter back out of an output is
scoring's (:func:`evalrun.scoring.choice.parse_letter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evalrun.records.seeds import derive_rng

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def select_fewshot(ids: Sequence[str], examples: Sequence[Mapping[str, Any]], k: int, stratify: str | None,
                   master: int, task: str, item_id: str) -> tuple[int, ...]:  # fmt: skip
    """Indices into the pool of ``k`` examples for ``item_id``, in prompt order; never the item itself.

    Stratified: labels (of field ``stratify``) are visited in a seeded order, round robin, each
    label's examples in a seeded order, so the chosen labels are as balanced as ``k`` allows.
    """
    candidates = [i for i, example_id in enumerate(ids) if example_id != item_id]
    rng = derive_rng(master, "fewshot", task, item_id)
    if stratify is None:
        return tuple(rng.sample(candidates, k))
    groups: dict[str, list[int]] = {}
    for i in candidates:
        groups.setdefault(str(examples[i][stratify]), []).append(i)
    labels = sorted(groups)
    rng.shuffle(labels)
    for label in labels:
        rng.shuffle(groups[label])
    chosen: list[int] = []
    while len(chosen) < k:
        for label in labels:
            if groups[label] and len(chosen) < k:
                chosen.append(groups[label].pop())
    return tuple(chosen)


def shuffle_order(
    n: int, master: int, task: str, item_id: str, criterion: str = "", judge: str = ""
) -> tuple[int, ...]:
    """Shown position -> original option index, for ``n`` options of one (item, criterion, judge)."""
    order = list(range(n))
    derive_rng(master, "shuffle", task, item_id, criterion, judge).shuffle(order)
    return tuple(order)


def option_continuation(label: str, delimiter: str = " ") -> str:
    """What a loglikelihood request scores for an option: the delimiter (a space, lm-evaluation-harness's default
    ``target_delimiter``) and its text."""
    return f"{delimiter}{label}"
