"""The two sides of a conversation, measured apart: the agent's model calls and a model-played simulated user's
(docs/design.md "Simulated users"). Runs of agent episodes record every call of both in their chains; over two or
more runs of the same episodes this says, per side, how often its replies came out identical and which side a
diverging episode diverged on first, so a swing in the results is put on the agent or on the user.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalrun.records.entries import CompletionResponse, FailedCallEntry
from evalrun.records.view import ChainView, ModelCall, is_user_turn
from evalrun.rundir import layout
from evalrun.rundir.reader import iter_chains, load_record, part_pairs

SIDES = ("agent", "user")
EpisodeKey = tuple[str, str, int, int]  # task, item, seed, repeat


@dataclass(frozen=True)
class Call:
    """One model call of a conversation as a side made it: the prompt it was shown (by hash) and what it said."""

    side: str  # agent | user
    prompt_sha256: str
    text: str  # the reply ("" for a refused call)
    token_ids: tuple[int, ...]
    error: str | None = None  # a refused call's reason


def side_of(entry: ModelCall) -> str:
    return "user" if is_user_turn(entry) else "agent"


def conversation_calls(chain: ChainView) -> tuple[Call, ...]:
    """An episode's agent and user calls in call order (a judge's or an option score's are neither)."""
    calls = []
    for entry in sorted(chain.model_calls, key=lambda e: e.call):
        request = entry.request
        prompt = getattr(request, "prompt_sha256", "")
        if isinstance(entry, FailedCallEntry):
            calls.append(Call(side_of(entry), prompt, "", (), entry.error))
        elif isinstance(getattr(entry, "response", None), CompletionResponse) and not hasattr(entry, "criterion"):
            response = entry.response
            assert isinstance(response, CompletionResponse)
            calls.append(Call(side_of(entry), prompt, response.text, tuple(response.token_ids)))
    return tuple(calls)


@dataclass(frozen=True)
class Conversation:
    episode_id: str
    key: EpisodeKey
    calls: tuple[Call, ...]

    def side(self, side: str) -> tuple[Call, ...]:
        return tuple(c for c in self.calls if c.side == side)


def read_conversations(path: Path) -> dict[str, Conversation]:
    """Every episode of a finished run as its conversation's calls, by episode id."""
    run = layout.RunDir(path)
    found = {}
    for log_rel, _out_rel in part_pairs(run, load_record(run)):
        for chain in iter_chains(run.path / log_rel, log_rel):
            view = ChainView.of(chain.entries)
            h = view.header
            found[chain.episode] = Conversation(chain.episode, (h.task, h.item, h.seed, h.repeat),
                                                conversation_calls(view))  # fmt: skip
    return found


@dataclass(frozen=True)
class FirstDivergence:
    """Where conversations of one episode first part: the call's number among the episode's calls, its side and
    that side's turn, and whether the texts differ there or only the prompts (the other side spoke otherwise)."""

    call: int
    side: str
    turn: int
    what: str  # "reply" (the texts differ), "prompt" (same reply, shown something else), "length" (one ended)

    def describe(self) -> str:
        return f"call {self.call} ({self.side} turn {self.turn}, {self.what})"


def first_divergence(conversations: Sequence[tuple[Call, ...]]) -> FirstDivergence | None:
    """The first call where the conversations (one per run) differ, None when they are identical."""
    shortest = min(len(c) for c in conversations)
    turns: dict[str, int] = defaultdict(int)
    for i in range(shortest):
        calls = [c[i] for c in conversations]
        side = calls[0].side
        if len({c.side for c in calls}) > 1 or len({(c.text, c.error) for c in calls}) > 1:
            return FirstDivergence(i, side, turns[side], "reply")
        if len({c.prompt_sha256 for c in calls}) > 1:
            return FirstDivergence(i, side, turns[side], "prompt")
        turns[side] += 1
    if len({len(c) for c in conversations}) > 1:
        side = next(c[shortest].side for c in conversations if len(c) > shortest)
        return FirstDivergence(shortest, side, turns[side], "length")
    return None


@dataclass(frozen=True)
class SideAgreement:
    """One side over episodes matched across runs."""

    side: str
    episodes: int  # episodes in which this side made a call in some run
    identical: int  # ... whose replies of this side are identical in every run
    tarr: float | None  # items all of whose episodes are identical on this side (None: no such episode)
    first_diverged: int  # episodes whose first divergence is on this side
    calls: int  # this side's calls, summed over the runs

    @property
    def diverged(self) -> int:
        return self.episodes - self.identical


def side_agreement(matched: Iterable[Sequence[Conversation]]) -> dict[str, SideAgreement]:
    """Per side: replies identical across the runs (episode and item level) and where episodes first diverge.
    ``matched``: each episode's conversations, one per run."""
    by_item: dict[str, dict[tuple[str, str], list[bool]]] = {s: defaultdict(list) for s in SIDES}
    first: dict[str, int] = dict.fromkeys(SIDES, 0)
    calls: dict[str, int] = dict.fromkeys(SIDES, 0)
    for runs in matched:
        task, item = runs[0].key[0], runs[0].key[1]
        for side in SIDES:
            replies = [tuple((c.text, c.error) for c in r.side(side)) for r in runs]
            calls[side] += sum(len(r) for r in replies)
            if any(replies):
                by_item[side][(task, item)].append(len(set(replies)) == 1)
        found = first_divergence([r.calls for r in runs])
        if found is not None:
            first[found.side] += 1
    return {
        side: SideAgreement(
            side=side,
            episodes=sum(len(v) for v in by_item[side].values()),
            identical=sum(sum(v) for v in by_item[side].values()),
            tarr=(sum(all(v) for v in by_item[side].values()) / len(by_item[side])) if by_item[side] else None,
            first_diverged=first[side],
            calls=calls[side],
        )
        for side in SIDES
    }


def match_by_episode(runs: Sequence[Mapping[str, Conversation]]) -> list[list[Conversation]]:
    """The episodes every run has, by episode id (runs of one digest), each as its conversations in run order."""
    common = set.intersection(*(set(r) for r in runs))
    return [[r[eid] for r in runs] for eid in sorted(common)]


def match_by_key(runs: Sequence[Mapping[str, Conversation]]) -> list[list[Conversation]]:
    """The episodes every run has, by task, item, seed and repeat (a repeat with other sampling seeds)."""
    keyed = [{c.key: c for c in r.values()} for r in runs]
    common = set.intersection(*(set(k) for k in keyed))
    return [[k[key] for k in keyed] for key in sorted(common)]
