"""Throughput of the record path: write (chains + output parts), verify and rescore a large run.

A synthetic run of single-call episodes goes through the real code. The engine is the only thing
left out: completions are generated here, before any clock starts, and stand for what an engine
returns inside its worker.

* write: as in a real run, the per-episode work (``evalrun.episodes.harness.record_episode`` and
  ``evalrun.rundir.encode.encode_part``: chain lines, log bytes, Parquet bytes) runs in a pool of worker
  processes, one per core like engine workers, and the driver only commits the returned
  ``EncodedPart`` bytes with ``writer.PartWriter.write``. Timed end to end: first batch sent to last
  part on disk. The headline figure starts where an engine worker stands once its batch has been
  answered: episodes and completions are in the worker (forked in before the clock starts) and the
  driver sends index ranges. Two reference figures are printed beside it: the same pool with each
  batch's episodes pickled to its worker (the dispatch cost a Ray run adds, measured against the
  real engine by bench_dispatch.py), and everything in one process. All three run directories
  must come out byte-identical. Then scores, summary and record.json are written as
  ``evalrun.pipeline.runner`` writes them (not timed).
* verify: ``evalrun verify`` on that directory with ``--jobs 1`` and with ``--jobs N``.
* rescore: ``evalrun rescore`` with the unchanged scorer (must be bit-identical).

    .venv/bin/python scripts/bench_records.py [--episodes 1000000] [--part-size 10000] [--jobs N]

Targets (issue 4): write >= 50,000 episodes/s, verify >= 200,000 log entries/s, rescore >=
1,000,000 rows per 10 s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from evalrun.audit.claims import implied_identity
from evalrun.config import ScorerConfig
from evalrun.engines import Completion, SamplingSpec
from evalrun.episodes import EncodedPart, encode
from evalrun.episodes.harness import encode_generator, record_episode
from evalrun.episodes.plan import Episode, episode_id
from evalrun.pipeline.manifest import Digest, seed_set_hash
from evalrun.records.canonical import Canonical, canonical_json
from evalrun.records.formats import Manifest
from evalrun.records.seeds import derive_seed
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import attest_finished_run
from evalrun.rundir.reader import read_outputs
from evalrun.scoring import score_outputs, scoring_hash
from evalrun.stats.summary import summarize

SCORER = {"name": "exact_match", "normalize": ["strip"], "pattern": None, "group": 1, "extract": "first",
          "tolerance": 0.0}  # fmt: skip
SCORER_CONFIG = ScorerConfig.from_record(SCORER)
DECODING = {"name": "greedy", "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop": ["\n"],
            "logprobs": True}  # fmt: skip
SEEDS = {"master": 1234, "set": [0], "repeats": 1}
TEMPLATE_SHA = "0" * 64
GENERATOR = {"name": "evalrun", "version": "bench", "git_commit": None}


def synthetic(n: int) -> tuple[list[Episode], list[Completion]]:
    rng = random.Random(0)
    episodes, completions = [], []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        item = f"add-{i:07d}"
        seed = derive_seed(SEEDS["master"], "sampling", "addition", item, 0, 0)
        sampling = SamplingSpec(0.0, 1.0, 0, 16, ("\n",), seed, True)
        eid = episode_id("addition", item, 0, 0, {"sampling": str(sampling.seed)})
        episodes.append(Episode(eid, "addition", item, 0, 0, f"Q: {a}+{b}\nA:", str(a + b), sampling))
        answer = str(a + b if rng.random() < 0.8 else a + b + 1)
        tokens = tuple(rng.randrange(120) for _ in range(len(answer) + 1))
        logprobs = tuple(-rng.random() * 10 ** -rng.randrange(1, 8) for _ in tokens)
        completions.append(Completion(" " + answer, tokens, logprobs, "stop", 7))
    return episodes, completions


# The plan and the stand-in engine's output, by episode index. Pool workers are forked after they
# are filled, so each holds them as an engine worker holds a batch it has run.
_EPISODES: list[Episode] = []
_COMPLETIONS: list[Completion] = []


def _encode_batch(lo: int, episodes: list[Episode], generator: Canonical) -> EncodedPart:
    """What an engine worker does with a batch once the engine has answered (evalrun.pipeline.worker)."""
    completions = _COMPLETIONS[lo : lo + len(episodes)]
    results = [record_episode(e, c, generator) for e, c in zip(episodes, completions, strict=True)]
    provenance = encode.Provenance(worker="bench", hardware="{}", batch_size=len(results), latency_s=0.0)
    return encode.encode_part(results, provenance)


def _encode_range(lo: int, hi: int, generator: Canonical) -> EncodedPart:
    return _encode_batch(lo, _EPISODES[lo:hi], generator)


def _ready(_: int) -> int:
    time.sleep(0.05)  # long enough that every worker gets one
    return os.getpid()


def write_parts_inline(parts: writer.PartWriter, episodes: list[Episode], part_size: int) -> None:
    """Single process: encode and commit each batch in the driver."""
    generator = encode_generator(GENERATOR)
    for lo in range(0, len(episodes), part_size):
        parts.write(_encode_batch(lo, episodes[lo : lo + part_size], generator))


def write_parts_pool(parts: writer.PartWriter, episodes: list[Episode], part_size: int, pool: ProcessPoolExecutor,
                     window: int, send_episodes: bool) -> None:  # fmt: skip
    """Workers encode, the driver commits in batch order; at most ``window`` batches in flight."""
    generator = encode_generator(GENERATOR)
    pending: deque[Future[EncodedPart]] = deque()
    for lo in range(0, len(episodes), part_size):
        if len(pending) >= window:
            parts.write(pending.popleft().result())
        if send_episodes:
            pending.append(pool.submit(_encode_batch, lo, episodes[lo : lo + part_size], generator))
        else:
            pending.append(pool.submit(_encode_range, lo, min(lo + part_size, len(episodes)), generator))
    while pending:
        parts.write(pending.popleft().result())


def write_run(path: Path, episodes: list[Episode], part_size: int, pool: ProcessPoolExecutor | None,
              window: int = 0, send_episodes: bool = False) -> float:  # fmt: skip
    """Write the run directory; returns the seconds spent in chains + output parts."""
    run = layout.create_run_dir(path.parent, path.name, exact=path)
    digest = Digest(prompt_pack=_prompt_pack(), seed_set=seed_set_hash(SEEDS), scoring=scoring_hash(SCORER_CONFIG))
    sections = {
        "digest": digest.as_record(),
        "limit": None,
        "episodes": len(episodes),
        "task": {"name": "addition", "scorer": SCORER, "template": {"sha256": TEMPLATE_SHA}},
        "decoding": DECODING,
        "seeds": SEEDS,
        "model": {},
        "judge_model": None,
        "generator": GENERATOR,
    }
    manifest = Manifest(
        identity={"digest": digest.as_record(), **implied_identity(sections)}, **sections, engine={}, determinism={},
        cluster={}, workers=[], libraries={}, python="3", git={}, hardware={}, started_at="synthetic",
    )  # fmt: skip
    raw_config = {"task": {"name": "addition", "scorer": SCORER}, "decoding": DECODING, "seeds": SEEDS}
    files = {layout.CONFIG: writer.write_atomic(run.config, canonical_json(raw_config).encode())}
    files[layout.MANIFEST] = writer.write_json(run.manifest, manifest)
    parts = writer.PartWriter(run)
    started = time.perf_counter()
    if pool is None:
        write_parts_inline(parts, episodes, part_size)
    else:
        write_parts_pool(parts, episodes, part_size, pool, window, send_episodes)
    write_s = time.perf_counter() - started
    scores = score_outputs(read_outputs(run, ["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]),
                           SCORER_CONFIG)  # fmt: skip
    files[layout.SCORES] = writer.write_atomic(run.scores, writer.table_bytes(scores))
    files[layout.SUMMARY] = writer.write_json(run.summary, summarize(scores))
    files.update(parts.file_hashes)
    record = {
        "format": "evalrun.record/1",
        "episodes": {"planned": len(episodes), "written": len(parts.heads)},
        "parts": parts.next_index,
        "output_tokens": parts.output_tokens,
        "merkle_root": parts.heads.merkle_root(),
        "digest": digest.digest,
        "manifest_sha256": files[layout.MANIFEST],
        "files": dict(sorted(files.items())),
        "ended_at": "synthetic",
    }
    writer.write_json(run.record, record)
    attest_finished_run(run.path)
    return write_s


def _prompt_pack() -> str:
    from evalrun.records.canonical import canonical_hash

    settings = {k: v for k, v in DECODING.items() if k != "name"}
    return canonical_hash({"templates": {"user": TEMPLATE_SHA}, "fewshot": [], "decoding": settings})


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument("--part-size", type=int, default=10_000)
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes of the write path and of the parallel verify (0: one per CPU)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs under this folder (default: a temp dir)")
    args = parser.parse_args()
    jobs = args.jobs or (os.cpu_count() or 1)

    from evalrun.audit.rescore import rescore_run
    from evalrun.audit.verify import verify_run

    started = time.perf_counter()
    episodes, completions = synthetic(args.episodes)
    _EPISODES[:] = episodes
    _COMPLETIONS[:] = completions
    del completions
    n = args.episodes
    print(f"generated {n:,} synthetic episodes in {time.perf_counter() - started:.1f} s (not timed); "
          f"{os.cpu_count()} CPUs, load average {_load()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or Path(tmp)
        path = root / "run"
        # Workers are forked now (after the plan and completions exist) and warmed up before the clock.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            assert len(set(pool.map(_ready, range(2 * jobs)))) == jobs, "every worker is started"
            write_s = write_run(path, episodes, args.part_size, pool, window=4 * jobs)
            print(f"write   : {n:,} episodes (chains + output parts) in {write_s:.2f} s = {n / write_s:,.0f} "
                  f"episodes/s ({jobs} worker processes encode, the driver commits)  [target >= 50,000]")  # fmt: skip
            sent_s = write_run(root / "run-episodes-sent", episodes, args.part_size, pool, 4 * jobs, True)
        print(f"          with each batch's episodes pickled to its worker: {sent_s:.2f} s = {n / sent_s:,.0f} "
              f"episodes/s ({write_s / sent_s:.2f}x)")  # fmt: skip
        inline_s = write_run(root / "run-single-process", episodes, args.part_size, None)
        print(f"          single process: {inline_s:.2f} s = {n / inline_s:,.0f} episodes/s "
              f"({write_s / inline_s:.2f}x)")  # fmt: skip
        del episodes
        _EPISODES.clear()
        _COMPLETIONS.clear()
        for other in ("run-episodes-sent", "run-single-process"):
            assert _same_files(path, root / other), f"{other} must hold the same bytes as run"
            shutil.rmtree(root / other)
        report: dict[str, Any] = {}
        for verify_jobs in sorted({1, jobs}):
            verify_s = timed(lambda j=verify_jobs: report.update(verify=verify_run(path, jobs=j)))
            entries = report["verify"].log_entries
            print(f"verify  : {entries:,} log entries, {n:,} rows in {verify_s:.2f} s = {entries / verify_s:,.0f} "
                  f"entries/s (--jobs {verify_jobs})  [target >= 200,000]")  # fmt: skip
        rescore_s = timed(lambda: report.update(rescore=rescore_run(path, [])))
        rows = report["rescore"].rows
        print(f"rescore : {rows:,} rows in {rescore_s:.2f} s = {rows / rescore_s * 10:,.0f} rows per 10 s"
              "  [target >= 1,000,000]")  # fmt: skip
        assert report["rescore"].identical, "rescoring an unchanged scorer must be bit-identical"
    print(f"load average after: {_load()}")


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    return names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()) and all(
        (a / name).read_bytes() == (b / name).read_bytes() for name in names
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
