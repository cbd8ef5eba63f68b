"""The support-desk world (issue 31, item 1 and the scripted customer of item 2): a conversation with a simulated
customer written as seeded code, the policy, the reference solver and its frozen outcomes, the verifier's
partial credit, the scripted agent on every held-out family, and reproducible chains (the same Merkle root).
Engine-free: the scripted agent on the recorder (as tests/test_agents.py and tests/test_references.py run
invoice-desk and shift-planner), no Ray and no model."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from evalrun.config import load
from evalrun.config.settings import DecodingConfig, SeedsConfig
from evalrun.engines.replay import ReplayEngine
from evalrun.episodes import Engines, kind_named, replay_episodes
from evalrun.episodes.agent import AgentBudget, AgentEpisode, ScriptedAgent, plan_agent_episodes, run_agent_episodes
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.canonical import canonical_hash, canonical_json
from evalrun.records.entries import EndEntry, HeaderEntry, ObservationEntry, ToolEntry, parse_line
from evalrun.records.merkle import merkle_root
from evalrun.rundir import references
from evalrun.worlds import WORLDS, WorldTask, effects_for, make_world, score_final_state, world_class
from evalrun.worlds.actions import Step, ToolCall
from evalrun.worlds.reference_sets import build_references, check_reference_set
from evalrun.worlds.scripted import run_scripted, scripted_policy
from evalrun.worlds.scripted_support import support_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks
from evalrun.worlds.support_desk import (
    FAMILIES,
    PATIENCE,
    REFUSALS,
    REFUSE,
    SupportDesk,
    fact_told,
    generate_shop,
    policy_problem,
    verify_support_desk,
)

START = "2024-03-15T09:00:00Z"
TODAY = date(2024, 3, 15)
GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}
COMMITTED = references.REFERENCES_ROOT / "support-desk" / "1"
PASS = {"database": 1.0, "facts": 1.0, "ended": 1.0, "credit": 1.0, "pass": 1.0}


def task(seed: int, family: str = "return") -> WorldTask:
    return WorldTask("support-desk", "1", family, seed, f"{family}-{seed}", START)


def reset_world(t: WorldTask) -> SupportDesk:
    world = make_world(t)
    assert isinstance(world, SupportDesk)
    world.reset(t, effects_for(t))
    return world


def held_out() -> list[AgentEpisode]:
    """The episodes of the shipped task config: every family, the held-out (test) seeds, the scripted agent."""
    return prepare(load(["task=support_desk"])).episodes


def run(episodes: list[AgentEpisode], **policy: Any) -> list[Any]:
    agent = ScriptedAgent(partial(support_policy, **policy)) if policy else ScriptedAgent()
    return run_agent_episodes(episodes, agent, GENERATOR)


def plan(tasks: list[WorldTask], **budget: int) -> list[AgentEpisode]:
    decoding = DecodingConfig(name="agent", temperature=0.0, top_p=1.0, top_k=0, max_tokens=64, stop=(),
                              logprobs=False)  # fmt: skip
    seeds = SeedsConfig(master=7, set=(0,), repeats=1)
    return plan_agent_episodes("support-desk", tasks, decoding, seeds, "scripted", AgentBudget(**budget))


def refuse_tasks(reason: str, count: int = 3) -> list[WorldTask]:
    found = [task(seed, REFUSE) for seed in range(1000, 1050)
             if generate_shop(seed, REFUSE, TODAY).goal.reason == reason]  # fmt: skip
    assert len(found) >= count, reason
    return found[:count]


# ----------------------------------------------------------------------------- the world from its seed


@pytest.mark.parametrize("family", FAMILIES)
def test_the_world_is_generated_from_the_seed_alone(family: str) -> None:
    for seed in (0, 7, 1003):
        a, b = reset_world(task(seed, family)), reset_world(task(seed, family))
        assert a.world_hash() == b.world_hash() and canonical_json(a.generated()) == canonical_json(b.generated())
        assert a.call("get_order", {"order_id": "W1"}) == b.call("get_order", {"order_id": "W1"})
        assert generate_shop(seed, family, TODAY).as_json() == generate_shop(seed, family, TODAY).as_json()
    hashes = {reset_world(task(seed, family)).world_hash() for seed in range(30)}
    assert len(hashes) == 30  # every seed its own world


def test_the_task_text_holds_the_policy_and_the_customers_opening_only() -> None:
    world = make_world(task(1000))
    text = world.reset(task(1000), effects_for(task(1000)))
    shop = world.shop
    me = shop.customer(shop.goal.customer_id)
    assert "Store policy:" in text and f"within {shop.window} days of its delivery date" in text
    assert "The customer writes:" in text and "send_message" in text
    for hidden in (me.email, me.zip, me.last, shop.goal.order_id):  # identifying facts wait to be asked for
        assert hidden not in text


def test_every_family_is_planted_as_the_policy_sees_it() -> None:
    reasons = Counter()
    for seed in range(1000, 1050):
        for family in FAMILIES:
            shop = generate_shop(seed, family, TODAY)
            problem = policy_problem(shop, shop.goal)
            assert (problem is None) == (family != REFUSE), (family, seed, problem)
            reasons[problem] += 1
    assert set(reasons) == {None, *REFUSALS}  # every kind of refusal is among the held-out tasks


# --------------------------------------------------------------------------------- the customer


def test_the_customer_reveals_facts_only_when_asked_and_its_replies_are_the_tools_result() -> None:
    world = reset_world(task(1000))
    me = world.shop.customer(world.shop.goal.customer_id)
    hello = world.call("send_message", {"message": "Hello, I am here to help."})
    assert hello.status == "ok" and hello.content["ended"] is False
    assert me.email not in hello.content["reply"] and me.zip not in hello.content["reply"]
    asked = world.call("send_message", {"message": "Could you tell me your email, or your name and zip code?"})
    assert (me.email if me.knows_email else me.zip) in asked.content["reply"]
    assert world.shop.goal.order_id not in asked.content["reply"]
    order = world.call("send_message", {"message": "Which order is it?"})
    assert f"order {world.shop.goal.order_id}" in order.content["reply"]
    final = world.final_state()
    assert [turn["role"] for turn in final["conversation"]] == ["customer", *["agent", "customer"] * 3]
    assert final["messages"] == [turn["text"] for turn in final["conversation"] if turn["role"] == "agent"]


def test_the_customer_says_goodbye_once_it_sees_its_request_carried_out() -> None:
    world = reset_world(task(1001, "cancel"))
    goal = world.shop.goal
    assert world.call("send_message", {"message": "Can I proceed?"}).content["reply"] == "Yes, please go ahead."
    refund = world.call("cancel_order", {"order_id": goal.order_id}).content["refund"]
    assert world.done is False  # a change alone ends nothing: the customer has not been told
    told = f"Order {goal.order_id} is cancelled and {refund} refunded; an email is on its way. Anything else?"
    bye = world.call("send_message", {"message": told})
    assert bye.content["ended"] is True and world.done  # a mention of an email is no question
    final = world.final_state()
    assert final["customer_outcome"] == "done" and verify_support_desk(final) == PASS


def test_the_customer_gives_up_after_its_patience_and_the_episode_ends() -> None:
    world = reset_world(task(1001, "cancel"))
    for _ in range(PATIENCE - 1):
        assert world.call("send_message", {"message": "Hmm."}).content["ended"] is False
    last = world.call("send_message", {"message": "Hmm."})
    assert last.content["ended"] is True and world.done
    assert world.call("get_order", {"order_id": "W1"}).status == "error"  # the episode is over
    final = world.final_state()
    assert final["ended_by"] == "customer" and final["customer_outcome"] == "gave up"
    assert verify_support_desk(final)["ended"] == 0.0 and verify_support_desk(final)["pass"] == 0.0


def test_a_transfer_ends_the_episode() -> None:
    world = reset_world(task(1002, "exchange"))
    assert world.call("transfer_to_human", {"summary": "wants an exchange"}).content == {"transferred": True}
    final = world.final_state()
    assert world.done and final["ended_by"] == "transfer"
    assert verify_support_desk(final) == {"database": 0.0, "facts": 0.0, "ended": 0.0, "credit": 0.0, "pass": 0.0}


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("get_order", {"order_id": "W99"}, "no order"),
        ("get_product", {"product_id": "P99"}, "no product"),
        ("find_customer_by_email", {"email": "nobody@example.com"}, "no customer"),
        ("return_items", {"order_id": "W1", "item_ids": []}, "at least one item"),
        ("return_items", {"order_id": "W1", "item_ids": ["P99-1"]}, "has no item"),
        ("exchange_items", {"order_id": "W1", "item_ids": ["X"], "new_item_ids": []}, "one new item per item"),
        ("send_message", {"message": "  "}, "empty"),
        ("change_address", {"order_id": "W1", "street": "1 A St", "city": "B"}, "lacks the required argument"),
    ],
)
def test_bad_calls_are_error_results(name: str, arguments: Any, message: str) -> None:
    result = reset_world(task(1003)).call(name, arguments)
    assert result.status == "error" and message in result.content


def test_the_records_refuse_what_cannot_be_done_and_the_policy_is_left_to_the_agent() -> None:
    (late,) = refuse_tasks("late", 1)
    world = reset_world(late)
    goal = world.shop.goal
    first = world.call("return_items", {"order_id": goal.order_id, "item_ids": list(goal.item_ids)})
    assert first.status == "ok" and first.content["refund"] > 0  # after the window: the tool does it anyway
    again = world.call("return_items", {"order_id": goal.order_id, "item_ids": list(goal.item_ids)})
    assert again.status == "error" and "already returned" in again.content


# --------------------------------------------------------------------------- the scripted agent


def test_the_scripted_customer_and_agent_solve_every_held_out_family() -> None:
    episodes = held_out()
    results = run(episodes)
    assert len(results) == 250 and {r.episode.world_task.split for r in results} == {"test"}
    by_family: dict[str, list[float]] = {}
    for r in results:
        assert r.stop == "done" and r.scores == PASS, (r.episode.item_id, r.scores)
        assert r.final_state["ended_by"] == "customer"
        by_family.setdefault(r.episode.world_task.family, []).append(r.scores["pass"])
        assert score_final_state(r.final_state) == r.scores  # rescored from the stored final state alone
        assert len(r.steps) <= 8
    assert set(by_family) == set(FAMILIES) and all(len(v) == 50 for v in by_family.values())
    outcomes = Counter((r.episode.world_task.family, r.final_state["customer_outcome"]) for r in results)
    assert outcomes == {(f, "refused" if f == REFUSE else "done"): 50 for f in FAMILIES}


def test_the_customers_turns_are_observations_of_the_worlds_step() -> None:
    (result,) = run(plan([task(1000, "exchange")]))
    entries = [parse_line(line) for line in result.log_lines]
    header, end = entries[0], entries[-1]
    assert isinstance(header, HeaderEntry) and header.world is not None and header.world.name == "support-desk"
    assert isinstance(end, EndEntry) and end.stop == "done"
    messages = {e.call for e in entries if isinstance(e, ToolEntry) and e.request.name == "send_message"}
    replies = [e.content for e in entries if isinstance(e, ObservationEntry) and e.call in messages]
    assert len(replies) >= 3 and all(isinstance(r, dict) and r["reply"] for r in replies)
    assert [r["ended"] for r in replies] == [False] * (len(replies) - 1) + [True]
    customer = [t["text"] for t in result.final_state["conversation"] if t["role"] == "customer"]
    assert customer[1:] == [r["reply"] for r in replies]  # the opening is in the task text, then every reply


def test_the_scripted_policy_is_registered_like_the_other_worlds() -> None:
    assert "support-desk@1" in WORLDS.names() and world_class("support-desk", "1") is SupportDesk
    t = task(1004, "cancel")
    via_dispatch = run_scripted(make_world(t), t, effects_for(t), max_steps=16)
    direct = run_scripted(make_world(t), t, effects_for(t), policy=support_policy, max_steps=16)
    assert via_dispatch.as_json() == direct.as_json() and via_dispatch.scores["pass"] == 1.0
    assert scripted_policy(via_dispatch.task_text, []) == support_policy(via_dispatch.task_text, [])


# ----------------------------------------------------------------------------------- the verifier


def test_a_refund_outside_the_policy_fails_with_partial_credit() -> None:
    for reason in ("late", "used", "not-pending", "shipped"):
        results = run(plan(refuse_tasks(reason)), obey_policy=False)
        for r in results:
            assert r.stop == "done" and r.final_state["customer_outcome"] == "done"  # a happy customer ...
            assert r.final_state["actions"] and r.final_state["orders"] != r.final_state["expected"]["orders"]
            # ... but the database is not the policy's and the refusal was never told: failed, partial credit
            assert r.scores == {"database": 0.0, "facts": 0.0, "ended": 1.0, "credit": pytest.approx(1 / 3),
                                "pass": 0.0}  # fmt: skip


def test_the_right_change_without_telling_the_facts_earns_part_of_the_credit() -> None:
    (result,) = run(plan([task(1005, "return")]))
    final = dict(result.final_state)
    told = final["messages"][-1]
    refund = final["expected"]["facts"][0]["value"]
    assert str(refund) in told
    final["messages"] = [*final["messages"][:-1], "Done: your return is requested."]
    assert verify_support_desk(final) == {"database": 1.0, "facts": 0.0, "ended": 1.0,
                                          "credit": pytest.approx(2 / 3), "pass": 0.0}  # fmt: skip
    final["orders"] = final["expected"]["orders"][::-1]  # the same orders in another order: still the same database
    assert verify_support_desk(final)["database"] == 1.0


def test_facts_are_found_in_what_the_agent_told() -> None:
    amount = {"fact": "refund", "kind": "amount", "value": 15}
    assert fact_told(amount, ["Your refund of $15.00 is on its way."])
    assert fact_told(amount, ["We refund 15 to your card"])
    assert not fact_told(amount, ["Delivered on 2024-03-15."]) and not fact_told(amount, ["refund 150"])
    assert not fact_told(amount, ["order W15"])
    status = {"fact": "status", "kind": "word", "value": "cancelled"}
    assert fact_told(status, ["Your order is Canceled."]) and not fact_told(status, ["not yet"])
    refusal = {"fact": "refusal", "kind": "refusal"}
    assert fact_told(refusal, ["Sorry, I can't do that."]) and not fact_told(refusal, ["Done!"])
    with pytest.raises(BadInput, match="not a support-desk final state"):
        verify_support_desk({"expected": {}})


def test_running_out_of_budget_is_scored_as_it_stands() -> None:
    (result,) = run(plan([task(1006, "address-change")], max_steps=2))
    assert result.stop == "max_steps" and result.final_state["ended_by"] is None
    assert result.scores["ended"] == 0.0 and result.scores["pass"] == 0.0


# ------------------------------------------------------------------------------ reproducibility


def test_two_runs_give_the_same_heads_and_merkle_root() -> None:
    episodes = plan(world_tasks(suite_from_mapping({
        "name": "support-desk", "version": "1", "family": list(FAMILIES),
        "seeds": {"train": [0, 1000], "test": [1000, 1010]}, "split": "test",
    })))  # fmt: skip
    first, second = run(episodes), run(episodes)
    alone = [run([e])[0] for e in reversed(episodes)][::-1]  # one episode at a time, in reverse: the same chains
    assert [r.log_lines for r in first] == [r.log_lines for r in second] == [r.log_lines for r in alone]
    root = merkle_root((r.episode.episode_id, r.head) for r in first)
    assert root == merkle_root((r.episode.episode_id, r.head) for r in second)
    wrong = run(episodes, obey_policy=False)  # another agent: other chains, another root
    assert merkle_root((r.episode.episode_id, r.head) for r in wrong) != root


def test_replay_against_fresh_worlds_reproduces_every_line() -> None:
    episodes = plan([task(1007, family) for family in FAMILIES])
    results = run(episodes)
    recorded = {r.episode.episode_id: r.log_lines for r in results}
    engine = ReplayEngine({}, {})
    replayed, divergences = replay_episodes(kind_named("world"), Engines(engine, engine), episodes, recorded,
                                            lambda _: GENERATOR)  # fmt: skip
    assert not divergences and [r.head for r in replayed] == [r.head for r in results]


# ---------------------------------------------------------------------------- frozen references


def test_the_committed_references_rebuild_byte_identical_and_check() -> None:
    report = check_reference_set("support-desk", "1")
    assert report.checked == 250 and report.problems == ()
    record = json.loads((COMMITTED / "refuse-1000.json").read_text())
    assert record["world"] == {"name": "support-desk", "version": "1"} and record["expected"]["outcome"] == "refused"
    shop = generate_shop(1000, REFUSE, TODAY)
    assert record["instance_sha256"] == canonical_hash(shop.as_json())


def test_a_build_is_byte_identical_to_the_committed_files(tmp_path: Path) -> None:
    tasks = world_tasks(suite_from_mapping({
        "name": "support-desk", "version": "1", "family": list(FAMILIES),
        "seeds": {"test": [1000, 1002]}, "split": "test",
    }))  # fmt: skip
    build_references(tasks, root=tmp_path)
    for t in tasks:
        built = (tmp_path / "support-desk" / "1" / f"{t.item_id}.json").read_bytes()
        assert built == (COMMITTED / f"{t.item_id}.json").read_bytes(), t.item_id


def test_an_edited_expected_outcome_fails_check_and_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "refs"
    shutil.copytree(COMMITTED, root / "support-desk" / "1")
    path = root / "support-desk" / "1" / "cancel-1001.json"
    record = json.loads(path.read_text())
    record["expected"]["outcome"] = "refused"
    path.write_bytes(references.encode(record))
    problems = check_reference_set("support-desk", "1", root=root).problems
    assert {(p.item, p.field) for p in problems} == {("cancel-1001", "sha256"), ("cancel-1001", "expected")}
    monkeypatch.setattr(references, "REFERENCES_ROOT", root)
    with pytest.raises(BadInput, match=r"cancel-1001"):
        prepare(load(["task=support_desk", "limit=15"]))


def test_the_manifest_records_the_reference_set_and_the_train_split_has_none() -> None:
    prepared = prepare(load(["task=support_desk", "limit=5"]))
    assert prepared.task.as_record()["references"] == {
        "name": "support-desk", "version": "1", "index_sha256": references.load_index("support-desk", "1").sha256,
    }  # fmt: skip
    assert {e.world_task.family for e in prepared.episodes} == set(FAMILIES)  # limit=5: every family of a seed
    with pytest.raises(BadInput, match="no reference for return-0"):
        prepare(load(["task=support_desk", "task.world.split=train", "limit=2"]))


def test_a_step_history_is_what_the_policy_reads() -> None:
    """The scripted policy is a pure function of the task text and the turns so far."""
    t = task(1008, "return")
    world = make_world(t)
    text = world.reset(t, effects_for(t))
    first = support_policy(text, [])
    assert [c.name for c in first] == ["today", "send_message"]
    results = tuple(world.call(c.name, dict(c.arguments)) for c in first)
    step = Step(tuple(first), results)
    assert support_policy(text, [step]) == support_policy(text, [step])
    assert support_policy(text, [step])[0].name.startswith("find_customer")
    assert isinstance(support_policy(text, [step])[0], ToolCall)
