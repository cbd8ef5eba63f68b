"""compare, digest, gate and nondet on constructed run directories with known answers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from evalrun.analysis.compare import changed_things, compare_paths, manifest_diff
from evalrun.analysis.gate import gate_paths, pooled_range
from evalrun.analysis.nondet import EpisodeOutputs, analyse, episode_nondet, nondet_paths
from evalrun.analysis.runs import digest_record, load_run
from evalrun.cli import main
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_json
from evalrun.records.outputs import OUTPUT_SCHEMA
from evalrun.rundir import layout, writer
from evalrun.scoring import SCORES_SCHEMA

DIGEST = {"prompt_pack": "a" * 64, "seed_set": "b" * 64, "scoring": "c" * 64, "digest": "d" * 64}
FILES = {"model.safetensors": "1" * 64, "config.json": "2" * 64}


def manifest(**changes: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "format": "evalrun.manifest/1",
        "identity": {"model": {"id": "org/base", "files": FILES}, "digest": DIGEST},
        "digest": dict(DIGEST),
        "model": {"id": "org/base", "revision": None, "path": "/m", "files": FILES, "pinned": True},
        "task": {"name": "t", "dataset": {"path": "/d", "sha256": "e" * 64, "items": 4},
                 "template": {"path": "/x", "sha256": "f" * 64}, "scorer": {"name": "exact_match"}},
        "decoding": {"temperature": 0.0}, "seeds": {"master": 7, "set": [0], "repeats": 1},
        "engine": {"name": "vllm", "version": "0.32.0", "settings": {"max_num_seqs": 256, "dtype": "float32"}},
        "determinism": {"asked": {"enabled": True}, "honoured": [{"seeded": True}], "notes": []},
        "cluster": {"batch_size": 256}, "workers": [{"worker": "w@1"}], "hardware": {"cpu": "x", "gpu": None},
        "libraries": {"torch": "2"}, "python": "3.11", "git": {"commit": "a", "dirty": False},
        "limit": None, "episodes": 4, "judge_model": None,
        "generator": {"name": "evalrun", "version": "0.1.0", "git_commit": "a"},
        "started_at": "2026-01-01T00:00:00+00:00",
    }  # fmt: skip
    for dotted, value in changes.items():
        node = m
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value
    return m


def make_run(root: Path, name: str, values: dict[tuple[str, int], float], m: dict[str, Any] | None = None,
             outputs: dict[tuple[str, int], tuple[str, list[int], list[float]]] | None = None) -> Path:  # fmt: skip
    """A finished run dir: ``values[(item, seed)]`` -> exact_match value; optional raw outputs."""
    run = layout.create_run_dir(root, name)
    m = m or manifest()
    run.manifest.write_text(canonical_json(m) + "\n")
    run.record.write_text("{}\n")
    rows: dict[str, list[Any]] = {n: [] for n in SCORES_SCHEMA.names}
    out: dict[str, list[Any]] = {n: [] for n in OUTPUT_SCHEMA.names}
    for (item, seed), value in sorted(values.items()):
        eid = f"{item}-{seed}"
        text, tokens, logprobs = (outputs or {}).get((item, seed), (str(value), [1, 2], [-0.1, -0.2]))
        for col, v in zip(SCORES_SCHEMA.names, [eid, "t", item, seed, 0, "exact_match", value, text.strip(),
                                                 "exact_match", "1", None], strict=True):  # fmt: skip
            rows[col].append(v)
        out_row = {"episode_id": eid, "task": "t", "item_id": item, "seed": seed, "repeat": 0,
                   "seeds": {"sampling": 1}, "prompt": "q", "prompt_sha256": "0", "target": "1", "output": text,
                   "token_ids": tokens, "token_logprobs": logprobs, "finish_reason": "stop", "prompt_tokens": 1,
                   "output_tokens": len(tokens), "head": "0" * 64, "worker": "w", "hardware": "{}",
                   "batch_size": 4, "latency_s": 0.1}  # fmt: skip
        for col in out:
            out[col].append(out_row.get(col))
    writer.write_atomic(run.scores, writer.table_bytes(pa.table(rows, schema=SCORES_SCHEMA)))
    writer.write_atomic(run.output_part(0), writer.table_bytes(pa.table(out, schema=OUTPUT_SCHEMA)))
    return run.path


# --- compare ----------------------------------------------------------------------------------


def test_manifest_diff_names_each_changed_thing_and_ignores_provenance() -> None:
    a = manifest()
    b = manifest(engine__settings__max_num_seqs=1, started_at="later", workers=[{"worker": "other"}])
    diffs = manifest_diff(a, b)
    assert [(d.category, d.field, d.a, d.b) for d in diffs] == [("engine", "engine.settings.max_num_seqs", 256, 1)]
    c = manifest(hardware={"cpu": "y", "gpu": None}, model__files={"model.safetensors": "9" * 64})
    assert sorted({d.category for d in manifest_diff(a, c)}) == ["hardware", "model"]


def test_compare_warns_when_more_than_one_thing_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = {(f"i{k}", 0): float(k % 2) for k in range(20)}
    a = make_run(tmp_path, "a", values)
    b = make_run(tmp_path, "b", values, manifest(engine__name="hf"))
    c = make_run(tmp_path, "c", values, manifest(engine__name="hf", hardware={"cpu": "gpu box", "gpu": "H200"}))
    assert compare_paths(a, b).warning is None
    report = compare_paths(a, c)
    assert report.changed == ("engine", "hardware") and "2 things changed" in (report.warning or "")
    assert main(["compare", str(a), str(c)]) == 0
    captured = capsys.readouterr()
    assert "WARNING: 2 things changed" in captured.out and "WARNING" in captured.err
    assert main(["compare", str(a), str(c), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["format"] == "evalrun.compare/1" and record["changed"] == ["engine", "hardware"]
    overall = record["rows"][-1]
    assert overall["task"] == "(overall)" and overall["estimate"]["diff"] == 0.0
    assert overall["estimate"]["test"]["name"] == "mcnemar"


def test_compare_pairs_items_and_shows_both_intervals(tmp_path: Path) -> None:
    # A right on items 0..29, B right on 0..29 plus 30..35: six discordant pairs, all for B.
    a = make_run(tmp_path, "a", {(f"i{k}", 0): float(k < 30) for k in range(60)})
    b = make_run(tmp_path, "b", {(f"i{k}", 0): float(k < 36) for k in range(60)})
    (row,) = [r for r in compare_paths(a, b).rows if r.task == "t"]
    est = row.estimate
    assert est.diff == pytest.approx(0.1)
    assert est.test.details["b_only"] == 6 and est.test.p_value == pytest.approx(2 / 64)
    assert est.ci95_paired[1] - est.ci95_paired[0] < est.ci95_unpaired[1] - est.ci95_unpaired[0]


# --- digest and gate --------------------------------------------------------------------------


def test_digest_prints_the_six_field_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path, "a", {("i0", 0): 1.0})
    record = digest_record(load_run(run))
    assert list(record) == ["candidate", "model_checkpoint", "prompt_pack", "seed_set", "scoring", "digest"]
    assert record["candidate"] == "org/base" and record["digest"] == "d" * 64
    assert main(["digest", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == record


def five_seed_run(tmp_path: Path, name: str, base: float, jitter: float, m: dict[str, Any] | None = None) -> Path:
    """40 items x 5 seeds; per-seed means base + jitter * (seed - 2) / 2 (range = 2 * jitter)."""
    values = {}
    for seed in range(5):
        right = round(40 * (base + jitter * (seed - 2) / 2))
        for k in range(40):
            values[(f"i{k}", seed)] = float(k < right)
    return make_run(tmp_path, name, values, m or manifest(seeds={"master": 7, "set": list(range(5)), "repeats": 1}))


def test_gate_range_rule_inside_and_outside_the_margin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = five_seed_run(tmp_path, "base", 0.5, 0.05)  # per-seed means .45 .475 .5 .525 .55: range 0.1
    cand = manifest(seeds={"master": 7, "set": list(range(5)), "repeats": 1}, model__id="org/cand")
    small = five_seed_run(tmp_path, "small", 0.6, 0.05, cand)  # +0.1 <= margin 2 x 0.1
    big = five_seed_run(tmp_path, "big", 0.75, 0.05, copy.deepcopy(cand))  # +0.25 > margin
    d = gate_paths(small, base)
    assert not d.passed and d.margin == pytest.approx(0.2) and d.delta == pytest.approx(0.1)
    d = gate_paths(big, base)
    assert d.passed and d.delta == pytest.approx(0.25)
    assert main(["gate", str(big), str(base)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["gate", str(small), str(base)]) == 1
    out, err = capsys.readouterr()
    assert "BLOCKED" in out and "margin = 2 x pooled range" in out and "blocked:" in err
    assert main(["gate", str(small), str(base), "--factor", "0.5"]) == 0  # margin 0.05 < 0.1


def test_gate_refuses_unequal_digests_whatever_the_scores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = five_seed_run(tmp_path, "base", 0.3, 0.0)
    other = manifest(seeds={"master": 7, "set": list(range(5)), "repeats": 1},
                     digest={**DIGEST, "prompt_pack": "e" * 64, "digest": "f" * 64})  # fmt: skip
    cand = five_seed_run(tmp_path, "cand", 0.9, 0.0, other)
    d = gate_paths(cand, base)
    assert not d.passed and "digests differ (prompt_pack)" in d.reason
    assert main(["gate", str(cand), str(base), "--rule", "paired"]) == 1
    assert "digests differ" in capsys.readouterr().err


def test_gate_paired_rule_and_one_seed_range_rule(tmp_path: Path) -> None:
    base = make_run(tmp_path, "base", {(f"i{k}", 0): float(k < 50) for k in range(100)})
    up = make_run(tmp_path, "up", {(f"i{k}", 0): float(k < 70) for k in range(100)})
    tie = make_run(tmp_path, "tie", {(f"i{k}", 0): float(k < 51) for k in range(100)})
    d = gate_paths(up, base, rule="paired")
    assert d.passed and d.paired is not None and d.margin == pytest.approx(d.delta - d.paired.ci95_paired[0])
    assert not gate_paths(tie, base, rule="paired").passed  # +0.01 is inside the interval
    one_seed = gate_paths(up, base)  # the range rule with one recorded seed: no spread, no pass
    assert not one_seed.passed and "at least 2 recorded seeds" in one_seed.reason
    assert pooled_range([0.5, 0.6], [0.1, 0.3]) == pytest.approx(0.2)  # deviations -.05 .05 -.1 .1


# --- nondet -----------------------------------------------------------------------------------


def ep(item: str, outputs: list[str], answers: list[str], tokens: list[list[int]], lps: list[list[float]],
       values: list[float]) -> EpisodeOutputs:  # fmt: skip
    return EpisodeOutputs("t", item, tuple(outputs), tuple(answers), tuple(values),
                          tuple(map(tuple, tokens)), tuple(map(tuple, lps)))  # fmt: skip


def test_tarr_tara_divergence_and_accuracy_on_a_hand_made_set() -> None:
    episodes = [
        # identical everywhere, logprobs differ by 0.002 at position 1
        ep("a", [" 5"] * 3, ["5"] * 3, [[1, 2]] * 3, [[-0.1, -0.2], [-0.1, -0.201], [-0.1, -0.199]], [1, 1, 1]),
        # raw differs (trailing space), parsed answer the same; token 2 diverges at position 1
        ep("b", [" 7", " 7 ", " 7"], ["7"] * 3, [[1, 3], [1, 4], [1, 3]], [[-0.5, -1], [-0.6, -2], [-0.5, -1]],
           [1, 1, 1]),
        # three different answers, diverging at position 0
        ep("c", [" 1", " 2", " 3"], ["1", "2", "3"], [[5], [6], [7]], [[-1], [-1], [-1]], [1, 0, 0]),
        # one run stops early: a prefix, divergence at the shorter length
        ep("d", [" 9", " 99", " 9"], ["9", "99", "9"], [[8], [8, 8], [8]], [[-0.3], [-0.3, -0.1], [-0.3]], [1, 0, 1]),
    ]  # fmt: skip
    r = analyse(episodes, ("r0", "r1", "r2"), "exact_match")
    assert r.tarr == pytest.approx(1 / 4)  # only a
    assert r.tara == pytest.approx(2 / 4)  # a and b
    assert r.distinct_histogram == {"1": 1, "2": 2, "3": 1} and r.distinct_max == 3
    assert r.distinct_mean == pytest.approx((1 + 2 + 3 + 2) / 4)
    by_item = {i.item_id: i for i in r.per_item}
    assert by_item["a"].first_divergence is None
    assert by_item["a"].max_abs_logprob_diff == pytest.approx(0.002)
    assert by_item["b"].first_divergence == 1 and by_item["b"].max_abs_logprob_diff == pytest.approx(0.1)
    assert by_item["c"].first_divergence == 0 and by_item["c"].max_abs_logprob_diff is None
    assert by_item["d"].first_divergence == 1
    assert r.diverged_episodes == 3 and r.first_divergence_min == 0
    assert r.accuracy == pytest.approx((1.0, 0.5, 0.75))
    assert (r.accuracy_best, r.accuracy_worst) == pytest.approx((1.0, 0.5))
    assert r.accuracy_spread == pytest.approx(0.5)
    assert r.accuracy_best_possible == pytest.approx(1.0) and r.accuracy_worst_possible == pytest.approx(0.5)
    assert episode_nondet(episodes[0]).identical_raw


def test_nondet_over_run_dirs_matches_episodes_and_names_the_differing_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = {("i0", 0): 1.0, ("i1", 0): 1.0}
    outs_a = {("i0", 0): (" 1", [1], [-0.5]), ("i1", 0): (" 2", [2], [-0.5])}
    outs_b = {("i0", 0): (" 1", [1], [-0.5000001]), ("i1", 0): (" 3", [3], [-0.5])}
    a = make_run(tmp_path, "a", values, outputs=outs_a)
    b = make_run(tmp_path, "b", {**values, ("i2", 0): 0.0}, manifest(engine__settings__max_num_seqs=1),
                 outputs=outs_b)  # fmt: skip
    r = nondet_paths([a, b])
    assert r.items == 2 and r.unmatched_episodes == 1 and r.tarr == 0.5
    assert r.max_abs_logprob_diff == pytest.approx(1e-7, rel=1e-3)
    assert [(s.field, s.values) for s in r.settings] == [("engine.settings.max_num_seqs", (256, 1))]
    assert main(["nondet", str(a), str(b)]) == 0
    assert "TARr@2" in capsys.readouterr().out
    assert main(["nondet", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "evalrun.nondet/1"
    c = make_run(tmp_path, "c", values, manifest(digest={**DIGEST, "seed_set": "9" * 64, "digest": "8" * 64}))
    with pytest.raises(BadInput, match="seed_set"):
        nondet_paths([a, c])
    assert main(["nondet", str(a)]) == 2
    assert main(["nondet", str(a), str(c)]) == 2


def test_compare_says_when_the_reference_set_changed() -> None:
    """Two agent runs scored against different frozen reference sets (issue 13): the reference set
    is named as a changed thing, apart from the world's versions."""
    world = {"name": "shift-planner", "versions": {"world": "1", "verifier": "1"},
             "references": {"name": "shift-planner", "version": "1", "index_sha256": "a" * 64}}  # fmt: skip
    other = {**world, "references": {**world["references"], "index_sha256": "b" * 64}}
    a, b = {"task": {"world": world}}, {"task": {"world": other}}
    diffs = manifest_diff(a, b)
    assert [(d.category, d.field) for d in diffs] == [("reference set", "task.world.references.index_sha256")]
    assert changed_things(diffs) == ["reference set"]
    newer = {"task": {"world": {**other, "versions": {"world": "2", "verifier": "1"}}}}
    assert changed_things(manifest_diff(a, newer)) == ["reference set", "world"]


