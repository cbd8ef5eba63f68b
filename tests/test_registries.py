"""Plug-in registries, typed settings and the one override parser: no engine needed.

A plug-in of each kind (engine, dispatcher, scorer, normaliser) is one decorated class or function;
config names are checked against the registries before any model loads; the typed settings give
back exactly the records the old untyped code wrote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from omegaconf import OmegaConf

from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import (
    BUILTIN_TASKS,
    EvalConfig,
    ScorerConfig,
    compose_config,
    load,
    load_stored,
    parse_overrides,
    to_yaml,
    validate,
)
from evalrun.config.registry import Registry
from evalrun.config.schema import Schema
from evalrun.engines import ENGINES, Completion, GenerationRequest, engine
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import DISPATCHERS, InlineDispatcher, dispatcher
from evalrun.pipeline.manifest import seeds_identity, seeds_section
from evalrun.pipeline.runner import execute, prepare
from evalrun.records.canonical import canonical_hash, sha256_hex
from evalrun.scoring import NORMALIZERS, SCORERS, Score, normalizer, scorer
from evalrun.scoring.registry import Row, RowScorer

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "addition-v1"
GOLDEN_OVERRIDES = ["limit=4", "cluster=inline", "task.references=null"]  # made before frozen answer sets
GOLDEN_COMMIT = "73bc763"  # the code that made tests/golden
RELOCATE = [
    f"task.dataset={BUILTIN_TASKS}/addition/test.jsonl",
    f"task.template={BUILTIN_TASKS}/addition/template.jinja",
]


# --- the registries -------------------------------------------------------------------------


def test_built_in_plug_ins_are_registered_by_name() -> None:
    assert ENGINES.names() == ("hf", "openai", "vllm")
    assert DISPATCHERS.names() == ("inline", "local", "ray")
    assert SCORERS.names() == ("choice", "exact_match", "lm_eval", "number", "regex", "rubric", "verifier")
    assert NORMALIZERS.names() == ("collapse_whitespace", "lower", "strip", "strip_punctuation")
    versions = {name: SCORERS.get(name).version for name in SCORERS.names()}
    assert versions == {**dict.fromkeys(SCORERS.names(), "1"), "lm_eval": "2"}  # 2: scored by lm-eval's library
    assert SCORERS.get("choice").columns[-2:] == ("shuffle_order", "option_logprobs")


def test_engine_names_are_known_without_importing_vllm_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "import evalrun.pipeline.runner, evalrun.audit.replay, evalrun.audit.rescore\n"
        "from evalrun.engines import ENGINES\n"
        "ENGINES.check('vllm'); ENGINES.check('hf')\n"
        "print([m for m in ('vllm', 'torch', 'transformers', 'ray') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_registry_names_the_config_field_and_refuses_two_plug_ins_under_one_name() -> None:
    registry: Registry[Any] = Registry("widget", field="task.widget")
    first = registry.register("a")(object())
    assert registry.get("a") is first and "a" in registry
    with pytest.raises(BadInput) as unknown:
        registry.get("b")
    assert unknown.value.where == "task.widget" and "('a',)" in unknown.value.message
    with pytest.raises(ValueError, match="two widgets"):
        registry.add("a", object())
    registry.declare("lazy", "evalrun.errors")  # a module that registers nothing
    assert registry.names() == ("a", "lazy")
    with pytest.raises(RuntimeError, match="did not"):
        registry.get("lazy")


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["engine.name=tpu"], "engine.name"),
        (["cluster.name=slurm"], "cluster.name"),
        (["task.scorer.name=bleu"], "task.scorer.name"),
        (["task.scorer.normalize=[strip,casefold]"], "task.scorer.normalize"),
        (["task.scorer.name=regex"], "task.scorer.pattern"),
        (["task.scorer.name=regex", "task.scorer.pattern='(a'"], "task.scorer.pattern"),
        (["task.scorer.name=regex", "task.scorer.pattern='a(b)'", "task.scorer.group=2"], "task.scorer.group"),
        (["task.scorer.extract=middle"], "task.scorer.extract"),
        (["model.dtype=float8"], "model.dtype"),
        (["task.choices.scoring=vote"], "task.choices.scoring"),
        (["task.choices.scoring=loglikelihood_rolling"], "task.choices.scoring"),  # an lm-eval output type only
    ],
)
def test_a_name_no_registry_holds_is_bad_input_naming_the_field(overrides: list[str], named: str) -> None:
    with pytest.raises(BadInput) as caught:
        prepare(load(["limit=1", *overrides]))
    assert caught.value.where == named, caught.value


# --- one decorated class or function per plug-in ------------------------------------------------


@pytest.fixture
def plug_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registries restored afterwards: the plug-ins a test registers do not outlive it."""
    for registry in (ENGINES, DISPATCHERS, SCORERS, NORMALIZERS):
        monkeypatch.setattr(registry, "_plugins", dict(registry._plugins))
    yield


