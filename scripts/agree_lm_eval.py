"""Agreement of evalrun with lm-evaluation-harness 0.4.13 itself, item by item, on lm-eval task YAMLs.

What it measures. For one model directory and each shipped lm-eval task YAML
(evalrun/tasks/builtin/lm_eval/*/*.yaml, or --tasks NAME,...) it runs

  * lm-eval, through its Python API: ``lm_eval.simple_evaluate(model="hf", model_args={pretrained: DIR,
    dtype: float32}, device="cpu", batch_size=1, log_samples=True, [limit=N])``, default seeds (0, 1234,
    1234, 1234), no chat template (``--apply-chat-template``: lm-eval's ``apply_chat_template=True`` against
    evalrun's ``task.chat_format=chat``); each task built from its YAML by lm-eval's own loader with
    ``dataset_kwargs.data_files`` made absolute (scripts/lm_eval_contexts.py's ``load_config``, imported,
    not copied) and handed to ``TaskManager(include_defaults=False)`` as an inline config;
  * evalrun, as a subprocess of its CLI: ``evalrun run task=lm_eval task.path=YAML engine=hf cluster=inline
    run.progress=false run.root=DIR model=M [limit=N]``;

and compares them per item (lm-eval ``doc_id`` against evalrun ``item_id``):

  * every item: the prompt (lm-eval's request context, every request of the doc, against evalrun's
    ``prompt``);
  * generate_until: the raw output (lm-eval ``resps`` against evalrun ``output``), the filtered answer per
    filter (lm-eval ``filtered_resps`` against the ``extracted`` of evalrun's ``METRIC/FILTER`` score) and
    the metric value;
  * multiple_choice: each choice's loglikelihood (lm-eval ``resps`` against evalrun ``option_logprobs``;
    the largest absolute difference is reported, it is not a pass/fail check) and acc / acc_norm;
  * loglikelihood: the continuation, its loglikelihood (as multiple choice's, reported, and the per-document
    perplexity value, which is that loglikelihood, is not compared apart), whether it is the model's greedy
    continuation (lm-eval ``is_greedy`` against evalrun ``option_greedy``) and acc; the aggregate perplexity
    against summary.json's (exp(-mean)).
    That difference is floating-point only: evalrun's inline worker runs torch on 1 thread
    (cluster.cpus_per_worker) and scores options in left-padded batches (engine.max_num_seqs) summing
    token logprobs in float64, lm-eval on torch's default threads, one request at a time, summing in
    float32. ``--lm-eval-threads 1 --evalrun-override engine.max_num_seqs=1`` leaves only the last part.

``--shipped NAMES|all`` runs lm-eval's own shipped task YAMLs instead, unmodified, from the installed
lm_eval/tasks (tests/helpers/shipped.py: every output type, multiple inputs, process_docs, process_results,
several filter pipelines, few-shot examples, corpus metrics): the project's small data in each hub dataset's
real schema is written to a local hub cache, which evalrun reads at its pinned commit (``+task.dataset_revision``)
and lm-eval reads as the same Parquet files (``dataset_path: parquet``; its ``load_dataset`` reads no revision
offline). A multiple-input task's per-choice contexts are compared with the prompts of its episode chains'
loglikelihood requests; a corpus metric (bleu, f1) by each document's input to the aggregation (lm-eval's
per-sample value against the score's ``extracted``) and by its aggregate (summary.json's ``aggregate``); a
multiple-choice metric that is a continuous function of the loglikelihoods (truthfulqa_mc2's) to a relative 1e-5.

It prints a table per task and an overall one, the first differing items with both values, and exits 1
when any prompt differs, or (generation) any output, answer or metric value differs, or (multiple choice)
any acc / acc_norm differs, or (loglikelihood) any is_greedy or acc differs, or the two sides
scored different item sets; 2 when something could not run.

How it sets up lm-eval. evalrun reads and scores lm-eval tasks with lm-eval's own library (the locked lm-eval
extra, in the .venv); the side of the comparison that runs lm-eval's evaluator with its own model backend runs
apart, as it always did, so that nothing it installs or writes can reach the .venv: the set-up is
scripts/compare_lm_eval.py's (``setup_lm_eval``, imported, not copied): ``pip install --target
--no-deps`` of exactly the distributions the .venv lacks for lm_eval==0.4.13 into
``${EVALRUN_CACHE:-~/.cache/evalrun}/lm-eval/0.4.13/site``, once (``ready.json``): none, where scripts/setup.sh
installed the lm-eval extra, so lm-eval itself is the .venv's locked one. It runs in a child process of the
project's python with that directory on PYTHONPATH (``lm_eval_env``: offline, its own datasets cache), so it uses
the .venv's torch, transformers and accelerate, the same ones evalrun uses; the child checks lm-eval's version
and that torch, transformers and datasets come from the .venv. The .venv's
site-packages (its entries and distributions with their versions) is fingerprinted before and after the
set-up, and the script fails if it changed.

    .venv/bin/python scripts/agree_lm_eval.py                              # tiny-adder, all shipped tasks
    .venv/bin/python scripts/agree_lm_eval.py --model smollm2 --tasks addition_gen,addition_mc --limit 20
    .venv/bin/python scripts/agree_lm_eval.py --model smollm2 --limit 20 --apply-chat-template
    .venv/bin/python scripts/agree_lm_eval.py --model smollm2 --shipped all
    .venv/bin/python scripts/agree_lm_eval.py --model smollm2 --limit 20 --apply-chat-template --single-turn \
        --system-instruction "You are a careful calculator."
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
YAMLS = REPO / "evalrun" / "tasks" / "builtin" / "lm_eval"
CACHE = Path(os.environ.get("EVALRUN_CACHE") or Path.home() / ".cache" / "evalrun")

MODELS = {
    # --model NAME: (model directory, evalrun model config)
    "tiny": (REPO / "evalrun" / "models" / "tiny-adder", "tiny_adder"),
    "smollm2": (CACHE / "models" / "smollm2-135m-instruct", "smollm2_135m_instruct"),
}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def fail(message: str) -> None:
    """Something could not run (as opposed to a disagreement): exit 2."""
    print(f"agree_lm_eval: {message}", file=sys.stderr)
    raise SystemExit(2)


def show_cmd(cmd: list[str], env: dict[str, str] | None = None) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(str(c)) for c in cmd)


# ---------------------------------------------------------------------------------------------------------
# Side installation of lm-eval


def venv_fingerprint() -> dict:
    """What the project's environment holds: site-packages' top-level entries and distributions."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions(path=[str(purelib)]))
    return {"purelib": str(purelib), "entries": sorted(os.listdir(purelib)), "dists": dists}


