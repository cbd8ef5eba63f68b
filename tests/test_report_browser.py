"""The report in a real browser (issue 15): headless Chromium opens each page from disk, no console or
page error and no request leaves the file; the digest, a plot and the episode table with every
episode are there, and typing in the search box filters the rows. A screenshot of each page is saved
(in the test's tmp dir, and under $EVALRUN_ARTIFACTS when set).

Chromium is Debian's ``chromium`` (scripts/setup.sh installs it where it can), driven by Playwright's
Python package through ``executable_path`` (no browser download). Where there is no Chromium, or no
Playwright, the tests are skipped saying why; a Chromium that is there but fails is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from evalrun.config import load
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import execute, prepare
from evalrun.report import build_report

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# As the machine's own probe starts it: no sandbox (root), no GPU, and none of Chromium's own network
# traffic (this machine has no network but the package registries).
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
PAGE_SIZE = 50  # the table's default page


def chromium() -> str | None:
    wanted = os.environ.get("EVALRUN_CHROMIUM")
    if wanted:
        return wanted
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def why_not() -> str | None:
    """Why the browser test cannot run here (None: it can): decided before any engine starts."""
    if chromium() is None:
        return ("no Chromium on this machine (scripts/setup.sh installs Debian's chromium when it runs as root; "
                "EVALRUN_CHROMIUM names another binary)")  # fmt: skip
    if importlib.util.find_spec("playwright") is None:
        return "Playwright's Python package is not installed (a dev dependency: the lock installs it)"
    return None


pytestmark = [pytest.mark.e2e, pytest.mark.skipif(why_not() is not None, reason=f"browser test: {why_not()}")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium()
    assert executable is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _run(dispatcher: Dispatcher, root: Path, *overrides: str) -> Path:
    return execute(prepare(load([f"run.root={root}", "run.progress=false", *overrides])), dispatcher)


@pytest.fixture(scope="module")
def reports(dispatcher: Dispatcher, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[Path]]]:
    """name -> (the report, its runs): a default run, two runs of one digest at other batch sizes, an agent run."""
    root = tmp_path_factory.mktemp("report-runs")
    default = _run(dispatcher, root, "limit=12", "seeds.set=[0,1]")
    sampled = ("limit=10", "decoding=sample", "seeds.set=[0,1]")
    pair = [_run(dispatcher, root, *sampled), _run(dispatcher, root, *sampled, "cluster.batch_size=3")]
    agent = _run(dispatcher, root, "task=invoice_desk", "limit=2", "seeds.repeats=2")
    out = tmp_path_factory.mktemp("reports")
    made = {"default": [default], "comparison": pair, "agent": [agent]}
    for name, runs in made.items():
        build_report(runs, out / f"{name}.html")
    return {name: (out / f"{name}.html", runs) for name, runs in made.items()}


def _artifacts(tmp_path: Path) -> list[Path]:
    folders = [tmp_path]
    if os.environ.get("EVALRUN_ARTIFACTS"):
        folders.append(Path(os.environ["EVALRUN_ARTIFACTS"]))
        folders[-1].mkdir(parents=True, exist_ok=True)
    return folders


def _open(browser: Any, report: Path) -> tuple[Any, list[str]]:
    """The page, opened from disk, and the list every console error, page error and request off the file
    is appended to."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(f"fetch: {r.url}"))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    return page, problems


def _episodes(run: Path) -> list[dict[str, Any]]:
    return pq.read_table(run / "outputs", columns=["episode_id", "item_id", "seed", "repeat"]).to_pylist()


def _matched(table: Any) -> int:
    return int(table.locator(".count").first.get_attribute("data-matched"))


@pytest.mark.parametrize("name", ["default", "comparison", "agent"])
def test_the_report_opens_in_chromium_with_its_digest_plots_table_and_search(
    browser: Any, reports: dict[str, tuple[Path, list[Path]]], name: str, tmp_path: Path
) -> None:
    report, runs = reports[name]
    page, problems = _open(browser, report)
    body = page.inner_text("body")
    for run in runs:
        digest = json.loads((run / "manifest.json").read_text())["digest"]["digest"]
        assert digest in body, f"{run.name}: the digest is on the page"
    assert page.locator("figure.plot svg").count() >= 1 and page.locator("figure.plot svg").first.is_visible()
    assert page.locator(".banner.fail").count() == 0  # every run verifies
    tables = page.locator(".episodes[data-source]")
    assert tables.count() == len(runs)
    table = tables.first
    episodes = _episodes(runs[0])
    assert _matched(table) == len(episodes)
    assert f"of {len(episodes)} episodes" in table.locator(".count").first.inner_text()
    assert table.locator("tbody tr.ep").count() == min(PAGE_SIZE, len(episodes))
    item = episodes[-1]["item_id"]
    table.locator("input[type=search]").fill(item)
    same_item = [e for e in episodes if e["item_id"] == item]
    assert _matched(table) == len(same_item) and table.locator("tbody tr.ep").count() == len(same_item)
    assert all(item in row for row in table.locator("tbody tr.ep").all_inner_texts())
    table.locator("input[type=search]").fill("no episode holds this text")
    assert _matched(table) == 0 and table.locator("tbody tr.ep").count() == 0
    table.locator("input[type=search]").fill("")
    table.locator("tbody tr.ep").first.click()  # the whole episode opens below its row
    detail = table.locator("tr.detail")
    assert detail.count() == 1 and re.search(r"\b[0-9a-f]{64}\b", detail.inner_text())
    if name == "comparison":
        assert page.locator("#comparison").is_visible() and "TARr@2" in page.text_content("#comparison")
        assert page.locator("#comparison figure.plot svg").count() >= 2  # paired comparison, nondeterminism
    if name == "agent":
        steps = page.locator(".transcript .step")
        kinds = set(page.locator(".transcript .step .kind").all_text_contents())
        assert steps.count() > 5 and {"task", "tool", "observation", "clock", "final", "verdict", "end"} <= kinds
        row = table.locator("tbody tr.ep").nth(1)
        row.click()
        detail = row.locator("xpath=following-sibling::tr[1]")
        episode = re.search(r"[0-9a-f]{64}", detail.inner_text())
        assert episode is not None
        detail.locator("button").click()  # show transcript: the viewer switches to that episode
        assert episode.group(0)[:10] in page.locator(".transcripts select option:checked").inner_text()
    page.evaluate("window.scrollTo(0, 0)")
    for folder in _artifacts(tmp_path):
        page.screenshot(path=str(folder / f"report-{name}.png"), full_page=True)
    assert problems == [], problems
    page.close()
