"""lm-eval task YAMLs read as lm-eval 0.4.13 reads them: the shipped suites' prompts and continuations equal, item
for item, what lm-eval's own code builds from them (tests/lm_eval_requests, made by scripts/lm_eval_contexts.py in
a side environment with lm-eval installed); every key evalrun does not implement, a split that is not there, a
!function that does not exist and a hub dataset are refused naming the file and key; filters and metrics follow
lm-eval's definitions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.lm_eval import TINY_TASK, write_tiny_data

from evalrun.chat import ModelChat, chat_format
from evalrun.config import MODELS_DIR
from evalrun.errors import BadInput
from evalrun.scoring.lm_eval import FILTERS, apply_filters, choice_metrics, exact_match, likelihood_metrics
from evalrun.tasks.lm_eval import FILTER_FUNCTIONS, METRICS, FilterPipeline, index, load_task

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
    for path in sorted(SHIPPED.rglob("*.yaml")):
        if f"task: {task_name}\n" in path.read_text(encoding="utf-8"):
            return path
    raise AssertionError(f"no shipped YAML declares task {task_name}")


@pytest.mark.parametrize("golden", _goldens() + _variant_goldens(), ids=lambda p: p.name)
def test_the_prompts_are_lm_evals_item_for_item(golden: Path) -> None:
    """Plain, and as lm-eval makes them with its prompt options: under --apply_chat_template the description a
    system message, each example a user and an assistant turn (or all in one user turn), a choice scored with no
    target delimiter; with --system_instruction before the description."""
    name, *options = golden.name.removesuffix(".jsonl").split(".")
    task = load_task(_yaml_of(name))
    expected = [json.loads(line) for line in golden.read_text(encoding="utf-8").splitlines()]
    chat = chat_format("chat", ModelChat.of_directory(CHAT_MODEL), None, None, "here") if "chat" in options else None
    system = SYSTEM if "system" in options else None
    got = list(task.requests(chat=chat, system_instruction=system, multiturn="singleturn" not in options))
    assert len(got) == len(expected) == len(task.eval_split.docs)
    for doc, requests, line in zip(task.eval_split.docs, got, expected, strict=True):
        assert dict(doc) == line["doc"]
        if task.output_type in ("multiple_choice", "loglikelihood"):  # the continuations scored
            assert [[requests.context, c] for c in requests.continuations] == line["requests"]
            assert task.target(doc) == line["target"]
        else:
            ((context, generation),) = line["requests"]
            assert requests.context == context and task.generation() == generation
            assert task.target(doc) == line["target"]


def test_a_golden_file_exists_for_every_shipped_task() -> None:
    names = {load_task(p).name for p in index(SHIPPED).tasks.values()}  # the group YAMLs beside them are not tasks
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


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("process_results: x\n", "process_results"),
        ("gen_prefix: 3\n", "gen_prefix"),
        ("fewshot_config: {process_docs: x}\n", "fewshot_config.process_docs"),
        ("fewshot_config: {target_delimiter: 1}\n", "fewshot_config.target_delimiter"),
        ("output_type: loglikelihood_rolling\n", "output_type"),
        ("generation_kwargs: {until: ['\\n'], num_beams: 4}\n", "generation_kwargs.num_beams"),
        ("fewshot_config: {sampler: first_n, samples: []}\n", "fewshot_config.samples"),
        ("filter_list: [{name: m, filter: [{function: map}]}]\n", "filter_list.0.filter.0.function"),
        ("metric_list: [{metric: bleu}]\n", "metric_list.0.metric"),
        ("output_type: loglikelihood\nmetric_list: [{metric: acc_norm}]\n", "metric_list.0.metric"),
        (
            "output_type: loglikelihood\nmetric_list: [{metric: perplexity, aggregation: mean}]\n",
            "metric_list.0.aggregation",
        ),
        ("output_type: loglikelihood\ndoc_to_choice: [a, b]\n", "doc_to_choice"),
        ("output_type: loglikelihood\nrepeats: 2\n", "repeats"),
        ("repeats: 0\n", "repeats"),
        ("metric_list: [{metric: exact_match, ignore_spaces: true}]\n", "metric_list.0.ignore_spaces"),
        ("test_split: validation\n", "test_split"),
    ],
)
def test_what_evalrun_does_not_implement_is_refused_by_file_and_key(tmp_path: Path, extra: str, key: str) -> None:
    path = _write(tmp_path, BASE + extra)
    with pytest.raises(BadInput) as caught:
        load_task(path)
    assert caught.value.where == f"{path}: {key}", caught.value


def test_a_key_is_named_in_the_file_it_came_from(tmp_path: Path) -> None:
    _write(tmp_path, BASE + "should_decontaminate: true\n", "base.yaml")
    path = tmp_path / "task.yaml"
    path.write_text("include: base.yaml\ntask: other\n", encoding="utf-8")
    with pytest.raises(BadInput) as caught:
        load_task(path)
    assert caught.value.where == f"{tmp_path / 'base.yaml'}: should_decontaminate"


def test_includes_merge_shallowly_with_the_including_files_keys_winning(tmp_path: Path) -> None:
    _write(tmp_path, BASE + 'description: "base\\n\\n"\n', "base.yaml")
    path = tmp_path / "task.yaml"
    path.write_text("include: base.yaml\ntask: derived\ndoc_to_text: 'q={{q}}'\n", encoding="utf-8")
    task = load_task(path)
    assert task.name == "derived" and [r.context for r in task.requests()] == ["base\n\nq=1+1", "base\n\nq=2+2"]
    (tmp_path / "loop.yaml").write_text("include: loop.yaml\ntask: loop\n", encoding="utf-8")
    with pytest.raises(BadInput, match="includes itself"):
        load_task(tmp_path / "loop.yaml")


def test_a_function_is_read_from_the_file_beside_its_yaml_and_hashed(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text("def text(doc):\n    return 'fn ' + doc['q']\n", encoding="utf-8")
    path = _write(tmp_path, BASE.replace('doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function utils.text"))
    task = load_task(path)
    assert [r.context for r in task.requests()] == ["fn 1+1", "fn 2+2"]
    record = task.as_record()["settings"]["doc_to_text"]
    assert record["function"] == "utils.text" and len(record["sha256"]) == 64
    missing = _write(tmp_path, BASE.replace('doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function nope.text"))
    with pytest.raises(BadInput) as caught:
        load_task(missing)
    assert caught.value.where == f"{missing}: !function nope.text" and "no file" in caught.value.message
    absent = _write(tmp_path, BASE.replace('doc_to_text: "Q: {{q}}\\nA:"', "doc_to_text: !function utils.absent"))
    with pytest.raises(BadInput, match="has no function 'absent'"):
        load_task(absent)


def test_process_docs_goes_over_every_split_and_is_recorded_apart_from_the_rows_read(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(
        "def upper(dataset):\n    return dataset.map(lambda d: {'q': d['q'].replace('+', ' plus ')})\n"
        "def boom(dataset):\n    raise KeyError('nope')\n"
        "def count(dataset):\n    return len(dataset)\n",
        encoding="utf-8",
    )
    (tmp_path / "train.jsonl").write_text('{"q": "5+5", "a": "10"}\n', encoding="utf-8")
    two_splits = BASE.replace("{test: test.jsonl}", "{test: test.jsonl, train: train.jsonl}")
    plain = load_task(_write(tmp_path, two_splits + "fewshot_split: train\nnum_fewshot: 1\n", "plain.yaml"))
    path = _write(tmp_path, plain.path.read_text() + "process_docs: !function utils.upper\n")
    task = load_task(path)
    assert [r.context for r in task.requests()] == ["Q: 5 plus 5\nA: 10\n\nQ: 1 plus 1\nA:",
                                                    "Q: 5 plus 5\nA: 10\n\nQ: 2 plus 2\nA:"]  # fmt: skip
    record, before = task.eval_split.as_record(), plain.eval_split.as_record()
    assert record["rows_sha256"] == before["rows_sha256"] and "process_docs" not in before  # the rows as read
    assert record["process_docs"]["function"] == "utils.upper"
    assert record["process_docs"]["docs_sha256"] != record["rows_sha256"]
    (tmp_path / "utils.py").write_text(
        (tmp_path / "utils.py").read_text(encoding="utf-8").replace("' plus '", "' and '"), encoding="utf-8"
    )
    edited = load_task(path)
    assert next(edited.requests()).context.endswith("Q: 1 and 1\nA:")
    assert edited.eval_split.as_record()["rows_sha256"] == record["rows_sha256"]  # the same data, read again
    assert edited.prompt_record() != task.prompt_record()  # the function's source is in the digest
    for reference, message in [("!function utils.boom", "failed on split 'test' (KeyError"),
                               ("!function utils.count", "returned int for split 'test'"),
                               ("utils.upper", "a !function reference")]:  # fmt: skip
        bad = _write(tmp_path, two_splits + f"process_docs: {reference}\n", "bad.yaml")
        with pytest.raises(BadInput, match=re.escape(message)) as caught:
            load_task(bad)
        assert caught.value.where == f"{bad}: process_docs", caught.value


COMMIT = "0123456789abcdef0123456789abcdef01234567"


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
    branch = _write(tmp_path, hub.replace("{data_files: {test: test.jsonl}}", "{revision: main}"), "branch.yaml")
    with pytest.raises(BadInput, match="the commit") as caught:
        load_task(branch)
    assert caught.value.where == f"{branch}: dataset_kwargs.revision"
    unpinned = load_task(branch, allow_unpinned=True).splits["test"].as_record()["hub"]
    assert unpinned["revision"] == COMMIT and unpinned["pinned"] is False  # the commit the cache had, recorded
    absent = _write(tmp_path, pinned.read_text().replace(COMMIT, "f" * 40), "absent.yaml")
    with pytest.raises(BadInput, match="is not in the local Hugging Face cache") as caught:
        load_task(absent)
    assert caught.value.where == f"{absent}: dataset_path"
    (tmp_path / "hub" / "datasets--evalrun--adds" / "snapshots" / COMMIT / "adds.py").write_text("# a builder\n")
    scripted = _write(tmp_path, pinned.read_text().replace("dataset_name: main", "dataset_name: scripted"), "s.yaml")
    with pytest.raises(BadInput, match=r"loading script \(adds\.py\), which evalrun does not run") as caught:
        load_task(scripted)  # its configs are the script's: no files
    assert caught.value.where == f"{scripted}: dataset_name"


def test_the_fewshot_sampler_is_lm_evals_one_generator_for_the_task_in_document_order(tmp_path: Path) -> None:
    import random

    rows = "".join(json.dumps({"q": f"{i}+1", "a": str(i + 1)}) + "\n" for i in range(12))
    (tmp_path / "train.jsonl").write_text(rows, encoding="utf-8")
    path = _write(tmp_path, BASE.replace("{test: test.jsonl}", "{test: test.jsonl, train: train.jsonl}")
                  + "fewshot_split: train\nnum_fewshot: 2\n")  # fmt: skip
    task = load_task(path)
    pool = list(task.splits["train"].docs)
    rnd = random.Random(1234)
    assert [[pool[i] for i in chosen] for chosen in task.fewshot()] == [rnd.sample(pool, 2), rnd.sample(pool, 2)]
    too_many = _write(tmp_path, path.read_text().replace("num_fewshot: 2", "num_fewshot: 13"), "many.yaml")
    with pytest.raises(BadInput, match="13 examples from split 'train', which has 12 documents"):
        list(load_task(too_many).requests())
    first = next(task.requests()).context
    a, b = rnd_examples = random.Random(1234).sample(pool, 2)
    assert first == f"Q: {a['q']}\nA: {a['a']}\n\nQ: {b['q']}\nA: {b['a']}\n\nQ: 1+1\nA:" and rnd_examples


def test_the_filters_and_metrics_are_lm_evals() -> None:
    assert set(FILTERS) == set(FILTER_FUNCTIONS) and set(METRICS) == {"exact_match", "acc", "acc_norm", "perplexity"}
    last = FilterPipeline("flex", (("regex", {"regex_pattern": r"(-?\d+)", "group_select": -1}), ("take_first", {})))
    assert apply_filters(last, ["12 then 35 ok", "x"]) == "35"
    groups = FilterPipeline("g", (("regex", {"regex_pattern": r"(\d+)|([a-z]+)"}), ("take_first", {})))
    assert apply_filters(groups, ["abc 1"]) == "abc"  # the first non-empty group of the first match
    none = FilterPipeline("n", (("regex", {}), ("take_first", {})))
    assert apply_filters(none, ["no answer line"]) == "[invalid]"
    vote = FilterPipeline("v", (("regex", {"regex_pattern": r"(\d+)"}), ("majority_vote", {}), ("take_first", {})))
    assert apply_filters(vote, ["it is 3", "5", "x 5", "3", "none"]) == "3"  # ties to the first of the most common
    assert apply_filters(vote, ["no", "7", "none"]) == "[invalid]"
    tidy = FilterPipeline("t", (("remove_whitespace", {}), ("lowercase", {}), ("take_first", {})))
    assert apply_filters(tidy, ["  Paris \n"]) == "paris"
    assert exact_match(" A.", "a", ignore_case=True, ignore_punctuation=True) == 0.0  # whitespace is kept
    assert exact_match("A.", "a", ignore_case=True, ignore_punctuation=True) == 1.0
    assert exact_match("The answer: 42", "42", regexes_to_ignore=[r"^The answer: "]) == 1.0
    assert exact_match("abc12", "abc", ignore_numbers=True) == 1.0
    # acc picks the likeliest choice, acc_norm the likeliest per character (ties to the first)
    assert choice_metrics([-4.0, -6.0], ["no", "yes!!"], 1) == {"acc": 0.0, "acc_norm": 1.0}
    assert choice_metrics([-2.0, -2.0], ["a", "b"], 0) == {"acc": 1.0, "acc_norm": 1.0}
    # loglikelihood: a document's perplexity value is its target's loglikelihood, acc whether it is greedy
    assert likelihood_metrics(-1.5, False) == {"perplexity": -1.5, "acc": 0.0}
    assert likelihood_metrics(-0.25, True) == {"perplexity": -0.25, "acc": 1.0}


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