def test_one_decorated_class_or_function_adds_an_engine_dispatcher_scorer_and_normaliser(
    plug_ins: None, tmp_path: Path
) -> None:
    @engine("echo")
    class EchoEngine:
        """Answers every prompt with its last word."""

        def __init__(self, model_path: Path, model_dtype: str, settings: dict[str, Any]) -> None:
            self.settings = settings

        def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
            return [Completion(" " + r.prompt.split()[-1], (1,), (0.0,), "stop", 3) for r in requests]

        def loglikelihood(self, requests: list[Any]) -> list[Any]:
            raise NotImplementedError

        def describe(self) -> dict[str, Any]:
            return {"name": "echo", "version": "0", "settings": self.settings}

    batches: list[int] = []  # each batch's size, as the dispatcher takes it

    @dispatcher("counting")
    class CountingDispatcher(InlineDispatcher):
        def map(self, batches_: Iterable[list[Any]], generator: dict[str, Any], scoring: Any = None,
                sink: Any = None) -> Iterator[Any]:  # fmt: skip
            def counted() -> Iterator[list[Any]]:
                for batch in batches_:
                    batches.append(len(batch))
                    yield batch

            yield from super().map(counted(), generator, scoring)

    @normalizer("shout")
    def shout(text: str) -> str:
        return text.upper()

    @scorer("length", version="7")
    def length(spec: ScorerConfig, context: Any) -> RowScorer:
        def score(row: Row) -> list[Score]:
            return [Score("length", float(len(row["output"])), None)]

        return score

    overrides = ["engine.name=echo", "cluster=inline", "cluster.name=counting", "cluster.batch_size=2", "limit=3",
                 "task.scorer.name=length", "task.scorer.normalize=[strip,shout]", "determinism=off",
                 f"run.root={tmp_path}", "run.progress=false"]  # fmt: skip
    run = execute(prepare(load(overrides)))
    assert batches == [2, 1]  # 3 episodes in batches of 2
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["engine"]["name"] == "echo" and manifest["cluster"]["name"] == "counting"
    scores = pq.read_table(run / "scores.parquet").to_pydict()
    assert set(scores["metric"]) == {"length"} and set(scores["scorer_version"]) == {"7"}
    verify_run(run)
    assert rescore_run(run, []).identical


# --- typed settings -------------------------------------------------------------------------


# left out while unset (task.path: an lm-eval task's YAML)
CHAT_SETTINGS = (
    "chat_format",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_parser",
    "path",
    "allow_unpinned_dataset",
    "dataset_revision",
    "system_instruction",
    "fewshot_as_multiturn",
    "overrides",
)
SERVED_SETTINGS = (
    "base_url",
    "served_model",
    "api_key_env",
    "serve",
    "max_concurrency",
    "timeout_s",
    "max_retries",
    "api",
    "token_ids",
)


CLUSTER_START = ("start_timeout_s", "min_workers", "resources_per_worker")  # added after runs were recorded


