"""A Ray worker scores the rows it makes (evalrun.scoring.parts), so the driver neither decodes its parts nor
runs the scorer. The driver takes those rows only when they carry the run's own scoring hash, and `verify`
recomputes every score from the outputs whoever made it (docs/design.md "Scores"). Engine-free: a stub
dispatcher makes its parts as a Ray worker does (through the real harness, encoder and pickling).
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from evalrun.cli.main import main
from evalrun.config import ScorerConfig, load
from evalrun.engines import Completion, GenerationRequest
from evalrun.episodes import Provenance
from evalrun.episodes.encode import encode_part
from evalrun.episodes.harness import run_episodes
from evalrun.episodes.plan import Episode
from evalrun.pipeline import runner
from evalrun.pipeline.dispatch import DispatchStats, dispatcher_key
from evalrun.pipeline.worker import BatchOutcome, RayEngineWorker, RunContext, WorkerSpec
from evalrun.rundir import layout, reader
from evalrun.scoring import Scoring, ScoringContext, score_columns
from evalrun.scoring.parts import PartScorer, ScoredPart, ScoringSetup
from evalrun.scoring.table import SCORED_SCHEMA, RowScoring

CONFIG = ("limit=8", "cluster=inline", "cluster.batch_size=3", "run.progress=false")  # 3 parts


class HalfRight:
    """Answers an addition right when its prompt has an even length, else off by one: scores of both values."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return [Completion(f" {self.answer(r.prompt)}", (1, 2), (-0.5, -0.25), "stop", len(r.prompt)) for r in requests]

    @staticmethod
    def answer(prompt: str) -> int:
        *_, a, b = (int(n) for n in re.findall(r"\d+", prompt))  # the last question's two numbers
        return a + b + len(prompt) % 2

    def describe(self) -> dict[str, Any]:
        return {"name": "half-right", "version": "1", "settings": {}}


class WorkerLike:
    """Parts made as a Ray worker makes them: scored with the setup the run hands over, pickled and unpickled.
    ``tamper``: ``hash`` sends them under another scoring hash, ``values`` with every value 1 under the run's."""

    def __init__(self, key: str, tamper: str | None = None, scores: bool = True) -> None:
        self.key, self.stats, self.tamper, self.scores = key, DispatchStats(), tamper, scores

    def workers(self) -> list[dict[str, Any]]:
        determinism = {"asked": {}, "honoured": {}, "notes": []}
        return [{"worker": "ray-0", "hardware": "{}", "determinism": determinism, "engine": HalfRight().describe(),
                 "judge_engine": None}]  # fmt: skip

    def map(self, batches: Iterable[list[Episode]], generator: dict[str, Any],
            scoring: ScoringSetup | None = None, sink: Any = None) -> Iterator[BatchOutcome]:  # fmt: skip
        scorer = PartScorer(scoring) if scoring is not None and self.scores else None
        for batch in batches:
            part = encode_part(run_episodes(HalfRight(), batch, generator), Provenance("ray-0", "{}", len(batch), 0.0),
                               scorer)  # fmt: skip
            if self.tamper is not None and part.scored is not None:
                part = replace(part, scored=_tampered(part.scored, self.tamper))
            yield pickle.loads(pickle.dumps(BatchOutcome(part, len(batch), "ray-0")))

    def close(self) -> None:
        pass


def _tampered(scored: ScoredPart, how: str) -> ScoredPart:
    if how == "hash":
        return ScoredPart("0" * 64, scored.rows)
    table = scored.table()
    ones = pa.array(
        [[1.0] * len(values) for values in table.column("value").to_pylist()], table.schema.field("value").type
    )
    table = table.set_column(table.schema.get_field_index("value"), "value", ones)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCORED_SCHEMA) as stream:
        stream.write_table(table)
    return ScoredPart(scored.scoring_hash, sink.getvalue().to_pybytes())


