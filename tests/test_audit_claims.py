"""Audit output that claims only what it checks (issue 10, item 6), with no engine.

The run directories are copies of the golden runs (tests/golden, made by the code before the
regroup, at commit 73bc763): verify's digest parts, summary intervals and formats, rescore and
replay verdicts on them; the determinism layer on this CPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.forgery import set_field as _set

from evalrun.audit import digest_check
from evalrun.audit import replay as replay_module
from evalrun.audit.digest_check import FROM_INPUTS, FROM_MANIFEST, NOT_RECORDED
from evalrun.audit.replay import CodeIdentity, ReplayReport, replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import ScorerConfig
from evalrun.episodes import kind_of_manifest
from evalrun.episodes.dataset import prompt_pack_record
from evalrun.errors import CheckFailed
from evalrun.pipeline import determinism
from evalrun.pipeline.manifest import Digest, seed_set_record
from evalrun.records.canonical import canonical_json, combine
from evalrun.records.outputs import SCORES_SCHEMA
from evalrun.rundir import attest, layout, writer
from evalrun.scoring import scoring_record
from evalrun.stats.estimates import Z_95, estimate, wilson_interval
from evalrun.stats.summary import SUMMARY_FORMAT, summarize

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_COMMIT = "73bc763fe25a62201307ac75348a3726437dbe3b"
OTHER_HASH = "0" * 64


# --- run directories -----------------------------------------------------------------------------


def golden_copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(GOLDEN / name, tmp_path / name))


def read_manifest(run: Path) -> dict[str, Any]:
    return json.loads((run / layout.MANIFEST).read_text(encoding="utf-8"))


def rewrite(run: Path, manifest: dict[str, Any] | None = None, summary: dict[str, Any] | None = None) -> None:
    """Write ``manifest`` (and ``summary``) and rehash everything that covers them, consistently, as a
    forger would: digest.digest from its parts, identity.digest, record.json, the attestation."""
    rundir = layout.RunDir(run)
    record = json.loads(rundir.record.read_text(encoding="utf-8"))
    if manifest is not None:
        digest = manifest["digest"]
        digest["digest"] = combine([digest["prompt_pack"], digest["seed_set"], digest["scoring"]])
        manifest["identity"]["digest"] = dict(digest)
        record["manifest_sha256"] = record["files"][layout.MANIFEST] = writer.write_json(rundir.manifest, manifest)
        record["digest"] = digest["digest"]
    if summary is not None:
        record["files"][layout.SUMMARY] = writer.write_json(rundir.summary, summary)
    writer.write_json(rundir.record, record)
    attest.attest_finished_run(run)


def recorded_inputs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The digest_inputs the current code would have recorded for this manifest's run."""
    task = manifest["task"]
    pack = {k: v for k, v in task["prompt_pack"].items() if k != "path"}
    return {
        "prompt_pack": prompt_pack_record(pack, task["choices"]),
        "seed_set": seed_set_record(manifest["seeds"]),
        "scoring": scoring_record(
            ScorerConfig.from_record(task["scorer"]),
            kind_of_manifest(manifest).recorded_scoring_context(manifest, None),
        ),
    }


def with_digest_inputs(run: Path) -> dict[str, Any]:
    """Make the run one of today's: its manifest records digest_inputs and its digest is theirs."""
    manifest = read_manifest(run)
    inputs = recorded_inputs(manifest)
    manifest["digest_inputs"] = inputs
    manifest["digest"] = Digest.of_inputs(inputs).as_record()
    rewrite(run, manifest)
    return read_manifest(run)  # as written: no dict shared between the inputs and the rest


@pytest.fixture(params=["addition-v1", "mc-v1"])
def golden_name(request: pytest.FixtureRequest) -> str:
    return request.param


# --- verify: the digest, part by part -----------------------------------------------------------


