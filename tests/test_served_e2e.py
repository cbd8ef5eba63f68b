"""Served models on a real server: ``engine=vllm_server`` starts vLLM's OpenAI-compatible server of the pinned
default model on 127.0.0.1 (once for the module: about 80-100 s on 2 cores), and ``engine=openai`` runs against
it by URL. The default task through the server gives the offline engine's tokens and logprobs bit for bit; every
model entry keeps what the server said of itself; the runs verify, replay (no server needed) and rescore
exactly; a URL where nothing listens, or a server serving another model, is refused before any episode."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import SERVED
from helpers.proxy import OTHER_FINGERPRINT, FaultProxy, settle
from helpers.runs import output_columns, run_alone

from evalrun.audit.replay import replay_run
from evalrun.audit.rescore import rescore_run
from evalrun.audit.verify import verify_run
from evalrun.config import BUILTIN_TASKS, load
from evalrun.engines.server import free_port
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, open_for, prepare, resume

pytestmark = pytest.mark.e2e
LM_EVAL_MC = BUILTIN_TASKS / "lm_eval" / "addition_mc" / "addition_mc.yaml"


def _base_url(served: Dispatcher) -> str:
    return served.worker.engine.identity.base_url


def _model_entries(run: Path) -> list[dict]:
    return [entry for path in sorted((run / "log").iterdir()) for line in path.read_text().splitlines()
            if (entry := json.loads(line))["kind"] == "model"]  # fmt: skip


def test_a_served_run_gives_the_offline_engines_tokens_and_records_the_server(
    served: Dispatcher, run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    run = execute(prepare(load([*SERVED, "engine=vllm_server", f"run.root={tmp_path / 'served'}"])), served)
    # the offline engine in the session's Ray worker (an in-process vLLM engine shares vLLM's process-wide state
    # with every other one the session made and closed)
    offline = run_eval("limit=20")
    assert output_columns(run) == output_columns(offline)  # text, token ids and logprobs, bit for bit
    entries = _model_entries(run)
    assert len(entries) == 20 and all(e["response"]["server"]["model"] == "tiny-adder" for e in entries)
    assert all(e["response"]["server"]["system_fingerprint"].startswith("vllm-0.32.0-") for e in entries)
    manifest = json.loads((run / "manifest.json").read_text())
    engine = manifest["engine"]
    (server,) = engine["servers"]
    assert engine["name"] == "openai" and server["model"] == "tiny-adder" and manifest["model"]["pinned"] is True
    assert server["max_model_len"] == 128 and server["system_fingerprint"] == entries[0]["response"]["server"][
        "system_fingerprint"]  # fmt: skip
    assert manifest["workers"][0]["engine"]["served_by"] == [entries[0]["response"]["server"]]
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])
    assert replayed.reproduced == 20 and not replayed.divergences and replayed.root_matches
    assert replayed.scores_identical and rescore_run(run, []).bytes_identical


def test_a_server_evalrun_did_not_start_is_reached_by_its_url(served: Dispatcher, tmp_path: Path) -> None:
    """engine=openai to the same server by URL: a dispatcher of its own, no model loaded in this process; the
    same tokens as through the started server."""
    url = ("engine=openai", f"engine.base_url={_base_url(served)}", "engine.served_model=tiny-adder")
    config = load([*SERVED, *url, f"run.root={tmp_path}", "decoding=sample", "seeds=five", "limit=4"])
    prepared = prepare(config)
    client = open_for(prepared)  # the server answers and serves the model
    try:
        first = execute(prepared, client)
        again = execute(prepare(load([*SERVED, *url, f"run.root={tmp_path / 'again'}", "decoding=sample",
                                      "seeds=five", "limit=4"])), client)  # fmt: skip
    finally:
        client.close()
    assert output_columns(first) == output_columns(again)  # seeded sampling, request by request: repeatable
    assert verify_run(first).scores == "recomputed"
    manifest = json.loads((first / "manifest.json").read_text())
    # the weights are the server's: the local directory only rendered the prompts
    assert manifest["model"]["pinned"] is False and manifest["identity"]["model"]["pinned"] is False
    assert manifest["engine"]["weights_pinned"] is False


def test_a_server_that_gives_no_token_ids_runs_on_evalruns_tokenization_of_its_replies(
    served: Dispatcher, run_eval: Callable[..., Path], tmp_path: Path
) -> None:
    """The session's server behind a proxy that answers as servers other than vLLM do (no token ids, no prompt
    logprobs, no chat rendering): refused unless ``engine.token_ids=local``, and refused for a task scored by
    loglikelihood or for the chat endpoint, all before any episode; with it, the offline engine's text for every
    item, its token ids less the stop token the text leaves out, and its logprobs on those tokens."""
    proxy = FaultProxy(_base_url(served))
    proxy.text_only = True
    url = (*SERVED, "engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder")
    try:
        with pytest.raises(BadInput, match=r"gives no token ids .*engine\.token_ids=local"):
            open_for(prepare(load([*url])))
        for task in (["task=addition_mc"], ["task=lm_eval", f"task.path={LM_EVAL_MC}"]):
            with pytest.raises(BadInput, match=r"gives no prompt logprobs .*scores by loglikelihood"):
                open_for(prepare(load([*url, "engine.token_ids=local", *task])))
        with pytest.raises(BadInput, match=r"does not say how its chat endpoint rendered") as caught:
            open_for(prepare(load([*url, "engine.token_ids=local", "engine.api=chat"])))
        assert caught.value.where == "engine.api"
        run = run_alone(prepare(load([*url, "engine.token_ids=local", f"run.root={tmp_path}"])))
    finally:
        proxy.close()
    offline = run_eval("limit=20")
    got, expected = output_columns(run), output_columns(offline)
    assert [r[:2] for r in got] == [r[:2] for r in expected]  # episode and text, every one
    for (_, _, ids, logprobs), (_, _, model_ids, model_logprobs) in zip(got, expected, strict=True):
        # the reply's text tokenized as the model spelled it; the stop token the text leaves out is not there
        ids, model_ids = json.loads(ids), json.loads(model_ids)
        assert ids == model_ids[: len(ids)] and len(ids) == len(model_ids) - 1
        assert json.loads(logprobs) == json.loads(model_logprobs)[: len(ids)]  # placed on the same tokens
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["engine"]["token_ids"] == "local" and manifest["engine"]["servers"][0]["token_ids"] is False
    assert verify_run(run).scores == "recomputed" and replay_run(run, []).reproduced == 20


def test_a_rubrics_judges_on_a_server_of_their_own_are_the_second_noisy_stage(served: Dispatcher,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    """An offline run (engine=hf) whose judges are a served model (``+engine@judge_engine=openai``): the policy's
    calls are the offline engine's, every judge call names the judges' server in the chain, the manifest records
    that server and its unpinned weights; the verdicts are those of judges in the worker's process, and replay
    serves the judges' recorded answers with no server."""
    base = [*SERVED, "task=report_rubric", "limit=2", "engine=hf"]
    judged = [*base, f"run.root={tmp_path / 'served'}", "+engine@judge_engine=openai",
              f"judge_engine.base_url={_base_url(served)}", "judge_engine.served_model=tiny-adder"]  # fmt: skip
    run = run_alone(prepare(load(judged)))
    local = run_alone(prepare(load([*base, f"run.root={tmp_path / 'local'}"])))
    entries = _model_entries(run)
    judges = [e for e in entries if e.get("role") == "judge"]
    assert len(judges) == 2 * (3 * 3 + 3 * 4) and all(e["response"]["server"]["model"] == "tiny-adder" for e in judges)
    assert all("server" not in e["response"] for e in entries if e.get("role") != "judge")  # the policy: offline
    assert output_columns(run) == output_columns(local)  # the policy's outputs, bit for bit
    for got, expected in zip(_judgements(run), _judgements(local), strict=True):
        assert [j["output"] for j in got] == [j["output"] for j in expected]  # the same verdicts
        for a, b in zip(got, expected, strict=True):  # two engines' float32 kernels: close, not bitwise
            assert a["option_logprobs"] == pytest.approx(b["option_logprobs"], abs=1e-3)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["judge_engine"]["name"] == "openai" and manifest["judge_engine"]["weights_pinned"] is False
    assert manifest["judge_engine"]["servers"][0]["base_url"] == _base_url(served)
    identity = manifest["identity"]["judge_engine"]  # the judges' engine, without its transport (resumes elsewhere)
    assert identity["name"] == "openai" and identity["served_model"] == "tiny-adder" and "base_url" not in identity
    assert manifest["model"]["pinned"] is True and manifest["judge_model"]["pinned"] is False
    assert manifest["workers"][0]["engine"]["served_by"] == [judges[0]["response"]["server"]]
    assert verify_run(run).scores == "recomputed"
    replayed = replay_run(run, [])  # the judges' answers from the record: no server is asked
    assert replayed.reproduced == 2 and not replayed.divergences and replayed.scores_identical


