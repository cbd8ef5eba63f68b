"""Train the tiny invoice-desk agent: a Llama chat model that plays the scripted policy with tool calls.

The model ships in ``evalrun/models/tiny-invoice-agent`` and is pinned by hash in
``evalrun/conf/model/tiny_invoice_agent.yaml``; this script is how it was made and how anyone can make it
again (a retrained model gets new hashes, so the pins must be refreshed with ``--write-pins``)::

    python scripts/build_agent_model.py --out evalrun/models/tiny-invoice-agent \
        --write-pins evalrun/conf/model/tiny_invoice_agent.yaml

Training data: the scripted agent's episodes (``run_scripted`` with ``effects_for(task)``) over the
TRAIN seed range of ``evalrun/conf/task/invoice_desk.yaml`` (its ``world`` section) only, both families, rendered with
``evalrun.worlds.actions.chat_messages``, the same rendering the model agent sees at run time. The
held-out ``test`` seeds never appear.

Tokenizer: byte-level BPE trained on that text (runs of digits are their own pre-tokens, so a
number is one or a few tokens and never merges with the JSON around it), with special tokens for
bos, pad, one per chat role and ``<|end|>``, which ends every message and is the eos token: an
assistant reply stops there. The chat template (``tokenizer_config.json``)::

    <s><|system|>...<|end|><|user|>...<|end|><|assistant|>...<|end|><|tool|>...<|end|>...

and ``add_generation_prompt`` appends ``<|assistant|>``. Role tags are special tokens, so each
message's text is tokenized on its own and the prompt of a turn is a prefix of the whole episode's
tokens: what the model is trained on is exactly what it is shown at run time.

Model: a small LlamaForCausalLM (context 2048, enough for a whole episode) trained on CPU with the
loss on assistant reply tokens only (the ``<|end|>`` that closes a reply included).
``scripts/eval_agent_model.py`` measures the pass rate on held-out seeds. The shipped model (1300 steps,
~24 min on one shared CPU core) has learned the protocol (no unparseable replies, the scripted turn
order) but rarely the report itself: about 0-4% of held-out episodes pass. It is a working model
agent for the harness, not a capable one.

``--tool-format native`` makes ``evalrun/models/tiny-tool-agent`` (pins:
``evalrun/conf/model/tiny_tool_agent.yaml``), the same model trained for native function calling::

    python scripts/build_agent_model.py --tool-format native --out evalrun/models/tiny-tool-agent \
        --write-pins evalrun/conf/model/tiny_tool_agent.yaml --steps 800

The episodes are rendered with ``native_messages`` and the tools go to the chat template as JSON Schema
(``tool_schemas``, the template's ``tools``); the template (:data:`NATIVE_TEMPLATE`) lists them in a
system turn, one minified schema a line inside ``<tools></tools>``, and renders every call of an
assistant turn Hermes style, ``<tool_call>{"name":NAME,"arguments":ARGS}</tool_call>`` (compact JSON,
arguments with sorted keys: the canonical JSON of the json format's calls), which vLLM's ``hermes``
tool parser reads. Each ``tool`` message is one call's result (``format_observation``), in call order.
``<tool_call>`` and ``</tool_call>`` are one added token each, not special ones: a decode that skips
special tokens keeps them. The training text is the template's own rendering, and for every episode
the script checks that each turn's prompt (``add_generation_prompt=True``) is a prefix of the episode's
tokens and that the labels are exactly the assistant turns' tokens and their ``<|end|>``. The longest
training episode is 495 tokens (the tools' system turn, constant, is a handful of BPE tokens). The shipped
model (800 steps, ~21 min on one contended CPU core, final loss ~0.12) writes well-formed calls: every
first reply on vLLM and every reply of 20 held-out episodes (``eval_agent_model.py --tool-format native``)
is read by the hermes parser into calls of the world's tools; like the json model it rarely gets the
report right (1 of those 20 passes).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from evalrun.config import load
from evalrun.engines.pins import hash_model_dir, write_pins
from evalrun.episodes.agent import planned_world_tasks
from evalrun.records.canonical import canonical_json
from evalrun.worlds import effects_for, make_world
from evalrun.worlds.actions import chat_messages, native_messages, tool_schemas
from evalrun.worlds.base import WorldTask
from evalrun.worlds.scripted import run_scripted

REPO = Path(__file__).resolve().parents[1]
BOS, PAD, END = "<s>", "<pad>", "<|end|>"
ROLES = ("system", "user", "assistant", "tool")
ROLE_TOKENS = {role: f"<|{role}|>" for role in ROLES}
SPECIAL = [PAD, BOS, END, *ROLE_TOKENS.values()]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"  # added tokens of the native model (not special)
NATIVE_CALL_FORM = '<tool_call>{"name":NAME,"arguments":ARGS}</tool_call>'
# The native model's template: the tools (``tools``, JSON Schema) in a system turn, one per line, then every
# message as in CHAT_TEMPLATE, an assistant turn's calls Hermes style after its text (if any). A leading
# system message goes first in the tools' system turn. Arguments given as a string (the OpenAI wire form)
# are written as they are; as an object (``native_messages``), in compact JSON with sorted keys.
NATIVE_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% if tools %}"
    "<|system|>{% if system %}{{ system }}\n{% endif %}"
    "Tools:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson(separators=(',', ':')) }}\n{% endfor %}"
    "</tools>\n"
    f"Call tools as {NATIVE_CALL_FORM}, one or more per reply; each call's result comes back as a tool message, "
    "in call order.<|end|>"
    "{% elif system %}<|system|>{{ system }}<|end|>{% endif %}"
    "{% for message in rest %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    '<tool_call>{"name":{{ f[\'name\'] | tojson }},"arguments":'
    "{% if f['arguments'] is string %}{{ f['arguments'] }}"
    "{% else %}{{ f['arguments'] | tojson(separators=(',', ':'), sort_keys=True) }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODELS = {"json": "tiny-invoice-agent", "native": "tiny-tool-agent"}


def pin_header(name: str) -> dict[str, object]:
    return {
        "name": name,
        "id": f"evalrun/{name}",
        "path": f"${{evalrun.root:}}/models/{name}",
        "revision": None,
        "cache_dir": None,
        "pinned": True,
        "dtype": "float32",
    }


IGNORE = -100


def split_tasks(split: str) -> list[WorldTask]:
    """The world tasks of ``task=invoice_desk``'s split, as a run plans them (the one config loader)."""
    world = load(["task=invoice_desk", f"task.world.split={split}"]).task.world
    assert world is not None
    return planned_world_tasks(world)


