"""lm-eval task YAMLs read, prompted and scored by lm-eval's own library, on documents evalrun reads: the shipped
suites' prompts and continuations equal, item for item, what lm-eval's own evaluator builds from them
(tests/lm_eval_requests, made by scripts/lm_eval_contexts.py); what lm-eval refuses, and what evalrun does not
run, are BadInputs naming the file with every reason; the features lm-eval's library brings (process_results, a
metric function, fewshot_config.samples, multiple inputs, decontamination keys) run as lm-eval runs them; data
are read at a pinned commit, a loading-script dataset from its Parquet conversion."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.lm_eval import TINY_TASK, write_tiny_data

from evalrun.chat import ModelChat, chat_format
from evalrun.config import MODELS_DIR, ScorerConfig
from evalrun.errors import BadInput
from evalrun.scoring import ScoringContext, make_scorer
from evalrun.tasks.lm_eval import ScoringTask, as_task, find_task, load_task, read_definition
from evalrun.tasks.lm_eval_catalog import catalog

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "evalrun" / "tasks" / "builtin" / "lm_eval"
GOLDEN = ROOT / "tests" / "lm_eval_requests"
CHAT_MODEL = MODELS_DIR / "tiny-invoice-agent"  # the chat goldens' template (it writes the BOS token itself)
SYSTEM = "You are a careful calculator."  # the --system_instruction of the NAME[.chat][.singleturn].system goldens


def _goldens() -> list[Path]:
    return sorted(p for p in GOLDEN.glob("*.jsonl") if p.name.count(".") == 1)


def _variant_goldens() -> list[Path]:
    """lm-eval's requests under its prompt options: NAME.chat (--apply_chat_template), .singleturn
    (--fewshot_as_multiturn false), .system (--system_instruction)."""
    return sorted(p for p in GOLDEN.glob("*.jsonl") if p.name.count(".") > 1)


def _yaml_of(task_name: str) -> Path:
    path = catalog(SHIPPED).definitions[task_name].path
    assert path is not None
    return path


@pytest.mark.parametrize("golden", _goldens() + _variant_goldens(), ids=lambda p: p.name)
def test_the_prompts_are_lm_evals_item_for_item(golden: Path) -> None:
    name, *options = golden.name.removesuffix(".jsonl").split(".")
    task = load_task(_yaml_of(name))
    expected = [json.loads(line) for line in golden.read_text(encoding="utf-8").splitlines()]
    chat = chat_format("chat", ModelChat.of_directory(CHAT_MODEL), None, None, "here") if "chat" in options else None
    system = SYSTEM if "system" in options else None
    got = task.requests(chat=chat, system_instruction=system, multiturn="singleturn" not in options)
    assert len(got) == len(expected) == len(task.eval_split.docs)
    for requests, line in zip(got, expected, strict=True):
        assert dict(requests.doc) == line["doc"] and requests.doc_id == line["doc_id"]
        assert task.task.doc_to_target(requests.doc) == line["target"]
        if task.output_type in ("multiple_choice", "loglikelihood"):  # the continuations scored
            assert [[requests.context, c] for c in requests.continuations] == line["requests"]
        else:
            ((context, generation),) = line["requests"]
            assert requests.context == context and task.task.config.generation_kwargs == generation


def test_a_golden_file_exists_for_every_shipped_task() -> None:
    names = {d.name for d in catalog(SHIPPED).of_kind("task")}  # the group YAMLs beside them are not tasks
    assert names and names == {p.stem for p in _goldens()}
    variants: dict[str, set[str]] = {}
    for path in _variant_goldens():
        name, variant = path.name.removesuffix(".jsonl").split(".", 1)
        variants.setdefault(variant, set()).add(name)
    assert variants == dict.fromkeys(("chat", "system", "chat.singleturn.system"), names)


def _write(tmp_path: Path, text: str, name: str = "task.yaml") -> Path:
    write_tiny_data(tmp_path)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


BASE = TINY_TASK


def test_what_lm_eval_refuses_and_what_evalrun_does_not_run_are_named_all_at_once(tmp_path: Path) -> None:
    unknown = _write(tmp_path, BASE + "not_a_key: 1\n", "unknown.yaml")
    with pytest.raises(BadInput, match="not_a_key") as caught:
        load_task(unknown)
    assert caught.value.where == str(unknown) and "lm-eval does not build it" in caught.value.message
    served = _write(tmp_path, BASE + "doc_to_audio: audio\ndoc_to_image: img\nunsafe_code: true\n")
    with pytest.raises(BadInput) as caught:
        load_task(served)
    message = caught.value.message
    assert "doc_to_audio" in message and "doc_to_image" in message and "unsafe_code" in message
    corpus = _write(tmp_path, BASE + "metric_list: [{metric: bleu}]\n", "bleu.yaml")  # a corpus metric runs
    assert load_task(corpus).output_type == "generate_until"
    absent = _write(tmp_path, BASE.replace("test_split: test", "test_split: validation"), "split.yaml")
    with pytest.raises(BadInput, match="no split 'validation'") as caught:
        load_task(absent)
    assert caught.value.where == f"{absent}: test_split"


def test_decontamination_keys_are_accepted_and_recorded(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE + "should_decontaminate: true\ndoc_to_decontamination_query: '{{q}}'\n")
    task = load_task(path)
    assert [r.context for r in task.requests()] == ["Q: 1+1\nA:", "Q: 2+2\nA:"]
    assert task.prompt_record()["settings"]["should_decontaminate"] is True


def test_task_overrides_set_lm_evals_settings_over_the_yamls_and_are_in_the_scoring_record(tmp_path: Path) -> None:
    """``task.overrides`` (lm-eval's ``--num_fewshot`` and the like, a group's settings of its tasks): merged key by
    key over the YAML's, in the records; a key that is not one of lm-eval's task settings is named."""
    from evalrun.config import load

    path = _write(tmp_path, BASE + 'description: "yaml: "\n')
    task = load_task(path, overrides={"description": "given: ", "target_delimiter": "|"})
    assert [r.context for r in task.requests()] == ["given: Q: 1+1\nA:", "given: Q: 2+2\nA:"]
    assert task.scoring_record()["overrides"] == {"description": "given: ", "target_delimiter": "|"}
    assert "overrides" not in load_task(path).scoring_record()  # none given: the record as before
    for key in ("nope", "task", "tag", "custom_dataset"):  # evalrun names the task and hands it its documents
        with pytest.raises(BadInput, match=rf"^task\.overrides\.{key}: one of lm-eval's task settings: "):
            load_task(path, overrides={key: 1})
    with pytest.raises(BadInput, match=r"^task\.overrides: expected {}: it is an lm-eval task's setting"):
        load(["task=addition_mc", "+task.overrides.num_fewshot=1"])


def test_includes_merge_as_lm_eval_merges_them(tmp_path: Path) -> None:
    _write(tmp_path, BASE + 'description: "base\\n\\n"\n', "base.yaml")
    path = tmp_path / "task.yaml"
    path.write_text("include: base.yaml\ntask: derived\ndoc_to_text: 'q={{q}}'\n", encoding="utf-8")
    task = load_task(path)
    assert task.name == "derived" and [r.context for r in task.requests()] == ["base\n\nq=1+1", "base\n\nq=2+2"]
    (tmp_path / "loop.yaml").write_text("include: loop.yaml\ntask: loop\n", encoding="utf-8")
    with pytest.raises(BadInput, match="Include cycle"):
        load_task(tmp_path / "loop.yaml")


def test_a_helper_is_hashed_and_one_that_does_not_import_names_its_package(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text("def text(doc):\n    return 'fn ' + doc['q']\n", encoding="utf-8")
    path = _write(tmp_path, BASE.replace('doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function utils.text"))
    task = load_task(path)
    assert [r.context for r in task.requests()] == ["fn 1+1", "fn 2+2"]
    record = task.as_record()["settings"]["doc_to_text"]
    assert record == {"function": "utils.text", "module": "utils.py", "sha256": record["sha256"]}
    assert len(record["sha256"]) == 64
    (tmp_path / "needs.py").write_text("import langdetect\n\ndef text(doc):\n    return doc['q']\n", encoding="utf-8")
    missing = _write(tmp_path, BASE.replace('doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function needs.text"),
                     "needs.yaml")  # fmt: skip
    with pytest.raises(BadInput, match=r"package 'langdetect' is not installed; lm-eval's extra ifeval") as caught:
        load_task(missing)
    assert caught.value.where == str(missing)


def test_a_folder_runs_every_task_whose_helper_imports(tmp_path: Path) -> None:
    """One task's helper that does not import refuses that task alone: the others of its folder load."""
    (tmp_path / "needs.py").write_text("import langdetect\n\ndef text(doc):\n    return doc['q']\n", encoding="utf-8")
    _write(
        tmp_path,
        BASE.replace("task: tiny", "task: broken").replace(
            'doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function needs.text"
        ),
        "b.yaml",
    )
    _write(tmp_path, BASE, "a.yaml")
    assert find_task(tmp_path, "tiny").name == "tiny"
    with pytest.raises(BadInput, match="langdetect"):
        find_task(tmp_path, "broken")


