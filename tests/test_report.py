"""`evalrun report` on stored runs, no engine (issue 15): what the page holds, that it is one
self-contained and repeatable file, that verify accepts it inside a run and that a run failing verify
still gets its page with the failure on top; agent transcripts from real chains; the benchmark's smoke
size. The page in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.audit.verify import verify_run
from evalrun.cli import main
from evalrun.config import load
from evalrun.episodes.agent import ModelAgent, ScriptedAgent, run_agent_episodes
from evalrun.errors import CheckFailed
from evalrun.pipeline.manifest import run_identity
from evalrun.pipeline.runner import prepare
from evalrun.records.entries import parse_line
from evalrun.report import build_report
from evalrun.report.data import ROW_FIELDS, compact_json, transcript_steps
from evalrun.report.html import script_json
from evalrun.rundir import layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agents import GENERATOR, ScriptedEngine, ScriptedModel, plan, suite  # the agent tests' engine-free plan

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
BLOB = re.compile(r'<script type="application/json" id="(episodes|transcripts)-data-(\d+)">(.*?)</script>', re.S)


def copy_run(source: Path, where: Path) -> Path:
    return Path(shutil.copytree(source, where))


def blobs(html: str) -> dict[tuple[str, int], object]:
    return {(kind, int(index)): json.loads(text) for kind, index, text in BLOB.findall(html)}


def test_the_report_of_a_run_holds_its_identity_scores_and_every_episode(tmp_path: Path) -> None:
    run = copy_run(GOLDEN / "addition-v1", tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    record = json.loads((run / "record.json").read_text())
    data = build_report([run], run / layout.REPORT)
    html = (run / layout.REPORT).read_text(encoding="utf-8")
    assert data.runs[0].verification.ok and "verify: intact" in html and "banner fail" not in html
    for shown in (manifest["digest"]["digest"], manifest["digest"]["prompt_pack"], record["merkle_root"],
                  manifest["model"]["files"]["model.safetensors"], manifest["engine"]["version"]):  # fmt: skip
        assert shown in html
    assert html.count("<svg") >= 1 and "Scores per task" in html
    episodes = blobs(html)[("episodes", 0)]
    assert episodes["fields"] == list(ROW_FIELDS) and episodes["total"] == 4 and len(episodes["rows"]) == 4
    row = dict(zip(episodes["fields"], episodes["rows"][0], strict=True))
    outputs = {r["episode_id"]: r for r in json.loads(json.dumps(_outputs(run)))}
    expected = outputs[row["episode_id"]]
    assert (row["prompt"], row["output"], row["head"]) == (expected["prompt"], expected["output"], expected["head"])
    assert row["scores"] == {"exact_match": 1.0}
    # self-contained: nothing to fetch (no external script, style sheet, image or font)
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html) and not re.search(r"url\((?!#)", html)
    assert not re.search(r'href="(?!#)', html)  # links go to places on the page only
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "every id on the page (the plots' too) is unique"
    # a derived view: verify accepts it and still refuses any other stray file
    verify_run(run)
    (run / "notes.html").write_text("x")
    with pytest.raises(CheckFailed, match=r"notes\.html: not a file of an evalrun run directory"):
        verify_run(run)


def _outputs(run: Path) -> list[dict[str, object]]:
    import pyarrow.parquet as pq

    return pq.read_table(run / "outputs").select(["episode_id", "prompt", "output", "head"]).to_pylist()


def test_two_builds_of_a_report_are_byte_identical(tmp_path: Path) -> None:
    first, second = tmp_path / "a.html", tmp_path / "b.html"
    build_report([GOLDEN / "mc-v1"], first)
    build_report([GOLDEN / "mc-v1"], second)
    assert first.read_bytes() == second.read_bytes()


def test_a_run_that_fails_verify_gets_its_report_with_the_failure_on_top(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(GOLDEN / "addition-v1", tmp_path / "run")
    summary = run / "summary.json"
    summary.write_text(summary.read_text().replace('"mean":1', '"mean":0.5', 1))
    out = tmp_path / "report.html"
    code = main(["report", str(run), "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith("evalrun report: check failed: ") and "summary.json" in err
    html = out.read_text(encoding="utf-8")
    banner = re.search(r'<div class="banner fail"[^>]*>(.*?)</div>', html, re.S)
    assert banner and "verify failed" in banner.group(1) and "summary.json" in banner.group(1)
    assert html.index("banner fail") < html.index('id="overview"')  # above everything else


def test_several_runs_are_compared_and_equal_digests_get_the_nondeterminism_report(tmp_path: Path) -> None:
    a = copy_run(GOLDEN / "addition-v1", tmp_path / "a")
    b = copy_run(GOLDEN / "addition-v1", tmp_path / "b")
    data = build_report([a, b], tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    (comparison,) = data.comparisons
    assert comparison.report is not None and comparison.report.diffs == () and comparison.error is None
    assert data.nondet is not None and data.nondet.report is not None and data.nondet.report.tarr == 1.0
    assert 'id="comparison"' in html and "TARr@2" in html and "Paired comparison" in html
    assert {key[1] for key in blobs(html)} == {0, 1}  # a table per run
    other = build_report([a, GOLDEN / "mc-v1"], tmp_path / "other.html")
    assert other.nondet is not None and other.nondet.report is None and "digests differ" in other.nondet.note


def test_the_report_cli_refuses_what_is_not_a_run_and_an_unwritable_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nothing"), "-o", str(tmp_path / "r.html")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["report", str(GOLDEN / "addition-v1"), "-o", str(tmp_path / "missing" / "r.html")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["report", str(GOLDEN / "addition-v1"), "-o", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r.html")


def test_script_json_cannot_end_its_script_element_and_holds_no_nan() -> None:
    text = str(script_json({"prompt": "</script><!-- <b>", "value": float("nan")}))
    assert "<" not in text and json.loads(text) == {"prompt": "</script><!-- <b>", "value": None}


def test_a_scripted_agent_episode_reads_as_a_transcript_step_by_step() -> None:
    (result, *_) = run_agent_episodes(plan(suite()), ScriptedAgent(), GENERATOR)
    steps = transcript_steps(parse_line(line) for line in result.log_lines)
    kinds = [s.kind for s in steps]
    assert kinds[0] == "task" and kinds[-1] == "end" and "stopped: done" in steps[-1].title
    assert kinds.count("tool") == kinds.count("observation") == result.tool_calls
    assert {"clock", "uuid"} <= set(kinds)
    tools = [s for s in steps if s.kind == "tool"]
    assert any("submit_report" in s.title for s in tools) and any("list_invoices" in s.title for s in tools)
    clock = next(s for s in steps if s.kind == "clock")
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(", clock.text)  # the simulated date, readable
    observation = next(s for s in steps if s.kind == "observation")
    assert observation.title.startswith("result of tool call") and observation.status == "ok"


def test_a_model_agent_s_turns_and_unreadable_replies_are_in_its_transcript() -> None:
    episodes = plan(suite(seeds=(1000, 1001)), agent="model")
    (result, *_) = run_agent_episodes(episodes, ScriptedModel(ScriptedEngine(episodes)), GENERATOR)
    steps = transcript_steps(parse_line(line) for line in result.log_lines)
    turns = [s for s in steps if s.kind == "model"]
    assert turns and all(s.title.startswith("model turn ") and '"tool_calls"' in s.text for s in turns)
    assert [s.kind for s in steps].index("model") < [s.kind for s in steps].index("tool")  # the reply, then its calls
    garbage = ScriptedEngine(episodes, garbage="not a tool call")
    (failed, *_) = run_agent_episodes(episodes, ModelAgent(garbage), GENERATOR)
    steps = transcript_steps(parse_line(line) for line in failed.log_lines)
    unread = [s for s in steps if s.kind == "observation"]
    assert unread and all(s.title.startswith("reply of model call ") and s.status == "error" for s in unread)


def test_compact_json_puts_each_member_of_a_large_record_on_its_own_line() -> None:
    value = {"id": "I2", "lines": [{"line": n, "sku": "BOLT", "qty": 3, "price": 5} for n in range(3)]}
    assert compact_json({"a": 1}) == '{"a": 1}'
    lines = compact_json(value, width=60).splitlines()
    assert lines[0] == "{" and lines[2] == '  "lines": [' and lines[3].strip().startswith('{"line": 0')


def test_the_report_setting_is_no_part_of_a_run_s_identity() -> None:
    on, off = prepare(load(["limit=3"])), prepare(load(["limit=3", "report=false"]))
    assert on.config.report and not off.config.report
    assert on.digest == off.digest
    identities = [
        run_identity(p.kind, p.config, p.task, p.model, p.digest, len(p.episodes), p.judge_model) for p in (on, off)
    ]
    assert identities[0] == identities[1]


def test_bench_report_smoke(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_report.py"), "--episodes", "50", "--repeat", "1",
         "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "50 episodes in its table; builds byte-identical: yes" in done.stdout
    assert re.search(r"report +: \d+\.\d\d s best of 2", done.stdout)