def scripted_episodes(
    tasks: list[WorldTask], native_tools: list[dict[str, Any]] | None = None
) -> list[list[dict[str, Any]]]:
    """Every scripted episode of ``tasks`` as chat messages, up to and including the last reply: by
    ``chat_messages``, or with ``native_tools`` (every task's world must have those tools) by ``native_messages``."""
    episodes = []
    families = list(dict.fromkeys(t.family for t in tasks))
    # family by family, seeds ascending: the order the shipped model was trained in
    for task in sorted(tasks, key=lambda t: (families.index(t.family), t.seed)):
        world = make_world(task)
        transcript = run_scripted(world, task, effects_for(task))
        if transcript.scores["pass"] != 1.0:
            raise RuntimeError(f"the scripted agent failed {task.item_id}: {transcript.scores}")
        if native_tools is not None:
            if tool_schemas(world.tools()) != native_tools:
                raise RuntimeError(f"{task.item_id}: its world's tools differ from the first task's")
            messages = native_messages(transcript.task_text, transcript.steps)
            last = transcript.steps[-1]
            episodes.append(messages[: len(messages) - len(last.results)])  # submit_report's result is never an input
            continue
        messages = chat_messages(world.tools(), transcript.task_text, transcript.steps)
        episodes.append(messages[:-1])  # the result of submit_report is never a model input
    return episodes


