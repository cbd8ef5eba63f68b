"""Agent worlds (issue 12, world side): determinism, the scripted agent, the verifier, bad calls, the
tool-call format, the network guard, versions side by side, configured suites. Engine-free and fast."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from omegaconf import OmegaConf

from evalrun.config import load
from evalrun.episodes.agent import planned_world_tasks
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, canonical_json
from evalrun.worlds import (
    WORLDS,
    NetworkUsed,
    RecorderBypassed,
    SeededEffects,
    ToolResult,
    WorldTask,
    effects_for,
    make_world,
    score_final_state,
    tools_hash,
    world_class,
    world_guard,
)
from evalrun.worlds.actions import (
    MAX_CALLS,
    ParseError,
    Step,
    ToolCall,
    chat_messages,
    format_calls,
    format_observation,
    format_results,
    parse_reply,
    system_prompt,
)
from evalrun.worlds.base import check_arguments, set_scores
from evalrun.worlds.invoice_desk import FAMILIES, GOALS, InvoiceDesk, InvoiceDeskV2, verify_invoice_desk
from evalrun.worlds.scripted import Transcript, run_scripted, scripted_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks

START = "2024-03-15T09:00:00Z"
SUITE = {
    "name": "invoice-desk",
    "version": "1",
    "family": ["duplicates", "price-differences"],
    "seeds": {"train": [0, 1000], "test": [1000, 1050]},
    "split": "test",
    "start": START,
    "tick": 1.0,
}


def task(seed: int, family: str = "duplicates", version: str = "1") -> WorldTask:
    return WorldTask("invoice-desk", version, family, seed, f"{family}-{seed}", START)


def episode(t: WorldTask, **policy: Any) -> Transcript:
    world = make_world(t)
    if policy:
        return run_scripted(world, t, effects_for(t), policy=lambda text, h: scripted_policy(text, h, **policy))
    return run_scripted(world, t, effects_for(t))


def episode_json(transcript: Transcript) -> str:
    return canonical_json(transcript.as_json())


def reset_world(t: WorldTask, env: dict[str, str] | None = None) -> InvoiceDesk:
    world = make_world(t)
    assert isinstance(world, InvoiceDesk)
    world.reset(t, effects_for(t, env))
    return world


# ----------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_world_and_episode(family: str) -> None:
    for seed in (0, 7, 1003):
        a, b = episode(task(seed, family)), episode(task(seed, family))
        assert a.world_hash == b.world_hash
        assert episode_json(a) == episode_json(b)  # every call, observation, final state, score
        # asking the vendor draws randomness through the effects: still identical
        assert episode_json(episode(task(seed, family), ask_vendor=True)) == episode_json(
            episode(task(seed, family), ask_vendor=True)
        )


def test_different_seeds_and_families_differ() -> None:
    hashes = {episode(task(seed, family)).world_hash for family in FAMILIES for seed in range(40)}
    assert len(hashes) == 80
    first, second = reset_world(task(1)), reset_world(task(2))
    assert first.call("list_invoices", {}) != second.call("list_invoices", {})


def test_world_hash_is_the_generated_world_right_after_reset() -> None:
    world = reset_world(task(5))
    before = world.world_hash()
    assert before == canonical_hash(world.generated())
    world.call("submit_report", {"lines": []})
    assert world.world_hash() == before  # taken at reset, not changed by the episode


# ---------------------------------------------------------------------------------- scripted agent


@pytest.mark.parametrize("family", FAMILIES)
def test_scripted_agent_passes_every_seed(family: str) -> None:
    answers = set()
    for seed in range(1000, 1060):
        transcript = episode(task(seed, family))
        assert transcript.scores == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "pass": 1.0}, seed
        assert transcript.final_state["done"] is True
        assert 1 <= len(transcript.final_state["truth"]) <= 3
        answers.add(len(transcript.final_state["truth"]))
        assert len(transcript.steps) <= (3 if family == "duplicates" else 4)
    assert answers == {1, 2, 3}


def test_scripted_agent_with_vendor_question_passes_and_reads_random() -> None:
    for family in FAMILIES:
        transcript = episode(task(11, family), ask_vendor=True)
        assert transcript.scores["pass"] == 1.0
        asked = [s for s in transcript.steps if s.calls[0].name == "ask_vendor"]
        assert len(asked) == 1 and asked[0].results[0].status == "ok"
        assert "reply" in asked[0].results[0].content


def test_parallel_calls_in_one_turn() -> None:
    transcript = episode(task(3, "price-differences"))
    assert [c.name for c in transcript.steps[0].calls] == ["today", "list_invoices"]
    assert {c.name for c in transcript.steps[1].calls} == {"get_invoice"}
    assert len(transcript.steps[1].calls) == len(transcript.steps[0].results[1].content["invoices"]) > 1


def test_transcripts_are_small() -> None:
    """A whole episode stays within a few thousand characters (a tiny model's context)."""
    for family in FAMILIES:
        for seed in range(20):
            t = episode(task(seed, family))
            text = "".join(m["content"] for m in chat_messages(InvoiceDesk().tools(), t.task_text, t.steps))
            assert len(text) < 4200, (family, seed, len(text))


# ------------------------------------------------------------------------------------- verifier


def test_verifier_on_crafted_reports() -> None:
    world = reset_world(task(21, "price-differences"))
    truth = [tuple(ref) for ref in world.final_state()["truth"]]
    assert len(truth) >= 1

    def report(lines: list[tuple[str, int]] | None) -> dict[str, float]:
        state = dict(world.final_state(), submitted=None if lines is None else [list(r) for r in lines])
        return verify_invoice_desk(state)

    assert report(None) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "pass": 0.0}  # never submitted
    assert report([]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "pass": 0.0}
    assert report(truth) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "pass": 1.0}
    assert report([("I99", 1)]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "pass": 0.0}
    partial = report([*truth, ("I99", 1)])
    assert partial["recall"] == 1.0 and partial["precision"] == len(truth) / (len(truth) + 1)
    assert partial["pass"] == 0.0 and 0 < partial["f1"] < 1


