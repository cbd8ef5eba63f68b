"""Simulated users played by a model (issue 31, items 2-5), engine-free: support-desk's customer in two halves, the
user prompt pack, the lockstep of both sides (every waiting customer turn in one engine call), the chain's user
entries, holding one side fixed, the config's refusals before any model loads, the digest, and the two sides
measured apart. The engine is a test double here (the one thing these tests isolate); tests/test_simulated_users_e2e.py
runs the real one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_support_desk import GENERATOR, reset_world, task

from evalrun.analysis.compare import _category
from evalrun.analysis.sides import Call, Conversation, first_divergence, side_agreement
from evalrun.config import load
from evalrun.config.settings import DecodingConfig, SeedsConfig
from evalrun.engines import Completion, GenerationRequest
from evalrun.episodes.agent import AgentBudget, ModelAgent, ScriptedAgent, plan_agent_episodes, run_agent_episodes
from evalrun.episodes.users import HeldReplies, ModelUser, user_seed, user_setup
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.entries import FailedCallEntry, ObservationEntry, ToolEntry, UserEntry, parse_line
from evalrun.records.view import ChainView
from evalrun.tasks.user_pack import load_user_pack
from evalrun.worlds import ToolResult, UserTurn, WorldTask
from evalrun.worlds.actions import ToolCall, format_calls
from evalrun.worlds.support_desk import PATIENCE, SupportDesk

PACK = load_user_pack(SupportDesk.user_pack)  # type: ignore[arg-type]
DECODING = DecodingConfig(name="agent", temperature=0.0, top_p=1.0, top_k=0, max_tokens=64, stop=(), logprobs=False)
SEEDS = SeedsConfig(master=7, set=(0,), repeats=1)
END = PACK.end


class Scripted:
    """A test double of an engine: each request's reply is ``reply(request)``; every call's batch is kept."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.batches: list[list[GenerationRequest]] = []

    def describe(self) -> dict[str, Any]:
        return {"name": "scripted", "version": "test", "settings": {}}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        return [Completion(text=self.reply(r), token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), finish_reason="stop",
                           prompt_tokens=10) for r in requests]  # fmt: skip


def customer_says(request: GenerationRequest) -> str:
    """A customer that answers each message and says goodbye after 2 to 4 of them (by its name's length), so the
    episodes of a batch wait for their customer a different number of rounds."""
    asked = request.prompt.count("\nuser: ") - 1  # the agent's messages so far (plain rendering, the greeting first)
    name = request.prompt.split("You are ", 1)[1].split(",", 1)[0]
    return f"reply {asked}" + (f" thanks {END}" if asked >= 2 + len(name) % 3 else "")


def chatty(task_text: str, steps: Sequence[Any]) -> list[ToolCall]:
    """An agent that asks its customer something every turn."""
    return [ToolCall("send_message", {"message": f"Question {len(steps)}?"})]


def plan(tasks: Sequence[WorldTask], agent: str = "scripted", **settings: Any) -> list[Any]:
    user = user_setup(PACK, None, settings.pop("decoding", {}), "run")
    return plan_agent_episodes("support-desk", tasks, DECODING, SEEDS, agent, AgentBudget(max_steps=12), user=user,
                               **settings)  # fmt: skip


def kinds(lines: Sequence[str]) -> list[Any]:
    return [parse_line(line) for line in lines]


# --- the world in two halves ---------------------------------------------------------------------------------------


