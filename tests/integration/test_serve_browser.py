"""The page at ``/`` in headless Chromium (Debian's package, driven by Playwright): type a
sentence, wait for the translation; it must equal the API's, and the heat-map must have one row
per target token and one column per source token, each cell drawn from the API's alignment
weight w: its colour (computed by the browser) the shade round(255 (1 - w)) of blue, its title
the two tokens and w, and the darkest cell of each row the row's largest weight. The screenshot is kept under pytest's
temporary directory, and written to ``$SERVE_SCREENSHOT`` too when that is set (how
docs/serve-screenshot.png was made)."""
import contextlib
import math
import os
import re
import shutil

import httpx
import pytest
from helpers import ONE_THREAD
from playwright.sync_api import sync_playwright  # the test extra

from fairseq_plugins_lab.benchmarks.serve import ServerProcess

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# no network from the browser: the page must work from what the server sends alone
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium():
    """Headless Chromium, driven by Playwright, closed when the block ends."""
    assert os.path.exists(CHROMIUM), "install Debian's chromium (.ci/run does)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def test_page_translates_and_draws_the_alignment(generation_models, corpus_dir, tmp_path):
    sentence = open(f"{corpus_dir}/test.src").read().splitlines()[4]
    with ServerProcess(generation_models["rnnsearch"], ["--max-delay-ms", "1"], log=str(tmp_path / "serve.log"),
                       env=ONE_THREAD) as server, chromium() as browser:
        expected = httpx.post(server.url + "/translate", json={"text": sentence, "alignment": True},
                              timeout=60).json()["translations"][0]
        page = browser.new_page(viewport={"width": 900, "height": 640})
        offline = []  # requests to anywhere but the server
        page.on("request", lambda r: offline.append(r.url) if not r.url.startswith(server.url) else None)
        page.goto(server.url + "/")
        page.fill("#source", sentence)
        page.click("#go")
        page.wait_for_selector("#heatmap", timeout=60_000)
        assert page.inner_text("#translation") == expected["text"]
        rows = page.locator("#heatmap tbody tr")
        assert rows.count() == len(expected["tokens"])  # one row per target token
        assert [rows.nth(i).locator("th").inner_text() for i in range(rows.count())] == expected["tokens"]
        assert all(rows.nth(i).locator("td").count() == len(expected["source_tokens"]) for i in range(rows.count()))
        assert page.locator("#heatmap thead th").count() == 1 + len(expected["source_tokens"])
        assert "rnnsearch" in page.inner_text("#model")
        drawn = page.eval_on_selector_all(
            "#heatmap tbody tr", "rows => rows.map(r => [...r.querySelectorAll('td')].map("
                                 "td => [getComputedStyle(td).backgroundColor, td.title]))")
        check_cells(drawn, expected)
        assert offline == []
        page.screenshot(path=str(tmp_path / "serve-screenshot.png"), full_page=True)
        if os.environ.get("SERVE_SCREENSHOT"):
            shutil.copy(tmp_path / "serve-screenshot.png", os.environ["SERVE_SCREENSHOT"])


def check_cells(drawn, expected):
    """Each cell of ``drawn`` ([rows][columns] of (computed colour, title)) against the API's alignment."""
    source, weights = expected["source_tokens"], expected["alignment"]
    assert len(drawn) == len(expected["tokens"]) == len(weights)
    for token, cells, row in zip(expected["tokens"], drawn, weights):
        assert len(cells) == len(source) == len(row)
        shades = []
        for (colour, title), word, w in zip(cells, source, row):
            shade = math.floor(255 * (1 - w) + 0.5)  # JavaScript's Math.round
            assert colour == f"rgb({shade}, {shade}, 255)", (token, word, w, colour)
            match = re.fullmatch(rf"{re.escape(token)} / {re.escape(word)}: (\d\.\d{{3}})", title)
            assert match and abs(float(match.group(1)) - w) <= 5e-4 + 1e-9, (title, w)
            shades.append(int(colour[4:].split(",")[0]))
        assert row[shades.index(min(shades))] >= max(row) - 1 / 255  # the row's largest weight is drawn darkest
    assert len({c for cells in drawn for c, _ in cells}) > 1  # not one colour everywhere
