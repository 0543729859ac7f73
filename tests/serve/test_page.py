"""The live page in headless Chromium: type a sentence, press run, see the output and heatmap."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.jobs import load_run

from ..viz.test_page import browser, cells, errors  # noqa: F401  (the browser fixture)


def wait_for(driver, script: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


@pytest.mark.browser
def test_type_a_sentence_and_see_translation_and_heatmap(browser, service, runs):  # noqa: F811
    from selenium.webdriver.support.ui import Select

    folder, sentence = runs["translation"]
    browser.set_window_size(1400, 900)
    browser.get(service.url + "/")
    wait_for(browser, "return document.querySelectorAll('#model option').length === 4")
    Select(browser.find_element("id", "model")).select_by_value("translation")
    browser.find_element("id", "text").send_keys(sentence)
    browser.find_element("id", "run").click()
    wait_for(browser, "return document.querySelectorAll('#heatmap td.cell').length > 0")
    translator = load_run(folder)
    expected = translator.translate([sentence])[0]
    wait_for(browser, f"return document.getElementById('result').textContent === {expected!r}")
    attention = translator.attention(sentence)
    np.testing.assert_allclose(cells(browser), attention.kinds[0].weights[0].mean(0), atol=2e-4)
    # The explorer works as on its own page: another head redraws the heatmap.
    browser.find_element("css selector", "#heads button[data-head='1']").click()
    np.testing.assert_allclose(cells(browser), attention.kinds[0].weights[0, 1], atol=1e-4)
    assert errors(browser) == []


@pytest.mark.browser
def test_an_image_model_takes_a_file(browser, service, runs):  # noqa: F811
    from selenium.webdriver.support.ui import Select

    folder, png = runs["vit"]
    browser.get(service.url + "/")
    wait_for(browser, "return document.querySelectorAll('#model option').length === 4")
    Select(browser.find_element("id", "model")).select_by_value("vit")
    assert browser.find_element("id", "text").is_displayed() is False
    browser.find_element("id", "file").send_keys(png)
    wait_for(browser, "return document.querySelectorAll('#heatmap td.cell').length > 0")
    label = load_run(folder).predict([png])[0][0]
    assert browser.find_element("id", "result").text.startswith(label + " (probability")
    assert browser.execute_script("return document.getElementById('image').width") == 256
    assert errors(browser) == []