# ---------------------------------------------------------------------------------------------------------
# lm-eval (child process: the project's python with PYTHONPATH=SIDE_DIR)


def sampled(generation_kwargs: dict) -> bool:
    """The task samples its replies (lm-eval's do_sample, or a temperature above 0 without it): lm-eval's draws and
    evalrun's come from different random number generators, so only the prompts are compared item for item."""
    do_sample = generation_kwargs.get("do_sample")
    return bool(do_sample) if do_sample is not None else float(generation_kwargs.get("temperature") or 0) > 0


def worker(args: argparse.Namespace) -> int:
    import importlib.util

    import datasets
    import lm_eval
    import torch
    import transformers

    if args.lm_eval_threads is not None:
        torch.set_num_threads(args.lm_eval_threads)
    side = Path(args.side_dir).resolve()
    assert importlib.metadata.version("lm_eval") == "0.4.13", importlib.metadata.version("lm_eval")
    for mod in (torch, transformers, datasets):  # the .venv's, as evalrun uses them
        assert not Path(mod.__file__).resolve().is_relative_to(side), f"{mod.__name__} from {side}"
    print(
        f"lm-eval worker: lm_eval {importlib.metadata.version('lm_eval')} ({lm_eval.__file__}), "
        f"datasets {datasets.__version__}, torch {torch.__version__} ({torch.__file__}), "
        f"transformers {transformers.__version__}, threads {torch.get_num_threads()}",
        file=sys.stderr,
        flush=True,
    )
    import lm_eval_contexts as contexts  # scripts/ is on sys.path: its load_config, data_files made absolute
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    cfgs = [contexts.load_config(Path(y)) for y in args.yaml]
    shipped = json.loads(args.data_files) if args.data_files else {}
    for cfg, y in zip(cfgs, args.yaml, strict=True):
        if y in shipped:  # the documents evalrun reads from the hub cache, as Parquet files lm-eval's loader reads
            cfg.update(dataset_path="parquet", dataset_name=None, dataset_kwargs={"data_files": shipped[y]})
    yaml_of = {cfg["task"]: y for cfg, y in zip(cfgs, args.yaml, strict=True)}
    manager = TaskManager(include_defaults=False)
    evaluated: list = cfgs
    if args.group_yaml:  # lm-eval indexes a copy of the directory and resolves the group by name itself
        copy = include_dir(Path(args.group_yaml).parent, Path(tempfile.mkdtemp(prefix="agree-include-")) / "tasks")
        manager = TaskManager(include_defaults=False, include_path=str(copy))
        evaluated = [yaml_group_name(Path(args.group_yaml))]
    started = time.monotonic()
    results = simple_evaluate(
        model="hf",
        model_args={"pretrained": args.model_dir, "dtype": "float32"},
        tasks=evaluated,
        device="cpu",
        batch_size=1,
        limit=args.limit,
        log_samples=True,
        task_manager=manager,
        apply_chat_template=args.apply_chat_template,
        fewshot_as_multiturn=not args.single_turn,  # simple_evaluate's default, True (used under a chat template)
        system_instruction=args.system_instruction,
    )
    wall = time.monotonic() - started
    out = {"wall_s": wall, "lm_eval_version": importlib.metadata.version("lm_eval"), "tasks": {},
           "results": results["results"]}  # fmt: skip
    by_name = {cfg["task"]: cfg for cfg in cfgs}
    # a group's tasks are named GROUP::TASK by lm-eval (inline members): each is its YAML's task
    for name in results["samples"] if args.group_yaml else by_name:
        cfg = by_name[name.rsplit("::", 1)[-1]]
        out["tasks"][name] = {
            "yaml": yaml_of[cfg["task"]],
            "output_type": cfg.get("output_type", "generate_until"),
            "sampled": sampled(cfg.get("generation_kwargs") or {}),
            "results": results["results"].get(name, {}),
            "samples": results["samples"].get(name, []),
        }
    # NumPy's numbers in a corpus metric's per-document input (mrpc's f1 prediction) as JSON numbers
    Path(args.out).write_text(
        json.dumps(out, ensure_ascii=False, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    )
    print(f"lm-eval worker: simple_evaluate took {wall:.1f} s", file=sys.stderr)
    return 0


def shipped_hub(names: str, cache: Path) -> dict:
    """The shipped task YAMLs ``names`` picks (``all``: every one) with their data written to a hub cache at
    ``cache``: ``pins`` (YAML -> {dataset: commit}, what evalrun is given) and ``files`` (YAML -> {split: Parquet
    file}, what lm-eval is given)."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.hub import split_file, write_hub_dataset
    from helpers.shipped import CASES

    from evalrun.tasks.lm_eval_catalog import library_dir

    picked = sorted(CASES) if names == "all" else names.split(",")
    unknown = [n for n in picked if n not in CASES]
    if unknown:
        fail(f"no shipped case {', '.join(unknown)}; have: {', '.join(sorted(CASES))}")
    pins, files = {}, {}
    for name in picked:
        relative, repo, config, splits = CASES[name]
        yaml = str(library_dir() / relative)
        pins[yaml] = {repo: write_hub_dataset(cache, repo, config, splits)}
        files[yaml] = {split: str(split_file(cache, repo, config, split)) for split in splits}
    return {"pins": pins, "files": files}


def yaml_group_name(path: Path) -> str:
    import yaml

    return str(yaml.safe_load(path.read_text(encoding="utf-8"))["group"])


def include_dir(source: Path, target: Path) -> Path:
    """A copy of the YAML directory ``source`` at ``target`` that lm-eval can index as ``include_path``: every
    YAML's relative ``data_files`` made absolute (lm-eval reads them relative to the working directory), its
    ``!function`` tags and everything else kept; the Python files beside them copied as they are."""
    import shutil

    import yaml

    class Function(str):
        pass

    class Loader(yaml.SafeLoader):
        pass

    class Dumper(yaml.SafeDumper):
        pass

    Loader.add_constructor("!function", lambda loader, node: Function(loader.construct_scalar(node)))
    Dumper.add_representer(Function, lambda dumper, value: dumper.represent_scalar("!function", str(value)))
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in sorted(target.rglob("*.yaml")):
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        origin = source / path.parent.relative_to(target)
        if isinstance(files, dict):
            cfg["dataset_kwargs"]["data_files"] = {k: str(origin / v) for k, v in files.items()}
        elif isinstance(files, str):
            cfg["dataset_kwargs"]["data_files"] = str(origin / files)
        path.write_text(yaml.dump(cfg, Dumper=Dumper, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return target


# ---------------------------------------------------------------------------------------------------------
# Comparison


def fmt(v, width: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


class Check:
    def __init__(self, name: str, gating: bool = True):
        self.name, self.gating = name, gating
        self.n = self.equal = 0
        self.diffs: list[tuple[str, object, object]] = []

    def add(self, item: str, ours, theirs, equal: bool | None = None) -> None:
        self.n += 1
        if equal is None:
            equal = ours == theirs
        if equal:
            self.equal += 1
        else:
            self.diffs.append((item, ours, theirs))

    @property
    def ok(self) -> bool:
        return self.equal == self.n


def load_evalrun(run_dir: Path):
    import pandas as pd

    outs = pd.concat([pd.read_parquet(p) for p in sorted((run_dir / "outputs").glob("*.parquet"))])
    scores = pd.read_parquet(run_dir / "scores.parquet")
    first = outs.sort_values(["item_id", "seed", "repeat"]).groupby("item_id", sort=False).head(1)
    first_scores = scores.merge(first[["item_id", "seed", "repeat"]], on=["item_id", "seed", "repeat"])
    trials = outs.groupby("item_id").size().max() if len(outs) else 0
    return first.set_index("item_id"), first_scores, scores, int(trials)


def option_prompts(run_dir: Path, rolling: bool = False) -> dict[str, list[str]]:
    """Each item's loglikelihood requests' prompts in option order, from the episode chains (a multiple-input task's
    options each have a context of their own; outputs' ``prompt`` holds the first), its first trial's; ``rolling``:
    their continuations (a rolling request's document, which lm-eval logs as its one argument)."""
    episodes, prompts = {}, {}
    for part in sorted((run_dir / "log").glob("*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry["kind"] == "header" and entry["seed"] == 0 and entry["repeat"] == 0:
                episodes[entry["episode"]] = entry["item"]
            elif entry["kind"] == "model" and entry["request"].get("op", "").startswith("loglikelihood"):
                request = entry["request"]
                prompts.setdefault(entry["episode"], {})[entry["option"]] = request[
                    "continuation" if rolling else "prompt"]  # fmt: skip
    return {item: [prompts[e][o] for o in sorted(prompts[e])] for e, item in episodes.items() if e in prompts}


def close(a, b) -> bool:
    """Equal, but floats within a relative 1e-6 (a corpus metric's input holding a loglikelihood: wikitext's)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# scored by loglikelihood: no generation to compare
SCORED_TYPES = ("multiple_choice", "loglikelihood", "loglikelihood_rolling")
LOGLIKELIHOOD_METRICS = ("perplexity",)  # a document's value is its loglikelihood (compared as max |dlogprob|)


def compare_task(name: str, lm: dict, run_dir: Path) -> dict:
    out_type = lm["output_type"]
    items, scores1, scores_all, trials = load_evalrun(run_dir)
    by_doc: dict[str, dict[str, dict]] = {}  # doc_id -> filter -> sample
    for s in lm["samples"]:
        by_doc.setdefault(str(s["doc_id"]), {})[s["filter"]] = s
    filters = sorted({s["filter"] for s in lm["samples"]})
    ev_scores: dict[tuple[str, str, str], tuple[float, object]] = {}
    for r in scores1.itertuples():
        metric, _, filt = r.metric.partition("/")
        ev_scores[(r.item_id, metric, filt or "none")] = (r.value, r.extracted)
    lm_ids, ev_ids = set(by_doc), set(items.index)
    rolling = out_type == "loglikelihood_rolling"
    per_option = option_prompts(run_dir, rolling) if out_type in SCORED_TYPES else {}
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["tasks"].get(name, {})
    common = sorted(lm_ids & ev_ids, key=lambda x: (len(x), x))

    checks: dict[str, Check] = {"prompt": Check("prompt")}
    gating = not lm.get("sampled")  # sampled replies: reported, not gated (see sampled())
    metric_names: list[tuple[str, str]] = []  # (metric, filter)
    max_dlp, dlp_item = 0.0, None
    for doc_id in common:
        samples = by_doc[doc_id]
        row = items.loc[doc_id]
        s0 = samples[filters[0]]
        ctxs = [a[0] for a in s0["arguments"]]
        ctx = ctxs[0] if all(c == ctxs[0] for c in ctxs) else ctxs
        if rolling:  # the document, lm-eval's one argument, against the chain's request
            checks["prompt"].add(doc_id, ctx, (per_option.get(doc_id) or [None])[0])
        else:
            checks["prompt"].add(doc_id, ctx, row["prompt"] if isinstance(ctx, str) else per_option.get(doc_id))
        if row["finish_reason"] == "failed":  # evalrun refused the item (a prompt longer than the context)
            checks.setdefault("failed", Check("evalrun episode did not fail")).add(doc_id, True, False)
            continue
        if out_type in SCORED_TYPES:
            lls = [float(r[0] if rolling else r[0][0]) for r in s0["resps"]]  # a rolling one's is its loglikelihood
            ours = [float(x) for x in row["option_logprobs"]]
            if len(ours) == len(lls):
                d = max((abs(a - b) for a, b in zip(lls, ours, strict=True)), default=0.0)
                if d > max_dlp or dlp_item is None:
                    max_dlp, dlp_item = d, (doc_id, lls, ours)
            if out_type == "multiple_choice":
                checks.setdefault("choices", Check("number of choices")).add(doc_id, len(lls), len(ours))
            elif not rolling:  # loglikelihood: whether the continuation is the greedy one (lm-eval's is_greedy)
                greedy = [bool(r[0][1]) for r in s0["resps"]], [bool(g) for g in row["option_greedy"]]
                checks.setdefault("greedy", Check("is_greedy")).add(doc_id, *greedy)
        else:
            checks.setdefault("output", Check("output", gating)).add(doc_id, s0["resps"][0][0], row["output"])
        for filt in filters:
            s = samples.get(filt)
            if s is None:
                continue
            for metric in s["metrics"]:
                if (metric, filt) not in metric_names:
                    metric_names.append((metric, filt))
                ev = ev_scores.get((doc_id, metric, filt))
                label = metric if filt == "none" else f"{metric}/{filt}"
                corpus = "aggregation" in summary.get(label, {})  # its extracted is its input, compared below
                if out_type not in SCORED_TYPES and ev is not None and not corpus:
                    checks.setdefault(f"answer/{filt}", Check(f"answer [{filt}]", gating)).add(
                        doc_id, s["filtered_resps"][0], ev[1]
                    )
                lv, evv = num(s[metric]), (None if ev is None else num(ev[0]))
                if metric in LOGLIKELIHOOD_METRICS:  # a document's loglikelihood: floating point, as max |dlogprob|
                    continue
                if corpus:  # a corpus metric: its input to the aggregation
                    lv, evv = s[metric], None if ev is None or ev[1] is None else json.loads(ev[1])
                # a multiple-choice metric that is a continuous function of the loglikelihoods (truthfulqa_mc2's
                # probability mass): equal to the loglikelihoods' floating point, as a relative 1e-5
                continuous = (out_type in SCORED_TYPES and isinstance(lv, float) and isinstance(evv, float)
                              and {lv, evv} - {0.0, 1.0})  # fmt: skip
                equal = math.isclose(lv, evv, rel_tol=1e-5) if continuous else close(lv, evv) if corpus else None
                checks.setdefault(label, Check(label, gating)).add(doc_id, lv, evv, equal)
    # aggregates: lm-eval's results vs the mean of evalrun's per-item values (all trials); a perplexity, evalrun's
    # summary.json's (exp(-mean) of the documents' loglikelihoods); a corpus metric, summary.json's aggregate
    aggs = []
    for metric, filt in metric_names:
        lv = lm["results"].get(f"{metric},{filt}")
        ev_metric = metric if filt == "none" else f"{metric}/{filt}"
        vals = scores_all[scores_all.metric == ev_metric].value
        ev = summary.get(ev_metric, {}).get("perplexity") if metric in LOGLIKELIHOOD_METRICS else (
            float(vals.mean()) if len(vals) else None)  # fmt: skip
        if "aggregation" in summary.get(ev_metric, {}):
            ev = summary[ev_metric].get("aggregate")
        aggs.append((ev_metric, lv, ev, len(vals)))
    return {
        "name": name,
        "type": out_type,
        "sampled": bool(lm.get("sampled")),
        "n_lm": len(lm_ids),
        "n_ev": len(ev_ids),
        "n_common": len(common),
        "only_lm": sorted(lm_ids - ev_ids),
        "only_ev": sorted(ev_ids - lm_ids),
        "trials": trials,
        "checks": checks,
        "max_dlp": max_dlp if out_type in SCORED_TYPES else None,
        "dlp_item": dlp_item,
        "aggs": aggs,
        "metric_names": metric_names,
    }


def aggregate(value) -> str:
    """An aggregate as printed: 4 decimals, or 7 significant digits for a large one (a perplexity)."""
    if not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.7g}"


def print_task(r: dict, show: int) -> bool:
    print(
        f"\n=== {r['name']} ({r['type']}): items lm-eval {r['n_lm']}, evalrun {r['n_ev']}, common {r['n_common']}"
        + (f"; evalrun trials per item {r['trials']} (compared: the first)" if r["trials"] > 1 else "")
    )
    ok = not r["only_lm"] and not r["only_ev"]
    if r["only_lm"] or r["only_ev"]:
        print(f"  items only in lm-eval: {r['only_lm'][:10]}; only in evalrun: {r['only_ev'][:10]}")
    w = max(len(c.name) for c in r["checks"].values()) + 2
    if r["sampled"]:
        print("  sampled replies (do_sample): lm-eval's draws and evalrun's differ by design; only prompts gate")
    print(f"  {'check':<{w}}{'equal':>7}{'of':>6}")
    for c in r["checks"].values():
        print(f"  {c.name:<{w}}{c.equal:>7}{c.n:>6}" + ("" if c.ok else "   <-- differs" if c.gating else
                                                          "   (sampled: not gated)"))  # fmt: skip
        ok = ok and (c.ok or not c.gating)
    if r["max_dlp"] is not None:
        print(
            f"  max |dlogprob| over all choices: {r['max_dlp']:.3e}"
            + (f" (item {r['dlp_item'][0]})" if r["dlp_item"] else "")
        )
    print(f"  {'aggregate':<{w + 4}}{'lm-eval':>14}{'evalrun':>14}")
    for m, lv, ev, _n in r["aggs"]:
        print(f"  {m:<{w + 4}}{aggregate(lv):>14}{aggregate(ev):>14}")
    for c in r["checks"].values():
        for item, a, b in c.diffs[:show]:
            print(f"  differs: {c.name} item {item}: lm-eval {fmt(a)} | evalrun {fmt(b)}")
        if len(c.diffs) > show:
            print(f"  ... {len(c.diffs) - show} more {c.name} differences")
    if r["dlp_item"] and r["max_dlp"] and r["max_dlp"] > 0:
        doc_id, lls, ours = r["dlp_item"]
        print(f"  largest |dlogprob| item {doc_id}: lm-eval {[f'{x:.6f}' for x in lls]}")
        print(f"  {'':>{len('largest |dlogprob| item ' + doc_id)}}  evalrun {[f'{x:.6f}' for x in ours]}")
    return ok


def print_overall(results: list[dict]) -> None:
    print("\n=== overall")
    head = ["task", "items", "prompts=", "outputs=", "answers=", "metric=", "max|dlogprob|", "lm-eval", "evalrun"]
    rows = []
    for r in results:
        ch = r["checks"]

        def frac(keys, ch=ch):
            cs = [c for k, c in ch.items() if k in keys]
            return f"{sum(c.equal for c in cs)}/{sum(c.n for c in cs)}" if cs else "-"

        metric_keys = [m if f == "none" else f"{m}/{f}" for m, f in r["metric_names"]]
        aggs = r["aggs"]
        lmv = " ".join(aggregate(lv) for _, lv, _, _ in aggs)
        evv = " ".join(aggregate(ev) for _, _, ev, _ in aggs)
        same = r["n_lm"] == r["n_ev"] == r["n_common"]
        rows.append(
            [
                r["name"],
                f"{r['n_common']}" + ("" if same else f" ({r['n_lm']}/{r['n_ev']})"),
                frac(["prompt"]),
                frac(["output"]),
                frac([k for k in ch if k.startswith("answer/")]),
                frac(metric_keys),
                f"{r['max_dlp']:.2e}" if r["max_dlp"] is not None else "-",
                lmv + f" ({'/'.join(m for m, *_ in aggs)})",
                evv,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for line in [head, *rows]:
        print("  " + "  ".join(str(x).ljust(wd) for x, wd in zip(line, widths, strict=True)))


# ---------------------------------------------------------------------------------------------------------


GROUP_TOLERANCE = 1e-12  # a group's mean and stderr: the same sums over the same per-item values, in other orders


def compare_group(lm_results: dict, record: dict) -> tuple[list[tuple[str, str, object, object, bool]], bool]:
    """Each group's aggregate metric and stderr, lm-eval's results against group.json's: rows (group, key,
    lm-eval, evalrun, equal), and whether all are equal (within GROUP_TOLERANCE) and every lm-eval group
    aggregate has evalrun's."""
    rows, ok = [], True
    for group, result in record["results"].items():
        theirs = lm_results.get(group, {})
        for metric, est in result["metrics"].items():
            name, _, filt = metric.partition("/")
            for field, suffix in (("mean", ""), ("stderr", "_stderr")):
                lv, ev = theirs.get(f"{name}{suffix},{filt or 'none'}"), est.get(field)
                equal = (lv == ev or (isinstance(lv, (int, float)) and isinstance(ev, (int, float))
                                      and abs(lv - ev) <= GROUP_TOLERANCE))  # fmt: skip
                rows.append((group, metric if field == "mean" else f"{metric} stderr", lv, ev, equal))
                ok = ok and equal
        extra = [k for k in theirs if "," in k and "_stderr" not in k
                 and k.replace(",none", "").replace(",", "/") not in result["metrics"]]  # fmt: skip
        for key in extra:
            rows.append((group, key, theirs[key], None, False))
            ok = False
    return rows, ok


def task_yamls(names: str | None) -> list[Path]:
    found = {p.stem: p for p in sorted(YAMLS.rglob("*.yaml")) if "\ngroup:" not in f"\n{p.read_text()}"}  # tasks
    if not names:
        return list(found.values())
    out = []
    for n in names.split(","):
        n = n.strip().removeprefix("lm_eval_")
        if n not in found:
            fail(f"no shipped task {n!r}; have: {', '.join(found)}")
        out.append(found[n])
    return out


def main(argv: list[str] | None = None) -> int:
    venv = REPO / ".venv"
    if venv.is_dir() and Path(sys.prefix).resolve() != venv.resolve():
        # the project's python: its pip installs the side directory, its torch/transformers run lm-eval
        py = venv / "bin" / "python"
        os.execv(str(py), [str(py), str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="tiny",
        help="tiny (evalrun/models/tiny-adder, evalrun model=tiny_adder; default), smollm2 "
        "(~/.cache/evalrun/models/smollm2-135m-instruct, model=smollm2_135m_instruct), "
        "or a model directory (then give --evalrun-model)",
    )
    parser.add_argument("--evalrun-model", help="evalrun's model config name for a --model directory")
    parser.add_argument(
        "--tasks",
        help="comma-separated shipped task names (YAML stems, e.g. addition_gen,"
        "addition_mc); default: all under evalrun/tasks/builtin/lm_eval",
    )
    parser.add_argument(
        "--group",
        help="a shipped group YAML (its stem, e.g. addition_suite): lm-eval evaluates the group (its tasks inline), "
        "evalrun runs task.name=GROUP over the shipped directory; each task is compared as above, then each "
        "group's aggregate metrics and their stderr (lm-eval's results against group.json)",
    )
    parser.add_argument(
        "--shipped",
        help="comma-separated names of lm-eval's own shipped task YAMLs, unmodified, from the installed "
        "lm_eval/tasks (tests/helpers/shipped.py: arc_easy, hellaswag, winogrande, gsm8k, boolq, lambada_openai, "
        "truthfulqa_mc2, wmt16-ro-en, mrpc), or 'all': on small data in each hub dataset's real schema, written to "
        "a local hub cache that evalrun reads at its pinned commit (task.dataset_revision) and lm-eval reads as "
        "the same Parquet files (its load_dataset reads no revision offline)",
    )
    parser.add_argument("--limit", type=int, help="first N items of each task, on both sides")
    parser.add_argument("--work-dir", type=Path, help="where runs and lm-eval's samples go (default: a new /tmp dir)")
    parser.add_argument("--show", type=int, default=5, help="differing items listed per check (default 5)")
    parser.add_argument(
        "--evalrun-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for evalrun run (repeatable), e.g. engine.max_num_seqs=1",
    )
    parser.add_argument(
        "--lm-eval-threads",
        type=int,
        help="torch intra-op threads for lm-eval (default: torch's own, as lm-eval runs; evalrun's "
        "inline worker uses cluster.cpus_per_worker, 1 by default)",
    )
    parser.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="lm-eval's --apply_chat_template (few-shot examples as turns, its default then) against evalrun's "
        "task.chat_format=chat, both through the model's own chat template",
    )
    parser.add_argument(
        "--single-turn",
        action="store_true",
        help="with --apply-chat-template: lm-eval's --fewshot_as_multiturn false against evalrun's "
        "task.fewshot_as_multiturn=false",
    )
    parser.add_argument(
        "--system-instruction", help="lm-eval's --system_instruction against evalrun's task.system_instruction"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side-dir", help=argparse.SUPPRESS)  # the worker's: where lm_eval must come from
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--yaml", action="append", help=argparse.SUPPRESS)
    parser.add_argument("--group-yaml", help=argparse.SUPPRESS)
    parser.add_argument("--data-files", help=argparse.SUPPRESS)  # JSON: YAML -> {split: Parquet file}
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    if args.model in MODELS:
        model_dir, ev_model = MODELS[args.model]
    else:
        model_dir, ev_model = Path(args.model), args.evalrun_model
        if not ev_model:
            parser.error("--model DIR needs --evalrun-model NAME (a evalrun/conf/model config for the same weights)")
    model_dir = model_dir.resolve()
    if not (model_dir / "config.json").exists():
        fail(f"no model at {model_dir}")
    if args.group and args.tasks:
        parser.error("--group runs the group's tasks: give --group or --tasks, not both")
    group_yaml = YAMLS / f"{args.group}.yaml" if args.group else None
    if group_yaml is not None and not group_yaml.is_file():
        fail(f"no shipped group {args.group!r}; have: {', '.join(p.stem for p in sorted(YAMLS.glob('*.yaml')))}")
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="agree-lm-eval-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    hub = shipped_hub(args.shipped, work / "hub") if args.shipped else None
    yamls = [Path(y) for y in hub["pins"]] if hub else task_yamls(args.tasks)
    commands: list[str] = []
    walls: list[tuple[str, float]] = []

    before = venv_fingerprint()
    import compare_lm_eval as setup  # scripts/ is on sys.path: the shared lm-eval set-up

    home = setup.lm_eval_home()
    setup.setup_lm_eval(home)
    if venv_fingerprint() != before:
        fail(f"the project's environment changed while setting up lm-eval ({before['purelib']})")
    side = home / "site"

    # lm-eval: one simple_evaluate over all chosen tasks, in a child with PYTHONPATH=SIDE_DIR
    lm_json = work / "lm_eval_samples.json"
    env_shown = {**setup.lm_eval_env(home), **OFFLINE_ENV, "HF_DATASETS_CACHE": str(work / "hf_datasets_cache")}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--side-dir",
        str(side),
        "--model-dir",
        str(model_dir),
        "--out",
        str(lm_json),
    ]
    for y in yamls:
        cmd += ["--yaml", str(y)]
    if group_yaml is not None:
        cmd += ["--group-yaml", str(group_yaml)]
    if hub:
        cmd += ["--data-files", json.dumps(hub["files"])]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if args.lm_eval_threads is not None:
        cmd += ["--lm-eval-threads", str(args.lm_eval_threads)]
    if args.single_turn and not args.apply_chat_template:
        parser.error("--single-turn needs --apply-chat-template (as lm-eval's --fewshot_as_multiturn)")
    lm_eval_options = ["--apply-chat-template"] if args.apply_chat_template else []
    lm_eval_options += ["--single-turn"] if args.single_turn else []
    if args.system_instruction is not None:
        lm_eval_options += ["--system-instruction", args.system_instruction]
    cmd += lm_eval_options
    commands.append(show_cmd(cmd, env_shown))
    print("$ " + commands[-1], flush=True)
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env_shown
    with open(work / "lm_eval.log", "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    walls.append(("lm-eval (all tasks, one process)", time.monotonic() - started))
    if proc.returncode != 0:
        print((work / "lm_eval.log").read_text()[-6000:], file=sys.stderr)
        fail(f"lm-eval failed (exit {proc.returncode}); log: {work / 'lm_eval.log'}")
    lm = json.loads(lm_json.read_text())
    if venv_fingerprint() != before:
        fail("the project's environment changed while running lm-eval")

    # evalrun: one CLI run per task
    evalrun = Path(sys.executable).parent / "evalrun"
    if not evalrun.exists():
        evalrun = REPO / ".venv" / "bin" / "evalrun"
    reports, ok = [], True

    def run_evalrun(task_args: list[str], label: str) -> Path:
        cmd = [
            str(evalrun),
            "run",
            "task=lm_eval",
            *task_args,
            "engine=hf",
            "cluster=inline",
            "run.progress=false",
            f"run.root={work / 'evalrun'}",
            f"model={ev_model}",
        ]
        if args.limit is not None:
            cmd.append(f"limit={args.limit}")
        if args.apply_chat_template:
            cmd.append("task.chat_format=chat")
        if args.single_turn:
            cmd.append("task.fewshot_as_multiturn=false")
        if args.system_instruction is not None:
            cmd.append(f"task.system_instruction={args.system_instruction}")
        cmd += args.evalrun_override
        env = OFFLINE_ENV | ({"HF_HUB_CACHE": str(work / "hub")} if hub else {})
        commands.append(show_cmd(cmd, env))
        print("$ " + commands[-1], flush=True)
        started = time.monotonic()
        log_path = work / f"evalrun_{label}.log"
        proc = subprocess.run(cmd, env=os.environ | env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        walls.append((f"evalrun {label}", time.monotonic() - started))
        log_path.write_text(proc.stdout)
        lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
        if proc.returncode != 0 or not lines or not Path(lines[-1].strip()).is_dir():
            print(proc.stdout[-6000:], file=sys.stderr)
            fail(f"evalrun failed on {label} (exit {proc.returncode}); log: {log_path}")
        run_dir = Path(lines[-1].strip())
        print(f"  run directory: {run_dir}")
        return run_dir

    group_rows: list[tuple[str, str, object, object, bool]] = []
    if group_yaml is not None:  # one evalrun run of the group: a run per task in its directory, and group.json
        group_dir = run_evalrun([f"task.path={YAMLS}", f"task.name={args.group}"], args.group)
        for name, lm_task in lm["tasks"].items():
            task = name.rsplit("::", 1)[-1]
            reports.append(compare_task(task, lm_task, group_dir / task))
        group_rows, ok = compare_group(lm["results"], json.loads((group_dir / "group.json").read_text()))
    for y in yamls if group_yaml is None else ():
        name, lm_task = next((n, t) for n, t in lm["tasks"].items() if t["yaml"] == str(y))
        pinned = (
            [f"+task.dataset_revision={{{repo}: {commit}}}" for repo, commit in hub["pins"][str(y)].items()]
            if hub
            else []
        )
        reports.append(compare_task(name, lm_task, run_evalrun([f"task.path={y}", *pinned], name)))

    print(
        f"\nmodel: {model_dir} (evalrun model={ev_model}); limit: {args.limit}; "
        f"lm-eval {lm['lm_eval_version']} from {side}; work dir: {work}"
    )
    for r in reports:
        ok = print_task(r, args.show) and ok
    print_overall(reports)
    if group_rows:
        print(f"\n=== group {args.group}: lm-eval's aggregates against group.json's")
        w = max(len(f"{g} {k}") for g, k, *_ in group_rows) + 2
        for g, k, lv, ev, equal in group_rows:
            print(f"  {g + ' ' + k:<{w}}{aggregate(lv):>14}{aggregate(ev):>14}" + ("" if equal else "   <-- differs"))
        gaps = [abs(lv - ev) for _, _, lv, ev, _ in group_rows if isinstance(lv, float) and isinstance(ev, float)]
        print(
            f"  max |lm-eval - evalrun| over the group's figures: {max(gaps, default=0.0):.3e} "
            f"(equal within {GROUP_TOLERANCE:g})"
        )
    print("\ncommands run:")
    for c in commands:
        print("  $ " + c)
    print("wall times:")
    for what, s in walls:
        print(f"  {what}: {s:.1f} s")
    print(f"  lm-eval simple_evaluate alone: {lm['wall_s']:.1f} s")
    after = venv_fingerprint()
    print(
        f"project environment unchanged: {after == before} ({len(after['dists'])} distributions in {after['purelib']})"
    )
    if after != before:
        return 2
    print("AGREE" if ok else "DIFFER: see the differing items above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
