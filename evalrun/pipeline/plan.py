"""The plan: every episode of a run, fixed before anything is dispatched.

Episodes = task items x seed set x repeats. An episode's id and seeds, its prompt, few-shot
examples, option order and judge calls are pure functions of the config, so the same config gives
the same episodes on any machine, in any order. Few-shot examples draw from the few-shot seed
(``seeds.fewshot``, by default the master seed), everything else from the master seed. Few-shot
examples and option orders are drawn once per item (per criterion and judge for judges), so
repeats differ only in sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evalrun.config import DecodingConfig, SeedsConfig
from evalrun.engines import SamplingSpec
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, sha256_hex
from evalrun.records.seeds import derive_seed
from evalrun.tasks import Task, prompt_variables, render_prompt
from evalrun.tasks.rubric import Rubric
from evalrun.tasks.selection import select_fewshot, shuffle_order


@dataclass(frozen=True)
class JudgeCall:
    """One judge grading one criterion of an episode's output."""

    criterion: str
    judge: str
    order: tuple[int, ...]  # shown position -> original option index, seeded per (item, criterion, judge)
    sampling: SamplingSpec  # letter mode: how the judge generates (its seed derived per episode and call)


@dataclass(frozen=True)
class Episode:
    episode_id: str
    task: str
    item_id: str
    seed: int  # the member of the seed set this episode belongs to
    repeat: int
    prompt: str
    target: str
    sampling: SamplingSpec
    fewshot_ids: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # multiple choice: options in original order (cannot-assess last)
    shuffle_order: tuple[int, ...] = ()  # multiple choice: shown position -> original index
    choice_scoring: str = ""  # multiple choice: letter | loglikelihood | both
    judging: Rubric | None = None  # one object shared by a run's episodes (pickled once per batch)
    judge_calls: tuple[JudgeCall, ...] = ()
    fields: Mapping[str, Any] | None = None  # the item's fields, for judge prompts
    # Why the episode fails without an engine call (a prompt longer than the model's context, found
    # before dispatch: task.on_overlong=fail_episode); not part of the episode's identity.
    rejection: str | None = None

    @property
    def prompt_sha256(self) -> str:
        return sha256_hex(self.prompt)

    @property
    def single_call(self) -> bool:
        """One generation and nothing else: the header, model, end chain of ``record_episode``."""
        return not (self.fewshot_ids or self.options or self.judge_calls)

    def seeds_record(self) -> dict[str, str]:
        return {"sampling": str(self.sampling.seed)}


def episode_id(task: str, item_id: str, seed: int, repeat: int, seeds: dict[str, str]) -> str:
    return canonical_hash({"task": task, "item": item_id, "seed": seed, "repeat": repeat, "seeds": seeds})


# How judges decode unless their judge pack says otherwise.
JUDGE_DECODING = DecodingConfig(name="judge", temperature=0.0, top_p=1.0, top_k=0, max_tokens=4, stop=("\n",),
                                logprobs=False)  # fmt: skip


def sampling_spec(decoding: DecodingConfig, seed: int) -> SamplingSpec:
    return SamplingSpec(
        temperature=float(decoding.temperature),
        top_p=float(decoding.top_p),
        top_k=decoding.top_k,
        max_tokens=decoding.max_tokens,
        stop=decoding.stop,
        seed=seed,
        logprobs=decoding.logprobs,
    )


def build_plan(task: Task, decoding: DecodingConfig, seeds: SeedsConfig) -> list[Episode]:
    """Few-shot examples draw from ``seeds.fewshot_seed``; option orders, sampling and judge seeds from
    the master seed (docs/design.md "Seeds")."""
    master, fewshot_seed = seeds.master, seeds.fewshot_seed
    pool = task.pack.fewshot
    if pool is None and seeds.fewshot is not None:
        raise BadInput("seeds.fewshot", f"task {task.name}'s prompt pack has no few-shot pool: expected null")
    scoring = task.choices.scoring if task.multiple_choice else ""
    rubric = task.rubric
    criteria, judges = (rubric.criteria, rubric.judges) if rubric is not None else ((), ())
    prepared = []
    for item in task.items:
        fewshot: tuple[int, ...] = ()
        if pool is not None:
            fewshot = select_fewshot(pool.ids, pool.examples, pool.k, pool.stratify, fewshot_seed, task.name, item.id)
        options = task.options(item) if task.multiple_choice else ()
        order = tuple(range(len(options)))
        if options and task.choices.shuffle:
            order = shuffle_order(len(options), master, task.name, item.id)
        shown = tuple(options[i] for i in order)
        examples = [pool.examples[i] for i in fewshot] if pool is not None else []
        prompt = render_prompt(task.pack, item.id, prompt_variables(item, examples, shown))
        ids = tuple(pool.ids[i] for i in fewshot) if pool is not None else ()
        judge_orders = [
            (c.id, judge, shuffle_order(len(c.labels), master, task.name, item.id, c.id, judge))
            for c in criteria
            for judge in judges
        ]
        prepared.append((item, prompt, ids, options, order, judge_orders))
    judge_decoding = JUDGE_DECODING.with_overrides(rubric.judge_pack.decoding) if rubric is not None else JUDGE_DECODING
    episodes = []
    for seed in seeds.set:
        for repeat in range(seeds.repeats):
            for item, prompt, ids, options, order, judge_orders in prepared:
                sampling = sampling_spec(decoding, derive_seed(master, "sampling", task.name, item.id, seed, repeat))
                judge_calls = tuple(
                    JudgeCall(criterion, judge, shown_order, sampling_spec(
                        judge_decoding, derive_seed(master, "judge", task.name, item.id, seed, repeat, criterion, judge)
                    ))
                    for criterion, judge, shown_order in judge_orders
                )  # fmt: skip
                eid = episode_id(task.name, item.id, seed, repeat, {"sampling": str(sampling.seed)})
                episodes.append(
                    Episode(
                        episode_id=eid,
                        task=task.name,
                        item_id=item.id,
                        seed=seed,
                        repeat=repeat,
                        prompt=prompt,
                        target=item.target,
                        sampling=sampling,
                        fewshot_ids=ids,
                        options=options,
                        shuffle_order=order,
                        choice_scoring=scoring,
                        judging=rubric,
                        judge_calls=judge_calls,
                        fields=item.fields if rubric is not None else None,
                    )
                )
    return episodes