def render_native(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]], generation: bool = False) -> str:
    """``messages`` through NATIVE_TEMPLATE, as ``apply_chat_template`` renders them (before a tokenizer exists)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([list(messages)], tools=tools, chat_template=NATIVE_TEMPLATE,
                                        add_generation_prompt=generation, bos_token=BOS, eos_token=END,
                                        pad_token=PAD)  # fmt: skip
    return str(rendered[0])


def native_texts(episodes: Sequence[Sequence[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[str]:
    """The text the native tokenizer's BPE learns from: each rendered episode cut at its special and added
    tokens (the pieces the tokenizer encodes one by one)."""
    cut = re.compile("|".join(re.escape(t) for t in [*SPECIAL, TOOL_CALL, TOOL_CALL_END]))
    return [piece for messages in episodes for piece in cut.split(render_native(messages, tools)) if piece]


def build_tokenizer(
    texts: Sequence[str], vocab_size: int, native: bool = False, context: int = 2048
) -> PreTrainedTokenizerFast:
    backend = Tokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=END, pad_token=PAD, model_max_length=context
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS.values())})
    if native:  # one token each, kept by a decode that skips special tokens (so the tool parser sees them)
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (TOOL_CALL, TOOL_CALL_END)])
    tokenizer.chat_template = NATIVE_TEMPLATE if native else CHAT_TEMPLATE
    return tokenizer


def encode_episode(
    tokenizer: PreTrainedTokenizerFast, messages: Sequence[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered episode and labels: the reply tokens (and their end) of every assistant turn."""
    ids = [tokenizer.bos_token_id]
    labels = [IGNORE]
    end = tokenizer.convert_tokens_to_ids(END)
    for message in messages:
        content = [*tokenizer.encode(message["content"], add_special_tokens=False), end]
        ids += [tokenizer.convert_tokens_to_ids(ROLE_TOKENS[message["role"]]), *content]
        labels += [IGNORE, *(content if message["role"] == "assistant" else [IGNORE] * len(content))]
    return ids, labels


def check_template(tokenizer: PreTrainedTokenizerFast, messages: Sequence[dict[str, str]]) -> None:
    """The chat template renders to exactly the training tokens; each turn's prompt is their prefix."""
    ids, _ = encode_episode(tokenizer, messages)
    rendered = tokenizer.apply_chat_template(list(messages), tokenize=False)
    assert tokenizer.encode(rendered) == ids, "chat template and training encoding disagree"
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = tokenizer.apply_chat_template(list(messages[:last]), tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt)
    assert ids[: len(prompt_ids)] == prompt_ids and ids[len(prompt_ids) - 1] == tokenizer.convert_tokens_to_ids(
        ROLE_TOKENS["assistant"]
    )
    assert tokenizer.decode(ids[len(prompt_ids) : -1]) == messages[last]["content"], "tokens do not round-trip"