def _judgements(run: Path) -> list[list[dict]]:
    rows = pq.read_table(run / "outputs", columns=["episode_id", "judgements"]).to_pylist()
    return [r["judgements"] for r in sorted(rows, key=lambda r: r["episode_id"])]


def test_judges_whose_server_is_not_there_or_serves_another_model_are_refused_before_any_episode(
    served: Dispatcher,
) -> None:
    rubric = ["task=report_rubric", "engine=hf", *SERVED, "+engine@judge_engine=openai"]
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BadInput, match=r"the judges' engine: .*no server answers") as caught:
        open_for(prepare(load([*rubric, f"judge_engine.base_url={nobody}"])))
    assert caught.value.where == "judge_engine.base_url"
    with pytest.raises(BadInput, match=r"the judges' engine: .*not 'other'") as caught:
        open_for(prepare(load([*rubric, f"judge_engine.base_url={_base_url(served)}",
                               "judge_engine.served_model=other"])))  # fmt: skip
    assert caught.value.where == "judge_engine.served_model"
    with pytest.raises(BadInput, match=r"the task has no task\.rubric") as caught:
        load([*SERVED, "+engine@judge_engine=openai", f"judge_engine.base_url={nobody}"])
    assert caught.value.where == "judge_engine"


def test_nothing_listening_or_another_model_is_refused_before_any_episode(served: Dispatcher) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BadInput, match="no server answers") as caught:
        open_for(prepare(load([*SERVED, "engine=openai", f"engine.base_url={nobody}"])))
    assert caught.value.where == "engine.base_url"
    with pytest.raises(BadInput, match=r"serves \['tiny-adder'\], not 'other'") as caught:
        open_for(prepare(load([*SERVED, "engine=openai", f"engine.base_url={_base_url(served)}",
                               "engine.served_model=other"])))  # fmt: skip
    assert caught.value.where == "engine.served_model"
    with pytest.raises(BadInput, match="engine=openai needs the server's URL") as caught:
        load(["engine=openai"])
    assert caught.value.where == "engine.base_url"


