"""Chat formatting (evalrun/chat): prompts as chat messages through a chat template, recorded so that a
run renders, replays and verifies without its model directory. No engine but in the marked e2e tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalrun import cli
from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.chat import ChatFormat, ModelChat, chat_format
from evalrun.config import BUILTIN_TASKS, MODELS_DIR, load
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.tasks.pack import load_pack

MODELS = MODELS_DIR
BUILTIN = BUILTIN_TASKS
# ChatML, as SmolLM2 and Qwen write it (with SmolLM2's default system message)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def chatml(tmp_path: Path) -> Path:
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML, encoding="utf-8")
    return path


@pytest.mark.parametrize("model", ["tiny-invoice-agent", "tiny-adder"])
def test_a_model_dirs_chat_and_special_tokens_are_those_transformers_renders_with(model: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODELS / model)
    chat = ModelChat.of_directory(MODELS / model)
    assert dict(chat.special_tokens) == tokenizer.special_tokens_map
    assert chat.template == (tokenizer.chat_template or None)
    if chat.template is not None:  # the rendering is apply_chat_template's, byte for byte
        messages = [{"role": "system", "content": "tools"}, {"role": "user", "content": "task"},
                    {"role": "assistant", "content": '{"calls": []}'}, {"role": "tool", "content": "[]"}]  # fmt: skip
        rendered = ChatFormat(chat.template, chat.special_tokens, {}, "model").render(messages)
        assert rendered == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered.startswith("<s><|system|>tools<|end|>") and rendered.endswith("<|assistant|>")


def test_a_recorded_chat_round_trips_and_a_tampered_one_is_refused() -> None:
    chat = ModelChat.of_directory(MODELS / "tiny-invoice-agent")
    assert ModelChat.recorded(chat.as_record()) == chat
    tampered = {**chat.as_record(), "template": chat.template + " "}
    with pytest.raises(BadInput, match="does not match its recorded sha256"):
        ModelChat.recorded(tampered)


def test_chat_format_modes(chatml: Path) -> None:
    model = ModelChat.of_directory(MODELS / "tiny-invoice-agent")
    plain = ModelChat.of_directory(MODELS / "tiny-adder")
    assert chat_format(None, model, None, None, "here").origin == "model"  # auto: the model's template
    assert chat_format("plain", model, None, None, "here") is None
    assert chat_format("auto", plain, None, None, "here") is None  # no template: plain prompts
    override = chat_format("chat", plain, chatml, None, "here")
    assert override.origin == "file" and override.template == CHATML and override.customised
    with pytest.raises(BadInput, match=r"chat, but the model \(models/tiny-adder\) has no chat template") as caught:
        chat_format("chat", plain, None, None, "models/tiny-adder")
    assert caught.value.where == "task.chat_format"


def test_a_pack_renders_system_examples_as_turns_and_the_question() -> None:
    pack = load_pack(BUILTIN / "addition_chat")
    assert pack.fewshot is not None and pack.fewshot.assistant is not None
    examples = [{"id": "a", "question": "1+2", "answer": "3"}, {"id": "b", "question": "4+5", "answer": "9"}]
    messages = pack.messages({"question": "6+7", "answer": "13", "examples": examples, "choices": [], "letters": []})
    assert messages == [
        {"role": "system", "content": "You are a calculator. Reply with the sum only, as digits."},
        {"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": "3"},
        {"role": "user", "content": "What is 4+5?"}, {"role": "assistant", "content": "9"},
        {"role": "user", "content": "What is 6+7?"},
    ]  # fmt: skip


def test_a_multiturn_pack_without_an_assistant_template_is_refused(tmp_path: Path) -> None:
    pack = Path(shutil.copytree(BUILTIN / "addition_chat", tmp_path / "pack"))
    shutil.copy(BUILTIN / "addition_fewshot" / "fewshot.jsonl", tmp_path / "fewshot.jsonl")
    text = (pack / "pack.yaml").read_text().replace("  assistant: assistant.jinja\n", "")
    (pack / "pack.yaml").write_text(text.replace("../addition_fewshot/fewshot.jsonl", "../fewshot.jsonl"))
    with pytest.raises(BadInput, match="as_multiturn: true and an assistant template") as caught:
        load_pack(pack)
    assert "fewshot.assistant" in caught.value.where


def test_chat_prompts_and_their_digest(chatml: Path) -> None:
    """A chat-formatted plan renders every prompt through the template; the template's hash, origin, tokens
    and kwargs are in the prompt-pack digest part (a change to any is a new digest); plain packs are as before."""
    base = ["task=addition_chat", "limit=3", f"task.chat_template={chatml}"]
    prepared = prepare(load(base))
    first = prepared.episodes[0]
    assert first.prompt.startswith("<|im_start|>system\nYou are a calculator.")
    assert first.prompt.count("<|im_start|>user\n") == 4 and first.prompt.endswith("<|im_start|>assistant\n")
    chat = prepared.digest.inputs["prompt_pack"]["chat"]
    assert chat["origin"] == "file" and chat["kwargs"] == {}
    # a variable the template never reads changes nothing: refused, naming it and the template
    with pytest.raises(BadInput, match="never reads enable_thinking, so it would change nothing") as caught:
        prepare(load([*base, "+task.chat_template_kwargs.enable_thinking=false"]))
    assert caught.value.where == "task.chat_template_kwargs.enable_thinking"
    thinking = chatml.with_name("thinking.jinja")
    thinking.write_text(CHATML + "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")
    kwargs = [f"task.chat_template={thinking}", "+task.chat_template_kwargs.enable_thinking=false"]
    with_kwargs = prepare(load([*base, *kwargs]))
    assert with_kwargs.digest.inputs["prompt_pack"]["chat"]["kwargs"] == {"enable_thinking": False}
    assert with_kwargs.episodes[0].prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert with_kwargs.digest.prompt_pack != prepared.digest.prompt_pack
    plain = prepare(load(["task=addition_chat", "limit=3", "task.chat_format=plain"]))
    assert "chat" not in plain.digest.inputs["prompt_pack"]
    assert plain.episodes[0].prompt.startswith("You are a calculator. Reply with the sum only, as digits.What is")


def test_chat_on_a_model_without_a_template_exits_2_before_any_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "task=addition_chat", "limit=2", "cluster=inline"]) == 2
    err = capsys.readouterr().err
    assert "task.chat_format" in err and "has no chat template" in err


def test_template_kwargs_must_be_json_scalars(chatml: Path) -> None:
    with pytest.raises(BadInput, match="a mapping of names to strings, numbers") as caught:
        load(["task=addition_chat", f"task.chat_template={chatml}", "+task.chat_template_kwargs.a=[1]"])
    assert caught.value.where == "task.chat_template_kwargs"


@pytest.mark.e2e
def test_a_chat_run_replays_verifies_and_rescores_without_its_model_directory(run_eval, chatml: Path,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    """On the default model with a template file: the prompts are chat-formatted, and a copy of the run whose
    recorded model directory does not exist replays every head exactly and rescores bit for bit. (Zero-shot:
    the default model's context is too short for the pack's examples.)"""
    pack = Path(shutil.copytree(BUILTIN / "addition_chat", tmp_path / "pack"))
    text = (pack / "pack.yaml").read_text()
    (pack / "pack.yaml").write_text(text[: text.index("fewshot:")] + text[text.index("decoding:") :])
    run = run_eval("task=addition_chat", "limit=4", f"task.chat_template={chatml}", f"task.prompt_pack={pack}")
    prompts = [json.loads(line)["request"]["prompt"] for p in (run / "log").iterdir()
               for line in p.read_text().splitlines() if '"kind":"model"' in line]  # fmt: skip
    assert len(prompts) == 4 and all(p.startswith("<|im_start|>system\n") for p in prompts)
    assert verify_run(run).scores == "recomputed"
    moved = Path(shutil.copytree(run, tmp_path / "moved"))
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["model"]["path"] = str(tmp_path / "no-such-model")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    replayed = replay_run(moved, [])
    assert replayed.reproduced == 4 and not replayed.divergences and replayed.root_matches
    assert replayed.scores_identical
    assert rescore_run(run, []).bytes_identical