def test_set_scores_rules() -> None:
    assert set_scores([], []) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "pass": 1.0}
    assert set_scores([1], []) == {"precision": 0.0, "recall": 1.0, "f1": 0.0, "pass": 0.0}
    half = set_scores([1, 2], [1, 3])
    assert half == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "pass": 0.0}
    assert set_scores([1, 1, 2], [2, 1])["pass"] == 1.0  # a set: a line reported twice counts once


@pytest.mark.parametrize("family", FAMILIES)
def test_final_state_is_canonical_and_rescoring_reproduces_the_score(family: str) -> None:
    for seed in range(5):
        transcript = episode(task(seed, family))
        stored = canonical_json(transcript.final_state)  # JSON-able as the record stores it
        assert score_final_state(json.loads(stored)) == transcript.scores  # no world re-run
        assert json.loads(stored)["world"] == {"name": "invoice-desk", "version": "1"}


def test_submitted_report_is_what_the_world_received() -> None:
    world = reset_world(task(2))
    result = world.call(
        "submit_report",
        {
            "lines": [
                {"invoice_id": "i2", "line_no": 1},
                {"invoice_id": "I1", "line_no": 3},
                {"invoice_id": "I1", "line_no": 3},
            ]
        },
    )
    assert result.status == "ok" and result.content["received"] == 2
    final = world.final_state()
    assert world.done and final["submitted"] == [["I1", 3], ["I2", 1]]
    assert final["report_id"] == result.content["report_id"] and len(final["report_id"]) == 36  # via effects.uuid


# ------------------------------------------------------------------------------------ bad calls


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("delete_invoice", {}, "unknown tool 'delete_invoice'"),
        ("get_invoice", {}, "lacks the required argument 'invoice_id'"),
        ("get_invoice", {"invoice_id": 3}, "get_invoice arguments.invoice_id must be a string, got int"),
        ("get_invoice", {"invoice_id": "I1", "x": 1}, "unknown argument 'x'"),
        ("get_invoice", {"invoice_id": "I42"}, "no invoice 'I42'"),
        ("get_invoice", ["I1"], "must be an object, got list"),
        ("get_purchase_order", {"po_id": "P9"}, "no purchase order 'P9'"),
        ("search_invoices", {}, "needs a vendor or a sku"),
        ("ask_vendor", {"vendor": "Nobody", "question": "hi"}, "no vendor 'Nobody'"),
        ("submit_report", {"lines": [{"invoice_id": "I1"}]}, "lines[0] lacks the required argument 'line_no'"),
        ("submit_report", {"lines": [{"invoice_id": "I1", "line_no": True}]}, "line_no must be an integer, got bool"),
        ("submit_report", {"lines": "I1"}, "lines must be an array"),
    ],
)
def test_bad_calls_are_error_results(name: str, arguments: Any, message: str) -> None:
    world = reset_world(task(4))
    result = world.call(name, arguments)
    assert result.status == "error" and message in result.content, result
    assert not world.done


