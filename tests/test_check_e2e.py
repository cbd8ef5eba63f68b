"""`evalrun check` on real runs of the shared engine (issue 14, item 1): a default run passes all three checks;
a run whose stored outputs were altered and rehashed consistently fails the repeat at the altered token; an
agent run whose world code changed fails the replay at the first line the world now writes differently."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from tokenizers import Tokenizer

from evalrun.audit.check import check_run, sample_items
from evalrun.audit.rescore import recorded_context, recorded_scorer
from evalrun.audit.verify import verify_run
from evalrun.cli import render
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.records.canonical import canonical_json, file_sha256
from evalrun.records.chain import GENESIS, link
from evalrun.records.formats import CHECK_FORMAT, Record, seal_of
from evalrun.records.merkle import merkle_root
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record, read_manifest, read_outputs
from evalrun.scoring import score_columns, score_outputs
from evalrun.stats.summary import resummarize
from evalrun.worlds import WORLDS
from evalrun.worlds.invoice_desk import InvoiceDeskV2

pytestmark = pytest.mark.e2e  # the shared engine


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def render_text(report: object) -> str:
    out = io.StringIO()
    render.render_check(Console(file=out, width=200, markup=False, emoji=False, highlight=False), report)  # type: ignore[arg-type]
    return out.getvalue()


def test_a_default_run_passes_all_three_checks_here(audit_run: Path, dispatcher: Dispatcher, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    before = listing(audit_run)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = check_run(audit_run, dispatcher=dispatcher)
    assert [(v.check, v.passed) for v in report.verdicts] == [("replay", True), ("rescore", True), ("repeat", True)]
    assert report.passed and report.failure() == ""
    repeat = report.repeat
    assert repeat is not None and repeat.items_in_run == 12 and len(repeat.items) == 8  # the default N
    master = read_manifest(layout.RunDir(audit_run))["seeds"]["master"]
    assert repeat.items == sample_items(read_outputs(layout.RunDir(audit_run), ["item_id"]).column(0).to_pylist(), 8,
                                        master, "addition")  # fmt: skip
    assert repeat.episodes == repeat.identical_tokens == repeat.same_heads == 8 and repeat.tarr == repeat.tara == 1.0
    assert repeat.max_abs_logprob_diff == 0.0 and repeat.first_divergence is None
    assert [(m.metric, m.inside) for m in repeat.means] == [("exact_match", True)]
    assert repeat.means[0].repeat_mean == repeat.means[0].original_mean
    assert {d.category for d in repeat.settings} <= {"dispatch"}  # same engine, hardware and software
    assert repeat.run_dir is None and listing(scratch) == [] and listing(audit_run) == before  # removed; untouched

    record = json.loads(canonical_json(report.as_record()))
    assert record["format"] == CHECK_FORMAT and record["passed"] is True
    assert record["repeat"]["items"] == list(repeat.items) and record["repeat"]["seed"]["purpose"] == "check-repeat"
    text = render_text(report)
    assert "replay    PASS" in text and "repeat    PASS" in text and text.rstrip().endswith("on this machine")

    kept = check_run(audit_run, repeat_items=2, dispatcher=dispatcher, keep=tmp_path / "kept")
    assert kept.passed and kept.repeat is not None and kept.repeat.run_dir == str(tmp_path / "kept")
    assert len(kept.repeat.items) == 2 and set(kept.repeat.items) < set(repeat.items)
    assert verify_run(tmp_path / "kept").episodes == 2  # a real run directory


# --- a consistent forgery of one generated token ---------------------------------------------------


def forge_token(run: Path, episode_id: str, index: int) -> tuple[int, int]:
    """Change the ``index``-th generated token of one episode (and its text) and recompute everything a careful
    forger would: the chain line and the links after it, the output row, the Merkle root, the scores and
    summary, record.json (file hashes, seal) and the attestation. Returns (old token, new token)."""
    rundir = layout.RunDir(run)
    manifest = read_manifest(rundir)
    tokenizer = Tokenizer.from_file(str(Path(manifest["model"]["path"]) / "tokenizer.json"))
    digits = [tokenizer.token_to_id(d) for d in "0123456789"]
    tokens: list[int] = []
    for log in sorted(rundir.log.glob("*.jsonl")):
        lines = log.read_text(encoding="utf-8").splitlines()
        head, touched = GENESIS, False
        for i, line in enumerate(lines):
            value = json.loads(line)
            if value["episode"] != episode_id:
                continue
            touched = True
            value["prev"] = head
            if value["kind"] == "model":
                tokens = list(value["response"]["token_ids"])
                old = tokens[index]
                tokens[index] = next(d for d in digits if d != old)
                value["response"]["token_ids"] = tokens
                value["response"]["text"] = tokenizer.decode(tokens)
            lines[i] = canonical_json(value)
            head = link(head, lines[i])
        if touched:
            log.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            break
    for part in rundir.output_parts():
        table = pq.read_table(part)
        rows = table.to_pylist()
        for row in rows:
            if row["episode_id"] == episode_id:
                row.update(output=tokenizer.decode(tokens), token_ids=tokens, head=head)
                writer.write_atomic(part, writer.table_bytes(pa.Table.from_pylist(rows, schema=table.schema)))
    spec = recorded_scorer(rundir)
    scores = score_outputs(read_outputs(rundir, score_columns(spec)), spec, recorded_context(rundir, None)[0])
    writer.write_atomic(rundir.scores, writer.table_bytes(scores))
    writer.write_json(rundir.summary, resummarize(scores, json.loads(rundir.summary.read_text(encoding="utf-8"))))
    record = load_record(rundir)
    heads = read_outputs(rundir, ["episode_id", "head"]).to_pydict()
    files = {rel: file_sha256(run / rel) for rel in record.files}
    forged = Record.model_validate({**record.as_record(), "files": files, "manifest_sha256": files[layout.MANIFEST],
                                    "merkle_root": merkle_root(zip(*heads.values(), strict=True))})  # fmt: skip
    forged = forged.model_copy(update={"seal": seal_of(forged)})
    writer.write_json(rundir.record, forged)
    write_attestation(rundir, forged, None)
    return old, tokens[index]


def test_a_consistently_rewritten_output_fails_the_repeat_at_the_altered_token(
    audit_run: Path, dispatcher: Dispatcher, tmp_path: Path
) -> None:
    run = Path(shutil.copytree(audit_run, tmp_path / "run"))
    outputs = read_outputs(layout.RunDir(run), ["episode_id", "item_id"]).to_pydict()
    master = read_manifest(layout.RunDir(run))["seeds"]["master"]
    item = sample_items(outputs["item_id"], 4, master, "addition")[0]
    episode = outputs["episode_id"][outputs["item_id"].index(item)]
    old, new = forge_token(run, episode, 1)
    verify_run(run)  # the forgery is consistent: everything verify recomputes agrees

    report = check_run(run, repeat_items=4, dispatcher=dispatcher)
    assert [(v.check, v.passed) for v in report.verdicts] == [("replay", True), ("rescore", True), ("repeat", False)]
    divergence = f"episode {episode} call 0 token 1 (original token {new}, repeat {old})"
    assert report.repeat is not None and report.repeat.first_divergence == divergence
    assert report.failure() == f"repeat: {divergence}"
    assert report.repeat.identical_tokens == report.repeat.episodes - 1 and report.repeat.tarr == 0.75
    assert "repeat    FAIL" in render_text(report)


# --- an agent run whose world code changed ---------------------------------------------------------


def test_an_agent_run_whose_world_code_changed_fails_the_replay_naming_the_first_divergence(
    run_eval, dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_eval("task=invoice_desk", "limit=2")
    assert check_run(run, dispatcher=dispatcher).passed
    # the world's code changed without a version bump (version 2's behaviour under version 1's name): replayed in
    # this process, against the changed world (the repeat's episodes run in the shared engine's worker)
    monkeypatch.setitem(WORLDS._plugins, "invoice-desk@1", type("Drifted", (InvoiceDeskV2,), {"version": "1"}))
    report = check_run(run, dispatcher=dispatcher)
    replay = report.verdicts[0]
    assert replay.check == "replay" and not replay.passed and report.verdicts[1].passed  # stored final states rescore
    assert report.replay is not None and report.replay.divergences
    first = report.replay.divergences[0]
    assert first.seq is not None and first.seq > 0  # the header (world name and versions) agrees; a later line not
    assert replay.first_divergence is not None
    assert replay.first_divergence.startswith(f"episode {first.episode} seq {first.seq}: expected ")
    assert report.failure() == f"replay: {replay.first_divergence}"