def _run(tmp_path: Path, name: str, **worker: Any) -> Path:
    prepared = runner.prepare(load([*CONFIG, f"run.dir={tmp_path / name}"]))
    return runner.execute(prepared, WorkerLike(dispatcher_key(prepared.worker_spec, prepared.config.cluster), **worker))


def test_rows_a_worker_scored_make_the_same_scores_as_the_driver_scoring_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_worker = _run(tmp_path, "worker")
    by_driver = _run(tmp_path, "driver", scores=False)  # the parts carry no scored rows: the driver decodes them
    for name in (layout.SCORES, layout.SUMMARY):
        assert (by_worker / name).read_bytes() == (by_driver / name).read_bytes(), name
    values = reader.read_scores(layout.RunDir(by_worker)).column("value").to_pylist()
    assert set(values) == {0.0, 1.0}  # the scores are not all alike, so the comparison above can fail
    assert "scoring hash" not in capsys.readouterr().err
    assert main(["verify", str(by_worker)]) == 0


def test_rows_scored_under_another_scoring_hash_are_scored_again_by_the_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    honest = _run(tmp_path, "honest")
    other = _run(tmp_path, "other", tamper="hash")
    assert (other / layout.SCORES).read_bytes() == (honest / layout.SCORES).read_bytes()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "scoring hash" in line]
    assert len(warnings) == 1 and "000000000000" in warnings[0] and "the driver scores its parts" in warnings[0]


def test_verify_recomputes_rows_a_worker_scored_wrongly_under_the_run_s_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lying = _run(tmp_path, "lying", tamper="values")
    assert set(reader.read_scores(layout.RunDir(lying)).column("value").to_pylist()) == {
        1.0
    }  # taken: the worker is trusted to run
    capsys.readouterr()
    assert main(["verify", str(lying)]) == 1
    assert "scores.parquet" in (err := capsys.readouterr().err) and "the recorded scorer gives" in err


def test_a_scored_part_is_the_driver_s_scoring_of_the_same_rows_and_stays_under_ray_s_inline_limit() -> None:
    prepared = runner.prepare(load(["limit=64", "run.progress=false"]))
    setup = ScoringSetup(ScorerConfig(), ScoringContext())
    results = run_episodes(
        HalfRight(), list(prepared.episodes)[:64], {"name": "evalrun", "version": "t", "git_commit": None}
    )
    part = encode_part(results, Provenance("ray-0", "{}", 64, 0.0), PartScorer(setup))
    assert part.rows is None and part.scored is not None
    decoded = reader.decode_output_part(part.table, "part", score_columns(ScorerConfig()))
    assert part.scored.table().equals(RowScoring(ScorerConfig())(decoded))
    assert len(pickle.dumps(BatchOutcome(part, 64, "ray-0"))) < 100 * 1024  # Ray's max_direct_call_object_size
    with pytest.raises(ValueError, match="scored rows with columns"):
        Scoring(ScorerConfig()).add_scored(decoded)


def test_a_worker_that_cannot_build_the_scorer_leaves_the_scoring_to_the_driver() -> None:
    def stub(spec: WorkerSpec) -> HalfRight:
        return HalfRight()

    prepared = runner.prepare(load(list(CONFIG)))
    worker = RayEngineWorker(replace(prepared.worker_spec, engine_factory=stub), "ray-0")
    generator = {"name": "evalrun", "version": "t", "git_commit": None}
    unknown = pickle.dumps(ScoringSetup(ScorerConfig(name="registered-only-in-the-driver"), ScoringContext()))
    [outcome] = worker.run_batches(RunContext(prepared.episodes, generator, unknown), [(0, 0, 2)])
    assert outcome.part.scored is None
    known = pickle.dumps(ScoringSetup(ScorerConfig(), ScoringContext()))
    [outcome] = worker.run_batches(RunContext(prepared.episodes, generator, known), [(0, 0, 2)])
    scored = outcome.part.scored
    assert scored is not None and pc.sum(pc.list_value_length(scored.table().column("value"))).as_py() == 2