def test_a_held_repeat_is_compared_with_its_original_and_what_was_held_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nondet ORIGINAL HELD``: the held repeat's digest differs from the original's by its prompt-pack part's
    ``world.held`` alone (the side held fixed, and the original's digest it was served from); nondet takes the
    pair and names what was held. Held from another run, or with anything else changed: refused."""
    from evalrun.pipeline.manifest import Digest

    inputs = {"prompt_pack": {"world": {"name": "support-desk", "seeds": [0, 4]}}, "seed_set": {"set": [0]},
              "scoring": {"scorer": "verifier"}}  # fmt: skip
    original = Digest.of_inputs(inputs).as_record()

    def holding(digest: str, **world: Any) -> dict[str, Any]:
        held = copy.deepcopy(inputs)
        held["prompt_pack"]["world"].update(world, held={"side": "user", "digest": digest, "root": "1" * 64,
                                                         "seal": "2" * 64})  # fmt: skip
        return held

    values = {("i0", 0): 1.0, ("i1", 0): 0.0}
    a = make_run(tmp_path, "original", values, manifest(digest=original, digest_inputs=inputs))
    repeat = holding(original["digest"])
    b = make_run(tmp_path, "repeat", values, manifest(digest=Digest.of_inputs(repeat).as_record(),
                                                       digest_inputs=repeat))  # fmt: skip
    report = nondet_paths([a, b])
    assert report.held == {str(b): {"side": "user", "from_digest": original["digest"]}}
    assert report.as_record()["held"] == report.held and "held" not in nondet_paths([a, a]).as_record()
    assert main(["nondet", str(a), str(b)]) == 0
    assert "held fixed in repeat: the user side, served from the run of digest " in capsys.readouterr().out
    for name, other in (("elsewhere", holding("9" * 64)), ("changed", holding(original["digest"], seeds=[0, 5]))):
        c = make_run(tmp_path, name, values, manifest(digest=Digest.of_inputs(other).as_record(),
                                                      digest_inputs=other))  # fmt: skip
        with pytest.raises(BadInput, match=r"prompt_pack\): nondet compares runs of the same prompts"):
            nondet_paths([a, c])
