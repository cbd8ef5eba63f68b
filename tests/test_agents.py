"""Agent episodes on the recorder (issue 12): chains that hold every read, lockstep turns, exact replay
against fresh worlds. Engine-free: the scripted agent, and a scripted stand-in for the engine where
a test isolates what the model agent records (the real engine runs in tests/test_agents_e2e.py)."""

from __future__ import annotations

import json
import os
import random
import secrets
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from evalrun.config import load
from evalrun.config.settings import DecodingConfig, SeedsConfig
from evalrun.engines import Completion, GenerationRequest
from evalrun.engines.replay import ReplayEngine
from evalrun.episodes import Engines, kind_named, replay_episodes
from evalrun.episodes.agent import (
    AgentBudget,
    AgentEpisode,
    ModelAgent,
    ScriptedAgent,
    plan_agent_episodes,
    run_agent_episodes,
)
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.chain import chain_head
from evalrun.records.entries import EndEntry, HeaderEntry, ObservationEntry, parse_line
from evalrun.worlds import WORLDS, WorldTask
from evalrun.worlds.actions import ToolCall, format_calls
from evalrun.worlds.invoice_desk import InvoiceDesk, InvoiceDeskV2
from evalrun.worlds.scripted import scripted_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks

GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}
DECODING = DecodingConfig(name="agent", temperature=0.0, top_p=1.0, top_k=0, max_tokens=64, stop=(), logprobs=False)


def suite(version: str = "1", seeds: tuple[int, int] = (1000, 1006)) -> list[WorldTask]:
    return world_tasks(suite_from_mapping({
        "name": "invoice-desk", "version": version, "family": ["duplicates", "price-differences"],
        "seeds": {"train": [0, 1000], "test": list(seeds)}, "split": "test",
    }))  # fmt: skip


def plan(tasks: list[WorldTask], agent: str = "scripted", repeats: int = 1, **budget: int) -> list[AgentEpisode]:
    seeds = SeedsConfig(master=7, set=(0,), repeats=repeats)
    return plan_agent_episodes("invoice-desk", tasks, DECODING, seeds, agent, AgentBudget(**budget))


def replay(episodes: list[AgentEpisode], recorded: dict[str, tuple[str, ...]]) -> tuple[list[Any], list[Any]]:
    """The world kind's replay of scripted episodes, through the one replay loop (no model: an empty replay engine)."""
    engine = ReplayEngine({}, {})
    return replay_episodes(kind_named("world"), Engines(engine, engine), episodes, recorded, lambda _: GENERATOR)


def kinds(lines: tuple[str, ...]) -> list[str]:
    return [json.loads(line)["kind"] for line in lines]


def test_scripted_agent_passes_both_families_and_records_every_read() -> None:
    results = run_agent_episodes(plan(suite()), ScriptedAgent(), GENERATOR)
    assert len(results) == 12 and all(r.stop == "done" and r.scores["pass"] == 1.0 for r in results)
    for r in results:
        entries = [parse_line(line) for line in r.log_lines]
        header, end = entries[0], entries[-1]
        assert isinstance(header, HeaderEntry) and header.world is not None and header.world.agent == "scripted"
        assert header.world.world_hash == r.world_hash and header.world.family == r.episode.world_task.family
        assert isinstance(end, EndEntry) and end.stop == "done" and end.steps == len(r.steps)
        assert chain_head(r.log_lines) == r.head
        counts = Counter(kinds(r.log_lines))
        assert counts["tool"] == counts["observation"] == r.tool_calls
        assert counts["clock"] >= 1 and counts["uuid"] == 1  # today's date, the report id
        assert counts["join"] == sum(len(s.calls) > 1 for s in r.steps)


def test_same_seed_same_episodes_whatever_the_batch() -> None:
    episodes = plan(suite())
    together = run_agent_episodes(episodes, ScriptedAgent(), GENERATOR)
    alone = [run_agent_episodes([e], ScriptedAgent(), GENERATOR)[0] for e in reversed(episodes)][::-1]
    assert [r.log_lines for r in together] == [r.log_lines for r in alone]
    assert len({r.world_hash for r in together}) == len(together)  # every task its own world


