"""The requests lm-evaluation-harness itself builds for evalrun's lm-eval task YAMLs, written as goldens.

For each ``*.yaml`` under ``evalrun/tasks/builtin/lm_eval/`` this loads the file with lm-eval's own YAML
loader (``include:``, ``!function``), builds the task with lm-eval's TaskManager (no model), applies what
``simple_evaluate`` applies before building requests (``num_fewshot`` None -> 0, few-shot seed 1234) and
writes ``<out>/<task name>.jsonl``: one line per eval doc in lm-eval's order,

    {"doc_id": i, "doc": {...}, "requests": [[arg0, arg1], ...], "target": doc_to_target(doc)}

(generate_until: one [context, generation kwargs] pair; multiple_choice: one [context, " " + choice] pair
per choice, in choice order). Keys sorted, ensure_ascii=False.

``--chat-template MODEL_DIR`` builds them as ``--apply_chat_template`` does (``fewshot_as_multiturn``, its
default then), the chat template that of MODEL_DIR's tokenizer applied as lm-eval's HF model applies it
(``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``), and writes
``<out>/<task name>.chat.jsonl``. ``--single-turn`` is ``--fewshot_as_multiturn false`` (``.singleturn``
in the name), ``--system-instruction TEXT`` lm-eval's own (``.system`` in the name), with or without a chat
template.

The YAMLs give ``dataset_kwargs.data_files`` relative to the YAML file's directory. lm-eval 0.4.13 passes
them to ``datasets.load_dataset`` unchanged, which resolves them against the current directory, so this
script makes them absolute first (against the directory of the file that sets ``dataset_kwargs``, following
``include:``) and hands lm-eval the loaded config inline, as lm-eval does with a YAML path given to --tasks.

Runs with a Python that has lm-eval, never the project's .venv (lm-eval is not a dependency of evalrun):

    python3 -m venv DIR && DIR/bin/pip install --no-deps lm_eval==0.4.13 \
        && DIR/bin/pip install datasets jinja2 requests sacrebleu
    DIR/bin/python scripts/lm_eval_contexts.py [--out tests/lm_eval_requests]

(The smallest set that imports: lm-eval's modules import requests and sacrebleu at top level, and recent
datasets releases no longer bring requests. pyyaml comes with datasets; more_itertools is not needed here.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

REPO = Path(__file__).resolve().parents[1]
YAMLS = REPO / "evalrun" / "tasks" / "builtin" / "lm_eval"
SEED = 1234  # simple_evaluate's default fewshot_random_seed (--seed's 4th value)


def defining_dir(path: Path, key: str) -> Path | None:
    """The directory of the file whose ``key`` wins after lm-eval's shallow ``include:`` merge."""
    raw = load_yaml(path, resolve_func=False, recursive=False)
    if key in raw:
        return path.parent
    includes = raw.get("include") or []
    for inc in reversed(includes if isinstance(includes, list) else [includes]):
        found = defining_dir(path.parent / inc, key)  # an absolute inc stays absolute
        if found is not None:
            return found
    return None


def load_config(path: Path) -> dict:
    cfg = load_yaml(path, resolve_func=True)
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, (str, list, dict)):
        base = defining_dir(path.resolve(), "dataset_kwargs")

        def absolute(p):
            return [absolute(x) for x in p] if isinstance(p, list) else str(base / p)

        if isinstance(files, dict):
            cfg["dataset_kwargs"]["data_files"] = {split: absolute(p) for split, p in files.items()}
        else:
            cfg["dataset_kwargs"]["data_files"] = absolute(files)
    return cfg


def chat_template(model_dir: Path):
    """What lm-eval's HF model passes as ``chat_template`` (``HFLM.apply_chat_template``), on MODEL_DIR's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def apply(messages: list[dict], add_generation_prompt: bool = True) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)  # fmt: skip

    return apply


def golden_lines(task, chat=None, multiturn: bool = True, system_instruction: str | None = None) -> list[str]:
    if task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=SEED)
    if chat is None:
        task.build_all_requests(limit=None, rank=0, world_size=1, system_instruction=system_instruction)
    else:
        task.build_all_requests(limit=None, rank=0, world_size=1, apply_chat_template=True,
                                fewshot_as_multiturn=multiturn, chat_template=chat,
                                system_instruction=system_instruction)  # fmt: skip
    by_doc: dict[int, list] = {}
    for inst in task.instances:
        by_doc.setdefault(inst.doc_id, []).append(inst)
    lines = []
    for doc_id, insts in by_doc.items():
        insts.sort(key=lambda inst: inst.idx)
        doc = insts[0].doc
        row = {
            "doc_id": doc_id,
            "doc": doc,
            "requests": [list(inst.arguments) for inst in insts],
            "target": task.doc_to_target(doc),
        }
        lines.append(json.dumps(row, sort_keys=True, ensure_ascii=False))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "lm_eval_requests")
    parser.add_argument("--chat-template", type=Path, metavar="MODEL_DIR", help="as --apply_chat_template, with "
                        "MODEL_DIR's tokenizer's chat template: writes NAME.chat.jsonl")  # fmt: skip
    parser.add_argument("--single-turn", action="store_true", help="with --chat-template: --fewshot_as_multiturn "
                        "false (NAME.chat.singleturn.jsonl)")  # fmt: skip
    parser.add_argument("--system-instruction", help="lm-eval's --system_instruction (.system in the name)")
    args = parser.parse_args()
    if args.single_turn and args.chat_template is None:
        parser.error("--single-turn needs --chat-template (as lm-eval's --fewshot_as_multiturn)")
    chat = None if args.chat_template is None else chat_template(args.chat_template)
    parts = [".chat"] if chat is not None else []
    parts += [".singleturn"] if args.single_turn else []
    parts += [".system"] if args.system_instruction is not None else []
    suffix = "".join(parts) + ".jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    manager = TaskManager(include_defaults=False)
    for path in sorted(YAMLS.rglob("*.yaml")):
        cfg = load_config(path)
        if "group" in cfg:  # a group's YAML (addition_suite): its tasks' requests are theirs
            continue
        name = cfg["task"]
        task = manager.load(cfg)["tasks"][name]
        lines = golden_lines(task, chat, not args.single_turn, args.system_instruction)
        (args.out / f"{name}{suffix}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"{path.relative_to(REPO)} -> {args.out / (name + suffix)} ({len(lines)} docs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