def test_call_after_done_is_an_error() -> None:
    world = reset_world(task(4))
    assert world.call("submit_report", {"lines": []}).status == "ok"
    assert world.call("list_invoices", {}) == ToolResult("error", "the episode is over: the report was submitted")
    assert world.call("submit_report", {"lines": [{"invoice_id": "I1", "line_no": 1}]}).status == "error"
    assert world.final_state()["submitted"] == []  # the first report stands


def test_tools_answer_from_the_world() -> None:
    world = reset_world(task(8, "price-differences"))
    listed = world.call("list_invoices", {}).content["invoices"]
    first = world.call("get_invoice", {"invoice_id": listed[0]["id"]}).content
    assert (
        first["id"] == listed[0]["id"] and sum(ln["qty"] * ln["price"] for ln in first["lines"]) == listed[0]["total"]
    )
    assert (
        world.call("search_invoices", {"vendor": first["vendor"]}).content["invoices"][0]["vendor"] == first["vendor"]
    )
    sku = first["lines"][0]["sku"]
    found = world.call("search_invoices", {"sku": sku.lower()}).content["invoices"]
    assert listed[0] in found
    po = world.call("get_purchase_order", {"po_id": first["po"]}).content
    assert po["vendor"] == first["vendor"] and sku in {ln["sku"] for ln in po["lines"]}
    reply = world.call("ask_vendor", {"vendor": first["vendor"], "question": f"agreed price of {sku}?"}).content
    agreed = next(ln["price"] for ln in po["lines"] if ln["sku"] == sku)
    assert f"The agreed price of {sku} is {agreed}." in reply["reply"]


def test_clock_and_random_only_through_effects() -> None:
    t = task(6)
    world = make_world(t)
    effects = SeededEffects(start=1_700_000_000.0, tick=86_400.0, seed=5)
    world.reset(t, effects)
    dates = [world.call("today", {}).content["date"] for _ in range(3)]
    assert dates == ["2023-11-14", "2023-11-15", "2023-11-16"]  # one simulated day per read
    vendor = world.call("list_invoices", {}).content["invoices"][0]["vendor"]
    replies = {world.call("ask_vendor", {"vendor": vendor, "question": "I1?"}).content["reply"] for _ in range(12)}
    assert len(replies) > 1  # phrasing varies with the effects' draws


def test_seeded_effects() -> None:
    a, b = SeededEffects(100.0, 2.5, seed=9), SeededEffects(100.0, 2.5, seed=9)
    assert [a.clock() for _ in range(3)] == [100.0, 102.5, 105.0]
    assert [a.random("x", 53) for _ in range(4)] == [b.random("x", 53) for _ in range(4)]
    assert a.random("y", 8) < 256
    u = a.uuid()
    assert u == b.uuid() and u == u.lower() and u[14] == "4" and len(u) == 36
    assert a.env("HOME") is None and SeededEffects(0, 1, 0, {"currency": "USD"}).env("currency") == "USD"
    with pytest.raises(ValueError, match="1 to 53"):
        a.random("x", 64)
    with pytest.raises(ValueError):
        SeededEffects(0, -1, 0)
    with pytest.raises(ValueError):
        SeededEffects(0, 1, 2**60)


# -------------------------------------------------------------------------------- tool-call format