def test_a_server_that_goes_away_stops_the_run_resumably_and_resume_finishes_it(
    served: Dispatcher, tmp_path: Path
) -> None:
    """The server stops answering after 10 of 20 requests: the run stops (exit 1, naming `evalrun resume`) with its
    first parts committed; resumed once the server is back, it runs only the missing episodes and ends with the
    records a run without the fault makes. The resume reaches the server by another URL (the transport is not
    the run's identity; the server's answers are checked for drift)."""
    proxy = FaultProxy(_base_url(served))
    proxy.down_after = 10
    try:
        flaky = ("engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder",
                 "engine.max_retries=1", "engine.max_concurrency=5", "cluster.batch_size=5")  # fmt: skip
        prepared = prepare(load([*SERVED, *flaky, f"run.root={tmp_path / 'flaky'}"]))
        client = open_for(prepared)
        try:
            with pytest.raises(CheckFailed, match=r"no answer after 2 tries.*evalrun resume") as caught:
                execute(prepared, client)
            assert proxy.given["drop"] >= 2 and proxy.forwarded == 10
            (run,) = (tmp_path / "flaky").iterdir()
            assert str(run) in str(caught.value) and not (run / "record.json").exists()
            kept = len(list((run / "outputs").iterdir()))
            assert kept == 2  # the two batches the server answered, committed (flushed before the stop)
            settle(proxy)  # the stopped run's cancelled retries, still on their way, meet the server down
        finally:
            client.close()
        resume(run, [f"engine.base_url={_base_url(served)}"])  # the server is back, at another address
        proxy.down_after = None
        clean = run_alone(prepare(load([*SERVED, *flaky, f"run.root={tmp_path / 'clean'}"])))
    finally:
        proxy.close()
    assert proxy.forwarded == 10 + 20  # the first run's answered 10, and the clean run's 20
    assert verify_run(run).scores == "recomputed"
    assert output_columns(run) == output_columns(clean)
    record, again = (json.loads((r / "record.json").read_text())["merkle_root"] for r in (run, clean))
    assert record == again
    # the engine counts faults until its worker next reports them: the stopped run's last ones land in its own
    # last batch's report or in none (its engine closed with them); never any other kind
    served_record = json.loads((run / "record.json").read_text())["dispatch"]["served"]
    assert set(served_record["faults"]) <= {"connection"}
    assert served_record["faults"].get("connection", 0) <= proxy.given["drop"]
    assert json.loads((clean / "record.json").read_text())["dispatch"]["served"] == {
        "faults": {}, "retries": 0, "limit_changes": 0}  # fmt: skip


