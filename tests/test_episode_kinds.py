"""A third kind of episode, defined only here, runs through run, verify, replay, rescore, report and export
with no change outside this file (docs/design.md "Kinds of episode"): ``vote`` samples three answers per
item and scores the most common one (self-consistency), each sample a model call of its own in the chain."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import EvalConfig, load
from evalrun.engines import Completion, GenerationRequest
from evalrun.episodes import EPISODE_KINDS, Engines, ModelFiles, episode_kind
from evalrun.episodes.dataset import DatasetKind
from evalrun.episodes.harness import EpisodeResult, completion_record, encode_generator, generate_each
from evalrun.episodes.plan import Episode
from evalrun.errors import BadInput, CheckFailed
from evalrun.export.inspect_log import export_inspect
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, prepare
from evalrun.records.canonical import Canonical
from evalrun.records.chain import ChainBuilder
from evalrun.records.entries import EndEntry, EpisodeSeeds, HeaderEntry, ModelEntry, generation_request
from evalrun.records.formats import Generator
from evalrun.records.seeds import derive_seed
from evalrun.records.view import ChainView
from evalrun.report import build_report
from evalrun.tasks import Task

VOTES = 3


@dataclass(frozen=True)
class VoteEpisode(Episode):
    kind: ClassVar[str] = "vote"


def _majority(completions: Sequence[Completion]) -> Completion:
    """The first completion whose text is the most common (ties: the earliest)."""
    counts = Counter(c.text for c in completions)
    best = max(counts.values())
    return next(c for c in completions if counts[c.text] == best)


@episode_kind("vote")
class VoteKind(DatasetKind):
    """A dataset task's items, each answered ``VOTES`` times with its own sampling seed; the output is the
    majority answer. Loading, the manifest's sections, the output rows and the scoring context are the
    dataset kind's."""

    name = "vote"

    def plan(self, config: EvalConfig, task: Task, model: ModelFiles) -> Sequence[VoteEpisode]:
        names = [f.name for f in fields(Episode)]
        return [VoteEpisode(**{n: getattr(e, n) for n in names}) for e in super().plan(config, task, model)]

    def prompt_record(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return {**super().prompt_record(config, task), "votes": VOTES}

    def identity(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return {**super().identity(config, task), "kind": self.name, "votes": VOTES}

    def section(self, config: EvalConfig, task: Task) -> dict[str, Any]:
        return {**super().section(config, task), "kind": self.name, "votes": VOTES}

    def run(self, engines: Engines, episodes: list[VoteEpisode], generator: dict[str, Any] | Canonical) -> list[Any]:
        requests = [
            GenerationRequest(e.prompt, replace(e.sampling, seed=derive_seed(str(e.sampling.seed), "vote", v)),
                              e.episode_id, v)
            for e in episodes for v in range(VOTES)
        ]  # fmt: skip
        outcomes = generate_each(engines.engine, requests)
        typed = Generator.model_validate_json(encode_generator(generator))
        results = []
        for i, e in enumerate(episodes):
            chain = ChainBuilder(e.episode_id)
            chain.append(HeaderEntry, generator=typed, item=e.item_id, repeat=e.repeat, seed=e.seed,
                         seeds=EpisodeSeeds(sampling=str(e.sampling.seed)), task=e.task)  # fmt: skip
            mine = outcomes[i * VOTES : (i + 1) * VOTES]
            completions = [o for o in mine if isinstance(o, Completion)]
            assert len(completions) == VOTES, mine  # the tiny model's prompts all fit
            for v, (request, completion) in enumerate(zip(requests[i * VOTES :], completions, strict=False)):
                chain.append(ModelEntry, call=v, request=generation_request(request.prompt, request.sampling),
                             response=completion_record(completion))  # fmt: skip
            chain.append(EndEntry, model_calls=VOTES, status="ok")
            results.append(EpisodeResult(e, _majority(completions), tuple(chain.lines), chain.head, e.prompt_sha256))
        return results

    def run_batches(self, engines: Engines, batches: Iterable[list[VoteEpisode]],
                    generator: dict[str, Any] | Canonical) -> Iterator[list[Any]]:  # fmt: skip
        for batch in batches:
            yield self.run(engines, batch, generator)

    def replay(self, engines: Engines, episode: VoteEpisode, recorded: Sequence[str],
               generator: dict[str, Any] | Canonical) -> EpisodeResult:  # fmt: skip
        (result,) = self.run(engines, [episode], generator)
        return result

    def recorded_prompt_record(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().recorded_prompt_record(manifest), "votes": manifest["task"]["votes"]}

    def row_mismatch(self, row: dict[str, Any], chain: ChainView) -> str | None:
        header, calls = chain.header, chain.generations
        if len(calls) != VOTES:
            return "output"
        chosen = _majority([Completion(c.response.text, tuple(c.response.token_ids), tuple(c.response.logprobs),
                                       c.response.finish_reason, 0) for c in calls])  # fmt: skip
        expected = {"task": header.task, "item_id": header.item, "seed": header.seed, "repeat": header.repeat,
                    "prompt": calls[0].request.prompt, "output": chosen.text, "token_ids": list(chosen.token_ids),
                    "finish_reason": chosen.finish_reason}  # fmt: skip
        return next((column for column, value in expected.items() if row[column] != value), None)


VOTE = ("cluster=inline", "task.kind=vote", "decoding=sample", "limit=4", "seeds.repeats=2")


@pytest.fixture(scope="module")
def vote_run(inline_dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vote")
    return execute(prepare(load([f"run.root={root}", "run.progress=false", *VOTE])), inline_dispatcher)


def test_a_kind_defined_here_runs_verifies_replays_rescores_reports_and_exports(vote_run: Path, tmp_path: Path) -> None:
    manifest = json.loads((vote_run / "manifest.json").read_text())
    assert manifest["task"]["kind"] == "vote" and manifest["digest_inputs"]["prompt_pack"]["votes"] == VOTES
    rows = pq.read_table(vote_run / "outputs").to_pylist()
    assert len(rows) == 4 * 2
    chains: dict[str, list[dict[str, Any]]] = {}
    for part in sorted((vote_run / "log").iterdir()):
        for line in part.read_text().splitlines():
            entry = json.loads(line)
            chains.setdefault(entry["episode"], []).append(entry)
    for row in rows:
        calls = [e for e in chains[row["episode_id"]] if e["kind"] == "model"]
        assert [c["call"] for c in calls] == list(range(VOTES))
        texts = Counter(c["response"]["text"] for c in calls)
        assert texts[row["output"]] == max(texts.values())  # the row holds the majority answer
    assert len({c["request"]["sampling"]["seed"] for chain in chains.values() for c in chain if c["kind"] == "model"}) \
        == 4 * 2 * VOTES  # every vote sampled with a seed of its own  # fmt: skip

    assert verify_run(vote_run).scores == "recomputed"
    replayed = replay_run(vote_run, [])
    assert not replayed.divergences and replayed.reproduced == 8 and replayed.root_matches and replayed.scores_identical
    assert rescore_run(vote_run, []).identical

    report = build_report([vote_run], tmp_path / "report.html")
    assert report.runs[0].verification.ok and "vote" in (tmp_path / "report.html").read_text()
    exported = export_inspect(vote_run, tmp_path / "vote.eval")
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(exported.output))
    assert len(log.samples or []) == 8
    assert {s.output.completion for s in log.samples or []} == {r["output"] for r in rows}


def test_a_forged_vote_fails_verify_naming_the_column(vote_run: Path, tmp_path: Path) -> None:
    """verify checks each row with the run's own kind: a row whose output is not the majority of its votes fails."""
    forged = Path(shutil.copytree(vote_run, tmp_path / "forged"))
    part = sorted((forged / "outputs").iterdir())[0]
    table = pq.read_table(part)
    rows = table.to_pylist()
    rows[0]["output"] = rows[0]["output"] + " (not what was voted)"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), part)
    with pytest.raises(CheckFailed, match=r"column 'output' differs from the chain"):
        verify_run(forged)


def test_a_world_task_given_a_dataset_kind_is_refused_naming_task_kind() -> None:
    for kind in ("dataset", "vote"):
        with pytest.raises(BadInput, match=r"task\.kind.*expected task\.kind=world") as info:
            prepare(load(["task=invoice_desk", f"task.kind={kind}"]))
        assert info.value.where == "task.kind" and repr(kind) in info.value.message


def test_an_unregistered_kind_is_refused_naming_task_kind_before_anything_loads() -> None:
    with pytest.raises(BadInput, match=r"task\.kind") as info:
        prepare(load(["task.kind=nope"]))
    assert "vote" in str(info.value) and "dataset" in str(info.value) and "world" in str(info.value)
    assert "vote" in EPISODE_KINDS.names()