def test_format_and_parse_round_trip() -> None:
    calls = [ToolCall("today"), ToolCall("get_invoice", {"invoice_id": "I1"}), ToolCall("submit_report", {"lines": []})]
    text = format_calls(calls)
    assert text.startswith('{"tool_calls":[{"name":"today","arguments":{}}')
    assert parse_reply(text) == calls
    assert parse_reply(f"  {text}\n") == calls


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", "one JSON object and nothing else"),
        ("get_invoice I1", "one JSON object and nothing else"),
        ('{"tool_calls":[]} extra', "one JSON object and nothing else"),
        ('```json\n{"tool_calls":[{"name":"today","arguments":{}}]}\n```', "one JSON object and nothing else"),
        ('{"tool_calls":[{"name":"today","arguments":{}}]', "one JSON object and nothing else"),
        ("[]", 'the one key "tool_calls"'),
        ('{"calls":[]}', 'the one key "tool_calls"'),
        ('{"tool_calls":[],"note":1}', 'the one key "tool_calls"'),
        ('{"tool_calls":[]}', "one or more calls"),
        ('{"tool_calls":{"name":"today"}}', "one or more calls"),
        ('{"tool_calls":[{"name":"today"}]}', 'exactly the keys "name" and "arguments"'),
        ('{"tool_calls":["today"]}', 'exactly the keys "name" and "arguments"'),
        ('{"tool_calls":[{"name":"","arguments":{}}]}', "tool_calls[0].name must be a tool name"),
        ('{"tool_calls":[{"name":"today","arguments":[]}]}', "tool_calls[0].arguments must be an object"),
        ('{"tool_calls":[{"name":"a","arguments":{"x":1,"x":2}}]}', "the key 'x' appears twice"),
        ('{"tool_calls":[{"name":"a","arguments":{"x":NaN}}]}', "NaN is not JSON"),
    ],
)
def test_parse_reply_rejects(reply: str, message: str) -> None:
    parsed = parse_reply(reply)
    assert isinstance(parsed, ParseError) and message in parsed.message, parsed
    assert parsed.as_result() == ToolResult("error", parsed.message)


def test_parse_reply_limits_parallel_calls() -> None:
    many = format_calls([ToolCall("today")] * (MAX_CALLS + 1))
    assert isinstance(parse_reply(many), ParseError)
    assert parse_reply(format_calls([ToolCall("today")] * MAX_CALLS)) == [ToolCall("today")] * MAX_CALLS


def test_observations_render_canonically() -> None:
    ok = ToolResult("ok", {"b": 1, "a": [1.0, "é"]})
    assert format_observation(ok) == '{"ok":{"a":[1,"é"],"b":1}}'  # key order and number notation fixed
    assert format_observation(ToolResult("error", "no invoice")) == '{"error":"no invoice"}'
    assert format_results([ok, ToolResult.error("x")]) == '{"ok":{"a":[1,"é"],"b":1}}\n{"error":"x"}'


def test_chat_messages_and_system_prompt() -> None:
    specs = InvoiceDesk().tools()
    prompt = system_prompt(specs)
    assert "- submit_report(lines: [{invoice_id: string, line_no: integer}])" in prompt
    assert "- search_invoices(vendor?: string, sku?: string)" in prompt
    step = Step((ToolCall("today"),), (ToolResult.ok({"date": "2024-03-15"}),))
    bad = Step((), (ParseError("bad").as_result(),), reply="hello")
    messages = chat_messages(specs, "the task", [step, bad])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert messages[2]["content"] == format_calls(step.calls) and messages[4]["content"] == "hello"


def test_tool_specs_check_arguments() -> None:
    spec = next(s for s in InvoiceDesk().tools() if s.name == "search_invoices")
    assert check_arguments(spec, {"vendor": "Acme"}) is None
    assert check_arguments(spec, {"sku": 1}) == "search_invoices arguments.sku must be a string, got int"


# ---------------------------------------------------------------------------------- network guard


def test_guard_blocks_sockets_inside_and_restores_outside() -> None:
    original_init = socket.socket.__init__
    with world_guard():
        with pytest.raises(NetworkUsed, match=r"socket\.socket\("):
            socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with pytest.raises(NetworkUsed, match=r"socket\.create_connection\(\('example\.com', 80\)\)"):
            socket.create_connection(("example.com", 80), timeout=0.1)
        with pytest.raises(NetworkUsed, match="getaddrinfo"):
            socket.getaddrinfo("localhost", 80)
    assert socket.socket.__init__ is original_init
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # outside: works again
        sock.bind(("127.0.0.1", 0))


