"""verify, rescore, replay, proofs and attestations on a real run of the real engine (issue 4)."""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from evalrun import cli
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS
from evalrun.errors import BadInput, CheckFailed

pytestmark = pytest.mark.e2e  # starts the engine


@pytest.fixture
def run_copy(audit_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(audit_run, tmp_path / "run"))


def root_of(run: Path) -> str:
    return json.loads((run / "record.json").read_text())["merkle_root"]


def expect_caught(run: Path, rel: str, what: str) -> None:
    with pytest.raises(CheckFailed) as info:
        verify_run(run, jobs=1)
    message = str(info.value)
    assert rel in message, f"{what}: {message}"  # the first bad location is in the tampered file


def test_intact_run_verifies_and_every_tamper_is_caught(run_copy: Path) -> None:
    assert cli.main(["verify", str(run_copy)]) == 0
    assert cli.main(["verify", str(run_copy), "--expect-root", root_of(run_copy)]) == 0
    rng = random.Random(4)
    files = sorted(p for d in ("log", "outputs") for p in (run_copy / d).iterdir())
    assert len(files) == 6  # three parts
    checked = 0
    for path in files:
        rel = f"{path.parent.name}/{path.name}"
        original = path.read_bytes()
        try:
            # single-byte changes, sampled over the whole file
            for pos in sorted(rng.sample(range(len(original)), min(60, len(original)))):
                data = bytearray(original)
                data[pos] = (data[pos] + rng.randrange(1, 256)) % 256
                path.write_bytes(bytes(data))
                expect_caught(run_copy, rel, f"byte {pos}")
                checked += 1
            # truncations, including to nothing
            for size in sorted({0, 1, len(original) - 1, *rng.sample(range(len(original)), 5)}):
                path.write_bytes(original[:size])
                expect_caught(run_copy, rel, f"truncated to {size}")
                checked += 1
            if path.suffix == ".jsonl":
                lines = original.decode().splitlines(keepends=True)
                for i in range(len(lines)):  # every deleted line
                    path.write_bytes("".join(lines[:i] + lines[i + 1 :]).encode())
                    expect_caught(run_copy, rel, f"line {i + 1} deleted")
                    checked += 1
                swaps = [(i, i + 1) for i in range(len(lines) - 1)]
                swaps += [tuple(sorted(rng.sample(range(len(lines)), 2))) for _ in range(10)]
                for i, j in swaps:  # adjacent pairs and random pairs
                    swapped = list(lines)
                    swapped[i], swapped[j] = swapped[j], swapped[i]
                    path.write_bytes("".join(swapped).encode())
                    expect_caught(run_copy, rel, f"lines {i + 1} and {j + 1} swapped")
                    checked += 1
        finally:
            path.write_bytes(original)
    assert checked > 450
    assert cli.main(["verify", str(run_copy)]) == 0  # restored: intact again


def test_verify_exit_codes(run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(tmp_path / "nothing-here")]) == 2
    assert cli.main(["verify", str(run_copy), "--expect-root", "0" * 64]) == 1
    first = sorted((run_copy / "log").iterdir())[0]
    first.write_bytes(first.read_bytes().replace(b'"seq":1', b'"seq":7', 1))
    assert cli.main(["verify", str(run_copy)]) == 1
    err = capsys.readouterr().err
    assert "log/part-00000.jsonl:2" in err and "seq 7" in err


def test_rescore_is_bit_identical_100_times_and_a_changed_scorer_reports_per_task(run_copy: Path) -> None:
    before = (run_copy / "scores.parquet").read_bytes()
    for _ in range(100):
        report = rescore_run(run_copy, [])
        assert report.identical and report.bytes_identical and not report.scorer_changed
    assert (run_copy / "scores.parquet").read_bytes() == before
    assert cli.main(["rescore", str(run_copy)]) == 0
    changed = rescore_run(run_copy, ["task.scorer.name=number", "extract=last"])
    assert changed.scorer_changed and not changed.identical and changed.written is not None
    assert (changed.written / "scores.parquet").is_file() and (changed.written / "summary.json").is_file()
    assert {(d.task, d.metric) for d in changed.diffs} == {("addition", "exact_match"), ("addition", "number_match")}
    assert cli.main(["rescore", str(run_copy), "name=number"]) == 0
    assert cli.main(["rescore", str(run_copy), "nosuchfield=1"]) == 2
    assert cli.main(["verify", str(run_copy)]) == 0  # rescoring writes beside the run, never over it


