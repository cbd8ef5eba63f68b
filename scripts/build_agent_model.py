"""Train the tiny invoice-desk agent: a Llama chat model that plays the scripted policy with tool calls.

The model ships in ``models/tiny-invoice-agent`` and is pinned by hash in
``conf/model/tiny_invoice_agent.yaml``; this script is how it was made and how anyone can make it
again (a retrained model gets new hashes, so the pins must be refreshed with ``--write-pins``)::

    python scripts/build_agent_model.py --out models/tiny-invoice-agent \
        --write-pins conf/model/tiny_invoice_agent.yaml

Training data: the scripted agent's episodes (``run_scripted`` with ``effects_for(task)``) over the
TRAIN seed range of ``conf/task/invoice_desk.yaml`` (its ``world`` section) only, both families, rendered with
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
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from evalrun.config import load
from evalrun.engines.pins import hash_model_dir, write_pins
from evalrun.episodes.agent import planned_world_tasks
from evalrun.worlds import effects_for, make_world
from evalrun.worlds.actions import chat_messages
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
PIN_HEADER = {
    "name": "tiny-invoice-agent",
    "id": "evalrun/tiny-invoice-agent",
    "path": "${evalrun.root:}/models/tiny-invoice-agent",
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


def scripted_episodes(tasks: list[WorldTask]) -> list[list[dict[str, str]]]:
    """Every scripted episode of ``tasks`` as chat messages, up to and including the last reply."""
    episodes = []
    families = list(dict.fromkeys(t.family for t in tasks))
    # family by family, seeds ascending: the order the shipped model was trained in
    for task in sorted(tasks, key=lambda t: (families.index(t.family), t.seed)):
        world = make_world(task)
        transcript = run_scripted(world, task, effects_for(task))
        if transcript.scores["pass"] != 1.0:
            raise RuntimeError(f"the scripted agent failed {task.item_id}: {transcript.scores}")
        messages = chat_messages(world.tools(), transcript.task_text, transcript.steps)
        episodes.append(messages[:-1])  # the result of submit_report is never a model input
    return episodes


def build_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
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
        tokenizer_object=backend, bos_token=BOS, eos_token=END, pad_token=PAD, model_max_length=2048
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS.values())})
    tokenizer.chat_template = CHAT_TEMPLATE
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


def reply_loss(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token loss on the labelled positions only (the head runs on those positions alone)."""
    hidden = model.model(input_ids=ids).last_hidden_state  # right padding + causal mask: no attention mask needed
    targets = labels[:, 1:]
    where = targets != IGNORE
    logits = model.lm_head(hidden[:, :-1][where])
    return torch.nn.functional.cross_entropy(logits, targets[where])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "models" / "tiny-invoice-agent")
    parser.add_argument("--steps", type=int, default=1300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=1, help="one thread runs best on a shared 2-core machine")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save the model here every 200 steps")
    parser.add_argument("--write-pins", type=Path, default=None, help="rewrite this model config's sha256 pins")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    episodes = scripted_episodes(split_tasks("train"))
    texts = [message["content"] for messages in episodes for message in messages]
    tokenizer = build_tokenizer(texts, args.vocab)
    check_template(tokenizer, episodes[0])
    check_template(tokenizer, episodes[-1])
    examples = [encode_episode(tokenizer, messages) for messages in episodes]
    lengths = sorted(len(ids) for ids, _ in examples)
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
        max_position_embeddings=2048,
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
            args.write_pins.write_text(yaml.safe_dump(PIN_HEADER, sort_keys=False), encoding="utf-8")
        write_pins(args.write_pins, hash_model_dir(args.out))
        print(f"pins written to {args.write_pins}")
    print(json.dumps({"files": hash_model_dir(args.out)}, indent=1))


if __name__ == "__main__":
    main()
