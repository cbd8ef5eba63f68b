"""Prompt packs, seeded few-shot selection, option shuffling and rubrics: no engine needed."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from evalrun import cli
from evalrun.config import ScorerConfig, load
from evalrun.errors import BadInput
from evalrun.pipeline.runner import prepare
from evalrun.records.outputs import OUTPUT_SCHEMA
from evalrun.scoring import ScoringContext, score_outputs, scoring_hash
from evalrun.scoring.choice import parse_letter
from evalrun.scoring.rubric import aggregate, rubric_score
from evalrun.tasks.pack import load_pack
from evalrun.tasks.rubric import load_rubric
from evalrun.tasks.selection import select_fewshot, shuffle_order

BUILTIN = Path(__file__).resolve().parents[1] / "evalrun" / "tasks" / "builtin"


def plan(*overrides: str):
    return prepare(load(list(overrides))).episodes


def test_same_seed_same_prompts_fewshot_and_orders_different_master_different() -> None:
    for task in ("addition_fewshot", "addition_mc", "report_rubric"):
        a, b = plan(f"task={task}"), plan(f"task={task}")
        assert [(e.prompt, e.fewshot_ids, e.shuffle_order, e.judge_calls) for e in a] == [
            (e.prompt, e.fewshot_ids, e.shuffle_order, e.judge_calls) for e in b
        ]
    fewshot = plan("task=addition_fewshot"), plan("task=addition_fewshot", "seeds.master=99")
    assert [e.fewshot_ids for e in fewshot[0]] != [e.fewshot_ids for e in fewshot[1]]
    mc = plan("task=addition_mc"), plan("task=addition_mc", "seeds.master=99")
    assert [e.shuffle_order for e in mc[0]] != [e.shuffle_order for e in mc[1]]
    judged = plan("task=report_rubric"), plan("task=report_rubric", "seeds.master=99")
    orders = [[jc.order for jc in e.judge_calls] for e in judged[0]]
    assert orders != [[jc.order for jc in e.judge_calls] for e in judged[1]]
    # judges of one criterion see their own orders: not all equal across the run
    assert any(len({jc.order for jc in e.judge_calls if jc.criterion == "terse"}) > 1 for e in judged[0])


def test_a_fewshot_seed_draws_the_examples_and_nothing_else() -> None:
    """seeds.fewshot decides the few-shot examples, exactly as select_fewshot with that seed; the sampling
    seeds and episode ids stay the master's; equal to the master seed it changes nothing, digest included."""
    config = load(["task=addition_fewshot", "limit=20", "seeds.set=[0,1]"])
    default = prepare(config)
    pool = default.task.pack.fewshot
    assert pool is not None
    same = prepare(load(["task=addition_fewshot", "limit=20", "seeds.set=[0,1]", "seeds.fewshot=1234"]))
    assert same.episodes == default.episodes and same.digest == default.digest
    other = prepare(load(["task=addition_fewshot", "limit=20", "seeds.set=[0,1]", "seeds.fewshot=99"]))
    assert [e.episode_id for e in other.episodes] == [e.episode_id for e in default.episodes]
    assert [e.sampling for e in other.episodes] == [e.sampling for e in default.episodes]
    for e in other.episodes:
        chosen = select_fewshot(pool.ids, pool.examples, pool.k, pool.stratify, 99, "addition_fewshot", e.item_id)
        assert e.fewshot_ids == tuple(pool.ids[i] for i in chosen)
    pairs = list(zip(other.episodes, default.episodes, strict=True))
    changed = [(e, d) for e, d in pairs if e.fewshot_ids != d.fewshot_ids]
    assert len(changed) > len(pairs) / 2 and all(e.prompt != d.prompt for e, d in changed)  # other examples shown
    # the digest's seed-set part names it; the prompt pack and scoring parts are the same
    assert other.digest.seed_set != default.digest.seed_set and other.digest.digest != default.digest.digest
    assert (other.digest.prompt_pack, other.digest.scoring) == (default.digest.prompt_pack, default.digest.scoring)
    assert other.digest.inputs is not None and other.digest.inputs["seed_set"] == {
        "master": 1234, "set": [0, 1], "repeats": 1, "fewshot": 99}  # fmt: skip
    # another master with the master's old value as few-shot seed: the same examples, other sampling seeds
    moved = plan("task=addition_fewshot", "limit=20", "seeds.set=[0,1]", "seeds.master=99", "seeds.fewshot=1234")
    assert [e.fewshot_ids for e in moved] == [e.fewshot_ids for e in default.episodes]
    assert [e.prompt for e in moved] == [e.prompt for e in default.episodes]
    assert all(m.sampling.seed != d.sampling.seed for m, d in zip(moved, default.episodes, strict=True))


