"""The few-shot seed and a generated master seed, end to end on the shared engine (docs/design.md "Seeds"):
what the records say, and that verify, replay and resume agree with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from evalrun.audit.replay import replay_run
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.pipeline import runner
from evalrun.records.seeds import derive_seed
from evalrun.rundir import layout
from evalrun.rundir.reader import read_outputs
from evalrun.tasks.selection import select_fewshot

FEWSHOT = ("task=addition_fewshot", "limit=3")


def manifest_of(run: Path) -> dict[str, Any]:
    return json.loads((run / layout.MANIFEST).read_text(encoding="utf-8"))


def record_of(run: Path) -> dict[str, Any]:
    return json.loads((run / layout.RECORD).read_text(encoding="utf-8"))


def rows(run: Path, *columns: str) -> dict[str, dict[str, Any]]:
    table = read_outputs(layout.RunDir(run), ["item_id", *columns]).to_pylist()
    return {row["item_id"]: row for row in table}


def test_master_auto_is_recorded_verifies_and_resumes_with_the_same_seed(run_eval, dispatcher) -> None:
    run = run_eval("limit=3", "decoding=sample", "cluster.batch_size=1", "seeds.master=auto")
    master = yaml.safe_load((run / layout.CONFIG).read_text(encoding="utf-8"))["seeds"]["master"]
    assert isinstance(master, int) and 0 <= master < 2**53
    manifest = manifest_of(run)
    assert manifest["seeds"] == {"master": master, "set": [0], "repeats": 1, "master_generated": True}
    assert manifest["identity"]["seeds"] == {"master": master, "set": [0], "repeats": 1}
    for item, row in rows(run, "seeds").items():
        assert row["seeds"]["sampling"] == derive_seed(master, "sampling", "addition", item, 0, 0)
    report = verify_run(run, jobs=1)  # the sampling seeds derive from the recorded master seed
    root = record_of(run)["merkle_root"]
    assert report.merkle_root == root

    # Interrupted before its last part and its record: resume reloads config.yaml (the number, not
    # auto), sees the same identity and samples the missing episode with the same seed.
    last = layout.RunDir(run).output_parts()[-1]
    last.unlink()
    (run / layout.RECORD).unlink()
    assert runner.resume(run, dispatcher=dispatcher) == run
    assert record_of(run)["merkle_root"] == root and record_of(run)["dispatch"]["kept_parts"] == 2
    assert manifest_of(run) == manifest
    verify_run(run, jobs=1)


def test_a_fewshot_seed_changes_the_examples_and_the_digest_and_verifies(run_eval) -> None:
    default, seeded = run_eval(*FEWSHOT), run_eval(*FEWSHOT, "seeds.fewshot=7")
    plain, chosen = manifest_of(default), manifest_of(seeded)
    assert plain["seeds"] == plain["identity"]["seeds"] == {"master": 1234, "set": [0], "repeats": 1}
    assert chosen["seeds"] == chosen["identity"]["seeds"] == {"master": 1234, "set": [0], "repeats": 1, "fewshot": 7}
    assert yaml.safe_load((seeded / layout.CONFIG).read_text(encoding="utf-8"))["seeds"]["fewshot"] == 7
    assert chosen["digest"]["digest"] != plain["digest"]["digest"]
    assert chosen["digest"]["seed_set"] != plain["digest"]["seed_set"]
    assert chosen["digest"]["prompt_pack"] == plain["digest"]["prompt_pack"]
    assert chosen["digest_inputs"]["seed_set"]["fewshot"] == 7

    pool = runner.prepare(load(list(FEWSHOT))).task.pack.fewshot
    assert pool is not None

    def expected(seed: int, item: str) -> list[str]:
        return [
            pool.ids[i]
            for i in select_fewshot(pool.ids, pool.examples, pool.k, pool.stratify, seed, "addition_fewshot", item)
        ]

    shown, shown_default = rows(seeded, "fewshot_ids", "seeds"), rows(default, "fewshot_ids", "seeds")
    assert all(row["fewshot_ids"] == expected(7, item) for item, row in shown.items())
    assert all(row["fewshot_ids"] == expected(1234, item) for item, row in shown_default.items())
    assert any(shown[item]["fewshot_ids"] != shown_default[item]["fewshot_ids"] for item in shown)
    assert {i: r["seeds"] for i, r in shown.items()} == {i: r["seeds"] for i, r in shown_default.items()}

    for run in (default, seeded):
        verify_run(run, jobs=1)
    report = replay_run(seeded, [])  # the plan rebuilt from config.yaml draws the same examples
    assert report.divergences == () and report.root_matches and report.scores_identical
