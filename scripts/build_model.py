"""Train the embedded default model: a tiny Llama that adds two-digit numbers.

The model ships in ``evalrun/models/tiny-adder`` and is pinned by hash in ``evalrun/conf/model/tiny_adder.yaml``;
this script is how it was made and how anyone can make it again (a retrained model gets new
hashes, so the pins must be refreshed with ``--write-pins``).

    python scripts/build_model.py --out evalrun/models/tiny-adder --write-pins evalrun/conf/model/tiny_adder.yaml

The training prompt format is the built-in task's template (``evalrun/tasks/builtin/addition``),
rendered for every pair ``a+b`` with ``0 <= a, b <= 99`` except the task's own test items, so the
task measures generalisation to unseen pairs.

The second shipped model, ``evalrun/models/tiny-adder-context``, puts the prompt after other text in a
share of the batches (``--context-share``), in the shapes of the example prompt packs: one to
three worked examples before the question (``addition_fewshot``), or four options listed under it
(``addition_mc``), so it answers the last question wherever it sits in its window. The loss is on
the final answer only; the held-out pairs never appear anywhere::

    python scripts/build_model.py --out evalrun/models/tiny-adder-context --steps 4500 --context-share 0.5 \
        --write-pins evalrun/conf/model/tiny_adder_context.yaml

The third, ``evalrun/models/tiny-thinking-adder``, is a reasoning model in miniature (``--thinking``): a ChatML chat
template (``<|im_start|>``/``<|im_end|>``, special tokens; ``<|im_end|>`` ends its turn) whose user turn is the
task's question, and a reply that thinks first, Qwen3-style, between ``<think>`` and ``</think>`` (added
tokens, not special ones, so a decode that skips special tokens keeps them for vLLM's reasoning parsers):
``<think>b+a=s</think>`` then the answer ``s``. The thinking starts with another number than the answer, so a
scorer that reads the first number gets the answer only once the thinking is separated. Rendered with
``enable_thinking=false`` the template closes an empty think block itself and the model answers at once::

    python scripts/build_model.py --out evalrun/models/tiny-thinking-adder --thinking --steps 1500 --batch 64 \
        --write-pins evalrun/conf/model/tiny_thinking_adder.yaml
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders
from tokenizers.models import BPE
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = REPO / "evalrun" / "tasks" / "builtin" / "addition"
SPECIAL = ["<unk>", "<s>", "</s>"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: a BPE model with printable ASCII as its vocabulary and no merges."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )


# The thinking model's chat template (Qwen3's shape, trimmed): messages as ChatML turns; the generation prompt
# opens the assistant's turn, and with enable_thinking=false closes an empty think block for the model.
THINK_START, THINK_END = "<think>", "</think>"
CHAT_TURN_TOKENS = ["<|im_start|>", "<|im_end|>"]
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def thinking_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer with ChatML turn tokens (special) and think tokens (added, not special)."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": CHAT_TURN_TOKENS})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def thinking_example(tokenizer: PreTrainedTokenizerFast, template: str, a: int, b: int,
                     thinking: bool) -> tuple[list[int], list[int]]:  # fmt: skip
    """Prompt and reply ids of one question: the template's rendering of a user turn, then the reply."""
    messages = [{"role": "user", "content": render(template, a, b)}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=thinking)  # fmt: skip
    reply = f"{THINK_START}{b}+{a}={a + b}{THINK_END}\n\n{a + b}" if thinking else f"{a + b}"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids, tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def render(template: str, a: int, b: int) -> str:
    # Same rendering as the task's Jinja template for the fields this task has.
    return template.replace("{{ question }}", f"{a}+{b}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "evalrun" / "models" / "tiny-adder")
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--write-pins", type=Path, default=None, help="rewrite this model config's sha256 pins")
    parser.add_argument("--context-share", type=float, default=0.0, help="share of batches with a context prefix")
    parser.add_argument("--thinking", action="store_true", help="a chat model that thinks before it answers")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    template = (TASK_DIR / "template.jinja").read_text(encoding="utf-8")
    held_out = set()
    with open(TASK_DIR / "test.jsonl", encoding="utf-8") as fh:
        for line in fh:
            held_out.add(json.loads(line)["question"])
    pairs = [(a, b) for a in range(100) for b in range(100) if f"{a}+{b}" not in held_out]

    tokenizer = thinking_tokenizer() if args.thinking else build_tokenizer()
    eos = tokenizer.eos_token_id
    examples = []
    for a, b in pairs:
        if args.thinking:  # each question twice: thinking, and with the think block closed by the template
            examples += [thinking_example(tokenizer, template, a, b, thinking) for thinking in (True, False)]
            continue
        prompt_ids = tokenizer(render(template, a, b), add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(f" {a + b}", add_special_tokens=False)["input_ids"] + [eos]
        examples.append((prompt_ids, answer_ids))

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    width = max(len(p) + len(a) for p, a in examples)
    model = LlamaForCausalLM(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=3e-3, total_steps=args.steps, pct_start=0.1)

    def with_context(a: int, b: int) -> str:
        """The question after worked examples, or with four options listed under it."""
        if rng.random() < 0.6:
            shots = rng.sample(pairs, rng.randint(1, 3))
            return "".join(f"Q: {x}+{y}\nA: {x + y}\n" for x, y in shots) + render(template, a, b)
        options = [a + b]
        for delta in rng.sample([1, -1, 2, -2, 10, -10, 11, -11], 8):
            if len(options) < 4 and a + b + delta >= 0:
                options.append(a + b + delta)
        rng.shuffle(options)
        listed = "".join(f"{'ABCD'[i]}) {o}\n" for i, o in enumerate(options))
        return f"Q: {a}+{b}\n{listed}A:"

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        rows = rng.choices(examples, k=args.batch)
        size = width  # the default model's batches: one width (and no extra draw) for reproducibility
        if args.context_share > 0:
            if rng.random() < args.context_share:
                rows = []
                for a, b in rng.choices(pairs, k=args.batch):
                    prompt_ids = tokenizer(with_context(a, b), add_special_tokens=False)["input_ids"]
                    rows.append((prompt_ids, tokenizer(f" {a + b}", add_special_tokens=False)["input_ids"] + [eos]))
            size = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((args.batch, size), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((args.batch, size), -100, dtype=torch.long)
        for row, (p, a) in enumerate(rows):
            seq = p + a
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, len(p) : len(seq)] = torch.tensor(a)
        return ids, labels

    started = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        ids, labels = batch()
        loss = model(input_ids=ids, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        if step % 100 == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} ({time.perf_counter() - started:.0f}s)", flush=True)

    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)  # the chat template in tokenizer_config.json
    model.generation_config.save_pretrained(args.out)

    if args.write_pins:
        from evalrun.engines.pins import hash_model_dir, write_pins

        write_pins(args.write_pins, hash_model_dir(args.out))
        print(f"pins written to {args.write_pins}")


if __name__ == "__main__":
    main()
