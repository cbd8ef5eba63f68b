"""Checkpointed seals on the real engine: a run commits what is durable while it runs (checkpoints, signed when a
signing key is set, anchored in run.ledger), a run killed after its third checkpoint keeps them and, resumed,
verifies against all of them, and an edited checkpoint fails verify naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.forgery import reseal

from evalrun.audit.ledger import read_ledger, verify_anchored
from evalrun.audit.verify import verify_run
from evalrun.config import load
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import check_before_engine, resume
from evalrun.records.canonical import canonical_json
from evalrun.records.formats import checkpoint_hash
from evalrun.rundir import layout
from evalrun.rundir.checkpoints import read_checkpoints

pytestmark = pytest.mark.e2e

RUN = ("cluster=inline", "limit=12", "cluster.batch_size=2", "run.checkpoint_every_parts=1", "run.progress=false",
       "report=false")  # fmt: skip


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A run (6 parts, a checkpoint after each) SIGKILLed right after its third checkpoint, as a user runs it."""
    root = tmp_path_factory.mktemp("killed")
    run, ledger = root / "run", root / "ledger.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EVALRUN_FAILPOINT": "after-checkpoint-2"}
    env.pop("EVALRUN_SIGNING_KEY", None)
    done = subprocess.run([sys.executable, "-m", "evalrun.cli", "run", *RUN, f"run.dir={run}", f"run.ledger={ledger}"],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == -9, done.stderr[-3000:]
    yield run, ledger


def test_a_run_killed_after_its_third_checkpoint_keeps_them_and_resumed_verifies_against_all(
    killed: tuple[Path, Path], inline_dispatcher: Dispatcher, tmp_path: Path
) -> None:
    original, original_ledger = killed
    run, ledger = Path(shutil.copytree(original, tmp_path / original.name)), tmp_path / "ledger.jsonl"
    shutil.copy(original_ledger, ledger)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace(str(original_ledger), str(ledger)))
    found = read_checkpoints(layout.RunDir(run))
    assert [c.seq for _, c in found] == [0, 1, 2] and [c.episodes for _, c in found] == [2, 4, 6]
    anchored = read_ledger(ledger).lines
    assert [line.entry.run for line in anchored] == [f"{run.name}/checkpoint-00000{k}" for k in range(3)]
    assert [line.entry.seal for line in anchored] == [checkpoint_hash(c) for _, c in found]
    assert all(c.parts.keys() < found[-1][1].parts.keys() for _, c in found[:-1])  # each covers the ones before

    assert resume(run, [], inline_dispatcher) == run
    after = read_checkpoints(layout.RunDir(run))
    assert [c.seq for _, c in after][:3] == [0, 1, 2] and after[:3] == found  # kept as they were, then more
    assert after[-1][1].prev == checkpoint_hash(after[-2][1]) and after[-1][1].episodes <= 12
    report = verify_anchored(run, ledger)
    assert report.checkpoints == f"{len(after)} checked (unsigned)"
    assert f"{len(after)} of {len(after)} checkpoints anchored" in report.ledger  # and the finished run itself
    assert read_ledger(ledger).lines[-1].entry.run == run.name

    # a checkpoint edited afterwards: its bytes no longer match the record; rewritten consistently (every hash,
    # the seal), its root no longer matches the heads it covered, or (its provenance only) the next checkpoint's
    # prev no longer chains to it; the last one's provenance only: the ledger's hash of it
    last = len(after) - 1
    for seq, change, named in (
        (1, lambda c: c, r"checkpoints/checkpoint-000001.json: sha256 differs from record.json"),
        (1, lambda c: {**c, "merkle_root": "0" * 64}, r"checkpoint-000001.json: merkle_root 0{64} differs from the "
                                                      r"root of the final heads of the 4 episodes it covered"),
        (1, lambda c: {**c, "created_at": "2020-01-01T00:00:00+00:00"}, r"checkpoint-000002.json: prev [0-9a-f]{64} "
                                                                        r"is not the hash of the checkpoint before it"),
        (last, lambda c: {**c, "created_at": "2020-01-01T00:00:00+00:00"},
         rf"checkpoint-{last:06d}.json: anchored at .* line {last + 1} with seal"),
    ):  # fmt: skip
        forged = Path(shutil.copytree(run, tmp_path / "forged" / run.name))
        path = forged / "checkpoints" / f"checkpoint-{seq:06d}.json"
        checkpoint = json.loads(path.read_text())
        path.write_text(canonical_json(change(checkpoint)) + ("\n" if change(checkpoint) != checkpoint else " \n"))
        if "sha256 differs" not in named:
            reseal(forged)  # a careful forger: every hash, the seal and the attestation made to match
        with pytest.raises(CheckFailed, match=named):
            verify_anchored(forged, ledger)
        shutil.rmtree(forged)


def test_resume_refuses_a_run_whose_checkpoint_lists_a_part_it_lost(killed: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:  # fmt: skip
    original, _ = killed
    run = Path(shutil.copytree(original, tmp_path / "run"))
    (run / "outputs" / "part-00001.parquet").unlink()  # a part the second checkpoint covered
    with pytest.raises(BadInput, match=r"checkpoints/checkpoint-000001.json: lists log/part-00001.jsonl, which this "
                                       r"run does not keep"):  # fmt: skip
        resume(run, [])


def test_signing_during_a_run_signs_its_checkpoints_and_its_attestation(
    run_eval: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    keys = {}
    for name in ("key", "other"):
        private = ed25519.Ed25519PrivateKey.generate()
        (tmp_path / f"{name}.pem").write_bytes(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        keys[name] = tmp_path / f"{name}.pub"
        keys[name].write_bytes(private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    monkeypatch.setenv("EVALRUN_SIGNING_KEY", str(tmp_path / "key.pem"))
    run = run_eval("limit=8", "cluster.batch_size=2", "run.checkpoint_every_parts=2")
    report = verify_run(run, public_key=keys["key"])
    assert report.attestation == "signature checked" and report.checkpoints == "2 checked (signature checked)"
    assert verify_run(run).checkpoints == "2 checked (signed, not checked)"
    with pytest.raises(CheckFailed, match=r"checkpoint-000000.json: its signature does not verify"):
        verify_run(run, public_key=keys["other"])


@pytest.mark.parametrize(("override", "named"), [("run.checkpoint_every_parts=0", "run.checkpoint_every_parts"),
                                                 ("run.checkpoint_every_s=-1", "run.checkpoint_every_s"),
                                                 ("run.ledger=/no/such/dir/ledger", "run.ledger")])  # fmt: skip
def test_bad_checkpoint_settings_are_refused_before_any_engine_loads(override: str, named: str) -> None:
    with pytest.raises(BadInput) as raised:
        check_before_engine(load([override]))
    assert raised.value.where == named