def test_process_docs_is_lm_evals_and_what_it_made_is_recorded_apart_from_the_rows_read(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(
        "def upper(dataset):\n    return dataset.map(lambda d: {'q': d['q'].replace('+', ' plus ')})\n",
        encoding="utf-8",
    )
    (tmp_path / "train.jsonl").write_text('{"q": "5+5", "a": "10"}\n', encoding="utf-8")
    two_splits = BASE.replace("{test: test.jsonl}", "{test: test.jsonl, train: train.jsonl}")
    plain = load_task(_write(tmp_path, two_splits + "fewshot_split: train\nnum_fewshot: 1\n", "plain.yaml"))
    path = _write(tmp_path, plain.path.read_text() + "process_docs: !function utils.upper\n")
    task = load_task(path)
    assert [r.context for r in task.requests()] == ["Q: 5 plus 5\nA: 10\n\nQ: 1 plus 1\nA:",
                                                    "Q: 5 plus 5\nA: 10\n\nQ: 2 plus 2\nA:"]  # fmt: skip
    assert task.eval_split.rows_sha256 == plain.eval_split.rows_sha256  # the rows as read
    assert set(task.processed_docs_sha256) == {"test", "train"} and plain.processed_docs_sha256 == {}
    (tmp_path / "utils.py").write_text(
        (tmp_path / "utils.py").read_text(encoding="utf-8").replace("' plus '", "' and '"), encoding="utf-8"
    )
    edited = load_task(path)
    assert edited.requests()[0].context.endswith("Q: 1 and 1\nA:")
    assert edited.processed_docs_sha256 != task.processed_docs_sha256
    assert edited.prompt_record() != task.prompt_record()  # the helper's source is in the digest


def test_the_fewshot_examples_are_lm_evals_sampler_and_recorded_by_place(tmp_path: Path) -> None:
    rows = "".join(json.dumps({"q": f"{i}+1", "a": str(i + 1)}) + "\n" for i in range(12))
    (tmp_path / "train.jsonl").write_text(rows, encoding="utf-8")
    path = _write(tmp_path, BASE.replace("{test: test.jsonl}", "{test: test.jsonl, train: train.jsonl}")
                  + "fewshot_split: train\nnum_fewshot: 2\n")  # fmt: skip
    task = load_task(path)
    pool = list(task.splits["train"].docs)
    rnd = random.Random(1234)
    expected = [rnd.sample(pool, 2), rnd.sample(pool, 2)]
    made = task.requests()
    assert [[pool[int(e.split(":")[1])] for e in r.examples] for r in made] == expected
    a, b = expected[0]
    assert made[0].context == f"Q: {a['q']}\nA: {a['a']}\n\nQ: {b['q']}\nA: {b['a']}\n\nQ: 1+1\nA:"
    assert task.requests(seed=7)[0].examples != made[0].examples  # seeds.fewshot replaces lm-eval's 1234


def test_fewshot_samples_from_the_yaml(tmp_path: Path) -> None:
    samples = "fewshot_config: {sampler: first_n, samples: [{q: 9+9, a: '18'}]}\nnum_fewshot: 1\n"
    task = load_task(_write(tmp_path, BASE + samples))
    made = task.requests()
    assert made[0].context == "Q: 9+9\nA: 18\n\nQ: 1+1\nA:" and made[0].examples == ("samples:0",)


MULTIPLE_INPUT = """task: fill
dataset_path: json
dataset_kwargs: {data_files: {test: fill.jsonl}}
test_split: test
output_type: multiple_choice
doc_to_text: !function fill.gold
doc_to_choice: !function fill.contexts
doc_to_target: !function fill.rest
should_decontaminate: true
doc_to_decontamination_query: sentence
"""
FILL = """def contexts(doc):
    head = doc["sentence"].split("_")[0]
    return [head + doc["option1"], head + doc["option2"]]


def gold(doc):
    return int(doc["answer"]) - 1


def rest(doc):
    return doc["sentence"].split("_")[1].strip()
"""


def test_a_multiple_input_task_scores_its_one_continuation_after_each_context(tmp_path: Path) -> None:
    """winogrande's form: one context per choice, the same continuation; acc is whichever context makes it the
    likeliest, scored by lm-eval's process_results."""
    (tmp_path / "fill.py").write_text(FILL, encoding="utf-8")
    (tmp_path / "fill.jsonl").write_text(json.dumps({"sentence": "The cup fell because _ was slippery.",
                                                     "option1": "the cup", "option2": "the table",
                                                     "answer": "1"}) + "\n", encoding="utf-8")  # fmt: skip
    path = tmp_path / "fill.yaml"
    path.write_text(MULTIPLE_INPUT, encoding="utf-8")
    task = load_task(path)
    (made,) = task.requests()
    assert made.contexts == ("The cup fell because the cup", "The cup fell because the table")
    assert made.continuations == (" was slippery.", " was slippery.")
    scoring = ScoringTask(read_definition(path))
    scores = {m: v for m, _, v, _ in scoring.score(made.doc, [[(-1.0, False)], [(-3.0, False)]])}
    assert scores == {"acc": 1.0, "acc_norm": 1.0}
    scores = {m: v for m, _, v, _ in scoring.score(made.doc, [[(-5.0, False)], [(-3.0, False)]])}
    assert scores["acc"] == 0.0


SCORED = """task: scored
dataset_path: json
dataset_kwargs: {data_files: {test: test.jsonl}}
test_split: test
doc_to_text: "Q: {{q}}\\nA:"
doc_to_target: a
generation_kwargs: {until: ["\\n"], max_gen_toks: 4}
"""


def test_process_results_and_a_metric_function_score_as_lm_eval_scores(tmp_path: Path) -> None:
    (tmp_path / "score.py").write_text(
        "def results(doc, replies):\n    return {'close': float(replies[0].strip() == doc['a']), 'length': "
        "len(replies[0])}\n\n"
        "def digits(references, predictions):\n    return float(predictions[0].strip().isdigit())\n",
        encoding="utf-8",
    )
    custom = _write(tmp_path, SCORED + "process_results: !function score.results\nmetric_list:\n"
                    "  - {metric: close, aggregation: mean, higher_is_better: true}\n"
                    "  - {metric: length, aggregation: mean, higher_is_better: false}\n", "custom.yaml")  # fmt: skip
    task = load_task(custom)
    doc = task.eval_split.docs[0]
    scored = ScoringTask(read_definition(custom)).score(doc, [[" 2"]])
    assert [(m, f, v) for m, f, v, _ in scored] == [("close", "none", 1.0), ("length", "none", 2)]
    assert task.scoring_record()["process_results"]["function"] == "score.results"
    function = _write(tmp_path, SCORED + "metric_list:\n  - {metric: !function score.digits, aggregation: mean, "
                      "higher_is_better: true}\n", "function.yaml")  # fmt: skip
    load_task(function)
    scored = ScoringTask(read_definition(function)).score(doc, [[" 12"]])
    assert [(m, v) for m, _, v, _ in scored] == [("digits", 1.0)]


def test_a_run_carries_its_definition_to_where_it_scores(tmp_path: Path) -> None:
    """A Ray worker on another machine does not see the YAML's path: the scoring context carries the YAML, its
    includes and helpers, and scores from a copy of them; a finished run's context (rescore, verify) reads the
    path, which must then be there."""
    source = tmp_path / "tasks"
    source.mkdir()
    (source / "score.py").write_text(
        "def results(doc, replies):\n    return {'close': float(replies[0].strip() == doc['a'])}\n", encoding="utf-8"
    )
    (source / "common.yaml").write_text(SCORED.replace("task: scored\n", ""), encoding="utf-8")
    write_tiny_data(source)
    yaml = source / "scored.yaml"
    yaml.write_text(
        "include: common.yaml\ntask: scored\nprocess_results: !function score.results\n"
        "metric_list: [{metric: close, aggregation: mean, higher_is_better: true}]\n",
        encoding="utf-8",
    )
    task = as_task(load_task(yaml))
    carried = task.pack.files
    assert carried is not None and carried.entry == "scored.yaml"
    assert [name for name, _ in carried.files] == ["common.yaml", "score.py", "scored.yaml"]
    spec = ScorerConfig.from_record({**ScorerConfig().as_record(), "name": "lm_eval"})
    context = ScoringContext(lm_eval=task.scoring, lm_eval_path=str(yaml), lm_eval_files=carried)
    recorded = replace(context, lm_eval_files=None)
    assert context.as_record() == recorded.as_record()  # not in the scoring hash: the recorded hashes check them
    source.rename(tmp_path / "elsewhere")
    item = task.items[0]
    row = {"output": f" {item.fields['a']}", "target": item.target, "replies": None, "option_logprobs": None,
           "option_greedy": None}  # fmt: skip
    assert [(s.metric, s.value) for s in make_scorer(spec, context)(row)] == [("close", 1.0)]
    with pytest.raises(BadInput, match="does not exist"):
        make_scorer(spec, recorded)


COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONVERSION = "fedcba9876543210fedcba9876543210fedcba98"


def _hub_cache(root: Path) -> Path:
    """A Hugging Face hub cache holding one dataset, evalrun/adds at COMMIT (main), as huggingface_hub lays it out:
    its card's configs name a ``main`` config whose test split is a Parquet file; an ``other`` config is a
    directory with ``test-*`` files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = root / "datasets--evalrun--adds"
    snapshot = repo / "snapshots" / COMMIT
    (snapshot / "main").mkdir(parents=True)
    (snapshot / "other").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (snapshot / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n"
                                        "    path: main/test-*\n---\n# adds\n")  # fmt: skip
    rows = pa.table({"q": ["1+1", "2+2", "3+3"], "a": ["2", "4", "6"]})
    pq.write_table(rows, snapshot / "main" / "test-00000-of-00001.parquet")
    pq.write_table(rows.slice(0, 1), snapshot / "other" / "test-00000-of-00001.parquet")
    return root


def test_a_hub_dataset_is_read_from_the_local_cache_at_its_pinned_commit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(_hub_cache(tmp_path / "hub")))
    hub = BASE.replace("dataset_path: json", "dataset_path: evalrun/adds\ndataset_name: main")
    pinned = _write(tmp_path, hub.replace("{data_files: {test: test.jsonl}}", f"{{revision: {COMMIT}}}"))
    task = load_task(pinned)
    assert [r.context for r in task.requests()] == ["Q: 1+1\nA:", "Q: 2+2\nA:", "Q: 3+3\nA:"]
    record = task.splits["test"].as_record()
    assert record["hub"] == {"id": "evalrun/adds", "config": "main", "revision": COMMIT, "pinned": True}
    assert record["files"][0]["file"] == "test-00000-of-00001.parquet" and record["docs"] == 3
    other = _write(tmp_path, pinned.read_text().replace("dataset_name: main", "dataset_name: other"), "other.yaml")
    assert len(load_task(other).eval_split.docs) == 1  # no card config: the files named after the split
    unpinned = hub.replace("dataset_kwargs: {data_files: {test: test.jsonl}}\n", "")
    branch = _write(tmp_path, unpinned, "branch.yaml")
    with pytest.raises(BadInput, match="the commit") as caught:
        load_task(branch)
    assert caught.value.where == f"{branch}: dataset_kwargs.revision"
    assert load_task(branch, revision=COMMIT).splits["test"].as_record()["hub"]["pinned"] is True  # no edit
    assert load_task(branch, revision={"evalrun/adds": COMMIT}).eval_split.rows_sha256 == task.eval_split.rows_sha256
    read = load_task(branch, allow_unpinned=True).splits["test"].as_record()["hub"]
    assert read["revision"] == COMMIT and read["pinned"] is False  # the commit the cache had, recorded
    absent = _write(tmp_path, pinned.read_text().replace(COMMIT, "f" * 40), "absent.yaml")
    with pytest.raises(BadInput, match="is not in the local Hugging Face cache") as caught:
        load_task(absent)
    assert caught.value.where == f"{absent}: dataset_path"


def test_a_loading_script_dataset_is_read_from_its_parquet_conversion(tmp_path: Path, monkeypatch) -> None:
    """The hub's refs/convert/parquet commit lays each config's split out as CONFIG/SPLIT/NNNN.parquet; evalrun runs
    no dataset code, says which commit to pin, and reads the conversion at it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cache = _hub_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    repo = cache / "datasets--evalrun--adds"
    (repo / "snapshots" / COMMIT / "adds.py").write_text("# a builder\n")
    converted = repo / "snapshots" / CONVERSION / "scripted" / "test"
    converted.mkdir(parents=True)
    pq.write_table(pa.table({"q": ["7+7"], "a": ["14"]}), converted / "0000.parquet")
    (repo / "refs" / "convert").mkdir()
    (repo / "refs" / "convert" / "parquet").write_text(CONVERSION)
    scripted = BASE.replace("dataset_path: json", "dataset_path: evalrun/adds\ndataset_name: scripted")
    main = _write(tmp_path, scripted.replace("{data_files: {test: test.jsonl}}", f"{{revision: {COMMIT}}}"))
    with pytest.raises(BadInput, match=rf"loading script \(adds\.py\).*task\.dataset_revision={CONVERSION}"):
        load_task(main)
    task = load_task(main, revision=CONVERSION)
    assert [r.context for r in task.requests()] == ["Q: 7+7\nA:"]
    assert task.eval_split.as_record()["hub"]["revision"] == CONVERSION


def test_lm_evals_prompt_options_are_in_the_digest_and_refused_where_they_mean_nothing() -> None:
    """--system_instruction and --fewshot_as_multiturn: a system instruction is the prompts' start and in the
    prompt-pack part of the digest; either on a task that is not an lm-eval YAML, or fewshot_as_multiturn without
    a chat template (lm-eval refuses it too), is a BadInput naming the setting, before any model loads."""
    from evalrun.config import load
    from evalrun.pipeline.runner import prepare

    base = ["task=lm_eval", f"task.path={SHIPPED / 'addition_gen/addition_gen_3shot.yaml'}", "limit=2"]
    plain = prepare(load(base))
    instructed = prepare(load([*base, f"task.system_instruction={SYSTEM}"]))
    assert instructed.episodes[0].prompt == f"{SYSTEM}\n\n{plain.episodes[0].prompt}"
    assert instructed.digest.inputs["prompt_pack"]["system_instruction"] == SYSTEM
    assert "system_instruction" not in plain.digest.inputs["prompt_pack"]
    assert instructed.digest.prompt_pack != plain.digest.prompt_pack
    with pytest.raises(BadInput, match=r"null unless task\.chat_format=chat") as caught:
        load([*base, "task.fewshot_as_multiturn=false"])
    assert caught.value.where == "task.fewshot_as_multiturn"
    with pytest.raises(BadInput, match="an lm-eval task's setting") as caught:
        load(["task=addition", f"task.system_instruction={SYSTEM}"])
    assert caught.value.where == "task.system_instruction"
    with pytest.raises(BadInput, match="a commit") as caught:
        load([*base, "task.dataset_revision=main"])
    assert caught.value.where == "task.dataset_revision"