def test_golden_runs_verify_and_say_which_parts_were_recomputed(golden_name: str) -> None:
    report = verify_run(GOLDEN / golden_name, jobs=1)
    assert report.digest_parts == {"prompt_pack": FROM_MANIFEST, "seed_set": FROM_MANIFEST, "scoring": NOT_RECORDED}
    assert NOT_RECORDED == "not recomputable: no recorded inputs"


def test_golden_prompt_pack_part_edited_and_rehashed_fails_naming_it(tmp_path: Path, golden_name: str) -> None:
    run = golden_copy(tmp_path, golden_name)
    manifest = read_manifest(run)
    manifest["digest"]["prompt_pack"] = OTHER_HASH
    rewrite(run, manifest)
    with pytest.raises(CheckFailed, match=r"manifest\.json: digest\.prompt_pack does not match task\.prompt_pack"):
        verify_run(run, jobs=1)


def test_golden_seed_set_part_edited_and_rehashed_fails_naming_it(tmp_path: Path) -> None:
    run = golden_copy(tmp_path, "addition-v1")
    manifest = read_manifest(run)
    manifest["seeds"]["master"] += 1
    rewrite(run, manifest)
    with pytest.raises(CheckFailed, match=r"manifest\.json: digest\.seed_set does not match seeds"):
        verify_run(run, jobs=1)


def test_a_fewshot_seed_counts_in_the_seed_set_part_only_when_it_differs_from_the_master(tmp_path: Path) -> None:
    """Manifests without ``seeds.fewshot`` verify as before; one equal to the master seed leaves the digest
    alone (same prompts); another one added without re-running changes what the seed set hashes."""
    run = golden_copy(tmp_path, "addition-v1")
    manifest = read_manifest(run)
    for seeds in (manifest["seeds"], manifest["identity"]["seeds"]):  # both records of the seeds, alike
        seeds["fewshot"] = manifest["seeds"]["master"]
    rewrite(run, manifest)
    assert verify_run(run, jobs=1).digest_parts["seed_set"] == FROM_MANIFEST
    for seeds in (manifest["seeds"], manifest["identity"]["seeds"]):
        seeds["fewshot"] = 99
    rewrite(run, manifest)
    with pytest.raises(CheckFailed, match=r"manifest\.json: digest\.seed_set does not match seeds"):
        verify_run(run, jobs=1)


def test_golden_scoring_part_cannot_be_checked_and_the_report_says_so(tmp_path: Path) -> None:
    """A format-1 manifest without digest_inputs records no preimage of its scoring part: an edit
    passes, and verify's report says that part was not recomputed (it claims nothing about it)."""
    run = golden_copy(tmp_path, "addition-v1")
    manifest = read_manifest(run)
    manifest["digest"]["scoring"] = OTHER_HASH
    rewrite(run, manifest)
    assert verify_run(run, jobs=1).digest_parts["scoring"] == NOT_RECORDED


def test_a_run_with_digest_inputs_has_every_part_recomputed(tmp_path: Path, golden_name: str) -> None:
    run = golden_copy(tmp_path, golden_name)
    with_digest_inputs(run)
    assert verify_run(run, jobs=1).digest_parts == dict.fromkeys(("prompt_pack", "seed_set", "scoring"), FROM_INPUTS)