def native_call_text(call: dict[str, Any]) -> str:
    """One call as the native template writes it (the Python side of NATIVE_TEMPLATE's call form)."""
    function = call["function"]
    arguments = json.dumps(function["arguments"], separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert arguments == canonical_json(function["arguments"]), "the template's arguments are not canonical JSON"
    name = json.dumps(function["name"], ensure_ascii=False)
    return f'{TOOL_CALL}{{"name":{name},"arguments":{arguments}}}{TOOL_CALL_END}'


def encode_native(
    tokenizer: PreTrainedTokenizerFast, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Token ids of the episode as the chat template renders it, and labels: each assistant turn's tokens and
    its end. Checked on the way, for every turn: the prompt the model is shown at run time (the messages
    before the turn, ``add_generation_prompt=True``) is a prefix of the episode's tokens ending in the
    assistant tag, the episode up to the turn is a prefix too ending in ``<|end|>``, and the turn's tokens
    decode to its calls in the template's form (:func:`native_call_text`)."""

    def tokens(upto: int, generation: bool) -> list[int]:
        text = tokenizer.apply_chat_template(list(messages[:upto]), tools=tools, tokenize=False,
                                             add_generation_prompt=generation)  # fmt: skip
        return tokenizer.encode(text, add_special_tokens=False)

    ids = tokens(len(messages), False)
    labels = [IGNORE] * len(ids)
    assistant, end = tokenizer.convert_tokens_to_ids([ROLE_TOKENS["assistant"], END])
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i in turns:
        prompt, turn = tokens(i, True), tokens(i + 1, False)
        assert ids[: len(prompt)] == prompt and prompt[-1] == assistant, f"turn {i}: its prompt is not a prefix"
        assert ids[: len(turn)] == turn and turn[-1] == end, f"turn {i}: the episode up to it is not a prefix"
        reply = messages[i]["content"] + "".join(native_call_text(call) for call in messages[i]["tool_calls"])
        assert tokenizer.decode(turn[len(prompt) : -1]) == reply, f"turn {i}: its tokens do not decode to its calls"
        assert turn[len(prompt) : -1] == tokenizer.encode(reply, add_special_tokens=False), f"turn {i}: not its text's"
        labels[len(prompt) : len(turn)] = turn[len(prompt) :]
    assert turns and ids[-1] == end and turns[-1] == len(messages) - 1, "an episode ends with the last reply"
    return ids, labels


def reply_loss(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token loss on the labelled positions only (the head runs on those positions alone)."""
    hidden = model.model(input_ids=ids).last_hidden_state  # right padding + causal mask: no attention mask needed
    targets = labels[:, 1:]
    where = targets != IGNORE
    logits = model.lm_head(hidden[:, :-1][where])
    return torch.nn.functional.cross_entropy(logits, targets[where])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool-format", choices=sorted(MODELS), default="json",
                        help="json: tiny-invoice-agent (evalrun's JSON reply protocol); native: tiny-tool-agent "
                             "(tools through the chat template, Hermes tool calls)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default: evalrun/models/MODEL of the tool format")
    parser.add_argument("--steps", type=int, default=1300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=2048, help="the model's context (max_position_embeddings)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=1, help="one thread runs best on a shared 2-core machine")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save the model here every 200 steps")
    parser.add_argument("--write-pins", type=Path, default=None, help="rewrite this model config's sha256 pins")
    args = parser.parse_args()
    native = args.tool_format == "native"
    if args.out is None:
        args.out = REPO / "evalrun" / "models" / MODELS[args.tool_format]

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    tasks = split_tasks("train")
    tools = tool_schemas(make_world(tasks[0]).tools()) if native else None
    episodes = scripted_episodes(tasks, tools)
    if native:
        assert tools is not None
        tokenizer = build_tokenizer(native_texts(episodes, tools), args.vocab, native=True, context=args.context)
        examples = [encode_native(tokenizer, messages, tools) for messages in episodes]  # every episode checked
    else:
        texts = [message["content"] for messages in episodes for message in messages]
        tokenizer = build_tokenizer(texts, args.vocab, context=args.context)
        check_template(tokenizer, episodes[0])
        check_template(tokenizer, episodes[-1])
        examples = [encode_episode(tokenizer, messages) for messages in episodes]
    lengths = sorted(len(ids) for ids, _ in examples)
    if lengths[-1] > args.context:
        raise SystemExit(f"the longest training episode has {lengths[-1]} tokens, over the context ({args.context})")
    print(
        f"{len(examples)} episodes, vocab {len(tokenizer)}, tokens per episode min {lengths[0]} "
        f"median {lengths[len(lengths) // 2]} max {lengths[-1]} ({time.perf_counter() - started:.0f}s)",
        flush=True,
    )

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    print(f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)

    def save(directory: Path) -> None:
        model.eval()
        directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(directory, safe_serialization=True)
        tokenizer.save_pretrained(directory, save_jinja_files=False)  # the chat template in tokenizer_config.json
        model.generation_config.save_pretrained(directory)
        model.train()

    # Batches of episodes of similar length (less padding): shuffle, cut into chunks, sort each chunk.
    order: list[int] = []

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal order
        if len(order) < args.batch:
            pool = list(range(len(examples)))
            rng.shuffle(pool)
            chunks = [pool[i : i + args.batch * 16] for i in range(0, len(pool), args.batch * 16)]
            groups = []
            for chunk in chunks:
                chunk.sort(key=lambda i: len(examples[i][0]))
                groups += [chunk[i : i + args.batch] for i in range(0, len(chunk), args.batch)]
            rng.shuffle(groups)
            order = [i for group in groups for i in group]
        rows, order = order[: args.batch], order[args.batch :]
        width = max(len(examples[i][0]) for i in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        for row, i in enumerate(rows):
            seq, lab = examples[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(lab)] = torch.tensor(lab)
        return ids, labels

    started = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        ids, labels = batch()
        loss = reply_loss(model, ids, labels)
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        if step % 25 == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} ({time.perf_counter() - started:.0f}s)", flush=True)
        if args.checkpoint_dir and step % 200 == 0 and step < args.steps:
            save(args.checkpoint_dir / f"step-{step}")

    save(args.out)
    print(f"trained in {time.perf_counter() - started:.0f}s; saved to {args.out}", flush=True)
    if args.write_pins:
        if not args.write_pins.exists():
            header = pin_header(MODELS[args.tool_format])
            args.write_pins.write_text(yaml.safe_dump(header, sort_keys=False), encoding="utf-8")
        write_pins(args.write_pins, hash_model_dir(args.out))
        print(f"pins written to {args.write_pins}")
    print(json.dumps({"files": hash_model_dir(args.out)}, indent=1))


if __name__ == "__main__":
    main()
