"""The HTML report of `raydra compare --html`: one self-contained file, checked as text and then
in a real headless Chromium driven by selenium (Debian's chromium and chromium-driver: make browser):
no console error, no network request, curves a legend click hides, a sortable table, the sweep
views and a config diff of two runs."""

import os
import re

import pytest
from test_compare import compare, make_run

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def report(tmp_path, capsys):
    """A sweep over lr (job 1 best), a failed job, a running one and one without metrics.csv."""
    root = tmp_path / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    make_run(root, "0", lr=0.001, accs=(0.5, 0.7, 0.8))
    make_run(root, "1", lr=0.01, accs=(0.6, 0.95, 0.9))
    make_run(root, "2", lr=0.1, accs=(0.3, 0.4, 0.45))
    make_run(root, "3", lr=0.5, status="failed", error="CUDA out of memory", accs=(0.1, 0.2))
    make_run(root, "4", lr=0.2, metrics_csv=False)
    path = tmp_path / "report" / "index.html"
    code, _, err = compare(capsys, root, "--metric", "val/acc", "--html", path)
    assert code == 0
    assert err.count("has no metrics.csv") == 1 and f"wrote {path}" in err
    return path


def test_the_report_is_one_file_that_loads_nothing(report):
    page = report.read_text()
    # plotly.js holds URLs in strings it never loads unasked (the browser test watches the requests);
    # the page's own markup must name none.
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", markup), "the report must load nothing from a network"
    assert "<link" not in page and "<script src" not in page
    assert "Plotly" in page and 'id="data"' in page  # plotly.js inline, the data beside it
    assert "model.optimizer.lr=0.5" in page and "CUDA out of memory" in page
    assert report.stat().st_size < 6_000_000


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (make browser)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    for flag in ("--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.mark.browser
def test_the_report_works_in_headless_chromium(report, browser):
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(report.as_uri())
    WebDriverWait(browser, 60).until(lambda d: d.execute_script("return document.querySelectorAll('#curves .main-svg').length > 0"))

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    # chrome:// is the browser's own start page; what the report asks for is its file and nothing on a network.
    assert report.as_uri() in urls
    assert [u for u in urls if not u.startswith(("file:", "data:", "blob:", "about:", "chrome:"))] == []

    # Every metric metrics.csv logged has its plot; val/acc's first trace is job 0's curve.
    metrics = browser.execute_script("return [...document.querySelectorAll('#curves .plot')].map(d => d.dataset.metric)")
    assert set(metrics) == {"test/acc", "train/loss", "train/samples_per_s", "val/acc", "val/loss"}
    plot = browser.find_element(By.CSS_SELECTOR, '#curves .plot[data-metric="val/acc"]')
    plot_id = plot.get_attribute("id")
    traces = browser.execute_script(f"return document.getElementById('{plot_id}').data.map(t => [t.name, t.visible])")
    assert [t[0] for t in traces] == ["0", "1", "2", "3"]
    plot.find_elements(By.CSS_SELECTOR, ".legend .traces")[1].click()  # run 1 in the legend
    WebDriverWait(browser, 10).until(
        lambda d: d.execute_script(f"return document.getElementById('{plot_id}').data[1].visible") == "legendonly"
    )
    assert browser.execute_script(f"return document.getElementById('{plot_id}').data[0].visible") in (None, True)

    # x as epoch: val/acc has one point per epoch; log scale switches the axis.
    Select(browser.find_element(By.ID, "x")).select_by_value("epoch")
    browser.execute_script("document.getElementById('x').dispatchEvent(new Event('input'))")
    assert browser.execute_script(f"return document.getElementById('{plot_id}').data[1].x") == [0, 1, 2]
    browser.find_element(By.ID, "logy").click()
    assert browser.execute_script(f"return document.getElementById('{plot_id}').layout.yaxis.type") == "log"

    # The table sorts by a click on a metric's header, best first after two clicks (descending).
    header = browser.find_element(By.XPATH, "//table[@id='runs']//th[text()='best val/acc']")
    header.click()
    header = browser.find_element(By.XPATH, "//table[@id='runs']//th[text()='best val/acc']")
    header.click()
    first = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")[0].find_elements(By.TAG_NAME, "td")[0].text
    assert first == "1"

    # The sweep: parallel coordinates over lr and val/acc; the failed job is marked in the scatter.
    assert browser.execute_script("return document.getElementById('parcoords').data[0].dimensions.map(d => d.label)") == [
        "model.optimizer.lr",
        "val/acc",
    ]
    marked = browser.execute_script("return document.getElementById('scatter-0').data[1]")
    assert marked["name"].startswith("stopped / failed") and marked["x"] == [0.5]

    # The config diff of two runs shows the key that differs, and only it.
    Select(browser.find_element(By.ID, "diff-a")).select_by_visible_text("0")
    Select(browser.find_element(By.ID, "diff-b")).select_by_visible_text("2")
    browser.execute_script("document.getElementById('diff-b').dispatchEvent(new Event('input'))")
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#diff tbody tr")]
    assert rows == ["model.optimizer.lr 0.001 0.1"]
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
