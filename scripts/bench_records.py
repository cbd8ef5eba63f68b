"""Throughput of the record path: write (chains + output parts), verify and rescore a large run.

A synthetic run of single-call episodes goes through the real code: ``evalrun.episode.record_episode``
builds each chain, ``evalrun.store.PartWriter`` writes the log and Parquet parts, then scores,
summary and record.json are written as ``evalrun.runner`` writes them. The engine is the only
thing left out (completions are generated here, before the clock starts). Then ``evalrun verify``
and ``evalrun rescore`` run on that directory, each timed.

    .venv/bin/python scripts/bench_records.py [--episodes 1000000] [--part-size 10000] [--jobs N]

Targets (issue 4): write >= 50,000 episodes/s, verify >= 200,000 log entries/s, rescore >=
1,000,000 rows per 10 s.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from evalrun import store
from evalrun.digest import canonical_json
from evalrun.engines import Completion, SamplingSpec
from evalrun.episode import encode_generator, record_episode
from evalrun.manifest import Digest, seed_set_hash
from evalrun.merkle import merkle_root
from evalrun.plan import Episode, episode_id
from evalrun.report import summarize
from evalrun.scoring import score_outputs, scoring_hash

SCORER = {"name": "exact_match", "normalize": ["strip"], "pattern": None, "group": 1, "extract": "first",
          "tolerance": 0.0}  # fmt: skip
DECODING = {"name": "greedy", "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop": ["\n"],
            "logprobs": True}  # fmt: skip
SEEDS = {"master": 1234, "set": [0], "repeats": 1}
TEMPLATE_SHA = "0" * 64


def synthetic(n: int) -> tuple[list[Episode], list[Completion]]:
    rng = random.Random(0)
    episodes, completions = [], []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        sampling = SamplingSpec(0.0, 1.0, 0, 16, ("\n",), rng.getrandbits(64), True)
        item = f"add-{i:07d}"
        eid = episode_id("addition", item, 0, 0, {"sampling": str(sampling.seed)})
        episodes.append(Episode(eid, "addition", item, 0, 0, f"Q: {a}+{b}\nA:", str(a + b), sampling))
        answer = str(a + b if rng.random() < 0.8 else a + b + 1)
        tokens = tuple(rng.randrange(120) for _ in range(len(answer) + 1))
        logprobs = tuple(-rng.random() * 10 ** -rng.randrange(1, 8) for _ in tokens)
        completions.append(Completion(" " + answer, tokens, logprobs, "stop", 7))
    return episodes, completions


def write_run(path: Path, episodes: list[Episode], completions: list[Completion], part_size: int) -> float:
    """Write the run directory; returns the seconds spent in chains + output parts."""
    run = store.create_run_dir(path.parent, path.name, exact=path)
    digest = Digest(prompt_pack=_prompt_pack(), seed_set=seed_set_hash(SEEDS), scoring=scoring_hash(SCORER))
    manifest = {"format": "evalrun.manifest/1", "digest": digest.as_record(), "decoding": DECODING, "seeds": SEEDS,
                "task": {"name": "addition", "scorer": SCORER, "template": {"sha256": TEMPLATE_SHA}},
                "episodes": len(episodes), "note": "synthetic run written by scripts/bench_records.py"}  # fmt: skip
    raw_config = {"task": {"name": "addition", "scorer": SCORER}, "decoding": DECODING, "seeds": SEEDS}
    files = {store.CONFIG: store.write_atomic(run.config, canonical_json(raw_config).encode())}
    files[store.MANIFEST] = store.write_json(run.manifest, manifest)
    generator = encode_generator({"name": "evalrun", "version": "bench", "git_commit": None})
    provenance = store.Provenance(worker="bench", hardware="{}", batch_size=part_size, latency_s=0.0)
    writer = store.PartWriter(run)
    started = time.perf_counter()
    for lo in range(0, len(episodes), part_size):
        batch = zip(episodes[lo : lo + part_size], completions[lo : lo + part_size], strict=True)
        writer.write(store.encode_part([record_episode(e, c, generator) for e, c in batch], provenance))
    write_s = time.perf_counter() - started
    scores = score_outputs(run.read_outputs(["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]),
                           SCORER)  # fmt: skip
    files[store.SCORES] = store.write_atomic(run.scores, store.table_bytes(scores))
    files[store.SUMMARY] = store.write_json(run.summary, summarize(scores))
    files.update(writer.file_hashes)
    record = {
        "format": "evalrun.record/1",
        "episodes": {"planned": len(episodes), "written": len(writer.heads)},
        "parts": writer.next_index,
        "output_tokens": writer.output_tokens,
        "merkle_root": merkle_root(writer.heads.items()),
        "digest": digest.digest,
        "manifest_sha256": files[store.MANIFEST],
        "files": dict(sorted(files.items())),
        "ended_at": "synthetic",
    }
    store.write_json(run.record, record)
    return write_s


def _prompt_pack() -> str:
    from evalrun.digest import canonical_hash

    settings = {k: v for k, v in DECODING.items() if k != "name"}
    return canonical_hash({"templates": {"user": TEMPLATE_SHA}, "fewshot": [], "decoding": settings})


def timed(label: str, fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument("--part-size", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=0, help="verify processes (0: one per CPU)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    args = parser.parse_args()

    from evalrun.rescore import rescore_run
    from evalrun.verify import verify_run

    started = time.perf_counter()
    episodes, completions = synthetic(args.episodes)
    print(f"generated {args.episodes:,} synthetic episodes in {time.perf_counter() - started:.1f} s (not timed)")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.dir or Path(tmp) / "run"
        write_s = write_run(path, episodes, completions, args.part_size)
        del episodes, completions
        n = args.episodes
        print(f"write   : {n:,} episodes (chains + output parts) in {write_s:.2f} s = {n / write_s:,.0f} episodes/s"
              "  [target >= 50,000]")  # fmt: skip
        report: dict[str, Any] = {}
        verify_s = timed("verify", lambda: report.update(verify=verify_run(path, jobs=args.jobs)))
        entries = report["verify"].log_entries
        print(f"verify  : {entries:,} log entries, {n:,} rows in {verify_s:.2f} s = {entries / verify_s:,.0f} "
              "entries/s  [target >= 200,000]")  # fmt: skip
        rescore_s = timed("rescore", lambda: report.update(rescore=rescore_run(path, [])))
        rows = report["rescore"].rows
        print(f"rescore : {rows:,} rows in {rescore_s:.2f} s = {rows / rescore_s * 10:,.0f} rows per 10 s"
              "  [target >= 1,000,000]")  # fmt: skip
        assert report["rescore"].identical, "rescoring an unchanged scorer must be bit-identical"


if __name__ == "__main__":
    main()