def test_a_fewshot_seed_without_a_fewshot_pool_is_refused() -> None:
    with pytest.raises(BadInput, match="task addition's prompt pack has no few-shot pool") as info:
        plan("task=addition", "seeds.fewshot=5")
    assert info.value.where == "seeds.fewshot"
    with pytest.raises(BadInput, match="an agent task") as info:
        load(["task=invoice_desk", "seeds.fewshot=5"])
    assert info.value.where == "seeds.fewshot"


def test_fewshot_and_orders_do_not_depend_on_repeats_or_seed_set_members() -> None:
    episodes = plan("task=addition_mc", "limit=5", "seeds.set=[0,1]", "seeds.repeats=2")
    by_item: dict[str, set] = {}
    for e in episodes:
        by_item.setdefault(e.item_id, set()).add((e.prompt, e.shuffle_order))
    assert all(len(v) == 1 for v in by_item.values())
    assert len({e.sampling.seed for e in episodes}) == len(episodes)


def test_fewshot_never_selects_the_item_itself_and_is_stratified() -> None:
    ids = [f"x{i}" for i in range(10)]
    examples = [{"id": i, "label": "a" if n < 7 else "b"} for n, i in enumerate(ids)]
    for item in ids:
        for master in range(20):
            chosen = select_fewshot(ids, examples, 4, None, master, "t", item)
            assert len(set(chosen)) == 4 and ids.index(item) not in chosen
            strat = select_fewshot(ids, examples, 4, "label", master, "t", item)
            labels = Counter(examples[i]["label"] for i in strat)
            assert ids.index(item) not in strat and labels == {"a": 2, "b": 2}
    assert select_fewshot(ids, examples, 4, None, 1, "t", "x0") == select_fewshot(ids, examples, 4, None, 1, "t", "x0")


def test_fewshot_ids_appear_in_the_prompt_in_order() -> None:
    lines = (BUILTIN / "addition_fewshot" / "fewshot.jsonl").read_text().splitlines()
    pool = {json.loads(line)["id"]: json.loads(line) for line in lines}
    for e in plan("task=addition_fewshot", "limit=20"):
        positions = [e.prompt.index(f"Q: {pool[i]['question']}\nA: {pool[i]['answer']}\n") for i in e.fewshot_ids]
        assert positions == sorted(positions) and len(e.fewshot_ids) == 3


def test_shuffle_order_maps_shown_letters_back_to_original_options() -> None:
    for e in plan("task=addition_mc", "limit=10"):
        assert sorted(e.shuffle_order) == list(range(4))
        for position, original in enumerate(e.shuffle_order):
            assert f"{'ABCD'[position]}) {e.options[original]}\n" in e.prompt
            assert parse_letter(f" {'ABCD'[position]}", e.shuffle_order) == original
    assert parse_letter("no letter here", (1, 0)) is None
    assert parse_letter(" Z", (1, 0)) is None


def test_cannot_assess_option_is_appended_before_shuffling() -> None:
    episodes = plan("task=addition_mc", "limit=30", "task.choices.cannot_assess=N/A")
    assert all(e.options[-1] == "N/A" and len(e.shuffle_order) == 5 for e in episodes)
    assert {e.shuffle_order.index(4) for e in episodes} != {4}  # it is shuffled with the rest
    assert all("N/A" in e.prompt for e in episodes)


def test_shuffle_order_is_seeded_per_item_criterion_and_judge() -> None:
    base = shuffle_order(6, 1, "t", "i")
    assert shuffle_order(6, 1, "t", "i") == base
    others = {shuffle_order(6, 1, "t", "i", "c", j) for j in ("j1", "j2", "j3", "j4")}
    assert len(others) > 1


