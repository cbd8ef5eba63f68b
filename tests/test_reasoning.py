"""A reasoning model's replies split by a vLLM reasoning parser (``task.reasoning_parser``), judges' prompts
through the judges' model's chat template, and chat-formatted prompts tokenized without the tokenizer's special
tokens. No engine: an engine double answers as models/tiny-thinking-adder does (it thinks ``b+a=s`` between
``<think>`` and ``</think>``, then answers ``s``); tests/test_reasoning_e2e.py runs the model itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalrun.chat import ModelChat, chat_format
from evalrun.chat.reasoning import Split, reasoning_parser, vllm_version
from evalrun.config import BUILTIN_TASKS, MODELS_DIR, load
from evalrun.engines import Completion, GenerationRequest, Loglikelihood, LoglikelihoodRequest
from evalrun.episodes.agent import AgentBudget, ModelAgent, plan_agent_episodes, run_agent_episodes
from evalrun.episodes.encode import output_rows
from evalrun.episodes.harness import run_episodes
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.entries import ModelEntry, parse_line
from evalrun.records.view import ChainView
from evalrun.scoring import make_scorer
from evalrun.worlds.actions import format_calls
from evalrun.worlds.scripted import scripted_policy
from evalrun.worlds.suite import suite_from_mapping, world_tasks
from evalrun.worlds.tool_formats import JSON_TOOLS

THINKING_MODEL = MODELS_DIR / "tiny-thinking-adder"
THINKING = ("model=tiny_thinking_adder", "task=addition", "decoding.stop=[]", "task.reasoning_parser=deepseek_r1")
GENERATOR = {"name": "evalrun", "version": "test", "git_commit": None}


def test_vllms_parsers_split_the_thinking_and_read_enable_thinking_as_vllm_serve_does() -> None:
    parser = reasoning_parser("deepseek_r1", THINKING_MODEL, "models/tiny-thinking-adder")
    assert parser is not None and parser.as_record() == {"parser": "deepseek_r1", "vllm": vllm_version()}
    assert parser.split("<think>83+3=86</think>\n\n86") == Split("83+3=86", "\n\n86")
    assert parser.split("<think>83+3=8") == Split("83+3=8", "")  # cut inside its thinking: no answer
    qwen3 = reasoning_parser("qwen3", THINKING_MODEL, "x")
    assert qwen3 is not None and qwen3.split("<think>1+2=3</think>3") == Split("1+2=3", "3")
    # the template closed an empty think block itself: a reply without thinking is all answer
    off = reasoning_parser("qwen3", THINKING_MODEL, "x", {"enable_thinking": False})
    assert off is not None and off.split("86") == Split(None, "86")
    assert reasoning_parser(None, THINKING_MODEL, "x") is None


def test_a_reasoning_parser_is_checked_before_any_model_loads() -> None:
    with pytest.raises(BadInput, match="expected one of vLLM's reasoning parsers") as caught:
        prepare(load(["model=tiny_thinking_adder", "task.reasoning_parser=nope", "limit=2"]))
    assert caught.value.where == "task.reasoning_parser"
    # the default model has no <think> token: the parser cannot read its replies
    with pytest.raises(BadInput, match="could not locate think start/end tokens") as caught:
        prepare(load(["task.reasoning_parser=deepseek_r1", "limit=2"]))
    assert caught.value.where == "task.reasoning_parser"


class ThinkingEngine:
    """Answers every prompt as the thinking model does, and keeps the requests it was given."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest | LoglikelihoodRequest] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.requests += requests
        completions = []
        for r in requests:
            a, b = r.prompt.split("Q: ")[1].split("\n")[0].split("+") if "Q: " in r.prompt else ("0", "0")
            text = f"<think>{b}+{a}={int(a) + int(b)}</think>\n\n{int(a) + int(b)}"
            completions.append(Completion(text, (1,) * len(text), (), "stop", 3))
        return completions

    def loglikelihood(self, requests: list[LoglikelihoodRequest]) -> list[Loglikelihood]:
        self.requests += requests
        return [Loglikelihood(-1.0, (1,), True, 3) for _ in requests]

    def describe(self) -> dict[str, Any]:
        return {"name": "thinking", "version": "1", "settings": {}}


def test_split_replies_are_recorded_and_scored_on_the_answer() -> None:
    """The chain keeps the reply's text and adds its answer and thinking; the output row and the scorer see the
    answer; the row agrees with the chain (what verify checks); the parser is in the digest; the prompts are
    chat-formatted and sent without the tokenizer's special tokens."""
    prepared = prepare(load([*THINKING, "limit=4"]))
    assert prepared.digest.inputs["prompt_pack"]["reasoning"] == {"parser": "deepseek_r1", "vllm": vllm_version()}
    plain = prepare(load(["model=tiny_thinking_adder", "task=addition", "decoding.stop=[]", "limit=4"]))
    assert "reasoning" not in plain.digest.inputs["prompt_pack"]
    assert plain.digest.prompt_pack != prepared.digest.prompt_pack
    engine = ThinkingEngine()
    results = run_episodes(engine, list(prepared.episodes), GENERATOR)
    assert all(isinstance(r, GenerationRequest) and not r.add_special_tokens for r in engine.requests)
    assert all(r.prompt.startswith("<|im_start|>user\n") for r in engine.requests)
    rows = output_rows(results, _provenance())
    for result, row in zip(results, rows.to_pylist(), strict=True):
        response = parse_line(result.log_lines[1]).response
        a, b = result.episode.prompt.split("Q: ")[1].split("\n")[0].split("+")
        assert response.text == f"<think>{b}+{a}={int(a) + int(b)}</think>\n\n{int(a) + int(b)}"
        assert (response.reasoning, response.content) == (f"{b}+{a}={int(a) + int(b)}", f"\n\n{int(a) + int(b)}")
        assert row["output"] == response.content
        assert prepared.kind.row_mismatch(row, ChainView.of([parse_line(x) for x in result.log_lines])) is None
    score = make_scorer(prepared.config.task.scorer)
    assert [s.value for r in rows.to_pylist() for s in score(r)] == [1.0] * 4
    # the same replies taken whole: the scorer reads the thinking too, and every answer is wrong
    whole = output_rows(run_episodes(ThinkingEngine(), list(plain.episodes), GENERATOR), _provenance())
    assert [s.value for r in whole.to_pylist() for s in score(r)] == [0.0] * 4
    assert '"reasoning"' not in run_episodes(ThinkingEngine(), list(plain.episodes)[:1], GENERATOR)[0].log_lines[1]