def _with_inputs_rehashed(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Edits, then every digest part recomputed from the (edited) digest_inputs: a consistent forgery."""

    def edit(manifest: dict[str, Any]) -> None:
        for e in edits:
            e(manifest)
        manifest["digest"] = Digest.of_inputs(manifest["digest_inputs"]).as_record()

    return edit


TAMPERING = {
    # a part edited, everything above it rehashed: the part no longer matches its recorded inputs
    "prompt pack part": ("mc-v1", _set("digest.prompt_pack", OTHER_HASH),
                         r"digest\.prompt_pack does not match its recorded inputs"),
    "seed set part": ("addition-v1", _set("digest.seed_set", OTHER_HASH),
                      r"digest\.seed_set does not match its recorded inputs"),
    "scoring part": ("addition-v1", _set("digest.scoring", OTHER_HASH),
                     r"digest\.scoring does not match its recorded inputs"),
    # the manifest edited, the digest left alone: the recorded inputs no longer describe the manifest
    "scorer normalize": ("addition-v1", _set("task.scorer.normalize", ["strip", "lower"]),
                         r"digest_inputs\.scoring\.params differs from task\.scorer"),
    "template": ("addition-v1", _set("task.prompt_pack.templates.user", OTHER_HASH),
                 r"digest_inputs\.prompt_pack\.templates differs from task\.prompt_pack"),
    "shuffle": ("mc-v1", _set("task.choices.shuffle", False),
                r"digest_inputs\.prompt_pack\.choices differs from task\.choices"),
    "decoding": ("addition-v1", _set("decoding.max_tokens", 99),
                 r"task\.prompt_pack\.decoding differs from decoding"),
    "seeds": ("addition-v1", _set("seeds.set", [0, 1]), r"digest_inputs\.seed_set\.set differs from seeds"),
    # the recorded inputs edited and the parts rehashed from them: they disagree with the manifest
    "inputs template": ("mc-v1", _with_inputs_rehashed(_set("digest_inputs.prompt_pack.templates.user", OTHER_HASH)),
                        r"digest_inputs\.prompt_pack\.templates differs from task\.prompt_pack"),
    "inputs scorer": ("addition-v1", _with_inputs_rehashed(_set("digest_inputs.scoring.params.normalize", [])),
                      r"digest_inputs\.scoring\.params differs from task\.scorer"),
    "inputs version": ("addition-v1", _with_inputs_rehashed(_set("digest_inputs.scoring.version", "2")),
                       r"digest_inputs\.scoring\.version '2' differs from the scorer_version in scores\.parquet"),
    "inputs choice scoring": ("mc-v1", _with_inputs_rehashed(_set("digest_inputs.scoring.context.choice_scoring",
                                                                  "letter")),
                              r"digest_inputs\.scoring\.context\.choice_scoring differs from task\.choices\.scoring"),
    "inputs judge model": ("mc-v1",
                           _with_inputs_rehashed(_set("digest_inputs.scoring.context.judge_model", OTHER_HASH)),
                           r"digest_inputs\.scoring\.context\.judge_model differs from the judges' model files"),
    "inputs python": ("addition-v1", _with_inputs_rehashed(_set("digest_inputs.scoring.python", "2.7")),
                      r"digest_inputs\.scoring\.python differs from python"),
    "inputs seeds": ("addition-v1", _with_inputs_rehashed(_set("digest_inputs.seed_set.master", 1)),
                     r"digest_inputs\.seed_set\.master differs from seeds"),
    "fewshot seed": ("addition-v1", _set("seeds.fewshot", 99), r"digest_inputs\.seed_set\.fewshot differs from seeds"),
    "inputs extra field": ("addition-v1", _with_inputs_rehashed(_set("digest_inputs.scoring.note", "x")),
                           r"digest_inputs\.scoring has an unknown field 'note'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_an_edited_manifest_rehashed_to_match_fails_naming_the_part(tmp_path: Path, case: str) -> None:
    name, edit, message = TAMPERING[case]
    run = golden_copy(tmp_path, name)
    manifest = with_digest_inputs(run)
    edit(manifest)
    rewrite(run, manifest)
    with pytest.raises(CheckFailed, match=rf"^{layout.MANIFEST}: {message}"):
        verify_run(run, jobs=1)


def test_identity_digest_must_equal_the_digest() -> None:
    manifest = read_manifest(GOLDEN / "addition-v1")
    manifest["identity"]["digest"] = {**manifest["digest"], "scoring": OTHER_HASH}
    with pytest.raises(CheckFailed, match=r"identity\.digest differs from digest"):
        digest_check.check_digest(manifest)


def test_a_manifest_without_a_section_fails_naming_it() -> None:
    manifest = read_manifest(GOLDEN / "addition-v1")
    manifest["digest_inputs"] = recorded_inputs(manifest)
    manifest["digest"] = Digest.of_inputs(manifest["digest_inputs"]).as_record()
    manifest["identity"]["digest"] = manifest["digest"]
    del manifest["task"]["scorer"]
    with pytest.raises(CheckFailed, match=r"task\.scorer is missing or not an object"):
        digest_check.check_digest(manifest)


# --- summary intervals --------------------------------------------------------------------------


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(0.7, 10)
    assert (low, high) == pytest.approx((0.3968, 0.8922), abs=5e-5)  # the textbook 7/10 example
    assert wilson_interval(1.0, 4) == (pytest.approx(1 / (1 + Z_95**2 / 4)), 1.0)
    assert wilson_interval(0.0, 4) == (0.0, pytest.approx(1 - 1 / (1 + Z_95**2 / 4)))


def test_all_correct_items_get_a_wilson_interval_not_a_point() -> None:
    est = estimate([(i, 0, 1.0) for i in range(4)])
    assert est.interval == "wilson" and est.se == 0.0
    assert est.ci95 == (pytest.approx(0.5101, abs=1e-4), 1.0)  # four items do not prove 100%
    assert estimate([(i, 0, 1.0) for i in range(4)], "clustered").ci95 == (1.0, 1.0)  # the /1 claim


def test_repeats_that_agree_within_each_item_use_wilson_over_items() -> None:
    obs = [(item, r, float(item < 3)) for item in range(5) for r in range(3)]
    est = estimate(obs)
    assert est.interval == "wilson" and est.ci95 == wilson_interval(0.6, 5)  # n = items, not observations


def test_fractional_item_means_get_the_clustered_interval_clipped() -> None:
    obs = [("A", 0, 1.0), ("A", 1, 1.0), ("B", 0, 0.0), ("B", 1, 1.0), ("C", 0, 0.0), ("C", 1, 0.0)]
    se = 0.5 / math.sqrt(3)
    assert estimate(obs, "clustered").ci95 == pytest.approx((0.5 - Z_95 * se, 0.5 + Z_95 * se))  # leaves [0, 1]
    est = estimate(obs)
    assert est.interval == "clustered-clipped" and est.ci95 == (0.0, 1.0)


def test_values_outside_the_unit_interval_keep_the_clustered_interval() -> None:
    est = estimate([("a", 0, -2.0), ("b", 0, 3.0), ("c", 0, 0.5)])
    assert est.interval == "clustered" and est.ci95 is not None and est.ci95[0] < 0 and est.ci95[1] > 1


def test_every_bounded_interval_lies_in_the_unit_interval() -> None:
    for n in range(2, 30):
        for k in range(n + 1):
            est = estimate([(i, 0, float(i < k)) for i in range(n)])
            assert est.ci95 is not None and 0.0 <= est.ci95[0] <= est.mean <= est.ci95[1] <= 1.0


def test_one_item_claims_no_interval() -> None:
    est = estimate([("a", 0, 1.0), ("a", 1, 1.0)])
    assert est.ci95 is None and est.interval == "none"


def test_new_summaries_are_format_5_and_name_their_interval() -> None:
    scores = pq.read_table(GOLDEN / "addition-v1" / layout.SCORES)
    summary = summarize(scores)
    assert summary["format"] == SUMMARY_FORMAT == "evalrun.summary/5"
    assert "Wilson" in summary["method"] and "clipped to [0, 1]" in summary["method"]
    metric = summary["tasks"]["addition"]["exact_match"]
    assert metric["interval"] == "wilson" and 0.5 < metric["ci95"][0] < 1.0 == metric["ci95"][1]


def test_a_perplexity_metric_reports_exp_of_minus_the_mean_loglikelihood_from_format_4() -> None:
    """lm-eval's perplexity: each document's value its loglikelihood, the aggregate exp(-mean); /3 summaries, and
    other metrics, hold no such field, and a mean beyond exp's range leaves it out rather than write infinity."""

    def table(metric: str, values: list[float]) -> pa.Table:
        n = len(values)
        return pa.table({"episode_id": [f"{i:064x}" for i in range(n)], "task": ["t"] * n,
                         "item_id": [str(i) for i in range(n)], "seed": [0] * n, "repeat": [0] * n,
                         "metric": [metric] * n, "value": values, "extracted": [None] * n,
                         "scorer": ["lm_eval"] * n, "scorer_version": ["1"] * n}, schema=SCORES_NO_ERROR)  # fmt: skip

    summary = summarize(table("perplexity", [-1.0, -2.0, -3.0]))
    assert summary["tasks"]["t"]["perplexity"]["perplexity"] == pytest.approx(math.exp(2.0))
    assert summary["overall"]["perplexity"]["mean"] == pytest.approx(-2.0)
    old = summarize(table("perplexity", [-1.0, -2.0]), "evalrun.summary/3")
    assert "perplexity" not in old["tasks"]["t"]["perplexity"]
    assert "perplexity" not in summarize(table("acc", [0.0, 1.0]))["tasks"]["t"]["acc"]
    assert "perplexity" in summarize(table("perplexity/none", [-1.0]))["tasks"]["t"]["perplexity/none"]
    assert "perplexity" not in summarize(table("perplexity", [-800.0, -900.0]))["tasks"]["t"]["perplexity"]
    failed = summarize(table("perplexity", [-1.0, 0.0]), failed=[f"{1:064x}"])["tasks"]["t"]["perplexity"]
    assert failed["errors"] == 1 and "perplexity" not in failed  # its 0 is no loglikelihood


def test_format_1_summaries_are_recomputed_with_the_old_method(golden_name: str) -> None:
    run = GOLDEN / golden_name
    stored = json.loads((run / layout.SUMMARY).read_text(encoding="utf-8"))
    assert stored["format"] == "evalrun.summary/1"
    recomputed = summarize(pq.read_table(run / layout.SCORES), "evalrun.summary/1")
    assert canonical_json(recomputed) + "\n" == (run / layout.SUMMARY).read_text(encoding="utf-8")


def test_verify_recomputes_a_format_2_summary_and_rejects_a_mislabelled_one(tmp_path: Path) -> None:
    run = golden_copy(tmp_path, "addition-v1")
    new = summarize(pq.read_table(run / layout.SCORES))
    rewrite(run, summary=new)
    verify_run(run, jobs=1)  # a /2 summary is recomputed with the /2 method
    rewrite(run, summary={**new, "format": "evalrun.summary/1"})  # /2 numbers under the /1 label
    with pytest.raises(CheckFailed, match=r"summary\.json: does not match the evalrun\.summary/1 summary"):
        verify_run(run, jobs=1)
    rewrite(run, summary={**new, "format": "evalrun.summary/9"})
    with pytest.raises(CheckFailed, match=r"summary\.json: unknown summary format 'evalrun\.summary/9'"):
        verify_run(run, jobs=1)


def test_rescore_of_a_golden_run_with_its_own_scorer_is_identical(tmp_path: Path, golden_name: str) -> None:
    run = golden_copy(tmp_path, golden_name)
    report = rescore_run(run, [])
    assert report.identical and report.bytes_identical and not report.scorer_changed and report.written is None


def test_rescore_writes_format_5_summaries_for_new_scores(tmp_path: Path) -> None:
    run = golden_copy(tmp_path, "addition-v1")
    report = rescore_run(run, ["name=number"])
    assert report.written is not None and report.scorer_changed
    summary = json.loads((report.written / layout.SUMMARY).read_text(encoding="utf-8"))
    assert summary["format"] == "evalrun.summary/5"
    assert summary["tasks"]["addition"]["number_match"]["interval"] == "wilson"
    verify_run(run, jobs=1)  # the run itself is untouched


SCORES_NO_ERROR = pa.schema([f for f in SCORES_SCHEMA if f.name != "error"])


# --- replay verdicts ----------------------------------------------------------------------------


def test_replaying_a_golden_run_now_is_not_a_reproduction(golden_name: str) -> None:
    report = replay_run(GOLDEN / golden_name, [])
    assert report.matches and not report.same_code
    assert report.verdict.startswith(f"replayed with different code (recorded {GOLDEN_COMMIT}/0.1.0, now ")
    assert report.verdict.endswith("this tests the new code, it is not a reproduction")
    record = report.as_record()
    assert json.loads(canonical_json(record)) == record  # plain JSON
    assert record["same_code"] is False and record["verdict"] == report.verdict
    assert record["code"]["recorded"] == [{"git_commit": GOLDEN_COMMIT, "name": "evalrun", "version": "0.1.0"}]


def test_replaying_with_the_recording_code_is_a_reproduction(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = read_manifest(GOLDEN / "mc-v1")["generator"]
    monkeypatch.setattr(replay_module, "generator_info", lambda: dict(recorded))
    monkeypatch.setattr(replay_module, "git_state", lambda: {"commit": recorded["git_commit"], "dirty": False})
    report = replay_run(GOLDEN / "mc-v1", [])
    assert report.same_code and report.matches
    assert report.verdict == (f"reproduced with the recording code ({GOLDEN_COMMIT}/0.1.0): every head, the Merkle "
                              "root and the scores came out as recorded")  # fmt: skip
    assert report.as_record()["same_code"] is True


GENERATOR = {"git_commit": "a" * 40, "name": "evalrun", "version": "1.0"}


def _report(code: CodeIdentity, overrides: tuple[str, ...] = (), diverged: bool = False) -> ReplayReport:
    return ReplayReport(episodes=3, reproduced=3, divergences=(), root_matches=not diverged,
                        scores_identical=None if diverged else True, code=code, overrides=overrides)  # fmt: skip


@pytest.mark.parametrize(
    ("recorded", "recorded_dirty", "current", "current_dirty", "why"),
    [
        ((GENERATOR,), False, {**GENERATOR, "version": "1.1"}, False, "a version"),
        ((GENERATOR,), False, {**GENERATOR, "git_commit": "b" * 40}, False, "a commit"),
        ((GENERATOR,), True, GENERATOR, False, "uncommitted changes when recorded"),
        ((GENERATOR,), False, GENERATOR, True, "uncommitted changes now"),
        ((GENERATOR,), None, GENERATOR, False, "no recorded working tree state"),
        ((GENERATOR, {**GENERATOR, "git_commit": "b" * 40}), False, GENERATOR, False, "a run resumed by other code"),
        ((GENERATOR,), False, {**GENERATOR, "git_commit": None}, False, "an unknown current commit"),
    ],
)
def test_any_doubt_about_the_code_is_reported_as_different_code(
    recorded: tuple[dict[str, Any], ...], recorded_dirty: bool | None, current: dict[str, Any],
    current_dirty: bool | None, why: str,
) -> None:  # fmt: skip
    code = CodeIdentity(recorded, recorded_dirty, current, current_dirty)
    assert not code.same_code, why
    assert _report(code).verdict.startswith("replayed with different code (recorded ")


def test_overrides_and_failures_are_in_the_verdict() -> None:
    same = CodeIdentity((GENERATOR,), False, GENERATOR, False)
    assert same.same_code
    assert _report(same, ("task.template=x.j2",)).verdict.endswith("this tests the changed config, it is not a "
                                                                   "reproduction")  # fmt: skip
    assert _report(same, diverged=True).verdict.startswith("not reproduced with the recording code")


# --- determinism=strict ---------------------------------------------------------------------------

STRICT = {"name": "strict", "enabled": True, "batch_invariant": True, "cublas_workspace_config": ":4096:8",
          "disable_v1_multiprocessing": True}  # fmt: skip
OFF = {"name": "off", "enabled": False, "batch_invariant": False, "cublas_workspace_config": "",
       "disable_v1_multiprocessing": True}  # fmt: skip


@pytest.fixture
def torch_state(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The environment and torch flags apply() sets, restored afterwards."""
    import torch

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT", "CUBLAS_WORKSPACE_CONFIG",
                 "VLLM_CPU_ATTN_SPLIT_KV"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)  # fmt: skip
    yield torch
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


def test_strict_means_a_nondeterministic_op_raises(torch_state: Any) -> None:
    torch = torch_state
    report = determinism.apply(STRICT, seed=0, engine="vllm")
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert report["honoured"]["torch_deterministic_algorithms"] is True
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        torch.zeros(3).put_(torch.tensor([0, 0]), torch.ones(2))  # nondeterministic on CPU too


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="the CPU record")
def test_strict_on_cpu_records_what_was_not_honoured_and_why(torch_state: Any) -> None:
    report = determinism.apply(STRICT, seed=0, engine="vllm")
    assert report["asked"] == {k: v for k, v in STRICT.items() if k != "name"}
    honoured = report["honoured"]
    assert honoured["batch_invariant"] is False and honoured["cublas_workspace_config"] is None
    assert honoured["seeded"] and honoured["disable_v1_multiprocessing"] and not honoured["cudnn_benchmark"]
    notes = " | ".join(report["notes"])
    assert "VLLM_BATCH_INVARIANT needs an NVIDIA GPU" in notes and "CUBLAS_WORKSPACE_CONFIG acts on CUDA" in notes
    assert len(report["notes"]) == 2  # one reason per setting asked and not honoured


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="the CPU record")
def test_strict_turns_off_vllms_split_kv_attention_on_cpu_and_records_it(torch_state: Any) -> None:
    """The batch-dependent kernel the canary found on this CPU (docs/nondeterminism.md "Canary")."""
    report = determinism.apply(STRICT, seed=0, engine="vllm")
    assert os.environ["VLLM_CPU_ATTN_SPLIT_KV"] == "0" and report["honoured"]["cpu_attn_split_kv"] is False
    assert any("VLLM_CPU_ATTN_SPLIT_KV=0" in n for n in report["notes"])
    assert determinism.apply(STRICT, seed=0, engine="hf")["honoured"]["cpu_attn_split_kv"] is None  # not vLLM
    os.environ.pop("VLLM_CPU_ATTN_SPLIT_KV")
    assert determinism.apply(OFF, seed=0, engine="vllm")["honoured"]["cpu_attn_split_kv"] is True  # vLLM's default
    assert "VLLM_CPU_ATTN_SPLIT_KV" not in os.environ  # off sets nothing


def test_batch_invariance_is_honoured_only_by_vllm_on_a_capable_gpu(
    torch_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(determinism, "_cuda_capability", lambda: (9, 0))
    report = determinism.apply(STRICT, seed=0, engine="vllm")
    assert report["honoured"]["batch_invariant"] is True and report["notes"] == []
    assert report["honoured"]["cpu_attn_split_kv"] is None  # a GPU: vLLM's CPU attention is not used
    assert report["honoured"]["cublas_workspace_config"] == ":4096:8"
    report = determinism.apply(STRICT, seed=0, engine="hf")
    assert report["honoured"]["batch_invariant"] is False
    assert report["notes"] == ["VLLM_BATCH_INVARIANT acts on vLLM only; this worker's engine is hf"]


def test_a_vllm_engine_core_in_another_process_is_not_claimed_deterministic(torch_state: Any) -> None:
    report = determinism.apply({**STRICT, "disable_v1_multiprocessing": False}, seed=0, engine="vllm")
    assert report["honoured"]["torch_deterministic_algorithms"] is False and report["honoured"]["seeded"] is False
    assert any("child process" in n for n in report["notes"])


def test_off_turns_deterministic_algorithms_off_and_claims_nothing(torch_state: Any) -> None:
    torch = torch_state
    determinism.apply(STRICT, seed=0, engine="vllm")
    report = determinism.apply(OFF, seed=0, engine="vllm")
    assert not torch.are_deterministic_algorithms_enabled()
    assert report["honoured"]["torch_deterministic_algorithms"] is False and report["notes"] == []
