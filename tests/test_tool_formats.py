"""Native tool calling (evalrun/worlds/tool_formats.py): tools as JSON Schema through a chat template that takes
them, replies read by vLLM's own tool parser, results as ``tool`` messages with call ids; the JSON protocol as
before. No engine: a scripted engine answers in the Hermes format the ``hermes`` parser reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evalrun.chat import ChatFormat, ModelChat
from evalrun.chat.reasoning import vllm_version
from evalrun.config import MODELS_DIR, DecodingConfig, SeedsConfig, load
from evalrun.engines import Completion, GenerationRequest
from evalrun.engines.replay import ReplayEngine
from evalrun.episodes import Engines, kind_named, replay_episodes
from evalrun.episodes.agent import AgentBudget, ModelAgent, plan_agent_episodes, run_agent_episodes
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.entries import parse_line
from evalrun.worlds.actions import ParseError, ToolCall, native_messages, tool_schemas
from evalrun.worlds.invoice_desk import InvoiceDesk
from evalrun.worlds.scripted import scripted_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks
from evalrun.worlds.tool_formats import JSON_TOOLS, NativeToolFormat

GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}
AGENT_MODEL = MODELS_DIR / "tiny-invoice-agent"
TOOL_MODEL = MODELS_DIR / "tiny-tool-agent"  # its template renders tools (a Hermes-style one)
# A Hermes-style template (as Qwen2.5's and NousResearch's): the tools in the system turn, each call in
# <tool_call> tags, each result a tool turn
HERMES = (
    "{% if tools %}<|im_start|>system\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% elif m.role == 'tool' %}<tool_response id={{ m.tool_call_id }}>{{ m.content }}</tool_response>"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HERMES_CHAT = ChatFormat(HERMES, {}, {}, "file")


def hermes(calls: list[ToolCall]) -> str:
    """A reply as a Hermes-format model writes it."""
    return "".join(f"<tool_call>\n{json.dumps(c.as_json())}\n</tool_call>" for c in calls)


@pytest.fixture(scope="module")
def native() -> NativeToolFormat:
    return NativeToolFormat("hermes", str(AGENT_MODEL))


def test_the_hermes_parser_reads_calls_and_names_what_it_cannot(native: NativeToolFormat) -> None:
    calls = [ToolCall("get_invoice", {"invoice_id": "I1"}), ToolCall("list_invoices", {})]
    assert native.parse("I will look.\n" + hermes(calls)) == calls
    assert native.parse("no calls here") == ParseError("no tool call the hermes parser could read in the reply")
    assert isinstance(native.parse("<tool_call>{not json</tool_call>"), ParseError)
    assert isinstance(native.parse('<tool_call>{"name": "x", "arguments": [1]}</tool_call>'), ParseError)
    assert native.as_record() == {"name": "native", "parser": "hermes", "vllm": vllm_version()}
    assert vllm_version() is not None and vllm_version().startswith("0.")


def test_native_messages_give_every_call_an_id_and_every_result_a_tool_message(native: NativeToolFormat) -> None:
    specs = InvoiceDesk().tools()
    assert HERMES_CHAT.renders_tools()
    agents = ModelChat.of_directory(AGENT_MODEL)
    assert agents.template is not None and not ChatFormat(agents.template, {}, {}, "model").renders_tools()
    # a template that reads ``tools`` and drops them renders none either: the probe is looked for in the prompt
    assert not ChatFormat("{% if tools %}{% endif %}" + agents.template, {}, {}, "model").renders_tools()
    prompt, chat = native.prompt(HERMES_CHAT, specs, "Find the duplicates.", [])
    assert chat is not None and chat.tools == tuple(tool_schemas(specs)) and chat.messages[-1]["role"] == "user"
    schemas = tool_schemas(specs)
    assert prompt.startswith("<|im_start|>system\n<tools>\n") and all(s["function"]["name"] in prompt for s in schemas)
    assert prompt.endswith("<|im_start|>user\nFind the duplicates.<|im_end|>\n<|im_start|>assistant\n")
    from evalrun.worlds.actions import Step
    from evalrun.worlds.base import ToolResult

    step = Step((ToolCall("a", {"x": 1}), ToolCall("b", {})), (ToolResult.ok([1]), ToolResult.error("no")), "raw")
    bad = Step((), (ToolResult.error("not a call"),), "gibberish")
    messages = native_messages("task", [step, bad])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_0_0", "call_0_1"]
    assert [m["tool_call_id"] for m in messages[2:4]] == ["call_0_0", "call_0_1"]
    assert messages[4]["content"] == "gibberish" and "not a call" in messages[5]["content"]


class HermesEngine:
    """An engine answering each turn with the scripted policy's calls, in the Hermes format."""

    def __init__(self) -> None:
        self.turns: dict[str, Any] = {}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion(text := hermes(self.turns[r.episode_id]()), (1,) * (len(text) // 8), (), "stop", 1)
                for r in requests]  # fmt: skip


class HermesModel(ModelAgent):
    def act(self, turns: Any) -> Any:
        for t in turns:
            self.engine.turns[t.episode.episode_id] = lambda t=t: scripted_policy(t.task_text, t.steps)
        return super().act(turns)


def test_native_episodes_run_record_raw_replies_and_replay_exactly(native: NativeToolFormat) -> None:
    """A model answering in its own format through the native path passes as the scripted agent does; the chain
    keeps each raw reply, and a replay parses it again to the same heads."""
    tasks = world_tasks(
        suite_from_mapping(
            {
                "name": "invoice-desk",
                "version": "1",
                "family": ["duplicates", "price-differences"],
                "seeds": {"train": [0, 1000], "test": [1000, 1003]},
                "split": "test",
            }
        )
    )
    decoding = DecodingConfig(name="agent", max_tokens=256, stop=(), logprobs=False)
    episodes = plan_agent_episodes("invoice-desk", tasks, decoding, SeedsConfig(master=7), "model", AgentBudget(),
                                   HERMES_CHAT, native)  # fmt: skip
    results = run_agent_episodes(episodes, HermesModel(HermesEngine()), GENERATOR)
    assert len(results) == 6 and all(r.stop == "done" and r.scores["pass"] == 1.0 for r in results)
    for r in results:
        models = [e for e in map(parse_line, r.log_lines) if type(e).__name__ == "ModelEntry"]
        assert models and all(m.response.text.startswith("<tool_call>\n") for m in models)
        assert all(m.request.prompt.startswith("<|im_start|>system\n<tools>") for m in models)
        assert "<tool_response id=call_0_0>" in models[1].request.prompt
    calls = {}
    for r in results:
        for e in map(parse_line, r.log_lines):
            if type(e).__name__ == "ModelEntry":
                calls[(r.episode.episode_id, e.call)] = _recorded(r.episode.episode_id, e)
    engine = ReplayEngine(calls, {})
    replayed, divergences = replay_episodes(kind_named("world"), Engines(engine, engine), episodes,
                                            {r.episode.episode_id: r.log_lines for r in results},
                                            lambda _: GENERATOR)  # fmt: skip
    assert not divergences and [r.head for r in replayed] == [r.head for r in results]


def _recorded(episode_id: str, entry: Any) -> Any:
    from evalrun.engines.replay import RecordedCall

    return RecordedCall(episode_id=episode_id, seq=entry.seq, call=entry.call, request=entry.request.as_record(),
                        request_hash=entry.request_hash, response=entry.response.as_record(), prompt_tokens=1,
                        error=None)  # fmt: skip


def test_tool_format_is_checked_before_any_model_loads() -> None:
    base = ["task=invoice_desk", "task.world.agent=model", "model=tiny_invoice_agent", "limit=2"]
    auto = prepare(load(base))  # its template does not render tools: the JSON protocol, recorded as before
    assert auto.task.tools is JSON_TOOLS and "tool_format" not in auto.digest.inputs["prompt_pack"]["world"]
    # native tools with a template that drops them: refused, naming the template and the way out
    with pytest.raises(BadInput, match=r"the model's \(.*tiny-invoice-agent\), does not render the tools") as caught:
        prepare(load([*base, "task.world.tool_format=native", "task.world.tool_parser=hermes"]))
    assert caught.value.where == "task.world.tool_format" and "task.chat_template=FILE" in caught.value.message
    tools = ["task=invoice_desk", "task.world.agent=model", "model=tiny_tool_agent", "limit=2"]
    with pytest.raises(BadInput, match="name the one for the model's format") as caught:
        prepare(load([*tools, "task.world.tool_format=native"]))
    assert caught.value.where == "task.world.tool_parser"
    with pytest.raises(BadInput, match="expected one of vLLM's tool parsers") as caught:
        prepare(load([*tools, "task.world.tool_format=native", "task.world.tool_parser=nope"]))
    assert caught.value.where == "task.world.tool_parser"
    native = prepare(load([*tools, "task.world.tool_format=native", "task.world.tool_parser=hermes"]))
    assert native.task.tools == NativeToolFormat("hermes", str(TOOL_MODEL.resolve()))
    record = native.digest.inputs["prompt_pack"]["world"]["tool_format"]
    assert record["parser"] == "hermes" and record["vllm"]
    assert native.digest.prompt_pack != prepare(load([*tools, "task.world.tool_format=json"])).digest.prompt_pack
    scripted = prepare(load(["task=invoice_desk", "limit=2", "task.world.tool_format=native"]))
    assert scripted.task.tools is JSON_TOOLS  # a scripted agent writes the JSON protocol whatever the setting