def test_a_model_playing_the_customer_is_shown_its_facts_and_the_conversation_from_its_side() -> None:
    world = reset_world(task(1003))
    turn = world.ask_user("send_message", {"message": "Could you tell me your email address?"})
    assert isinstance(turn, UserTurn)
    goal = world.shop.goal
    assert turn.facts["order_id"] == goal.order_id and turn.facts["request"] in turn.messages[0][1]
    assert turn.messages == ((("user", world.customer.opening())), ("agent", "Could you tell me your email address?"))
    prompt = PACK.system_prompt(turn.facts)
    assert goal.order_id in prompt and END in prompt and "policy" not in prompt.casefold()  # never the store's rules
    roles = [m["role"] for m in PACK.messages(turn.facts, turn.messages)]
    assert roles == ["system", "user", "assistant", "user"]  # the greeting, its opening, the agent's message
    result = world.user_replied("It's ana@example.com.", False)
    assert result == ToolResult.ok({"from": f"{world.customer.customer.name} (customer)",
                                    "reply": "It's ana@example.com.", "ended": False})  # fmt: skip
    assert world.final_state()["conversation"][-1] == {"role": "customer", "text": "It's ana@example.com."}


@pytest.mark.parametrize(("messages", "outcome"), [
    (["I'm afraid we cannot do that."], "refused"),
    (["Let me check."], "gave up"),
])  # fmt: skip
def test_a_goodbye_ends_the_conversation_with_the_outcome_the_records_show(messages: list[str], outcome: str) -> None:
    world = reset_world(task(1003))
    for message in messages:
        assert isinstance(world.ask_user("send_message", {"message": message}), UserTurn)
    world.user_replied("Bye.", True)
    state = world.final_state()
    assert world.done and state["customer_outcome"] == outcome and state["ended_by"] == "customer"


def test_the_request_carried_out_then_a_goodbye_is_done() -> None:
    world = reset_world(task(1003))
    goal = world.shop.goal
    assert world.call("return_items", {"order_id": goal.order_id, "item_ids": list(goal.item_ids)}).status == "ok"
    world.ask_user("send_message", {"message": "Your refund is on its way."})
    world.user_replied("Great, thanks!", True)
    assert world.final_state()["customer_outcome"] == "done"


def test_the_customer_leaves_after_its_patience_whatever_the_model_says() -> None:
    world = reset_world(task(1003))
    for k in range(PATIENCE):
        assert not world.done
        world.ask_user("send_message", {"message": f"Question {k}?"})
        world.user_replied("Hmm.", False)
    assert world.done and world.final_state()["customer_outcome"] == "gave up"


def test_a_bad_call_of_the_users_tool_is_an_error_and_asks_nobody() -> None:
    world = reset_world(task(1003))
    assert world.ask_user("send_message", {"message": "  "}) == ToolResult.error("the message is empty")
    assert world.ask_user("send_message", {}).status == "error"
    assert world.final_state()["conversation"] == [{"role": "customer", "text": world.customer.opening()}]


# --- the prompt pack -----------------------------------------------------------------------------------------------


def test_a_reply_ends_the_conversation_at_the_end_marker_which_the_agent_never_sees() -> None:
    assert PACK.read_reply(f" Thanks, bye! {END} extra") == ("Thanks, bye!", True)
    assert PACK.read_reply("Sure.") == ("Sure.", False)