def test_a_server_that_changes_mid_run_is_drift(served: Dispatcher, tmp_path: Path) -> None:
    """Answers with another system_fingerprint than the run's server had at the start (a backend swapped behind
    the URL): under determinism=strict the run stops before committing them, resumably; under run.on_drift=warn
    it goes on and record.json keeps the drift, while every model entry keeps the fingerprint it was given."""
    proxy = FaultProxy(_base_url(served))
    try:
        url = ("engine=openai", f"engine.base_url={proxy.url}", "engine.served_model=tiny-adder",
               "cluster.batch_size=5", "engine.max_concurrency=5")  # fmt: skip
        strict = prepare(load([*SERVED, *url, "determinism=strict", f"run.root={tmp_path / 'strict'}"]))
        client = open_for(strict)
        try:
            proxy.faults.extend([None] * 12 + ["fingerprint"])
            with pytest.raises(CheckFailed, match=rf"server {proxy.url}.*{OTHER_FINGERPRINT}.*run.on_drift=warn"):
                execute(strict, client)
            (run,) = (tmp_path / "strict").iterdir()
            assert not (run / "record.json").exists()
            assert all(e["response"]["server"]["system_fingerprint"] != OTHER_FINGERPRINT for e in _model_entries(run))
            proxy.rewrite = True  # the new backend stays: resumed under warn, the run completes with the drift kept
            resume(run, ["run.on_drift=warn"], client)
        finally:
            client.close()
    finally:
        proxy.close()
    record = json.loads((run / "record.json").read_text())
    (drift,) = record["dispatch"]["drift"]
    assert drift["field"] == f"server {proxy.url}" and drift["found"]["system_fingerprint"] == OTHER_FINGERPRINT
    prints = {e["response"]["server"]["system_fingerprint"] for e in _model_entries(run)}
    assert OTHER_FINGERPRINT in prints and len(prints) == 2
    assert verify_run(run).scores == "recomputed"


THINKING = ("model=tiny_thinking_adder", "task=addition", "decoding.stop=[]", "task.reasoning_parser=deepseek_r1",
            "limit=10")  # fmt: skip


LM_EVAL = ("model=tiny_thinking_adder", "task=lm_eval", "task.chat_format=chat", "limit=4")
# zero-shot addition_gen with a gen_prefix (the thinking adder's context is 128 tokens)
PREFIXED = "include: {}\ntask: prefixed\ngen_prefix: 'Answer:'\n".format(
    BUILTIN_TASKS / "lm_eval" / "addition_gen" / "addition_gen.yaml"
)


