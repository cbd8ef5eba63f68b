"""``evalrun compare RUN_A RUN_B``: what changed between two runs, then B - A per item.

First the manifest diff: every recorded field that differs, grouped into the things a user
changes (model, prompt pack, seed set, scorer, dataset, engine, determinism, hardware, software;
for agent tasks also the world's versions, the agent and its budgets, and the frozen reference set
scored against),
with a loud warning when more than one thing changed. Then, per task and overall, the paired
difference of per-item means (repeats averaged within an item first) with its interval and a
paired test, and the unpaired interval beside it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalrun.analysis.runs import OVERALL, Run, load_run
from evalrun.records.fields import differing_fields
from evalrun.records.formats import COMPARE_FORMAT
from evalrun.records.seeds import derive_seed
from evalrun.stats.estimates import PairedEstimate, item_means, paired

# Manifest field prefix -> the thing it belongs to. The first matching prefix wins; fields
# matching none of these (paths, worker names, start time, the identity copy) are not compared.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("model.path", ""),
    ("model.", "model"),
    ("user_model.path", ""),
    ("user_model.", "user model"),
    ("user_engine.", "engine"),
    ("digest.digest", ""),
    ("digest.prompt_pack", "prompt pack"),
    ("task.prompt_pack.path", ""),
    ("task.prompt_pack.", "prompt pack"),
    ("task.choices.", "prompt pack"),
    ("task.world.references.", "reference set"),
    ("task.references.", "reference set"),
    ("task.world.versions.", "world"),
    ("task.world.agent", "agent"),
    ("task.world.chat_template_sha256", "prompt pack"),
    ("task.world.system_prompt_sha256", "prompt pack"),
    ("task.world.reply_tokens", "prompt pack"),
    ("task.world.max_", "agent"),
    ("task.world.user.model", "user model"),  # the model playing a world's simulated user: its files' hashes
    ("task.world.user.", "simulated user"),  # its prompt pack, decoding and chat template
    ("task.world.held.", "held side"),  # the run a held side's replies came from
    ("task.world.", "dataset"),
    ("task.rubric.path", ""),
    ("task.rubric.", "scorer"),
    ("decoding.", "prompt pack"),
    ("digest.seed_set", "seed set"),
    ("seeds.", "seed set"),
    ("digest.scoring", "scorer"),
    ("task.scorer.", "scorer"),
    ("task.dataset.sha256", "dataset"),
    ("task.dataset.items", "dataset"),
    ("task.name", "dataset"),
    ("limit", "dataset"),
    ("episodes", "dataset"),
    ("engine.", "engine"),
    ("determinism.", "determinism"),
    ("hardware.", "hardware"),
    ("libraries.", "software"),
    ("python", "software"),
    ("generator.", "software"),
    ("git.", "software"),
    ("install.", "software"),
    ("cluster.batch_size", "dispatch"),
)
# Dispatch settings are listed but do not count as a change: results must not depend on them.
NOT_COUNTED = ("dispatch",)


@dataclass(frozen=True)
class FieldDiff:
    category: str
    field: str
    a: Any
    b: Any


# A worker's hardware as it reported it (workers.N.hardware.*: its CPU flags, the instruction set its kernels ran
# with, its GPU): the driver's own (hardware.*) is not the workers' on a cluster, or where engine.cpu_isa caps them
_WORKER_HARDWARE = re.compile(r"workers\.\d+\.hardware\.")


def _category(field: str) -> str:
    if _WORKER_HARDWARE.match(field):
        return "hardware"
    for prefix, category in CATEGORIES:
        if field == prefix.rstrip(".") or field.startswith(prefix):
            return category
    return ""


def manifest_diff(a: dict[str, Any], b: dict[str, Any]) -> tuple[FieldDiff, ...]:
    """Every compared manifest field whose value differs (a missing field reads as None)."""
    return tuple(FieldDiff(_category(f), f, va, vb) for f, va, vb in differing_fields(a, b) if _category(f))


def changed_things(diffs: tuple[FieldDiff, ...]) -> list[str]:
    return sorted({d.category for d in diffs if d.category not in NOT_COUNTED})


@dataclass(frozen=True)
class CompareRow:
    task: str
    metric: str
    items_only_a: int
    items_only_b: int
    estimate: PairedEstimate


@dataclass(frozen=True)
class CompareReport:
    run_a: str
    run_b: str
    diffs: tuple[FieldDiff, ...]
    changed: tuple[str, ...]
    warning: str | None
    rows: tuple[CompareRow, ...]

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["format"] = COMPARE_FORMAT
        record["direction"] = "B - A"
        record["method"] = (
            "per-item means (repeats averaged within an item first) over the items both runs have; "
            "paired 95% CI = diff +/- 1.96 x SE of per-item differences, and its item bootstrap "
            "(percentile, seeded); unpaired = diff +/- 1.96 x sqrt(SE_A^2 + SE_B^2); test: McNemar "
            "(exact) when every per-item value is 0/1, else a sign-flip permutation test"
        )
        return record


def warning_for(changed: list[str]) -> str | None:
    if len(changed) <= 1:
        return None
    return (
        f"WARNING: {len(changed)} things changed between the runs ({', '.join(changed)}); a difference "
        "below cannot be attributed to any one of them. Compare only when manifests differ in one field."
    )


def compare_runs(a: Run, b: Run) -> CompareReport:
    diffs = manifest_diff(a.manifest, b.manifest)
    changed = changed_things(diffs)
    obs_a, obs_b = a.observations(), b.observations()
    rows = []
    for task, metric in sorted(set(obs_a) & set(obs_b), key=lambda k: (k[0] == OVERALL, k)):
        ma, mb = item_means(obs_a[(task, metric)]), item_means(obs_b[(task, metric)])
        if not set(ma) & set(mb):
            continue
        seed = derive_seed(a.master_seed, "bootstrap", task, metric)
        rows.append(CompareRow(task, metric, len(set(ma) - set(mb)), len(set(mb) - set(ma)), paired(ma, mb, seed)))
    return CompareReport(str(a.path), str(b.path), diffs, tuple(changed), warning_for(changed), tuple(rows))


def compare_paths(path_a: Path, path_b: Path) -> CompareReport:
    return compare_runs(load_run(path_a), load_run(path_b))