def test_a_pack_that_reads_a_fact_the_world_does_not_give_is_refused_naming_it(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text('name: p\nversion: "1"\nsystem: "You are {{ nickname }}."\nend: "###"\n')
    with pytest.raises(BadInput) as caught:
        load_user_pack(pack).system_prompt({"name": "Ana"})
    assert str(pack) in caught.value.where and "nickname" in caught.value.message
    pack.write_text('name: p\nversion: "1"\nsystem: "You are {{ name }}."\n')
    with pytest.raises(BadInput) as caught:
        load_user_pack(pack)
    assert caught.value.where == f"{pack}: field end"


# --- lockstep, chains, replay --------------------------------------------------------------------------------------


def test_every_waiting_customer_turn_of_a_batch_is_one_engine_call_recorded_in_its_tool_call() -> None:
    engine = Scripted(customer_says)
    episodes = plan([task(s, f) for s in (1000, 1001) for f in ("return", "cancel", "address-change")])
    results = run_agent_episodes(episodes, ScriptedAgent(chatty), GENERATOR, users=ModelUser(engine))
    asked = [sum(isinstance(e, UserEntry) for e in kinds(r.log_lines)) for r in results]
    assert len(set(asked)) > 1  # the customers left after different numbers of turns
    # every round, one call with the turn of every episode still waiting: as many calls as the longest talk
    assert [len(b) for b in engine.batches] == [sum(n > k for n in asked) for k in range(max(asked))]
    for batch in engine.batches:
        assert len({r.episode_id for r in batch}) == len(batch)
    for result in results:
        entries = kinds(result.log_lines)
        users = [e for e in entries if isinstance(e, UserEntry)]
        assert users and all(u.role == "user" for u in users)
        for turn, u in enumerate(users):
            tool = next(e for e in entries if isinstance(e, ToolEntry) and e.call == u.tool)
            observation = next(e for e in entries if isinstance(e, ObservationEntry) and e.call == u.tool)
            assert tool.request.name == "send_message" and tool.seq < u.seq < observation.seq
            assert observation.content["reply"] == PACK.read_reply(u.response.text)[0]
            assert u.request.sampling.seed == str(user_seed(result.episode.sampling.seed, turn))  # a seed a turn
        view = ChainView.of(entries)
        assert view.user_turns == tuple(users) and view.generations == ()  # the scripted agent made no model call
        assert [c.user for t in view.turns for c in t.calls if c.user is not None] == users


def test_an_episodes_chain_does_not_depend_on_what_else_its_batch_held() -> None:
    episodes = plan([task(s, f) for s in (1000, 1001) for f in ("return", "exchange")])
    together = run_agent_episodes(episodes, ScriptedAgent(chatty), GENERATOR, users=ModelUser(Scripted(customer_says)))
    for episode, result in zip(episodes, together, strict=True):
        (alone,) = run_agent_episodes([episode], ScriptedAgent(chatty), GENERATOR,
                                      users=ModelUser(Scripted(customer_says)))  # fmt: skip
        assert alone.log_lines == result.log_lines


def test_a_customer_turn_the_engine_refuses_fails_the_episode_with_a_users_refused_call() -> None:
    class Refusing(Scripted):
        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            from evalrun.engines import RequestRejected

            raise RequestRejected("too long for the context")

    (result,) = run_agent_episodes(plan([task(1000)]), ScriptedAgent(), GENERATOR,
                                   users=ModelUser(Refusing(customer_says)))  # fmt: skip
    entries = kinds(result.log_lines)
    failed = [e for e in entries if isinstance(e, FailedCallEntry)]
    assert len(failed) == 1 and failed[0].role == "user" and failed[0].error == "too long for the context"
    assert result.error is not None and "simulated user" in result.error and entries[-1].status == "error"
    view = ChainView.of(entries)
    assert [c.user for t in view.turns for c in t.calls if c.user is not None] == failed


# --- one side held fixed -------------------------------------------------------------------------------------------


def _held(side: str, results: Sequence[Any]) -> HeldReplies:
    replies = {}
    for r in results:
        view = ChainView.of(kinds(r.log_lines))
        calls = view.user_turns if side == "user" else view.generations
        h = view.header
        replies[(h.task, h.item, h.seed, h.repeat)] = tuple(e.response.as_record() for e in calls)
    return HeldReplies(side, {"merkle_root": "0" * 64, "seal": "", "digest": "0" * 64}, "original", replies)


def test_a_held_customer_is_served_its_recorded_replies_and_no_model_is_asked() -> None:
    tasks = [task(1000), task(1001, "cancel")]
    original = run_agent_episodes(plan(tasks), ScriptedAgent(chatty), GENERATOR,
                                  users=ModelUser(Scripted(customer_says)))  # fmt: skip
    other = Scripted(lambda r: "something else entirely")
    held = run_agent_episodes(plan(tasks, held=_held("user", original)), ScriptedAgent(chatty), GENERATOR,
                              users=ModelUser(other))  # fmt: skip
    assert other.batches == []
    assert [r.log_lines for r in held] == [r.log_lines for r in original]


def test_a_live_side_that_asks_for_more_than_was_recorded_fails_its_episode_saying_so() -> None:
    original = run_agent_episodes(plan([task(1000)]), ScriptedAgent(chatty), GENERATOR,
                                  users=ModelUser(Scripted(customer_says)))  # fmt: skip
    short = _held("user", original)
    short = replace(short, replies={k: v[:1] for k, v in short.replies.items()})
    (result,) = run_agent_episodes(plan([task(1000)], held=short), ScriptedAgent(chatty), GENERATOR,
                                   users=ModelUser(Scripted(customer_says)))  # fmt: skip
    failed = [e for e in kinds(result.log_lines) if isinstance(e, FailedCallEntry)]
    assert failed and failed[0].role == "user" and "has 1 recorded replies" in failed[0].error


def test_a_held_agent_replies_as_recorded_whatever_the_customer_now_says() -> None:
    say = format_calls([ToolCall("send_message", {"message": "Could you tell me your email?"})])
    original = run_agent_episodes(plan([task(1000)], agent="model"), ModelAgent(Scripted(lambda r: say)), GENERATOR,
                                  users=ModelUser(Scripted(customer_says)))  # fmt: skip
    agent_engine, users = Scripted(lambda r: "no tool call"), Scripted(lambda r: "a different customer")
    (held,) = run_agent_episodes(plan([task(1000)], agent="model", held=_held("agent", original)),
                                 ModelAgent(agent_engine), GENERATOR, users=ModelUser(users))  # fmt: skip
    assert agent_engine.batches == [] and users.batches  # the agent served, the customer live
    old, new = ChainView.of(kinds(original[0].log_lines)), ChainView.of(kinds(held.log_lines))
    assert [g.response.text for g in new.generations] == [g.response.text for g in old.generations]
    assert {u.response.text for u in new.user_turns} == {"a different customer"}


# --- the two sides apart -------------------------------------------------------------------------------------------


def _talk(*calls: tuple[str, str, str]) -> Conversation:
    return Conversation("e", ("t", "i", 0, 0), tuple(Call(side, prompt, text, ()) for side, prompt, text in calls))


def test_a_divergence_is_put_on_the_side_that_spoke_differently_first() -> None:
    a = _talk(("agent", "p0", "hi"), ("user", "p1", "email?"), ("agent", "p2", "done"))
    b = _talk(("agent", "p0", "hi"), ("user", "p1", "no idea"), ("agent", "p3", "done"))
    found = first_divergence([a.calls, b.calls])
    assert found is not None and (found.call, found.side, found.turn, found.what) == (1, "user", 0, "reply")
    held = _talk(("agent", "p0", "hi"), ("user", "p9", "email?"), ("agent", "p2", "done"))
    found = first_divergence([a.calls, held.calls])
    assert found is not None and (found.side, found.what) == ("user", "prompt")
    sides = side_agreement([[a, b], [a, a]])
    assert (sides["user"].episodes, sides["user"].identical, sides["user"].first_diverged) == (2, 1, 1)
    assert (sides["agent"].identical, sides["agent"].first_diverged) == (2, 0)
    assert first_divergence([a.calls, a.calls]) is None


# --- config, digest, compare ---------------------------------------------------------------------------------------

BASE = ("task=support_desk", "model=tiny_invoice_agent", "cluster=inline", "limit=2")


@pytest.mark.parametrize(("overrides", "where"), [
    (("task=invoice_desk", "task.world.user=model"), "task.world.user"),
    (("task.world.user=someone",), "task.world.user"),
    (("+model@user_model=tiny_tool_agent",), "user_model"),
    (("task.world.user_decoding.temperature=0.5",), "task.world.user_decoding"),
    (("task.world.user=model", "task.world.user_decoding.top_p=0"), "task.world.user_decoding.top_p"),
    (("task.world.user=model", "task.world.user_prompt=/no/such/pack.yaml"), "task.world.user_prompt"),
    (("task.world.user=model", "task.world.held.side=user"), "task.world.held.run"),
    (("task.world.user=model", "task.world.held.side=agent", "task.world.held.run=/tmp"), "task.world.held.side"),
    (("task.world.user=model", "task.world.held.side=user", "task.world.held.run=/no/such/run"),
     "task.world.held.run"),
])  # fmt: skip
def test_settings_of_the_simulated_user_are_checked_before_any_model_loads(overrides: tuple[str, ...],
                                                                          where: str) -> None:  # fmt: skip
    with pytest.raises(BadInput) as caught:
        prepare(load([*BASE, *overrides]))
    assert caught.value.where == where


def test_a_run_that_holds_nothing_recorded_of_the_side_is_refused(tmp_path: Path) -> None:
    golden = Path(__file__).parent / "golden"
    run = next(p for p in sorted(golden.iterdir()) if (p / "record.json").is_file())
    with pytest.raises(BadInput) as caught:
        prepare(load([*BASE, "task.world.user=model", "task.world.held.side=user", f"task.world.held.run={run}"]))
    assert caught.value.where == "task.world.held.run" and "no user replies" in caught.value.message


def test_how_the_customer_is_played_is_in_the_digest_and_compare_names_it() -> None:
    scripted = prepare(load(list(BASE)))
    played = prepare(load([*BASE, "task.world.user=model"]))
    hotter = prepare(load([*BASE, "task.world.user=model", "task.world.user_decoding.temperature=0.7"]))
    other = prepare(load([*BASE, "task.world.user=model", "+model@user_model=tiny_tool_agent"]))
    explicit = prepare(load([*BASE, "task.world.user=scripted"]))
    digests = [p.digest.prompt_pack for p in (scripted, played, hotter, other)]
    assert len(set(digests)) == 4 and explicit.digest == scripted.digest
    assert scripted.digest.seed_set == played.digest.seed_set  # the seeds the run draws are not the user's
    record = other.task.as_record()["user"]
    assert record["model"]["id"] == "evalrun/tiny-tool-agent" and record["model"]["files"]
    assert played.task.as_record()["user"]["model"] == "run"
    assert _category("task.world.user.model.files.model.safetensors") == "user model"
    assert _category("task.world.user.decoding.temperature") == "simulated user"
    assert _category("user_model.files.config.json") == "user model"
    episode = played.episodes[0]
    assert episode.user is not None and episode.user.sampling_of(2).seed == user_seed(episode.sampling.seed, 2)


def test_a_model_agents_plain_reply_is_said_to_the_customer() -> None:
    users = Scripted(customer_says)
    agent = ModelAgent(Scripted(lambda r: " Hi! Your email? "))
    (result,) = run_agent_episodes(plan([task(1000)], agent="model"), agent, GENERATOR, users=ModelUser(users))
    entries = kinds(result.log_lines)
    tool = next(e for e in entries if isinstance(e, ToolEntry))
    assert tool.request.name == "send_message" and tool.request.arguments == {"message": "Hi! Your email?"}
    assert users.batches and "Hi! Your email?" in users.batches[0][0].prompt
    assert not any(isinstance(e, ObservationEntry) and e.reply is not None for e in entries)  # never "unreadable"


def test_an_episode_with_a_model_played_customer_crosses_to_a_ray_worker_whole() -> None:
    import pickle

    (episode,) = plan([task(1000)], held=_held("user", run_agent_episodes(
        plan([task(1000)]), ScriptedAgent(chatty), GENERATOR, users=ModelUser(Scripted(customer_says)))))  # fmt: skip
    again = pickle.loads(pickle.dumps(episode))
    assert again == episode and again.user.pack.system == PACK.system and again.held.replies == episode.held.replies
