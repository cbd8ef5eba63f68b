"""Bad input is refused before any model loads: exit 2, a message naming what is wrong, no record."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.config import BUILTIN_TASKS, MODELS_DIR, load, load_stored, to_yaml, validate
from evalrun.episodes.plan import episode_id
from evalrun.errors import BadInput
from evalrun.pipeline.manifest import seed_set_record, seeds_identity, seeds_section
from evalrun.pipeline.runner import prepare
from evalrun.records.seeds import derive_seed

MODEL_DIR = MODELS_DIR / "tiny-adder"
GOLDEN = Path(__file__).resolve().parent / "golden"


def evalrun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evalrun.cli", "run", f"run.root={tmp_path / 'runs'}", *overrides],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["decoding.temperature=-1"], "decoding.temperature"),
        (["decoding.temperature=hot"], "decoding.temperature"),
        (["decoding.temperature=3"], "decoding.temperature"),
        (["decoding.max_tokens=0"], "decoding.max_tokens"),
        (["task=nope"], "task"),
        (["task.dataset=missing.jsonl"], "task.dataset"),
        (["seeds.set=[1,2,1]"], "seeds.set"),
        (["seeds.repeats=0"], "seeds.repeats"),
        (["engine.max_num_seqs=0"], "engine.max_num_seqs"),
        (["decoding.temprature=0.5"], "temprature"),
        (["task.scorer.name=bleu"], "task.scorer.name"),
        (["cluster=ray"], "cluster.address"),
    ],
)
def test_bad_config_exits_2_before_anything_is_written(tmp_path: Path, overrides: list[str], named: str) -> None:
    result = evalrun(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, let alone a record.json
    assert "Loading" not in result.stderr and "vllm" not in result.stderr.lower()


def test_malformed_dataset_names_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "a", "answer": "1", "q": "x"}\n{"id": "b", "answer": \n', encoding="utf-8")
    template = tmp_path / "t.jinja"
    template.write_text("{{ q }}", encoding="utf-8")
    result = evalrun(tmp_path, "task=jsonl", "task.name=mine", f"task.dataset={data}", f"task.template={template}")
    assert result.returncode == 2
    assert f"{data}:2" in result.stderr
    data.write_text('{"id": "a", "answer": "1", "q": "x"}\n{"id": "a", "answer": "2", "q": "y"}\n', encoding="utf-8")
    result = evalrun(tmp_path, "task=jsonl", "task.name=mine", f"task.dataset={data}", f"task.template={template}")
    assert result.returncode == 2 and f"{data}:2" in result.stderr and "duplicate item id 'a'" in result.stderr


def test_template_variable_missing_from_items_is_bad_input(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("Q: {{ quesion }}\nA:", encoding="utf-8")
    with pytest.raises(BadInput) as err:
        prepare(load([f"task.template={template}"]))
    assert str(template) in str(err.value) and "quesion" in str(err.value)


def test_model_with_a_changed_file_is_refused_naming_file_and_both_hashes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(MODEL_DIR, model)
    config = model / "config.json"
    config.write_text(config.read_text() + " ", encoding="utf-8")
    result = evalrun(tmp_path, f"model.path={model}", "cluster=inline")  # (Ray's early start: test_startup.py)
    assert result.returncode == 2
    pinned = load([]).model.sha256["config.json"]
    from evalrun.records.canonical import file_sha256

    assert str(config) in result.stderr and pinned in result.stderr and file_sha256(config) in result.stderr
    # An explicitly unpinned model is accepted, and the manifest will say so.
    prepared = prepare(load([f"model.path={model}", "model.pinned=false"]))
    assert prepared.model.as_record()["pinned"] is False


def test_digest_parts_move_independently(tmp_path: Path) -> None:
    base = prepare(load(["limit=3"])).digest
    template = tmp_path / "template.jinja"
    text = (BUILTIN_TASKS / "addition" / "template.jinja").read_text(encoding="utf-8")
    template.write_text(text.replace("A:", "A;"), encoding="utf-8")
    edited = prepare(load(["limit=3", f"task.template={template}"])).digest
    assert edited.prompt_pack != base.prompt_pack and edited.digest != base.digest
    assert (edited.seed_set, edited.scoring) == (base.seed_set, base.scoring)

    reseeded = prepare(load(["limit=3", "seeds.set=[0,1]"])).digest
    assert reseeded.seed_set != base.seed_set
    assert (reseeded.prompt_pack, reseeded.scoring) == (base.prompt_pack, base.scoring)

    rescored = prepare(load(["limit=3", "task.scorer.name=number"])).digest
    assert rescored.scoring != base.scoring
    assert (rescored.prompt_pack, rescored.seed_set) == (base.prompt_pack, base.seed_set)


def test_master_auto_generates_a_seed_that_config_yaml_holds_and_the_manifest_marks(tmp_path: Path) -> None:
    first, second = load(["seeds.master=auto"]), load(["seeds.master=auto"])
    assert first.seeds.master_generated and second.seeds.master_generated
    assert first.seeds.master != second.seeds.master and all(0 <= c.seeds.master < 2**53 for c in (first, second))
    stored = tmp_path / "config.yaml"
    stored.write_text(to_yaml(first), encoding="utf-8")
    assert f"master: {first.seeds.master}\n" in stored.read_text(encoding="utf-8")
    reloaded = validate(load_stored(stored, []))  # as resume, replay and check reload a run
    assert reloaded.seeds.master == first.seeds.master and not reloaded.seeds.master_generated
    marked = {"master": first.seeds.master, "set": [0], "repeats": 1, "master_generated": True}
    assert seeds_section(first.seeds) == marked and seeds_section(reloaded.seeds) == _without(marked)
    assert seeds_identity(first.seeds) == seeds_identity(reloaded.seeds) == _without(marked)  # resume: same identity
    assert first.seeds.fewshot_seed == first.seeds.master


def _without(record: dict[str, object], key: str = "master_generated") -> dict[str, object]:
    return {k: v for k, v in record.items() if k != key}


def test_seeds_records_of_a_default_run_are_those_of_runs_made_before_the_fewshot_seed() -> None:
    golden = json.loads((GOLDEN / "addition-v1" / "manifest.json").read_text(encoding="utf-8"))
    default = load([]).seeds
    assert seeds_section(default) == seeds_identity(default) == golden["seeds"] == golden["identity"]["seeds"]
    assert seed_set_record(default.as_record()) == golden["seeds"]
    given = load(["task=addition_fewshot", "seeds.fewshot=1234"]).seeds  # given, recorded, same digest
    assert seeds_section(given) == {**golden["seeds"], "fewshot": 1234}
    assert seed_set_record(given.as_record()) == golden["seeds"]


def test_plan_is_items_times_seed_set_times_repeats() -> None:
    prepared = prepare(load(["limit=5", "seeds.set=[3,4]", "seeds.repeats=3"]))
    assert len(prepared.episodes) == 5 * 2 * 3
    assert len({e.episode_id for e in prepared.episodes}) == 30
    assert len({e.sampling.seed for e in prepared.episodes}) == 30
    again = prepare(load(["limit=5", "seeds.set=[3,4]", "seeds.repeats=3"]))
    assert [e.episode_id for e in again.episodes] == [e.episode_id for e in prepared.episodes]
    # made on demand: seeds x repeats x items, the same episode by index, by slice and in a pass
    plan = prepared.episodes
    episodes = list(plan)
    assert [(e.seed, e.repeat, e.item_id) for e in episodes[:6]] == [
        (3, 0, "add-000"), (3, 0, "add-001"), (3, 0, "add-002"), (3, 0, "add-003"), (3, 0, "add-004"),
        (3, 1, "add-000"),
    ]  # fmt: skip
    assert [plan[i] for i in range(len(plan))] == episodes == plan[:] and plan[-1] == episodes[-1]
    assert plan[7:20:3] == episodes[7:20:3]
    master = prepared.config.seeds.master
    for e in episodes:  # the plan's templates give what the generic functions give
        assert e.sampling.seed == derive_seed(master, "sampling", e.task, e.item_id, e.seed, e.repeat)
        assert e.episode_id == episode_id(e.task, e.item_id, e.seed, e.repeat, {"sampling": str(e.sampling.seed)})
    with pytest.raises(IndexError):
        plan[len(plan)]


def test_hub_id_and_revision_resolve_from_the_local_cache_only(tmp_path: Path) -> None:
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--acme--adder" / "snapshots" / revision
    shutil.copytree(MODEL_DIR, snapshot)
    hub = ["model.path=null", "model.id=acme/adder", f"model.cache_dir={tmp_path / 'hub'}"]
    prepared = prepare(load(["limit=2", *hub, f"model.revision={revision}"]))
    assert prepared.model.path == snapshot.resolve() and prepared.model.revision == revision
    with pytest.raises(BadInput) as missing:
        prepare(load(["limit=2", *hub, "model.revision=" + "f" * 40]))
    assert missing.value.where == "model.id" and "not in the local hub cache" in missing.value.message
    with pytest.raises(BadInput) as unpinned_revision:
        prepare(load(["limit=2", *hub]))
    assert unpinned_revision.value.where == "model.revision"


def test_a_newline_stop_string_typed_on_the_command_line_is_a_newline() -> None:
    """Hydra hands `decoding.stop=["\\n"]` over as a backslash and an n, which never matches: evalrun reads
    the escapes \\n, \\t, \\r and \\\\ in stop strings (decoding.stop, task.world.stop)."""
    from evalrun.config import load as load_config

    assert load_config(['decoding.stop=["\\n"]']).decoding.stop == ("\n",)
    assert load_config(["decoding.stop=['a\\tb']"]).decoding.stop == ("a\tb",)
    world = load_config(["task=invoice_desk", 'task.world.stop=["\\n\\n"]'])
    assert world.task.world is not None and world.task.world.stop == ("\n\n",)


def test_a_stored_config_is_read_with_the_stop_strings_it_ran_with(tmp_path: Path) -> None:
    """Escapes are read in what is typed, never again in a run's stored config: a run made with a backslash and
    an n (before the escapes were read, or typed as ``\\\\n``) replays and resumes with those two characters."""
    import yaml

    stored = yaml.safe_load((GOLDEN / "addition-v1" / "config.yaml").read_text())
    stored["decoding"]["stop"] = ["a\\nb", "\n"]  # a backslash and an n; a newline
    stored["model"]["path"] = str(MODEL_DIR)  # where the checkout keeps it now
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(stored))
    assert validate(load_stored(path, [])).decoding.stop == ("a\\nb", "\n")
    assert validate(load_stored(path, ['decoding.stop=["\\n"]'])).decoding.stop == ("\n",)
    assert load(["decoding.stop=['a\\\\nb']"]).decoding.stop == ("a\\nb",)  # typed \\n: a backslash, an n


@pytest.mark.parametrize(
    "text",
    ["seeds.set=[0, 1,2 ,-3]", "seeds.set=[]", "seeds.set=[7]", "a.b=[-0]", "a.b=[ 5 ]",  # read here
     "seeds.set=[007]", "seeds.set=[+5]", "seeds.set=[1_000]", "seeds.set=[ ]", "a=[1,2]", "+a.b=[1]"],  # Hydra's
)  # fmt: skip
def test_a_list_of_integers_is_read_as_hydras_parser_reads_it(text: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from evalrun.config.overrides import parse_overrides

    (override,) = parse_overrides([text])
    hydras = OverridesParser.create().parse_override(text)
    assert override.hydra == hydras and override.value == hydras.value()


def test_a_long_seed_set_on_the_command_line_composes_and_the_last_override_of_a_key_wins() -> None:
    seeds = ",".join(map(str, range(3000)))
    assert load([f"seeds.set=[{seeds}]"]).seeds.set == tuple(range(3000))  # Hydra's parser: 1 s a parse
    assert load([f"seeds.set=[{seeds}]", "seeds.set=[3]"]).seeds.set == (3,)
    assert load(["seeds.set=[1,2]", "seeds.set=[+4]", "seeds.repeats=2"]).seeds.set == (4,)  # Hydra's, after
    assert load(["seeds.set=[+4]", "seeds.set=[5, 6]"]).seeds.set == (5, 6)
    with pytest.raises(BadInput) as unknown:
        load(["seeds.sets=[1,2]"])
    assert unknown.value.where == "seeds.sets"