def test_settings_are_typed_frozen_and_give_back_the_composed_record() -> None:
    cfg = compose_config(["task=addition_mc"])
    raw = OmegaConf.to_container(cfg, resolve=True)
    config = validate(cfg)
    assert raw["task"].pop("kind") is None  # a setting left out of the record while null (records stay as before)
    assert [raw["task"].pop(k) for k in CHAT_SETTINGS] == [None, None, {}, None, None, None, None, None, None, {}]
    assert raw["task"]["choices"].pop("delimiter") is None  # the same
    assert raw["determinism"].pop("require_invariant") is None  # the same
    assert [raw["engine"].pop(k) for k in SERVED_SETTINGS] == [None] * len(SERVED_SETTINGS)  # engine=openai's, the same
    assert raw["engine"].pop("cpu_isa") is None  # the same (native)
    assert raw["engine"].pop("chunked_prefill") is None  # the same (vLLM's default)
    assert raw.pop("judge_engine") is None  # the same
    assert [raw.pop(k) for k in ("user_model", "user_engine")] == [None, None]  # the same
    assert [raw["run"].pop(k) for k in ("checkpoint_every_parts", "ledger", "part_writes")] == [None] * 3  # the same
    assert [raw["cluster"].pop(k) for k in CLUSTER_START] == [None, None, {}]  # the same
    assert config.as_record() == raw
    assert validate(compose_config(["task=addition_mc", "task.kind=dataset"])).as_record()["task"]["kind"] == "dataset"
    assert config.decoding.stop == ("\n",) and config.task.choices.scoring == "both"
    assert config.task.scorer == ScorerConfig(name="choice")
    with pytest.raises(FrozenInstanceError):
        config.decoding.temperature = 1.0  # type: ignore[misc]
    assert "dataset_path" not in config.as_record()


def test_the_hydra_schema_is_generated_from_the_settings_with_the_same_defaults() -> None:
    schema = OmegaConf.to_container(OmegaConf.structured(Schema))
    assert schema["task"].pop("kind") is None  # composed as null, left out of the record while null
    assert [schema["task"].pop(k) for k in CHAT_SETTINGS] == [None, None, {}, None, None, None, None, None, None, {}]
    assert schema["task"]["choices"].pop("delimiter") is None  # the same
    assert schema["determinism"].pop("require_invariant") is None  # the same
    assert [schema["engine"].pop(k) for k in SERVED_SETTINGS] == [None] * len(SERVED_SETTINGS)
    assert schema["engine"].pop("cpu_isa") is None
    assert schema["engine"].pop("chunked_prefill") is None
    assert schema.pop("judge_engine") is None
    assert [schema.pop(k) for k in ("user_model", "user_engine")] == [None, None]
    assert [schema["run"].pop(k) for k in ("checkpoint_every_parts", "ledger", "part_writes")] == [None] * 3
    assert [schema["cluster"].pop(k) for k in CLUSTER_START] == [None, None, {}]
    assert schema == EvalConfig().as_record()


def test_a_packs_decoding_settings_are_applied_typed_and_checked() -> None:
    config = load(["task=addition_fewshot"])
    assert config.with_decoding({"max_tokens": 8, "stop": ["\n"]}).decoding.stop == ("\n",)
    with pytest.raises(BadInput) as caught:
        config.with_decoding({"temperature": 9.0})
    assert caught.value.where == "decoding.temperature"


# --- the golden run: same records, same digest parts (but scoring) ---------------------------------


def test_the_default_config_records_what_the_golden_run_recorded() -> None:
    prepared = prepare(load([*GOLDEN_OVERRIDES, *RELOCATE]))
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    digest = prepared.digest.as_record()
    assert (digest["prompt_pack"], digest["seed_set"]) == (
        manifest["digest"]["prompt_pack"],
        manifest["digest"]["seed_set"],
    )
    # The scoring part hashes the scoring package's source files, which changed since: it differs.
    config = prepared.config
    assert config.decoding.as_record() == manifest["decoding"]
    assert seeds_section(config.seeds) == seeds_identity(config.seeds) == manifest["seeds"]  # no fewshot: left out
    assert config.cluster.as_record() == manifest["cluster"]
    assert config.task.scorer.as_record() == manifest["task"]["scorer"]
    assert config.task.choices.as_record() == manifest["task"]["choices"]
    asked = {k: v for k, v in config.determinism.as_record().items() if k != "name"}
    assert asked.pop("canary") is True  # added with the batch-invariance canary, at its default
    assert asked == manifest["determinism"]["asked"]
    assert {k: v for k, v in config.engine.as_record().items() if k != "dtype"} == {
        k: v for k, v in manifest["engine"]["settings"].items() if k != "dtype"
    }
    recorded = yaml.safe_load((GOLDEN / "config.yaml").read_text())
    written = yaml.safe_load(to_yaml(config))
    for section, key in (("run", "dir"), ("task", "dataset"), ("task", "template"), ("model", "path")):
        written[section][key] = recorded[section][key]  # paths of the machine it was made on
    assert written["task"].pop("on_overlong") == "fail_episode"  # a setting added after the golden run, at its default
    assert written["task"].pop("world") is None  # added with agent tasks: none for a dataset task
    assert written["task"].pop("references") is None  # added with frozen answer sets
    assert written["seeds"].pop("fewshot") is None  # added with the few-shot seed: the master seed
    assert written["run"].pop("on_drift") is None  # added with worker provenance: the profile's default
    assert written["determinism"].pop("canary") is True  # added with the batch-invariance canary
    assert written.pop("report") is True  # added with the HTML report: its default
    assert written["run"].pop("checkpoint_every_s") == 300.0  # added with checkpoints: its default
    assert written == recorded


