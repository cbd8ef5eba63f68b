"""Run the tiny invoice-desk agent on held-out seeds with transformers (CPU, greedy) and print its pass rate.

The model agent's loop as the harness runs it on vLLM, without vLLM: each turn renders
``chat_messages(specs, task_text, steps)`` with the tokenizer's chat template
(``add_generation_prompt=True``), generates greedily until the eos token (at most
``--max-new-tokens``), parses the reply with ``parse_reply`` and sends the calls to the world; a
reply that does not parse gets the parse error as its observation. An episode ends when the world
is done (submit_report) or after ``--max-steps`` turns, and is scored by the world's verifier::

    python scripts/eval_agent_model.py --model models/tiny-invoice-agent --seeds 20

Seeds are the first ``--seeds`` of the ``test`` split of ``conf/task/invoice_desk.yaml`` per family.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from evalrun.config import load
from evalrun.episodes.agent import planned_world_tasks
from evalrun.worlds import WorldTask, effects_for, make_world, network_guard
from evalrun.worlds.actions import ParseError, Step, chat_messages, parse_reply

REPO = Path(__file__).resolve().parents[1]


def run_episode(
    model: LlamaForCausalLM, tokenizer: AutoTokenizer, task: WorldTask, max_steps: int, max_new_tokens: int
) -> dict:
    world = make_world(task)
    counts: Counter[str] = Counter()
    steps: list[Step] = []
    with network_guard():
        text = world.reset(task, effects_for(task))
        while not world.done and len(steps) < max_steps:
            messages = chat_messages(world.tools(), text, steps)
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            if ids.shape[1] + max_new_tokens > model.config.max_position_embeddings:
                counts["context_full"] += 1
                break
            with torch.no_grad():
                out = model.generate(
                    ids,
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = out[0, ids.shape[1] :].tolist()
            if not new or new[-1] != tokenizer.eos_token_id:
                counts["unterminated"] += 1
            reply = tokenizer.decode(new, skip_special_tokens=True)
            parsed = parse_reply(reply)
            counts["replies"] += 1
            if isinstance(parsed, ParseError):
                counts["parse_failures"] += 1
                steps.append(Step((), (parsed.as_result(),), reply=reply))
                continue
            results = tuple(world.call(call.name, dict(call.arguments)) for call in parsed)
            counts["call_errors"] += sum(result.status == "error" for result in results)
            steps.append(Step(tuple(parsed), results, reply=reply))
    scores = type(world).verifier(world.final_state())
    return {"item_id": task.item_id, "scores": scores, "steps": len(steps), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "tiny-invoice-agent")
    parser.add_argument("--seeds", type=int, default=20, help="test seeds per family (the first of the split)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print every episode")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    world = load(["task=invoice_desk", f"task.world.split={args.split}"]).task.world
    assert world is not None
    planned = planned_world_tasks(world)
    first = min(task.seed for task in planned)
    tasks = [task for task in planned if task.seed < first + args.seeds]

    started = time.perf_counter()
    totals: dict[str, Counter[str]] = {}
    for task in tasks:
        episode = run_episode(model, tokenizer, task, args.max_steps, args.max_new_tokens)
        if args.verbose:
            print(json.dumps(episode), flush=True)
        total = totals.setdefault(task.family, Counter())
        total["episodes"] += 1
        total["passed"] += int(episode["scores"]["pass"])
        total["f1_x1000"] += round(1000 * episode["scores"]["f1"])
        for key in ("replies", "parse_failures", "call_errors", "unterminated", "context_full"):
            total[key] += episode.get(key, 0)
    for family, total in totals.items():
        print(
            f"{family}: pass {total['passed']}/{total['episodes']} ({total['passed'] / total['episodes']:.0%}), "
            f"mean F1 {total['f1_x1000'] / 1000 / total['episodes']:.3f}, "
            f"parse failures {total['parse_failures']}/{total['replies']} replies, "
            f"call errors {total['call_errors']}, unterminated {total['unterminated']}, "
            f"context full {total['context_full']}"
        )
    print(f"{len(tasks)} episodes in {time.perf_counter() - started:.0f}s ({args.split} seeds, model {args.model})")


if __name__ == "__main__":
    main()