def test_guard_blocks_a_socket_made_before_it() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.socket()
    try:
        with world_guard(), pytest.raises(NetworkUsed, match=r"socket\.connect"):
            client.connect(server.getsockname())
        client.connect(server.getsockname())  # outside: works
    finally:
        client.close()
        server.close()


def test_guard_is_per_thread_unless_all_threads() -> None:
    outcome: dict[str, str] = {}

    def other_thread(key: str) -> None:
        try:
            socket.socket().close()
            outcome[key] = "ok"
        except NetworkUsed:
            outcome[key] = "blocked"

    with world_guard():
        runner = threading.Thread(target=other_thread, args=("thread-scope",))
        runner.start()
        runner.join()
    with world_guard(all_threads=True):
        runner = threading.Thread(target=other_thread, args=("process-scope",))
        runner.start()
        runner.join()
    assert outcome == {"thread-scope": "ok", "process-scope": "blocked"}
    with world_guard(), world_guard():  # nested: the patch stays until the last guard closes
        pass
    socket.socket().close()


def test_the_guard_blocks_reads_around_the_effects_in_its_thread_only_and_restores_them() -> None:
    import os
    import random
    import time

    originals = (time.time, random.random, os.urandom, type(os.environ).__getitem__)
    seen: dict[str, str] = {}

    def other_thread() -> None:
        try:
            seen["read"] = f"{time.time() > 0} {'PATH' in os.environ}"
        except RecorderBypassed:
            seen["read"] = "blocked"

    with world_guard():
        with pytest.raises(RecorderBypassed, match=r"time\.time\(\) read .* \(effects\.clock\(\)\)"):
            time.time()
        with pytest.raises(RecorderBypassed, match=r"random\.shuffle\(\) .*effects\.random"):
            random.shuffle([1, 2])
        with pytest.raises(RecorderBypassed, match=r"os\.environ .*effects\.env\(name\)"):
            dict(os.environ)
        runner = threading.Thread(target=other_thread)  # the engine's threads keep their clock and environment
        runner.start()
        runner.join()
        assert seen == {"read": "True True"}
        assert random.Random(7).random() == random.Random(7).random()  # a seeded generator is the world's own
    assert (time.time, random.random, os.urandom, type(os.environ).__getitem__) == originals
    with world_guard(all_threads=True):
        runner = threading.Thread(target=other_thread)
        runner.start()
        runner.join()
    assert seen == {"read": "blocked"}
    assert time.time() > 0 and "PATH" in os.environ  # restored when the last guard closed


def test_the_verifier_runs_under_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    final = reset_world(task(12)).final_state()
    monkeypatch.setattr(InvoiceDesk, "verifier", staticmethod(lambda state: {"pass": float(time.time() > 0)}))
    with pytest.raises(RecorderBypassed, match=r"time\.time\(\)"):
        score_final_state(final)


class LeakyDesk(InvoiceDesk):
    """A world with a bug: a tool that phones home."""

    version = "leaky"

    def today(self) -> Any:
        socket.create_connection(("time.example.com", 37))
        return {}


def test_a_world_that_opens_a_socket_fails_the_episode_loudly() -> None:
    world = LeakyDesk()
    t = WorldTask("invoice-desk", "leaky", "duplicates", 1, "duplicates-1", START)
    with pytest.raises(NetworkUsed, match=r"time\.example\.com"):
        run_scripted(world, t, effects_for(t))  # not an error observation: the episode fails


# ---------------------------------------------------------------------------- versions side by side