def test_pack_hash_covers_templates_fewshot_and_decoding(tmp_path: Path) -> None:
    pack_dir = tmp_path / "pack"
    shutil.copytree(BUILTIN / "addition_fewshot", pack_dir)
    base = prepare(load(["task=addition_fewshot", f"task.prompt_pack={pack_dir}"])).digest
    assert base.prompt_pack == prepare(load(["task=addition_fewshot"])).digest.prompt_pack
    edits = {
        "user.jinja": lambda t: t.replace("Q:", "Q :", 1),
        "fewshot.jsonl": lambda t: t.replace('"answer": "109"', '"answer": "108"', 1),
        "pack.yaml": lambda t: t.replace("max_tokens: 8", "max_tokens: 7"),
    }
    for name, edit in edits.items():
        path = pack_dir / name
        original = path.read_text()
        path.write_text(edit(original))
        digest = prepare(load(["task=addition_fewshot", f"task.prompt_pack={pack_dir}"])).digest
        assert digest.prompt_pack != base.prompt_pack, name
        assert (digest.seed_set, digest.scoring) == (base.seed_set, base.scoring), name
        path.write_text(original)


def test_pack_decoding_wins_over_the_decoding_group() -> None:
    prepared = prepare(load(["task=addition_fewshot", "decoding.max_tokens=16"]))
    assert prepared.config.decoding.max_tokens == 8
    assert prepared.episodes[0].sampling.max_tokens == 8


def _rubric_copy(tmp_path: Path) -> Path:
    target = tmp_path / "report_rubric"
    shutil.copytree(BUILTIN / "report_rubric", target)
    return target / "rubric.yaml"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda t: t.replace("weight: 2", "weight: -2"), "criteria.0.weight"),
        (lambda t: t.replace("weight: 2", "weight: heavy"), "criteria.0.weight"),
        (lambda t: t.replace('{label: "no", value: 0}', '{label: "no", value: 3}', 1), "criteria.0.options.0.value"),
        (lambda t: t.replace("aggregation: mean", "aggregation: mode"), "aggregation"),
        (lambda t: t.replace("    kind: ordinal\n", "    kind: nominal\n", 1), "criteria.0.kind"),
        (lambda t: t.replace("judges: [j1, j2, j3]", "judges: []"), "judges"),
        (lambda t: t.replace("question: Total right?", "prompt: Total right?"), "criteria.0"),
        (lambda t: t.replace('      - {label: "yes", value: 1}\n', "", 1), "criteria.0.options"),
        (
            lambda t: (
                t + "  - id: correct\n    question: again\n    weight: 1\n    options: [{label: a, value: 0}, "
                "{label: b, value: 1}]\n"
            ),
            "criteria.2.id",
        ),
    ],
)
def test_malformed_rubric_fails_with_exit_2_naming_file_and_field(tmp_path: Path, capsys, edit, field) -> None:
    rubric = _rubric_copy(tmp_path)
    rubric.write_text(edit(rubric.read_text()))
    with pytest.raises(BadInput) as caught:
        load_rubric(rubric)
    assert str(rubric) in caught.value.where and field in caught.value.where
    code = cli.main(["run", "task=report_rubric", f"task.rubric={rubric}", f"run.root={tmp_path}/runs",
                     "cluster=inline"])  # fmt: skip
    assert code == 2
    assert str(rubric) in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: {**r, "choices": ["1"]}, "choices"),
        (lambda r: {**r, "choices": "12 13"}, "choices"),
        (lambda r: {**r, "choices": ["1", "1", "2"]}, "choices"),
        (lambda r: {**r, "answer": 7}, "answer"),
        (lambda r: {**r, "answer": "B"}, "answer"),
    ],
)
def test_malformed_choices_fail_with_exit_2_naming_file_line_and_field(tmp_path: Path, capsys, edit, field) -> None:
    lines = (BUILTIN / "addition_mc" / "test.jsonl").read_text().splitlines()
    lines[2] = json.dumps(edit(json.loads(lines[2])))
    data = tmp_path / "mc.jsonl"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput) as caught:
        load(["task=addition_mc", f"task.dataset={data}"])
    assert caught.value.where == f"{data}:3: field {field}"
    assert cli.main(["run", "task=addition_mc", f"task.dataset={data}", f"run.root={tmp_path}/runs"]) == 2
    assert f"{data}:3" in capsys.readouterr().err


