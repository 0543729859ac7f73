import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import qkv.viz
from qkv.viz.attention import AttentionKind, RunAttention, run_attention
from qkv.viz.page import attention_page, static_text, write_attention_page

from .conftest import SENTENCE

CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMEDRIVER = ("chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture(scope="module")
def maps(translation_run):
    return run_attention(translation_run, SENTENCE)


def embedded(page: str) -> dict:
    match = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>', page)
    return json.loads(match.group(1))


def vit_attention() -> RunAttention:
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(5), size=(1, 2, 5)).astype(np.float32)  # (L, H, S, S)
    tokens = ["[CLS]", "(0,0)", "(0,1)", "(1,0)", "(1,1)"]
    image = rng.random((8, 8)).astype(np.float32)
    kinds = [AttentionKind("encoder", weights, tokens, tokens)]
    return RunAttention("vit", "seven.png", "7 (probability 0.80)", kinds, image, (2, 2))


def test_page_is_self_contained_and_embeds_every_weight(maps):
    page = attention_page(maps)
    assert "http://" not in page and "https://" not in page
    assert "<script src" not in page and '<link rel="stylesheet"' not in page
    data = embedded(page)
    assert [k["name"] for k in data["kinds"]] == ["encoder", "decoder", "cross"]
    for kind, stored in zip(maps.kinds, data["kinds"], strict=True):
        assert stored["queries"] == kind.queries and stored["keys"] == kind.keys
        np.testing.assert_allclose(np.array(stored["weights"]), kind.weights, atol=5e-5)
    assert data["output"] == maps.output and data["image"] is None
    assert data["job"] == "translation"


def test_page_inlines_the_script_and_style_files(maps):
    """The code is package data (qkv/viz/static), read through importlib.resources."""
    static = Path(qkv.viz.__file__).parent / "static"
    script = (static / "explorer.js").read_text(encoding="utf-8")
    style = (static / "explorer.css").read_text(encoding="utf-8")
    assert "attention-data" in script and "#heatmap" in style
    assert static_text("explorer.js") == script and static_text("explorer.css") == style
    page = attention_page(maps)
    assert f"<script>\n{script}</script>" in page
    assert f"<style>\n{style}</style>" in page


def test_tokens_cannot_break_out_of_the_page():
    tokens = ["</script><b>", "a&b", "<!--"]
    weights = np.full((1, 1, 3, 3), 1 / 3, dtype=np.float32)
    attention = RunAttention(
        "tagger", "</script>", "x/NOUN", [AttentionKind("encoder", weights, tokens, tokens)]
    )
    page = attention_page(attention)
    assert page.count("</script>") == 2  # the ends of the data and of the code
    assert embedded(page)["kinds"][0]["keys"] == tokens


def find_browser() -> tuple[str, str]:
    """Paths of a Chromium and its chromedriver.

    Missing, the browser tests fail, saying what to install; they skip only when the user
    opts out with QKV_SKIP_BROWSER=1, so that the explorer is never left untested unnoticed.
    """
    browser = next((shutil.which(name) for name in CHROMIUM if shutil.which(name)), None)
    driver = next((shutil.which(name) for name in CHROMEDRIVER if shutil.which(name)), None)
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver)) if not path]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        message = (
            f"the attention explorer's browser tests need {', '.join(missing)}: run "
            "`make browser` (apt-get install chromium chromium-driver), or set "
            "QKV_SKIP_BROWSER=1 to skip them knowingly"
        )
        if os.environ.get("QKV_SKIP_BROWSER") == "1":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = find_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile = tempfile.mkdtemp(prefix="qkv-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    driver.get_log("browser")  # start each page with an empty log


def errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def cells(driver) -> np.ndarray:
    """The drawn heatmap as (Q, K) weights, read from the cells' data-w."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#heatmap tr')].slice(1).map(tr =>"
        " [...tr.querySelectorAll('td.cell')].map(td => td.dataset.w))"
    )
    return np.array(rows, dtype=float)


def shown(driver) -> tuple[str, str, str]:
    table = driver.find_element("id", "heatmap")
    return tuple(table.get_attribute(f"data-{a}") for a in ("kind", "layer", "head"))


@pytest.mark.browser
def test_page_in_a_real_browser(browser, maps, tmp_path):
    from selenium.webdriver.support.ui import Select

    page = write_attention_page(maps, tmp_path / "attention.html")
    open_page(browser, page)
    assert errors(browser) == []
    encoder, decoder, cross = maps.kinds
    assert shown(browser) == ("encoder", "0", "avg")
    np.testing.assert_allclose(cells(browser), encoder.weights[0].mean(0), atol=2e-4)
    browser.find_element("css selector", "#heads button[data-head='1']").click()
    assert shown(browser) == ("encoder", "0", "1")
    after = cells(browser)
    np.testing.assert_allclose(after, encoder.weights[0, 1], atol=1e-4)
    assert not np.allclose(after, encoder.weights[0, 0], atol=1e-4)
    Select(browser.find_element("id", "layer")).select_by_value("1")
    np.testing.assert_allclose(cells(browser), encoder.weights[1, 1], atol=1e-4)
    Select(browser.find_element("id", "kind")).select_by_index(2)  # encoder-decoder attention
    assert shown(browser) == ("cross", "0", "1")
    np.testing.assert_allclose(cells(browser), cross.weights[0, 1], atol=1e-4)
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#heatmap th.key')].map(th => th.textContent)"
    )
    assert labels == cross.keys
    # Clicking a query token shades the keys by where it attends.
    browser.find_elements("css selector", "#heatmap th.query")[1].click()
    shades = browser.execute_script(
        "return [...document.querySelectorAll('#keys span')].map(s => s.title)"
    )
    np.testing.assert_allclose(np.array(shades, dtype=float), cross.weights[0, 1, 1], atol=1e-4)
    assert "“" + cross.queries[1] + "”" in browser.find_element("id", "legend").text
    assert maps.output in browser.find_element("id", "output").text
    assert errors(browser) == []


@pytest.mark.browser
def test_vit_page_draws_the_image(browser, tmp_path):
    page = write_attention_page(vit_attention(), tmp_path / "vit.html")
    open_page(browser, page)
    size = browser.execute_script(
        "const c = document.getElementById('image'); return [c.width, c.height]"
    )
    assert size == [256, 256]
    browser.find_element("css selector", "#heads button[data-head='avg']").click()
    browser.find_elements("css selector", "#heatmap th.query")[0].click()  # [CLS]
    assert "[CLS]" in browser.find_element("id", "image-note").text
    assert errors(browser) == []