def _provenance() -> Any:
    from evalrun.episodes import Provenance

    return Provenance("test", "{}", 4, 0.0)


def test_a_model_agent_reads_its_tools_from_the_answer_not_the_thinking() -> None:
    suite = {"name": "invoice-desk", "version": "1", "family": ["duplicates"],
             "seeds": {"train": [0, 1000], "test": [1000, 1002]}, "split": "test"}  # fmt: skip
    tasks = world_tasks(suite_from_mapping(suite))
    chat = chat_format("chat", ModelChat.of_directory(THINKING_MODEL), None, None, "x")
    parser = reasoning_parser("deepseek_r1", THINKING_MODEL, "x")
    from evalrun.config import DecodingConfig, SeedsConfig

    decoding = DecodingConfig(name="agent", max_tokens=256, stop=(), logprobs=False)
    episodes = plan_agent_episodes("invoice-desk", tasks, decoding, SeedsConfig(master=7), "model", AgentBudget(),
                                   chat, JSON_TOOLS, parser)  # fmt: skip

    class Thinker:
        def __init__(self) -> None:
            self.next: dict[str, Any] = {}
            self.requests: list[GenerationRequest] = []

        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            self.requests += requests
            # JSON in its thinking too: read whole, no reply would parse; the answer alone is the calls
            return [Completion(f"<think>{format_calls([])}</think>{format_calls(self.next[r.episode_id]())}",
                               (1,) * 4, (), "stop", 1) for r in requests]  # fmt: skip

    class Agent(ModelAgent):
        def act(self, turns: Any) -> Any:
            for t in turns:
                self.engine.next[t.episode.episode_id] = lambda t=t: scripted_policy(t.task_text, t.steps)
            return super().act(turns)

    engine = Thinker()
    results = run_agent_episodes(episodes, Agent(engine), GENERATOR)
    assert all(r.stop == "done" and r.scores["pass"] == 1.0 for r in results)
    assert engine.requests and not any(r.add_special_tokens for r in engine.requests)
    replies = [e for r in results for e in map(parse_line, r.log_lines) if isinstance(e, ModelEntry)]
    assert replies and all(e.response.reasoning == format_calls([]) for e in replies)
    assert all(e.response.text == f"<think>{e.response.reasoning}</think>{e.response.content}" for e in replies)


def test_judge_prompts_go_through_the_judges_models_chat_template(tmp_path: Path) -> None:
    """A rubric's judges are shown their prompt as chat messages when the judges' model has a chat template
    (``chat_format: auto``, recorded in the digest), as plain text with ``chat_format: plain`` (a new judge-facing
    hash); the default model has no template, so the built-in rubric task's records are as they were."""
    base = ["task=report_rubric", "limit=2"]
    default = prepare(load(base))
    assert default.task.judge_chat is None and "judge_chat" not in default.digest.inputs["prompt_pack"]
    chat = prepare(load([*base, "model=tiny_thinking_adder"]))
    assert chat.task.judge_chat is not None
    assert chat.digest.inputs["prompt_pack"]["judge_chat"]["template_sha256"] == ModelChat.of_directory(
        THINKING_MODEL).template_sha256  # fmt: skip
    engine = ThinkingEngine()
    run_episodes(engine, list(chat.episodes)[:1], GENERATOR)
    judged = [r for r in engine.requests if isinstance(r, LoglikelihoodRequest)]
    assert judged and all(r.context.startswith("<|im_start|>user\n") and not r.add_special_tokens for r in judged)
    rubric = (BUILTIN_TASKS / "report_rubric" / "rubric.yaml").read_text()
    plain_rubric = tmp_path / "rubric.yaml"
    plain_rubric.write_text(rubric.replace("judge_pack: judge", f"judge_pack: {BUILTIN_TASKS}/"
                                                                "report_rubric/judge\nchat_format: plain"))  # fmt: skip
    plain = prepare(load([*base, "model=tiny_thinking_adder", f"task.rubric={plain_rubric}"]))
    assert plain.task.judge_chat is None and plain.task.rubric is not None and chat.task.rubric is not None
    assert plain.task.rubric.judge_facing_hash() != chat.task.rubric.judge_facing_hash()
    assert json.dumps(default.task.rubric.judge_facing()).find("chat_format") == -1  # type: ignore[union-attr]
