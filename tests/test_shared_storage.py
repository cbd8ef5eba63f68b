"""Workers write, the driver commits; run directories on shared file systems and S3-compatible stores (issue 32).

The two write paths give the same run directory; a worker killed after writing a part and before reporting it
loses and doubles nothing; a run on a local S3-compatible server (moto, started by the session) verifies, rescores
and replays from its s3:// location, and one whose driver was killed is resumed there; the stores' locks keep a
second driver out.
"""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from evalrun.audit.verify import verify_run
from evalrun.cli.main import _write_run_report, main
from evalrun.config import load
from evalrun.episodes import EncodedPart
from evalrun.errors import BadInput, WriteFailed
from evalrun.pipeline import runner
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.records.canonical import file_sha256
from evalrun.records.heads import pack_heads
from evalrun.rundir import layout, store, writer
from evalrun.rundir.reader import read_outputs
from tests.conftest import S3_BUCKET, evalrun_process

CONFIG = ("limit=40", "decoding=sample", "seeds.repeats=2", "cluster.num_workers=2", "cluster.batch_size=3")
GOLDEN = Path(__file__).parent / "golden" / "addition-v1"
PROVENANCE = ("worker", "hardware", "batch_size", "latency_s")  # output columns no hash covers (design.md)


def record(run: Path) -> dict[str, Any]:
    return json.loads((run / layout.RECORD).read_text())


def run_on(dispatcher: Dispatcher, root: str, *overrides: str) -> Path:
    config = load([f"run.root={root}", "run.progress=false", "report=false", *CONFIG, *overrides])
    return runner.execute(runner.prepare(config), dispatcher)


def parts(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for d in (layout.LOG, layout.OUTPUTS) for p in (run / d).iterdir())


