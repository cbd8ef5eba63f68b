"""The one typed view of a chain (evalrun.records.view.ChainView): every entry of an agent episode lands in
exactly one place (a turn's reply, tool call, read, result, unread answer or join; the reads made while the
world was generated; the end), in chain order; a single-turn episode is one turn with no tool calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evalrun.config import DecodingConfig, SeedsConfig
from evalrun.engines import Completion, GenerationRequest, SamplingSpec
from evalrun.episodes.agent import AgentBudget, ModelAgent, ScriptedAgent, plan_agent_episodes
from evalrun.episodes.agent import run_agent_episodes as run_agents
from evalrun.episodes.harness import record_episode
from evalrun.episodes.plan import Episode
from evalrun.records.entries import Entry, ModelEntry, parse_line
from evalrun.records.view import ChainView
from evalrun.worlds.suite import suite_from_mapping, world_tasks

GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}
DECODING = DecodingConfig(name="agent", temperature=0.0, top_p=1.0, top_k=0, max_tokens=64, stop=(), logprobs=False)


def _episodes(agent: str = "scripted", **budget: int) -> list[Any]:
    tasks = world_tasks(suite_from_mapping({
        "name": "invoice-desk", "version": "1", "family": ["duplicates", "price-differences"],
        "seeds": {"train": [0, 1000], "test": [1000, 1002]}, "split": "test",
    }))  # fmt: skip
    return plan_agent_episodes("invoice-desk", tasks, DECODING, SeedsConfig(master=7, set=(0,), repeats=1), agent,
                               AgentBudget(**budget))  # fmt: skip


def _placed(view: ChainView) -> list[int]:
    """The seq of every entry the view holds, in the order it holds them."""
    seqs = [view.header.seq, *(r.seq for r in view.setup_reads)]
    for turn in view.turns:
        seqs += [turn.reply.seq] if turn.reply is not None else []
        seqs += [c.request.seq for c in turn.calls]
        for call in turn.calls:
            seqs += [r.seq for r in call.reads] + ([call.result.seq] if call.result is not None else [])
        seqs += [turn.unread.seq] if turn.unread is not None else []
        seqs += [turn.join.seq] if turn.join is not None else []
    return seqs + ([view.end.seq] if view.end is not None else [])


def _entries(lines: tuple[str, ...]) -> list[Entry]:
    return [parse_line(line) for line in lines]


def test_a_scripted_agent_episode_is_every_entry_once_in_chain_order() -> None:
    for result in run_agents(_episodes(), ScriptedAgent(), GENERATOR):
        view = ChainView.of(_entries(result.log_lines))
        assert _placed(view) == list(range(len(result.log_lines)))
        assert all(t.reply is None for t in view.turns) and len(view.turns) == len(result.steps)
        assert [c.request.request.name for t in view.turns for c in t.calls][-1] == "submit_report"
        assert all(c.result is not None and c.result.call == c.request.call for t in view.turns for c in t.calls)
        parallel = [t for t in view.turns if len(t.calls) > 1]
        assert parallel and all(t.join is not None and t.join.calls == [c.request.call for c in t.calls]
                                for t in parallel)  # fmt: skip
        assert any(c.reads for t in view.turns for c in t.calls)  # the clock and ids the calls read
        assert all(r.tool == c.request.call for t in view.turns for c in t.calls for r in c.reads)
        assert view.end is not None and view.end.stop == "done" and view.failure is None


class _Garbage:
    """An engine whose every reply is no tool-call reply."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion("not json", (1, 2), (-0.5, -0.5), "stop", 3) for _ in requests]


def test_an_unreadable_model_reply_is_a_turn_with_its_answer() -> None:
    (result, *_rest) = run_agents(_episodes("model", max_steps=2), ModelAgent(_Garbage()), GENERATOR)
    view = ChainView.of(_entries(result.log_lines))
    assert _placed(view) == list(range(len(result.log_lines)))
    assert len(view.turns) == 2 and all(isinstance(t.reply, ModelEntry) and not t.calls for t in view.turns)
    assert [t.unread.reply for t in view.turns if t.unread is not None] == [0, 1]
    assert view.generations == tuple(t.reply for t in view.turns)


def test_a_single_turn_episode_is_one_turn_without_tools() -> None:
    sampling = SamplingSpec(0.0, 1.0, 0, 4, (), 11, True)
    episode = Episode("a" * 64, "t", "i", 0, 0, "2+2=", "4", sampling)
    result = record_episode(episode, Completion(" 4", (9,), (-0.25,), "stop", 3), GENERATOR)
    view = ChainView.of(_entries(result.log_lines))
    assert [t.reply.seq if t.reply else None for t in view.turns] == [1] and not view.turns[0].calls
    assert view.generations[0].response.text == " 4" and view.model_calls == view.generations
    assert view.end is not None and view.end.model_calls == 1 and view.setup_reads == ()


def test_a_chain_must_start_with_its_header() -> None:
    sampling = SamplingSpec(0.0, 1.0, 0, 4, (), 11, True)
    result = record_episode(Episode("b" * 64, "t", "i", 0, 0, "p", "x", sampling),
                            Completion("x", (1,), (-1.0,), "stop", 1), GENERATOR)  # fmt: skip
    with pytest.raises(ValueError, match="starts with its header"):
        ChainView.of(_entries(result.log_lines)[1:])
    assert json.loads(result.log_lines[0])["kind"] == "header"
