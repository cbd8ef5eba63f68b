"""The plan: every episode of a run, fixed before anything is dispatched.

Episodes = task items x seed set x repeats. An episode's id and seeds, its prompt, few-shot
examples, option order and judge calls are pure functions of the config, so the same config gives
the same episodes on any machine, in any order. Few-shot examples draw from the few-shot seed
(``seeds.fewshot``, by default the master seed), everything else from the master seed. Few-shot
examples and option orders are drawn once per item (per criterion and judge for judges), so
repeats differ only in sampling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, overload

from evalrun.chat import ChatFormat, Conversation
from evalrun.chat.reasoning import ReasoningParser
from evalrun.config import DecodingConfig, SeedsConfig
from evalrun.engines import SamplingSpec
from evalrun.errors import BadInput
from evalrun.records.canonical import SLOT, canonical_hash, canonical_integer, canonical_template, sha256_hex
from evalrun.records.seeds import derive_seed, seed_of
from evalrun.tasks import Item, Task, prompt_variables, render_prompt
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
    kind: ClassVar[str] = "dataset"  # the kind of episode that runs it (evalrun.episodes.EPISODE_KINDS)

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
    option_delimiter: str = " "  # multiple choice: between the prompt and an option scored by loglikelihood
    # multiple choice: each option's context, scored in place of the prompt (Item.contexts); empty: the prompt
    option_contexts: tuple[str, ...] = ()
    # how many times the policy's request is sampled, the replies scored together (lm-eval's repeats, whose
    # majority_vote filter reads them all); each call after the first with a seed of its own (GENERATION_SEED)
    generations: int = 1
    judging: Rubric | None = None  # one object shared by a run's episodes (pickled once per batch)
    judge_calls: tuple[JudgeCall, ...] = ()
    fields: Mapping[str, Any] | None = None  # the item's fields, for judge prompts
    reasoning: ReasoningParser | None = None  # splits the reply into thinking and answer; shared by a run's episodes
    add_special_tokens: bool = True  # False: a chat-formatted prompt (its template writes the BOS): GenerationRequest
    judge_chat: ChatFormat | None = None  # the judges' prompts as chat messages through this template; None: plain
    # the chat the prompt was rendered from (None: a plain prompt), for an engine that takes chats
    # (GenerationRequest.conversation); not part of the episode's identity: the prompt is
    conversation: Conversation | None = None
    # Why the episode fails without an engine call (a prompt longer than the model's context, found
    # before dispatch: task.on_overlong=fail_episode); not part of the episode's identity.
    rejection: str | None = None

    @property
    def prompt_sha256(self) -> str:
        return sha256_hex(self.prompt)

    @property
    def single_call(self) -> bool:
        """One generation and nothing else: the header, model, end chain of ``record_episode``."""
        return not (self.fewshot_ids or self.options or self.judge_calls) and self.generations == 1

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


@dataclass(frozen=True)
class PlannedItem:
    """What every episode of one item shares: drawn once per item, whatever the seed and repeat."""

    item: Item
    prompt: str
    fewshot_ids: tuple[str, ...]
    options: tuple[str, ...]
    shuffle_order: tuple[int, ...]
    judge_orders: tuple[tuple[str, str, tuple[int, ...]], ...]  # (criterion, judge, shown order)
    rejection: str | None = None  # see Episode.rejection
    conversation: Conversation | None = None  # see Episode.conversation


class Plan(Sequence[Episode]):
    """Every episode of a run, seeds x repeats x items in that order, each made when it is asked for.

    Only the per-item part is held, so a plan of a million episodes takes the memory of its items
    (docs/design.md "Start-up and exit": driver memory); an episode made again is equal to what it was.
    """

    def __init__(self, task: Task, items: tuple[PlannedItem, ...], decoding: DecodingConfig, seeds: SeedsConfig,
                 judge_decoding: DecodingConfig) -> None:  # fmt: skip
        self.task_name = task.name
        self.items = items
        self._decoding, self._judge_decoding = decoding, judge_decoding
        self._seeds_config = seeds
        self._master = seeds.master
        self._seeds = tuple(seeds.set)
        self._repeats = seeds.repeats
        self._scoring = task.choices.scoring if task.multiple_choice else ""
        self._option_delimiter = " " if task.choices.delimiter is None else task.choices.delimiter
        self._rubric = task.rubric
        self._task = task
        self._reasoning = task.reasoning
        self.add_special_tokens = task.chat is None  # a chat template writes the special tokens itself
        self._judge_chat = task.judge_chat
        self._templates = [_EpisodeTemplates.of(seeds.master, task.name, planned.item.id) for planned in items]

    def with_items(self, items: tuple[PlannedItem, ...]) -> Plan:
        """The same plan over changed items (prompts cut to fit, or rejected: episodes.context)."""
        if len(items) != len(self.items):
            raise ValueError(f"{len(items)} items for a plan of {len(self.items)}")
        return Plan(self._task, items, self._decoding, self._seeds_config, self._judge_decoding)

    def __len__(self) -> int:
        return len(self._seeds) * self._repeats * len(self.items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, index: int) -> Episode: ...

    @overload
    def __getitem__(self, index: slice) -> list[Episode]: ...

    def __getitem__(self, index: int | slice) -> Episode | list[Episode]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("plan index out of range")
        index %= n
        per_seed = self._repeats * len(self.items)
        seed_index, within = divmod(index, per_seed)
        repeat, item_index = divmod(within, len(self.items))
        return self._episode(self._seeds[seed_index], repeat, item_index)

    def episode_digests(self, start: int, stop: int) -> bytes:
        """The ids of episodes ``start`` to ``stop`` as the episodes would have them, each its 32 bytes, concatenated,
        without making the episodes (what the driver checks a run's written episodes against:
        evalrun.episodes.planned_digests). Two sha256s an episode, about 2 us: a sixth of making it."""
        first, last, _ = slice(start, stop).indices(len(self))
        items, digests = len(self.items), bytearray()
        while first < last:  # a run of items under one (seed, repeat) at a time
            seed_index, within = divmod(first, self._repeats * items)
            repeat, item_index = divmod(within, items)
            run = min(last - first, items - item_index)
            seed, repeat_text = canonical_integer(self._seeds[seed_index]), canonical_integer(repeat)
            for templates in self._templates[item_index : item_index + run]:
                digests += templates.identity(seed, repeat_text)[1]
            first += run
        return bytes(digests)

    def __iter__(self) -> Iterator[Episode]:
        for seed in self._seeds:
            for repeat in range(self._repeats):
                for item_index in range(len(self.items)):
                    yield self._episode(seed, repeat, item_index)

    def _episode(self, seed: int, repeat: int, item_index: int) -> Episode:
        planned, templates = self.items[item_index], self._templates[item_index]
        name, item, master = self.task_name, planned.item, self._master
        seed_text, repeat_text = canonical_integer(seed), canonical_integer(repeat)
        sampling_seed, digest = templates.identity(seed_text, repeat_text)
        sampling = sampling_spec(self._decoding, sampling_seed)
        judge_calls = tuple(
            JudgeCall(criterion, judge, shown_order, sampling_spec(
                self._judge_decoding, derive_seed(master, "judge", name, item.id, seed, repeat, criterion, judge)
            ))
            for criterion, judge, shown_order in planned.judge_orders
        )  # fmt: skip
        rubric = self._rubric
        return Episode(
            episode_id=digest.hex(),
            task=name,
            item_id=item.id,
            seed=seed,
            repeat=repeat,
            prompt=planned.prompt,
            target=item.target,
            sampling=sampling,
            fewshot_ids=planned.fewshot_ids,
            options=planned.options,
            shuffle_order=planned.shuffle_order,
            choice_scoring=self._scoring,
            option_delimiter=self._option_delimiter,
            option_contexts=item.contexts,
            judging=rubric,
            judge_calls=judge_calls,
            fields=item.fields if rubric is not None else None,
            reasoning=self._reasoning,
            add_special_tokens=self.add_special_tokens,
            judge_chat=self._judge_chat,
            rejection=planned.rejection,
            conversation=planned.conversation,
        )


@dataclass(frozen=True)
class _EpisodeTemplates:
    """One item's :func:`episode_id` and sampling :func:`derive_seed` texts with the seed and repeat left
    open: an episode is made in a few microseconds, not thirty (tests/test_config.py checks them against
    the two functions)."""

    seed_text: tuple[str, ...]  # [master, "sampling", task, item, SEED, REPEAT]
    id_text: tuple[str, ...]  # {"item", "repeat": REPEAT, "seed": SEED, "seeds": {"sampling": SAMPLING}, "task"}

    @classmethod
    def of(cls, master: int, task: str, item: str) -> _EpisodeTemplates:
        seeds = canonical_template([master, "sampling", task, item, SLOT, SLOT], 2)
        ids = canonical_template({"task": task, "item": item, "seed": SLOT, "repeat": SLOT,
                                  "seeds": {"sampling": SLOT}}, 3)  # fmt: skip
        return cls(seeds, ids)

    def identity(self, seed: str, repeat: str) -> tuple[int, bytes]:
        """The sampling seed and the 32 bytes of the id (:func:`episode_id` is their hex) of the episode of the seed
        and repeat written as canonical integers (:func:`canonical_integer`)."""
        pre, mid, post = self.seed_text
        sampling = seed_of(f"{pre}{seed}{mid}{repeat}{post}")
        pre, after_repeat, after_seed, post = self.id_text
        text = f'{pre}{repeat}{after_repeat}{seed}{after_seed}"{sampling}"{post}'
        return sampling, hashlib.sha256(text.encode()).digest()


def build_plan(task: Task, decoding: DecodingConfig, seeds: SeedsConfig) -> Plan:
    """Few-shot examples draw from ``seeds.fewshot_seed``; option orders, sampling and judge seeds from
    the master seed (docs/design.md "Seeds")."""
    master, fewshot_seed = seeds.master, seeds.fewshot_seed
    pool = task.pack.fewshot
    if pool is None and seeds.fewshot is not None:
        raise BadInput("seeds.fewshot", f"task {task.name}'s prompt pack has no few-shot pool: expected null")
    rubric = task.rubric
    criteria, judges = (rubric.criteria, rubric.judges) if rubric is not None else ((), ())
    items = []
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
        prompt, conversation = render_prompt(task.pack, item.id, prompt_variables(item, examples, shown), task.chat)
        made = task.pack.examples_of(item.id)  # a pack that made the prompt says which examples it shows
        ids = made if made is not None else tuple(pool.ids[i] for i in fewshot) if pool is not None else ()
        judge_orders = tuple(
            (c.id, judge, shuffle_order(len(c.labels), master, task.name, item.id, c.id, judge))
            for c in criteria
            for judge in judges
        )
        items.append(PlannedItem(item, prompt, ids, options, order, judge_orders, conversation=conversation))
    judge_decoding = JUDGE_DECODING.with_overrides(rubric.judge_pack.decoding) if rubric is not None else JUDGE_DECODING
    return Plan(task, tuple(items), decoding, seeds, judge_decoding)