@pytest.fixture(scope="module")
def driver_run(two_workers: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config through the driver-writes path on two local Ray workers."""
    return run_on(two_workers, str(tmp_path_factory.mktemp("driver")), "run.part_writes=driver")


def test_both_write_paths_give_the_same_run_directory(two_workers, driver_run: Path, tmp_path: Path) -> None:
    workers_run = run_on(two_workers, str(tmp_path), "run.part_writes=workers")
    a, b = record(driver_run), record(workers_run)
    assert parts(driver_run) == parts(workers_run)  # the same names: a part is named by its batch, not its arrival
    assert len(parts(driver_run)) == 2 * 27  # 80 episodes in batches of 3
    for rel in parts(driver_run):
        if rel.startswith(layout.LOG):  # the chains: byte for byte
            assert (driver_run / rel).read_bytes() == (workers_run / rel).read_bytes(), rel
        else:  # the rows: equal but for where and how fast they ran
            left, right = pq.read_table(driver_run / rel), pq.read_table(workers_run / rel)
            assert left.drop_columns(list(PROVENANCE)).equals(right.drop_columns(list(PROVENANCE))), rel
        assert file_sha256(workers_run / rel) == b["files"][rel]  # what the worker reported is what it wrote
    for name in (layout.SCORES, layout.SUMMARY):
        assert (driver_run / name).read_bytes() == (workers_run / name).read_bytes(), name
    for key in ("merkle_root", "digest", "episodes", "parts", "output_tokens", "format"):
        assert a[key] == b[key], key
    provenance_files = {layout.CONFIG, layout.MANIFEST} | {r for r in a["files"] if r.startswith(layout.OUTPUTS)}
    assert {k: v for k, v in a["files"].items() if k not in provenance_files} == {
        k: v for k, v in b["files"].items() if k not in provenance_files
    }
    verify_run(workers_run)


def test_a_part_committed_by_the_driver_or_by_its_worker_is_the_same_bytes(tmp_path: Path) -> None:
    part = EncodedPart(log=b'{"a":1}\n', table=writer.table_bytes(read_outputs(layout.RunDir(GOLDEN))),
                       heads=pack_heads([("0" * 64, "1" * 64)]), output_tokens=3)  # fmt: skip
    by_driver = layout.create_run_dir(tmp_path, "driver")
    committer = writer.PartWriter(by_driver)
    committer.write(part, 7)
    by_worker = layout.create_run_dir(tmp_path, "worker")
    files = writer.PartSink(str(by_worker.path), 5).write(2, part.log, part.table)
    assert files.hashes() == committer.file_hashes
    for rel in files.hashes():
        assert (by_driver.path / rel).read_bytes() == (by_worker.path / rel).read_bytes()
    assert not list(by_worker.path.rglob(".tmp-*"))


def test_a_worker_that_does_not_see_the_run_directory_says_so(tmp_path: Path) -> None:
    """A worker on a node without the run's file system: its commit fails naming the directory, and creates nothing."""
    missing = tmp_path / "not-mounted" / "run"
    with pytest.raises(WriteFailed, match="every node sees"):
        writer.PartSink(str(missing), 0).write(0, b"{}\n", b"")
    assert not missing.exists()


def test_a_worker_killed_after_writing_a_part_and_before_reporting_it(two_workers, driver_run, tmp_path) -> None:
    """Whichever worker commits part 1 first SIGKILLs itself before the driver hears of it (both are armed, once
    between them: which worker takes a batch is the dispatcher's to decide). The batch runs again under the same
    name: the part is replaced whole, nothing is lost or doubled, the retry is counted and the run verifies."""
    import ray

    actors = two_workers.actors()
    workers = {ray.get(actor.info.remote())["worker"] for actor in actors}
    ray.get([actor.arm_failpoint.remote("worker-after-write-1", str(tmp_path / "fired")) for actor in actors])
    run = run_on(two_workers, str(tmp_path / "runs"), "run.part_writes=workers")
    rec = record(run)
    assert rec["dispatch"]["retries"] >= 1 and rec["dispatch"]["worker_restarts"] == 1
    dead = {event["worker"] for event in rec["dispatch"]["events"]}
    assert len(dead) == 1 and dead <= workers and (tmp_path / "fired").is_file()
    (killed,) = dead
    assert rec["merkle_root"] == record(driver_run)["merkle_root"]
    ids = read_outputs(layout.RunDir(run), ["episode_id"]).column("episode_id").to_pylist()
    assert len(ids) == len(set(ids)) == 80  # nothing lost, nothing written twice
    assert parts(run) == parts(driver_run)  # one part per batch: the orphan was replaced, not kept beside
    assert killed not in set(pq.read_table(run / "outputs" / "part-00001.parquet").column("worker").to_pylist())
    assert verify_run(run).episodes == 80


def s3_location(endpoint: str, prefix: str) -> str:
    return f"s3://{S3_BUCKET}/{prefix}-{uuid.uuid4().hex[:8]}?endpoint_url={endpoint}"


def test_a_run_on_s3_verifies_rescores_and_replays(two_workers, driver_run, s3_server, capsys, tmp_path) -> None:
    root = s3_location(s3_server, "runs")
    local = run_on(two_workers, f'"{root}"')  # workers write by default on an object store
    location = store.location_of(local)
    assert location.startswith(f"s3://{S3_BUCKET}/") and location.endswith(f"?endpoint_url={s3_server}")
    remote = store.open_store(location)
    names = remote.names()
    rec = json.loads(remote.read(layout.RECORD))
    assert rec["merkle_root"] == record(driver_run)["merkle_root"]
    assert {n for n in names if n.startswith((f"{layout.LOG}/", f"{layout.OUTPUTS}/"))} == set(parts(driver_run))
    assert layout.ATTESTATION in names and store.LOCK_NAME not in names  # complete, and the lock let go
    assert not list((local / layout.OUTPUTS).iterdir())  # the workers' parts went to the store, not the driver
    capsys.readouterr()
    _write_run_report("evalrun run", local)  # as `evalrun run` ends: the report verifies the run, parts and all
    assert "warning" not in capsys.readouterr().err
    assert layout.RunDir(local).report.name in remote.names()
    store.discard(local)
    for command in ("verify", "rescore", "replay"):
        assert main([command, location]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert ("ok: 80 episodes" in out) or ("bit-identical" in out), out
    assert main(["report", location, "-o", str(tmp_path / "report.html")]) == 0, capsys.readouterr().err
    assert main(["export", location, "--format", "inspect", "-o", str(tmp_path / "run.eval")]) == 0
    with zipfile.ZipFile(tmp_path / "run.eval") as log:
        assert json.loads(log.read("header.json"))["eval"]["metadata"]["run_dir"] == location  # not the copy read
    capsys.readouterr()
    assert main(["attest", location]) == 0  # what it wrote, named where it is: the copy is gone once it ends
    assert capsys.readouterr().out.strip() == store.join(location, layout.ATTESTATION)
    remote.commit([(f"{layout.OUTPUTS}/{store.LOCK_NAME}", b"")])  # a stray file, though named as a lock is
    assert main(["verify", location]) == 1
    assert f"{layout.OUTPUTS}/{store.LOCK_NAME}" in capsys.readouterr().err


def test_a_run_on_s3_whose_driver_was_killed_is_resumed_in_place(run_eval, s3_server, capsys, tmp_path) -> None:
    """The driver SIGKILLed after its third part: the store keeps the parts it committed (one more output part is
    removed, and a log part whose output part never came is put) and the dead driver's lock. Resume names the lock;
    with it removed (as its message says), resume keeps the complete parts, drops the lone log parts, runs the rest
    and seals the run on the store, with the root of the run never interrupted."""
    config = ("limit=30", "decoding=sample", "cluster=inline", "cluster.batch_size=5", "run.progress=false")
    expected = record(run_eval(*config[:2]))["merkle_root"]
    location = s3_location(s3_server, "killed")
    killed = evalrun_process(tmp_path, "run", *config, f'run.dir="{location}"', failpoint="after-part-2")
    assert killed.returncode == -9, killed.stderr[-2000:]
    remote = store.open_store(location)
    outputs = sorted(n for n in remote.names() if n.startswith(f"{layout.OUTPUTS}/"))
    assert outputs and store.LOCK_NAME in remote.names() and layout.RECORD not in remote.names()
    kept = {n: remote.read(n) for n in outputs[:-1]}  # the last one's batch runs again: its output part removed
    remote.remove(outputs[-1])

    refused = evalrun_process(tmp_path, "resume", location)
    assert refused.returncode == 2 and "another evalrun driver" in refused.stderr
    assert store.join(location, store.LOCK_NAME) in refused.stderr  # the dead driver's lock, named
    remote.remove(store.LOCK_NAME)
    remote.commit([(f"{layout.LOG}/part-00099.jsonl", b"{}\n")])  # a log part whose output part never came

    resumed = evalrun_process(tmp_path, "resume", location, "run.progress=false")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.strip().splitlines()[-1] == location
    names = remote.names()
    rec = json.loads(remote.read(layout.RECORD))
    assert rec["merkle_root"] == expected and rec["dispatch"]["kept_parts"] == len(kept)
    assert all(remote.read(name) == data for name, data in kept.items())  # the kept parts as they were
    assert f"{layout.LOG}/part-00099.jsonl" not in names and store.LOCK_NAME not in names
    assert layout.ATTESTATION in names
    capsys.readouterr()
    assert main(["verify", location]) == 0, capsys.readouterr().err
    assert "ok: 30 episodes" in capsys.readouterr().out


def test_a_message_names_a_working_copys_files_by_their_store_location(tmp_path: Path) -> None:
    """What a command says of a run on an object store names it where it is, not the copy this process read."""
    remote = store.S3Store("bucket/runs/G", {"endpoint_url": "http://127.0.0.1:9"})  # never reached
    copy = store.new_working_copy(remote, "G")
    try:
        said = store.in_locations(f"{copy}/T/log/part-00001.jsonl: missing; `evalrun resume {copy}` finishes it. "
                                  f"{tmp_path}/G is another")  # fmt: skip
        query = "?endpoint_url=http://127.0.0.1:9"
        assert said == (f"s3://bucket/runs/G/T/log/part-00001.jsonl{query}: missing; `evalrun resume "
                        f"s3://bucket/runs/G{query}` finishes it. {tmp_path}/G is another")  # fmt: skip
        assert store.remote_of(copy / "T").location == f"s3://bucket/runs/G/T{query}"  # a task's run in a group
        assert store.staged_copy(f"s3://bucket/runs/G/T{query}") == copy / "T"
        assert store.staged_copy("s3://bucket/runs/G/T?endpoint_url=http://elsewhere") is None
    finally:
        store.discard(copy)
    assert store.in_locations(f"{copy}/x") == f"{copy}/x"


def test_the_stores_lock_keeps_a_second_driver_out(s3_server: str, tmp_path: Path) -> None:
    """Two drivers' handles on one run directory (each its own store object, as in two processes)."""
    prefix = f"{S3_BUCKET}/lock-{uuid.uuid4().hex[:8]}"
    for make in (lambda: store.S3Store(prefix, {"endpoint_url": s3_server}), lambda: store.LocalStore(str(tmp_path))):
        first, second = make(), make()
        first.acquire("driver one")
        with pytest.raises(BadInput, match="another evalrun driver"):
            second.acquire("driver two")
        first.release()
        second.acquire("driver two")
        second.release()


def test_unlock_removes_a_dead_drivers_lock_and_refuses_a_running_ones(
    s3_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver SIGKILLed on an object store leaves its lock (no store releases it); `evalrun unlock` removes it,
    but not while the driver that holds it is running on this host, nor a file system's, held by a live process."""
    prefix = f"{S3_BUCKET}/unlock-{uuid.uuid4().hex[:8]}"
    location = f"s3://{prefix}?endpoint_url={s3_server}"
    held, resumed = store.S3Store(prefix, {"endpoint_url": s3_server}), store.open_store(location)  # two drivers'
    held.acquire(store.holder())  # this process: running
    with pytest.raises(BadInput, match=r"another evalrun driver .* `evalrun unlock s3://"):
        resumed.acquire("a resume")
    assert main(["unlock", location]) == 2
    assert "held by a driver that is running on this host" in capsys.readouterr().err
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now names no process
    held.release()
    held.acquire(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    assert main(["unlock", location]) == 0
    assert f'"pid": {dead.pid}' in capsys.readouterr().out
    resumed.acquire("a resume")  # the run is free again
    resumed.release()
    assert main(["unlock", location]) == 0 and "no lock is held there" in capsys.readouterr().out
    held.acquire(json.dumps({"host": "another-node", "pid": 1}))  # a node this host cannot see: the user's word
    assert main(["unlock", location]) == 0 and store.LOCK_NAME not in held.names()

    local = store.LocalStore(str(tmp_path))
    local.acquire("a driver")
    with pytest.raises(BadInput, match="another evalrun driver"):
        store.LocalStore(str(tmp_path)).unlock()
    local.release()
    assert store.LocalStore(str(tmp_path)).unlock() is None


def test_an_unreachable_store_is_refused_before_the_engine_loads(monkeypatch, capsys) -> None:
    def no_engine(prepared: Any) -> None:
        raise AssertionError("the engine was loaded before the store was checked")

    monkeypatch.setattr(runner, "open_for", no_engine)
    code = main(["run", "cluster=inline", "limit=2", 'run.root="s3://nowhere/runs?endpoint_url=http://127.0.0.1:9"'])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("evalrun run: error: run.root: s3://nowhere/runs"), err


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), "driver"),  # local Ray on one machine
        (("cluster=inline",), "driver"),
        (("cluster=ray", "cluster.address=auto"), "workers"),
        (('run.root="s3://bucket/runs"',), "workers"),
        (("cluster=inline", 'run.root="s3://bucket/runs"'), "driver"),  # the inline worker is the driver's process
        (("cluster=ray", "cluster.address=auto", "run.part_writes=driver"), "driver"),
    ],
)
def test_who_writes_the_parts_by_default(overrides: tuple[str, ...], expected: str) -> None:
    assert runner.part_writes(load(list(overrides))) == expected


def test_workers_cannot_write_the_parts_of_an_inline_run() -> None:
    with pytest.raises(BadInput, match=r"run\.part_writes"):
        load(["cluster=inline", "run.part_writes=workers"])