class ScriptedEngine:
    """An engine that answers each chat prompt with the scripted policy's reply (or a fixed one):
    it isolates what the model agent records and how many engine calls it makes."""

    def __init__(self, episodes: list[AgentEpisode], garbage: str | None = None) -> None:
        self.by_id = {e.episode_id: e for e in episodes}
        self.calls: list[int] = []
        self.garbage = garbage
        self.histories: dict[str, Any] = {}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.calls.append(len(requests))
        out = []
        for r in requests:
            text = self.garbage if self.garbage is not None else self.histories[r.episode_id]()
            out.append(Completion(text, tuple(range(len(text) // 8 + 1)), (), "stop", len(r.prompt)))
        return out


class ScriptedModel(ModelAgent):
    """The model agent over :class:`ScriptedEngine`: the engine replies what the scripted policy would."""

    def act(self, turns: Any) -> Any:
        for t in turns:
            self.engine.histories[t.episode.episode_id] = lambda t=t: format_calls(
                scripted_policy(t.task_text, t.steps)
            )
        return super().act(turns)


def test_model_agent_advances_every_live_episode_in_one_engine_call() -> None:
    episodes = plan(suite(seeds=(1000, 1020)), agent="model")
    engine = ScriptedEngine(episodes)
    agent = ScriptedModel(engine)
    results = run_agent_episodes(episodes, agent, GENERATOR)
    assert all(r.scores["pass"] == 1.0 for r in results)
    assert engine.calls[0] == len(episodes) == 40  # every live episode in the first engine call
    assert agent.model_calls / agent.engine_calls > 25 and len(engine.calls) <= max(len(r.steps) for r in results)
    model_lines = [json.loads(line) for r in results for line in r.log_lines if '"kind":"model"' in line]
    assert len(model_lines) == agent.model_calls and all(
        m["request"]["prompt"].endswith("assistant:") for m in model_lines
    )


def test_bad_replies_and_budgets_are_recorded_and_scored_as_failures() -> None:
    episodes = plan(suite(seeds=(1000, 1001)), agent="model", max_steps=3)
    engine = ScriptedEngine(episodes, garbage='{"tool_calls":[{"name":"launch_rockets","arguments":{}}]} ok')
    results = run_agent_episodes(episodes, ModelAgent(engine), GENERATOR)
    for r in results:
        assert r.stop == "max_steps" and r.scores["pass"] == 0.0 and r.error is None
        observations = [parse_line(x) for x in r.log_lines if '"kind":"observation"' in x]
        assert len(observations) == 3 and all(isinstance(o, ObservationEntry) and o.reply is not None
                                              and o.status == "error" for o in observations)  # fmt: skip
    engine = ScriptedEngine(episodes, garbage='{"tool_calls":[{"name":"launch_rockets","arguments":{}}]}')
    results = run_agent_episodes(episodes, ModelAgent(engine), GENERATOR)
    for r in results:
        observations = [json.loads(x) for x in r.log_lines if '"kind":"observation"' in x]
        assert all(o["call"] >= 0 and "unknown tool" in o["content"] for o in observations)
    tokens = plan(suite(seeds=(1000, 1001)), agent="model", max_tokens=10)
    engine = ScriptedEngine(tokens, garbage="x" * 40)  # 6 tokens a reply
    results = run_agent_episodes(tokens, ModelAgent(engine), GENERATOR)
    assert all(r.stop == "max_tokens" and r.output_tokens >= 10 and len(r.steps) == 2 for r in results)


def test_replay_against_fresh_worlds_reproduces_every_line() -> None:
    episodes = plan(suite())
    results = run_agent_episodes(episodes, ScriptedAgent(), GENERATOR)
    recorded = {r.episode.episode_id: r.log_lines for r in results}
    replayed, divergences = replay(episodes, recorded)
    assert not divergences and [r.head for r in replayed] == [r.head for r in results]
    assert [r.final_state for r in replayed] == [r.final_state for r in results]


def test_a_world_change_is_the_first_divergence_at_that_tool_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 2 shows invoices differently: replaying a version-1 record against it diverges at the
    first get_invoice observation (the header's versions differ first, so compare from the tools on)."""
    episodes = plan(suite(seeds=(1000, 1001)))
    recorded = {r.episode.episode_id: r.log_lines for r in run_agent_episodes(episodes, ScriptedAgent(), GENERATOR)}
    changed = [replace(e, world_task=replace(e.world_task, version="2")) for e in episodes]
    _, divergences = replay(changed, recorded)
    assert len(divergences) == 2 and all(d.seq == 0 for d in divergences)  # the header names the world version
    # world code changed without a version bump (v2's behaviour under v1's name): the header agrees,
    # the first read or observation v2 makes differently is the divergence
    drifted = type("Drifted", (InvoiceDeskV2,), {"version": "1"})
    monkeypatch.setitem(WORLDS._plugins, "invoice-desk@1", drifted)
    _, divergences = replay(episodes, recorded)
    assert len(divergences) == 2
    for d in divergences:
        assert d.seq is not None and d.seq > 0
        assert json.loads(recorded[d.episode][d.seq])["kind"] in ("observation", "env")


def test_a_socket_opened_by_a_world_fails_the_episode_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def phone_home(self: Any) -> Any:
        socket.create_connection(("example.com", 80))

    handlers = InvoiceDesk.handlers
    monkeypatch.setattr(InvoiceDesk, "handlers", lambda self: {**handlers(self), "today": lambda: phone_home(self)})
    (result,) = run_agent_episodes(plan(suite(seeds=(1000, 1001)))[:1], ScriptedAgent(), GENERATOR)
    end = parse_line(result.log_lines[-1])
    assert isinstance(end, EndEntry) and end.status == "error" and end.error and "NetworkUsed" in end.error
    assert result.scores == {} and result.final_state is None


BYPASSES = [  # a world's tool reading each thing that varies directly, and the call the failure names
    # each looked up when called, as world code does (a function bound before the guard opened escapes it)
    (lambda: time.time(), "time.time()"),
    (lambda: time.monotonic(), "time.monotonic()"),
    (lambda: random.random(), "random.random()"),
    (lambda: random.choice([1, 2]), "random.choice()"),
    (lambda: uuid.uuid4(), "uuid.uuid4()"),
    (lambda: os.urandom(8), "os.urandom()"),
    (lambda: secrets.token_hex(8), "random.SystemRandom"),
    (lambda: os.environ.get("HOME"), "os.environ"),
    (lambda: os.getenv("PATH"), "os.environ"),
]


@pytest.mark.parametrize(("read", "named"), BYPASSES, ids=[named for _, named in BYPASSES])
def test_a_world_that_reads_around_its_effects_fails_the_episode_naming_the_call(
    monkeypatch: pytest.MonkeyPatch, read: Any, named: str
) -> None:
    """The recorder cannot be bypassed: a direct read of the clock, randomness, a fresh id or the environment in
    world code fails the episode loudly, its end entry naming the call and the effect to read it through; the
    same read outside world code (the test's own thread, after the episode) still works."""
    handlers = InvoiceDesk.handlers
    monkeypatch.setattr(InvoiceDesk, "handlers", lambda self: {**handlers(self), "today": lambda: {"x": read()}})
    (result,) = run_agent_episodes(plan(suite(seeds=(1000, 1001)))[:1], ScriptedAgent(), GENERATOR)
    end = parse_line(result.log_lines[-1])
    assert isinstance(end, EndEntry) and end.status == "error" and end.error
    assert "RecorderBypassed" in end.error and named in end.error and "effects." in end.error
    assert result.scores == {} and result.final_state is None
    read()  # outside world code: untouched


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("task.world.family=[fraud]", "task.world.family"),
        ("task.world.family=[]", "task.world.family"),
        ("task.world.version=9", "task.world.name/version"),
        ("task.world.split=dev", "task.world.split"),
        ("task.world.max_steps=0", "task.world.max_steps"),
        ("task.world.agent=human", "task.world.agent"),
        ("task.scorer.name=exact_match", "task.scorer.name"),
        ("+task.dataset=x.jsonl", "task.dataset"),
    ],
)
def test_a_bad_agent_task_is_refused_before_any_model_loads(override: str, where: str) -> None:
    with pytest.raises(BadInput) as caught:
        prepare(load(["task=invoice_desk", override]))
    assert caught.value.where.startswith(where)


def test_parallel_calls_run_at_once_and_are_recorded_alike_whatever_the_thread_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scripted agent reads every invoice in one reply: those calls run on threads at once, each
    reads the clock and a random draw through its own effects, and each finishes after a random real
    delay (a test double for a slow tool); the chain must not depend on which finished first."""
    threads: set[int] = set()
    get_invoice = InvoiceDesk.handlers

    def slow_handlers(self: InvoiceDesk) -> Any:
        handlers = dict(get_invoice(self))
        original = handlers["get_invoice"]

        def slow(**arguments: Any) -> Any:
            threads.add(threading.get_ident())
            time.sleep(random.SystemRandom().random() / 50)  # real, unseeded: the order of the reads varies
            self.effects.clock()
            self.effects.random("jitter", 8)
            time.sleep(random.SystemRandom().random() / 50)  # ... and the order the calls finish in
            return original(**arguments)

        handlers["get_invoice"] = slow
        return handlers

    monkeypatch.setattr(InvoiceDesk, "handlers", slow_handlers)
    episodes = plan(suite(seeds=(1000, 1003)))
    runs = [run_agent_episodes(episodes, ScriptedAgent(), GENERATOR) for _ in range(4)]
    assert all([r.log_lines for r in run] == [r.log_lines for r in runs[0]] for run in runs)
    assert len(threads) > 1  # the calls did run on several threads
    joined = [json.loads(x) for r in runs[0] for x in r.log_lines if '"kind":"join"' in x]
    assert joined and all(len(j["calls"]) > 1 for j in joined)
    clocks = [json.loads(x) for x in runs[0][0].log_lines if '"kind":"clock"' in x]
    assert all("tool" in c for c in clocks)  # every read names the tool call it was made in
    recorded = {r.episode.episode_id: r.log_lines for r in runs[0]}
    replayed, divergences = replay(episodes, recorded)
    assert not divergences and [r.head for r in replayed] == [r.head for r in runs[0]]


def test_a_clock_that_crosses_midnight_and_a_dst_change_records_the_same_chain_in_any_time_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The world clock is UTC (task.start is ISO 8601, a time without a zone UTC; dates are its UTC dates): an
    episode whose simulated time runs from 23:30 New York time past midnight and past the daylight-saving change
    (2024-03-10 07:00 UTC) records the same chain under TZ=America/New_York as under UTC."""
    (task,) = suite()[:1]
    tasks = [replace(task, start="2024-03-10T04:30:00Z", tick=1200.0)]  # 20 simulated minutes a call

    def policy(text: str, steps: Any) -> list[ToolCall]:  # the clock read ten turns in a row, then the reference
        return [ToolCall("today")] if len(steps) < 10 else scripted_policy(text, steps[10:])

    chains = {}
    try:
        for zone in ("UTC", "America/New_York"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            (result,) = run_agent_episodes(plan(tasks, max_steps=20), ScriptedAgent(policy), GENERATOR)
            chains[zone] = result.log_lines
    finally:
        monkeypatch.undo()
        time.tzset()
    assert chains["UTC"] == chains["America/New_York"]
    reads = [json.loads(line)["response"]["seconds"] for line in chains["UTC"] if json.loads(line)["kind"] == "clock"]
    # ten reads, then the reference policy's: past New York's midnight (05:00 UTC) and its DST change (07:00 UTC)
    assert len(reads) == 11 and reads[0] < 1710046800 < 1710054000 < reads[-1]
    entries = [json.loads(line) for line in chains["UTC"]]
    dates = {e["content"]["date"] for e in entries if e["kind"] == "observation" and set(e["content"]) == {"date"}}
    assert dates == {"2024-03-10"}  # the UTC date all along (New York's was 2024-03-09 until 05:00 UTC)