def test_replay_reproduces_heads_and_scores_without_an_engine(run_copy: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "vllm", None)  # any import of vllm now fails
    monkeypatch.setitem(sys.modules, "evalrun.engines.vllm", None)
    import evalrun.pipeline.worker

    def no_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("replay constructed a live engine")

    monkeypatch.setattr(evalrun.pipeline.worker, "_build_engine", no_engine)
    assert cli.main(["replay", str(run_copy)]) == 0
    assert "12 episodes replayed" in capsys.readouterr().out


def test_replay_after_a_one_character_template_change_diverges_at_the_model_call(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evalrun.audit.replay import replay_run

    text = (BUILTIN_TASKS / "addition" / "template.jinja").read_text(encoding="utf-8")
    assert "Q:" in text
    changed = tmp_path / "template.jinja"
    changed.write_text(text.replace("Q:", "Q;", 1), encoding="utf-8")
    report = replay_run(run_copy, [f"task.template={changed}"])
    assert report.reproduced == 0 and len(report.divergences) == 12
    first = report.divergences[0]
    assert first.seq == 1 and "request.prompt" in first.expected and "Q;" in first.got
    assert cli.main(["replay", str(run_copy), f"task.template={changed}"]) == 1
    out = capsys.readouterr()
    assert "seq 1" in out.out and "diverge" in out.err


def test_replay_refuses_an_unknown_schedule_format(run_copy: Path) -> None:
    log = sorted((run_copy / "log").iterdir())[0]
    log.write_bytes(log.read_bytes().replace(b"evalrun.schedule/1", b"evalrun.schedule/9", 1))
    assert cli.main(["replay", str(run_copy)]) == 2
    assert cli.main(["verify", str(run_copy)]) == 1


def test_inclusion_proof_for_every_episode(run_copy: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root = root_of(run_copy)
    ids = [
        e for p in sorted((run_copy / "outputs").iterdir()) for e in pq.read_table(p).column("episode_id").to_pylist()
    ]
    for eid in ids:
        proof = tmp_path / f"{eid}.json"
        assert cli.main(["prove", str(run_copy), eid, "-o", str(proof)]) == 0
        assert cli.main(["verify-proof", str(proof), "--root", root]) == 0
    assert cli.main(["verify-proof", str(proof), "--root", "1" * 64]) == 1
    data = json.loads(proof.read_text())
    data["lines"][1] = data["lines"][1].replace('"text":"', '"text":"9', 1)
    proof.write_text(json.dumps(data))
    assert cli.main(["verify-proof", str(proof), "--root", root]) == 1
    proof.write_text("{not json")
    assert cli.main(["verify-proof", str(proof), "--root", root]) == 2
    assert cli.main(["prove", str(run_copy), "no-such-episode"]) == 2


def test_a_proof_from_a_step_discloses_the_rest_of_the_chain_and_names_what_was_tampered(
    run_eval, tmp_path: Path
) -> None:
    """``prove --from SEQ``: an agent episode's entries from SEQ on, after the hash before SEQ, chain to its head
    and the head to the root, while the header (its system prompt) and the earlier steps stay private; an edited,
    moved or missing disclosed entry fails verify-proof naming the entry."""
    from evalrun.records.chain import GENESIS, link

    run = run_eval("task=invoice_desk", "limit=1")
    root = root_of(run)
    lines = next((run / "log").glob("part-*.jsonl")).read_text().splitlines()
    episode = json.loads(lines[0])["episode"]
    chain = [line for line in lines if json.loads(line)["episode"] == episode]
    assert len(chain) > 6
    proof_path = tmp_path / "proof.json"
    assert cli.main(["prove", str(run), episode, "--from", "4", "-o", str(proof_path)]) == 0
    proof = json.loads(proof_path.read_text())
    before = GENESIS
    for line in chain[:4]:
        before = link(before, line)
    assert proof["from_seq"] == 4 and proof["prev"] == before and proof["lines"] == chain[4:]
    assert chain[0] not in proof_path.read_text()  # the header, with the task's prompt, is not disclosed
    assert cli.main(["verify-proof", str(proof_path), "--root", root]) == 0

    def fails(lines: list[str], named: str, **fields: object) -> None:
        forged = tmp_path / "forged.json"
        forged.write_text(json.dumps({**proof, "lines": lines, **fields}))
        with pytest.raises(CheckFailed, match=named):
            from evalrun.audit.proofs import check_proof, load_proof

            check_proof(load_proof(forged), root)
        assert cli.main(["verify-proof", str(forged), "--root", root]) == 1

    disclosed = proof["lines"]
    observation = json.loads(disclosed[1])  # what list_invoices returned: an auditor's figure edited
    assert observation["kind"] == "observation" and '"total":' in disclosed[1]
    edited = re.sub(r'"total":(\d+)', lambda m: f'"total":{int(m.group(1)) + 1}', disclosed[1], count=1)
    fails([disclosed[0], edited, *disclosed[2:]], r"seq 6: disclosed chain entry does not link to entry 5 \(that one")
    fails([disclosed[0], "not a line", *disclosed[2:]], r"seq 5: disclosed line is not a chain entry")
    fails([disclosed[0], *disclosed[2:]], r"seq 5: the disclosed line is entry 6")  # one left out
    fails([disclosed[1], disclosed[0], *disclosed[2:]], r"seq 4: the disclosed line is entry 5")  # reordered
    fails(disclosed[:-1], rf"after entry {len(chain) - 2}, not at head")  # cut short
    fails(disclosed, r"seq 4: disclosed chain entry does not link to the proof's prev", prev="1" * 64)
    assert cli.main(["prove", str(run), episode, "--from", str(len(chain))]) == 2


def test_attestation_written_by_the_run_and_signed_on_request(run_copy: Path, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    statement = json.loads((run_copy / "attestation.intoto.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    record = json.loads((run_copy / "record.json").read_text())
    assert statement["predicate"]["merkle_root"] == record["merkle_root"]
    assert statement["predicate"]["digest"] == record["digest"]
    names = {s["name"] for s in statement["subject"]}
    assert names == {"record.json", *record["files"]}

    key = ed25519.Ed25519PrivateKey.generate()
    private, public, other = tmp_path / "key.pem", tmp_path / "key.pub", tmp_path / "other.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    for path, k in ((public, key), (other, ed25519.Ed25519PrivateKey.generate())):
        path.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    assert cli.main(["verify", str(run_copy), "--public-key", str(public)]) == 1  # not signed yet
    assert cli.main(["attest", str(run_copy), "--key", str(private)]) == 0
    assert verify_run(run_copy, public_key=public).attestation == "signature checked"
    assert cli.main(["verify", str(run_copy), "--public-key", str(other)]) == 1
    assert cli.main(["verify", str(run_copy), "--public-key", str(tmp_path / "missing.pub")]) == 2
    with pytest.raises(BadInput):
        verify_run(run_copy, public_key=private)  # a private key is not a public key
    summary = run_copy / "summary.json"
    summary.write_bytes(summary.read_bytes())  # unchanged bytes: still fine
    assert cli.main(["verify", str(run_copy), "--public-key", str(public)]) == 0
    envelope = json.loads((run_copy / "attestation.intoto.json").read_text())
    envelope["signatures"][0]["sig"] = envelope["signatures"][0]["sig"][::-1]
    (run_copy / "attestation.intoto.json").write_text(json.dumps(envelope))
    assert cli.main(["verify", str(run_copy), "--public-key", str(public)]) == 1