def test_the_golden_scoring_part_differs_only_by_the_scoring_sources() -> None:
    """With the sources the golden run hashed (the scoring files of its commit, read from git), today's
    scoring record hashes to the golden's scoring part: scorer, version, params, python are unchanged."""
    old_files = {"__init__.py": "evalrun/scoring/__init__.py", "tasks/rubric.py": "evalrun/tasks/rubric.py",
                 "tasks/selection.py": "evalrun/tasks/selection.py"}  # fmt: skip
    sources = {}
    for name, path in old_files.items():
        shown = subprocess.run(["git", "show", f"{GOLDEN_COMMIT}:{path}"], capture_output=True, cwd=ROOT)
        if shown.returncode != 0:
            pytest.skip(f"commit {GOLDEN_COMMIT} is not in this checkout's git history")
        sources[name] = sha256_hex(shown.stdout)
    prepared = prepare(load([*GOLDEN_OVERRIDES, *RELOCATE]))
    assert prepared.digest.inputs is not None
    record = {**prepared.digest.inputs["scoring"], "sources": sources}
    assert set(record.pop("libraries")) == {"numpy", "pyarrow"}  # added since: the golden's has none
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    assert canonical_hash(record) == manifest["digest"]["scoring"]


# --- one override parser ------------------------------------------------------------------


def test_overrides_parse_lists_quotes_and_null_in_one_grammar() -> None:
    parsed = parse_overrides(["a=[strip,lower]", "b='x, (y)'", "c=null", "d=1.5", "e.f=/tmp/x y.jsonl"])
    assert [(o.key, o.value) for o in parsed] == [
        ("a", ["strip", "lower"]),
        ("b", "x, (y)"),
        ("c", None),
        ("d", 1.5),
        ("e.f", "/tmp/x y.jsonl"),
    ]
    with pytest.raises(BadInput) as caught:
        parse_overrides(["a=1", "b=(oops"])
    assert caught.value.where == "b=(oops"
    for text in ("+a=1", "~a", "a=1,2", "+model@judge_model=x"):
        with pytest.raises(BadInput) as caught:
            parse_overrides([text], plain=True)
        assert caught.value.where == text


def test_stored_config_overrides_use_the_same_parser_and_name_the_override() -> None:
    cfg = load_stored(GOLDEN / "config.yaml", ["decoding.stop=[a,'b c']", "task.scorer.normalize=[strip,lower]"])
    assert list(cfg.decoding.stop) == ["a", "b c"] and list(cfg.task.scorer.normalize) == ["strip", "lower"]
    for bad in ("decoding.temperature=hot", "decoding.nope=1", "cluster=ray"):
        with pytest.raises(BadInput) as caught:
            load_stored(GOLDEN / "config.yaml", [bad])
        assert caught.value.where == bad


def test_rescore_overrides_use_the_same_parser(tmp_path: Path) -> None:
    run = Path(shutil.copytree(GOLDEN, tmp_path / "run"))
    report = rescore_run(run, ["task.scorer.normalize=[strip,lower]", "scorer.tolerance=0"])
    assert report.identical and report.scorer_changed
    with pytest.raises(BadInput) as caught:
        rescore_run(run, ["task.name=other"])
    assert caught.value.where == "task.name=other"
    with pytest.raises(BadInput) as caught:
        rescore_run(run, ["name=bleu"])
    assert caught.value.where == "task.scorer.name"
