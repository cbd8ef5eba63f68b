"""An lm-eval task read through lm-eval's library against the code before it (evalrun's hand-written reader), in
one command: the same multiple-choice task of N items (lm-eval's YAML format, local data, K-shot), the same
model, ``evalrun run ... cluster=inline``, each side a fresh process, rounds interleaved.

The earlier code runs from a git worktree of ``--base`` (default: the commit before lm-eval's library was used)
with the .venv's python and that worktree first on PYTHONPATH; each run's "timings:" line gives its phases. It
prints each side's median wall and the phases evalrun reports, and new / base.

    .venv/bin/python scripts/bench_lm_eval.py [--model tiny|smollm2] [--items 1000] [--shots 2] [--rounds 2] \
        [--base COMMIT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "f5746c3"  # the last commit whose lm-eval tasks were read by evalrun's own reader
MODELS = {"tiny": "tiny_adder", "smollm2": "smollm2_135m_instruct"}
YAML = """task: bench_mc
dataset_path: json
dataset_kwargs: {data_files: {test: test.jsonl, train: train.jsonl}}
output_type: multiple_choice
test_split: test
fewshot_split: train
num_fewshot: {shots}
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(directory: Path, items: int, shots: int) -> Path:
    def doc(i: int) -> dict:
        a, b = i % 97, (i * 7) % 89
        return {"question": f"What is {a} plus {b}?", "choices": [str(a + b + d) for d in (0, 1, -1, 2)],
                "label": 0}  # fmt: skip

    (directory / "test.jsonl").write_text("".join(json.dumps(doc(i)) + "\n" for i in range(items)))
    (directory / "train.jsonl").write_text("".join(json.dumps(doc(10_000 + i)) + "\n" for i in range(50)))
    path = directory / "bench_mc.yaml"
    path.write_text(YAML.replace("{shots}", str(shots)))
    return path


def run(side: str, code: Path, task: Path, model: str, root: Path) -> tuple[float, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(code)} if side == "base" else dict(os.environ)
    command = [sys.executable, "-m", "evalrun.cli", "run", "task=lm_eval", f"task.path={task}", f"model={model}",
               "cluster=inline", "run.progress=false", f"run.root={root / side}"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=code)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{side} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    timings = next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("timings:"))
    phases = {name.strip(): float(value) for name, value in re.findall(r"([a-z -]+?) ([0-9.]+) s", timings)}
    return wall, phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shots", type=int, default=2, help="few-shot examples (the tiny model's context is 128)")
    parser.add_argument("--base", default=BASE)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lm-eval-"))
    base = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                   capture_output=True)  # fmt: skip
    try:
        task = write_task(work, args.items, args.shots)
        code = {"new": ROOT, "base": base}
        walls: dict[str, list[float]] = {"new": [], "base": []}
        phases: dict[str, list[dict[str, float]]] = {"new": [], "base": []}
        for round_ in range(args.rounds):
            for side in ("base", "new") if round_ % 2 == 0 else ("new", "base"):
                wall, phase = run(side, code[side], task, MODELS[args.model], work / f"runs{round_}")
                walls[side].append(wall)
                phases[side].append(phase)
                print(f"round {round_ + 1} {side}: {wall:.1f} s  {phase}", flush=True)
        print(f"\n{args.items} multiple-choice items (4 choices, {args.shots}-shot), model {args.model}, "
              f"{args.rounds} rounds; base {args.base}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        for name in ["wall", *phases["new"][0]]:
            new = statistics.median(walls["new"] if name == "wall" else [p.get(name, 0.0) for p in phases["new"]])
            old = statistics.median(walls["base"] if name == "wall" else [p.get(name, 0.0) for p in phases["base"]])
            ratio = f"{new / old:.2f}" if old else "-"
            print(f"  {name:<14} base {old:8.2f} s   lm-eval's library {new:8.2f} s   new/base {ratio}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