def test_the_chat_endpoint_is_sent_the_messages_and_renders_the_prompt_evalrun_records(tmp_path: Path) -> None:
    """engine.api=chat on a server of a model with a chat template (the thinking adder's ChatML): the server renders
    the messages into the very prompt evalrun rendered and recorded, and generates the tokens the completions
    endpoint gives for that prompt; the reasoning parser splits served replies as offline ones. A task whose
    template is not the server's is refused request by request, naming the first difference."""
    chat_config = load([*SERVED, *THINKING, "engine=vllm_server", "engine.api=chat", f"run.root={tmp_path / 'c'}"])
    server = open_for(prepare(chat_config))
    try:
        chat = execute(prepare(chat_config), server)
        url = ("engine=openai", f"engine.base_url={server.worker.engine.identity.base_url}",
               "engine.served_model=tiny-thinking-adder")  # fmt: skip
        text = prepare(load([*SERVED, *THINKING, *url, f"run.root={tmp_path / 't'}"]))
        other = tmp_path / "other.jinja"
        template = Path(chat_config.model.path, "tokenizer_config.json")
        other.write_text(
            json.loads(template.read_text())["chat_template"].replace("<|im_start|>assistant", "<|im_start|>assistant ")
        )
        mismatch = prepare(load([*SERVED, *THINKING, *url, "engine.api=chat", f"task.chat_template={other}",
                                 "limit=2", f"run.root={tmp_path / 'm'}"]))  # fmt: skip
        # an lm-eval YAML under the chat template, its gen_prefix an assistant turn the server continues
        (tmp_path / "prefixed.yaml").write_text(PREFIXED, encoding="utf-8")
        lm_eval = (*SERVED, *LM_EVAL, f"task.path={tmp_path / 'prefixed.yaml'}", *url)
        lm_eval_chat = prepare(load([*lm_eval, "engine.api=chat", f"run.root={tmp_path / 'l'}"]))
        lm_eval_text = prepare(load([*lm_eval, f"run.root={tmp_path / 'lt'}"]))
        ends_otherwise = tmp_path / "ends-otherwise.jinja"  # a continued final message has no generation prompt
        ends_otherwise.write_text(other.read_text().replace("<|im_end|>", "<|im_end|> "))
        lm_eval_other = prepare(load([*lm_eval, "engine.api=chat", f"task.chat_template={ends_otherwise}", "limit=2",
                                      f"run.root={tmp_path / 'lo'}"]))  # fmt: skip
        completions, refused = run_alone(text), run_alone(mismatch)
        lm_chat, lm_text, lm_other = run_alone(lm_eval_chat), run_alone(lm_eval_text), run_alone(lm_eval_other)
    finally:
        server.close()
    assert output_columns(chat) == output_columns(completions)  # the same prompts, the same tokens and logprobs
    summary = json.loads((chat / "summary.json").read_text())
    assert [m["mean"] for m in summary["overall"].values()] == [1]  # the answers after the thinking, split as offline
    assert verify_run(chat).scores == "recomputed"
    replayed = replay_run(chat, [])
    assert replayed.reproduced == 10 and replayed.root_matches
    ends = [json.loads(line) for path in sorted((refused / "log").iterdir()) for line in path.read_text().splitlines()]
    errors = [e["error"] for e in ends if e["kind"] == "end"]
    assert len(errors) == 2 and all("the server rendered the chat otherwise" in e for e in errors)
    assert all("where evalrun's has ' \\n'" in e for e in errors)  # the first difference, named
    assert output_columns(lm_chat) == output_columns(lm_text)  # the server rendered lm-eval's prompts as evalrun did
    rows = pq.read_table(lm_chat / "outputs").to_pylist()
    assert len(rows) == 4 and all(r["finish_reason"] != "failed" and r["prompt"].endswith("Answer:") for r in rows)
    ends = [json.loads(line) for path in sorted((lm_other / "log").iterdir()) for line in path.read_text().splitlines()]
    assert [("the server rendered the chat otherwise" in e["error"]) for e in ends if e["kind"] == "end"] == [True] * 2


def test_a_customer_on_a_server_of_its_own_is_asked_there_and_its_refusal_recorded(served: Dispatcher,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    """The support-desk customer played by a served model (``+engine@user_engine=openai``) beside an offline run
    (engine=hf, the scripted agent): every customer turn goes to the server, which refuses it (the session's server
    is the tiny adder, whose context of 128 tokens a customer's prompt exceeds): the server's reason is recorded as
    the customer's refused call, the manifest records the server and the customer's unpinned weights, and the run
    verifies and replays with no server."""
    config = [*SERVED, "task=support_desk", "task.world.user=model", "limit=2", "engine=hf", f"run.root={tmp_path}",
              "+engine@user_engine=openai", f"user_engine.base_url={_base_url(served)}",
              "user_engine.served_model=tiny-adder"]  # fmt: skip
    run = run_alone(prepare(load(config)))
    refused = [e for e in _model_entries(run) if e.get("role") == "user"]
    assert len(refused) == 2 and all("error" in e and "128" in e["error"] for e in refused)  # the server's reason
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["user_engine"]["name"] == "openai" and manifest["user_engine"]["weights_pinned"] is False
    # the run's model, whose weights the server holds: recorded as a customer model of its own, unpinned
    assert manifest["task"]["world"]["user"]["model"]["pinned"] is False and manifest["model"]["pinned"] is True
    assert manifest["user_model"]["pinned"] is False and manifest["workers"][0]["engine"]["served_by"]
    assert manifest["identity"]["user_engine"]["served_model"] == "tiny-adder"
    assert verify_run(run).episodes == 2
    assert replay_run(run, []).matches