def test_versions_side_by_side() -> None:
    assert {"invoice-desk@1", "invoice-desk@2"} <= set(WORLDS.names())
    assert world_class("invoice-desk", "1") is InvoiceDesk and world_class("invoice-desk", "2") is InvoiceDeskV2
    one, two = reset_world(task(12)), reset_world(task(12, version="2"), env={"currency": "USD"})
    assert one.world_hash() == two.world_hash()  # the same generated world ...
    got_one, got_two = one.call("get_invoice", {"invoice_id": "I1"}), two.call("get_invoice", {"invoice_id": "I1"})
    assert got_one != got_two and got_two.content == {**got_one.content, "currency": "USD"}  # ... shown differently
    assert one.versions() != two.versions()
    assert one.versions() == {
        "name": "invoice-desk",
        "world": "1",
        "tools": "1",
        "tools_hash": tools_hash(one.tools()),
        "verifier": "1",
        "verifier_source": one.verifier_source_sha256(),
    }
    assert two.versions()["world"] == "2"
    assert episode(task(12, version="2")).scores["pass"] == 1.0
    with pytest.raises(BadInput, match="invoice-desk@1"):
        world_class("invoice-desk", "9")


def test_reset_checks_the_task() -> None:
    with pytest.raises(BadInput, match="cannot run"):
        InvoiceDesk().reset(task(1, version="2"), effects_for(task(1)))
    with pytest.raises(BadInput, match=r"task\.family"):
        InvoiceDesk().reset(WorldTask("invoice-desk", "1", "fraud", 1, "x", START), effects_for(task(1)))


# ------------------------------------------------------------------------------------------- suites


def test_suite_gives_deterministic_tasks() -> None:
    tasks = world_tasks(suite_from_mapping(SUITE))
    assert len(tasks) == 100 and tasks == world_tasks(suite_from_mapping(SUITE))
    assert tasks[0] == WorldTask("invoice-desk", "1", "duplicates", 1000, "duplicates-1000", START, 1.0, "test")
    assert tasks[1].family == "price-differences" and tasks[1].seed == 1000 and tasks[2].seed == 1001
    assert world_tasks(suite_from_mapping(OmegaConf.create(SUITE))) == tasks  # as Hydra gives it
    train = world_tasks(suite_from_mapping({**SUITE, "split": "train"}))
    assert not {t.seed for t in train} & {t.seed for t in tasks}  # the held-out split shares no world


def test_the_shipped_task_config_declares_a_suite() -> None:
    test = planned_world_tasks(load(["task=invoice_desk"]).task.world)
    train = planned_world_tasks(load(["task=invoice_desk", "task.world.split=train"]).task.world)
    assert len(test) == 200 and {t.split for t in test} == {"test"} and len(train) == 2000
    assert not {t.seed for t in test} & {t.seed for t in train}


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"name": "nowhere"}, "world.name/version"),
        ({"version": "7"}, "world.name/version"),
        ({"family": ["fraud"]}, "world.family"),
        ({"family": []}, "world.family"),
        ({"family": ["duplicates", "duplicates"]}, "world.family"),
        ({"seeds": {"train": [0, 10], "test": [5, 20]}}, "world.seeds"),
        ({"seeds": {"test": [10, 10]}}, "world.seeds.test"),
        ({"seeds": {"test": [0, "9"]}}, "world.seeds.test[1]"),
        ({"split": "dev"}, "world.split"),
        ({"start": "yesterday"}, "world.start"),
        ({"tick": -1}, "world.tick"),
        ({"colour": "red"}, "world.colour"),
    ],
)
def test_suite_bad_input_names_the_field(change: dict[str, Any], where: str) -> None:
    with pytest.raises(BadInput) as caught:
        suite_from_mapping({**SUITE, **change})
    assert caught.value.where == where


def test_task_text_names_the_goal() -> None:
    for family in FAMILIES:
        t = task(0, family)
        text = make_world(t).reset(t, effects_for(t))
        assert GOALS[family] in text and "submit_report" in text


def test_parallel_calls_on_threads_answer_as_in_order() -> None:
    """The harness may run one turn's calls on threads: the world serialises them, answers are the same."""
    t = task(9)
    sequential = reset_world(t)
    ids = [row["id"] for row in sequential.call("list_invoices", {}).content["invoices"]]
    expected = [sequential.call("get_invoice", {"invoice_id": i}) for i in ids]
    concurrent = reset_world(t)
    got: dict[int, ToolResult] = {}

    def fetch(position: int, invoice_id: str) -> None:
        got[position] = concurrent.call("get_invoice", {"invoice_id": invoice_id})

    threads = [threading.Thread(target=fetch, args=(n, i)) for n, i in enumerate(ids)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [got[n] for n in range(len(ids))] == expected