def test_malformed_pack_fails_naming_file_and_field(tmp_path: Path) -> None:
    pack_dir = tmp_path / "pack"
    shutil.copytree(BUILTIN / "addition_fewshot", pack_dir)
    pack = pack_dir / "pack.yaml"
    text = pack.read_text()
    for edit, field in [
        (text.replace('version: "1.0"', "version: 1.0"), "field version"),
        (text.replace("k: 3", "k: 40"), "field fewshot.k"),
        (text.replace("user: user.jinja", "user: missing.jinja"), "field user"),
        (text.replace("max_tokens: 8", "max_tokens: lots"), "field decoding.max_tokens"),
        (text + "temperature: 1\n", "field temperature"),
    ]:
        pack.write_text(edit)
        with pytest.raises(BadInput) as caught:
            load_pack(pack_dir)
        assert str(pack) in caught.value.where and field in caught.value.where, caught.value


def test_aggregation_and_weighted_rubric_score() -> None:
    rubric = load_rubric(BUILTIN / "report_rubric" / "rubric.yaml")
    correct, terse = rubric.criteria
    assert correct.labels == ("no", "yes", "unsure") and correct.values == (0, 1, None)
    assert aggregate(correct, [1, 1, 0], "mean") == pytest.approx(2 / 3)
    assert aggregate(correct, [1, 2, None], "mean") == 1  # cannot-assess and no verdict are left out
    assert aggregate(correct, [2, None], "mean") is None
    assert aggregate(terse, [0, 1, 2], "median") == 0.5
    assert aggregate(terse, [0, 2, 2, 0], "majority") == 0  # a tie goes to the lowest option
    assert rubric_score(rubric, {"correct": 1.0, "terse": 0.0}) == pytest.approx(2 / 3)
    assert rubric_score(rubric, {"correct": None, "terse": 0.5}) == 0.5
    assert rubric_score(rubric, {"correct": None, "terse": None}) is None


CALLS = [(c, j) for c in ("correct", "terse") for j in ("j1", "j2", "j3")]


def _judged_rows(verdict_logprobs: list[list[float]]) -> object:
    import pyarrow as pa

    judgements = [
        {"criterion": c, "judge": j, "shuffle_order": [0, 1, 2] if c == "correct" else [0, 1, 2, 3],
         "output": None, "option_logprobs": lp}
        for (c, j), lp in zip(CALLS, verdict_logprobs, strict=True)
    ]  # fmt: skip
    row = {name: None for name in OUTPUT_SCHEMA.names}
    row.update(episode_id="e1" * 32, task="t", item_id="i", seed=0, repeat=0, output="5", target="5",
               judgements=judgements)  # fmt: skip
    return pa.Table.from_pylist([row], schema=OUTPUT_SCHEMA)


def test_a_weight_edit_changes_only_the_scoring_hash_and_the_judged_scores(tmp_path: Path) -> None:
    rubric_path = _rubric_copy(tmp_path)
    rubric = load_rubric(rubric_path)
    rubric_path.write_text(rubric_path.read_text().replace("weight: 2", "weight: 5"))
    edited = load_rubric(rubric_path)
    assert edited.judge_facing() == rubric.judge_facing()
    spec = ScorerConfig(name="rubric")
    a, b = ScoringContext("", rubric, "m"), ScoringContext("", edited, "m")
    assert scoring_hash(spec, a) != scoring_hash(spec, b)
    # correct: yes, yes, no; terse: yes, partly, unsure
    table = _judged_rows([[-5, -1, -9], [-4, -2, -9], [-1, -3, -9], [-9, -9, -1, -9], [-9, -1, -9, -9],
                          [-9, -9, -9, -1]])  # fmt: skip
    old = dict(zip(*score_outputs(table, spec, a).select(["metric", "value"]).to_pydict().values(), strict=True))
    new = dict(zip(*score_outputs(table, spec, b).select(["metric", "value"]).to_pydict().values(), strict=True))
    assert old["rubric/correct"] == new["rubric/correct"] == pytest.approx(2 / 3)
    assert old["rubric/terse"] == new["rubric/terse"] == 0.75
    assert old["rubric"] == pytest.approx((2 * 2 / 3 + 0.75) / 3)
    assert new["rubric"] == pytest.approx((5 * 2 / 3 + 0.75) / 6)
    # a judge-facing edit (a question) changes what the judges see
    rubric_path.write_text(rubric_path.read_text().replace("Total right?", "Sum right?"))
    assert load_rubric(rubric_path).judge_facing() != rubric.judge_facing()
