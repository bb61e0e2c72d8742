"""The HTML report of `raydra compare --html`: one self-contained file, checked as text and then
in a real headless Chromium driven by selenium (Debian's chromium and chromium-driver: make browser):
no console error, no network request, curves a legend click hides in the order a reader wants them
(the monitored metric first, one-point metrics as bars, raydra's diagnostics last), a sortable
table with the runs' tags, the sweep views and a config diff of two runs."""

import dataclasses
import json
import os
import re

import pytest
from helpers import REPO, compare, make_run

from raydra.records import summary
from raydra.records.ledger import Ledger

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


# The report's plots for `report`'s runs, in order: the monitored metric (val/loss) before the
# table's metric (val/acc), then the user's curves by split, test/acc (one point per run) as bars,
# raydra's throughput diagnostics last.
ORDER = ["val/loss", "val/acc", "train/loss", "test/acc", "train/data_wait_s", "train/samples_per_s"]


# Jobs 0-2's compute ledgers (jobs 3 and 4 were recorded before raydra kept one): 2 workers x 1800 s.
LEDGER = Ledger(
    workers=2, gpu=False, wall_s=1800, allocated_s=3600, buckets={"startup": 360, "productive": 2520, "validation": 540, "lost": 180}
)


@pytest.fixture
def report(tmp_path, capsys):
    """A sweep over lr (job 1 best) monitoring val/loss, a failed job, a running one and one
    without metrics.csv; job 2 is tagged for an ablation. With --cost: jobs 0-2 have ledgers."""
    root = tmp_path / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    monitor, tags = ("val/loss", "min"), ("sweep", "lr")
    make_run(root, "0", lr=0.001, accs=(0.5, 0.7, 0.8), monitor=monitor, tags=tags)
    make_run(root, "1", lr=0.01, accs=(0.6, 0.95, 0.9), monitor=monitor, tags=tags)
    make_run(root, "2", lr=0.1, accs=(0.3, 0.4, 0.45), monitor=monitor, tags=("ablation", "no-aug"))
    make_run(root, "3", lr=0.5, status="failed", error="CUDA out of memory", accs=(0.1, 0.2), monitor=monitor, tags=tags)
    make_run(root, "4", lr=0.2, metrics_csv=False, monitor=monitor, tags=tags)
    for job in "012":
        summary.write(root / job, dataclasses.replace(summary.read(root / job), ledger=LEDGER))
    path = tmp_path / "report" / "index.html"
    code, _, err = compare(capsys, root, "--metric", "val/acc", "--html", path, "--cost")
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
    assert page.count('<svg class="buckets"') == 3  # --cost: a bar for each run with a ledger
    assert report.stat().st_size < 6_000_000


def page_data(path):
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', path.read_text(), re.S).group(1))


def test_the_report_orders_its_plots_monitor_first_bars_for_one_point_metrics_diagnostics_last(report):
    data = page_data(report)
    assert [p["metric"] for p in data["plots"]] == ORDER
    assert [p["metric"] for p in data["plots"] if p["bar"]] == ["test/acc"]
    assert [p["metric"] for p in data["plots"] if p["diagnostic"]] == ["train/data_wait_s", "train/samples_per_s"]
    assert [r["tags"] for r in data["runs"]] == [["sweep", "lr"], ["sweep", "lr"], ["ablation", "no-aug"], ["sweep", "lr"], ["sweep", "lr"]]
    assert "<p>tags: ablation, no-aug</p>" in report.read_text()


def test_plot_order_puts_splits_in_a_readers_order():
    from raydra.compare.curves import plot_order

    points = {
        "lr-AdamW": [30, 30],  # LearningRateMonitor's name: no split
        "test/acc": [1, 1],
        "test/loss": [1, 0],
        "train/acc": [30, 30],
        "train/loss": [30, 30],
        "train/mfu": [3, 3],
        "train/samples_per_s": [1, 1],
        "val/acc": [3, 3],
        "val/acc_best": [3, 3],
        "val/loss": [3, 3],
        "zeta/score": [3, 3],
        "ood/acc": [3, 3],
    }
    order = plot_order(points, first=["val/loss"])
    assert [p.metric for p in order] == [
        "val/loss",
        "val/acc",
        "val/acc_best",
        "train/acc",
        "train/loss",
        "ood/acc",
        "zeta/score",
        "lr-AdamW",
        "test/acc",
        "test/loss",
        "train/mfu",
        "train/samples_per_s",
    ]
    assert [p.metric for p in order if p.bar] == ["test/acc", "test/loss", "train/samples_per_s"]


def test_every_diagnostic_raydra_logs_is_listed_as_one():
    """The metric names raydra's worker callbacks log (keys of dicts, also as `metrics[NAME] = ...`,
    and self.log's first argument in src/raydra/worker/) are exactly curves.DIAGNOSTIC_METRICS: a new one drawn among the user's
    metrics would be a bug the report's order test cannot see."""
    import ast

    from raydra.compare.curves import DIAGNOSTIC_METRICS

    logged = set()
    for source in (REPO / "src" / "raydra" / "worker").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Dict):
                names = node.keys
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                names = [node.slice]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "log" and node.args:
                names = node.args[:1]
            else:
                continue
            logged |= {n.value for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str) and "/" in n.value}
    assert logged == DIAGNOSTIC_METRICS


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

    # Every metric metrics.csv logged has its plot, in the reader's order, the diagnostics under
    # their own heading; val/acc's first trace is job 0's curve.
    metrics = browser.execute_script("return [...document.querySelectorAll('#curves .plot')].map(d => d.dataset.metric)")
    assert metrics == ORDER
    below = browser.execute_script("return [...document.querySelectorAll('#diagnostics-heading ~ .plot')].map(d => d.dataset.metric)")
    assert below == ["train/data_wait_s", "train/samples_per_s"]
    # test/acc, one value per run: a bar per completed run (the failed one never tested), in its colour.
    bars = browser.execute_script(
        "return document.querySelector('#curves .plot[data-metric=\"test/acc\"]').data.map(t => [t.type, t.name, t.x, t.y])"
    )
    assert bars == [["bar", "0", ["0"], [0.805]], ["bar", "1", ["1"], [0.905]], ["bar", "2", ["2"], [0.455]]]
    assert browser.execute_script("return document.querySelectorAll('#curves .plot[data-metric=\"test/acc\"] .bars .point').length") == 3
    lines = browser.execute_script("return document.querySelector('#curves .plot[data-metric=\"val/loss\"]').data.map(t => t.type)")
    assert lines == ["scatter"] * 4
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
    # The runs' tags are a column beside the run, sortable like the rest.
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#runs th")]
    assert headers[:2] == ["run", "tags"]
    browser.find_element(By.XPATH, "//table[@id='runs']//th[text()='tags']").click()
    cells = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")[:2]] for tr in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")]
    assert cells[0] == ["2", "ablation, no-aug"] and all(tags == "sweep, lr" for _, tags in cells[1:])

    # The sweep: parallel coordinates over lr and val/acc; the failed job is marked in the scatter.
    assert browser.execute_script("return document.getElementById('parcoords').data[0].dimensions.map(d => d.label)") == [
        "model.optimizer.lr",
        "val/acc",
    ]
    marked = browser.execute_script("return document.getElementById('scatter-0').data[1]")
    assert marked["name"].startswith("stopped / failed") and marked["x"] == [0.5]

    # The config diff of two runs shows the keys that differ, and only them.
    Select(browser.find_element(By.ID, "diff-a")).select_by_visible_text("0")
    Select(browser.find_element(By.ID, "diff-b")).select_by_visible_text("2")
    browser.execute_script("document.getElementById('diff-b').dispatchEvent(new Event('input'))")
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#diff tbody tr")]
    assert rows == ['tags ["sweep", "lr"] ["ablation", "no-aug"]', "model.optimizer.lr 0.001 0.1"]

    # --cost: the runs table has the cost columns, and the cost section a stacked bar per run with a
    # ledger, a rectangle per bucket as wide as its share; the two older records have none.
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#runs th")]
    assert headers[-5:] == ["worker-h", "goodput", "% startup", "% validation", "% lost"]
    first = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")[0].find_elements(By.TAG_NAME, "td")]
    assert first[0] == "2" and first[-5:] == ["1", "70%", "10%", "15%", "5%"]  # sorted by tags above: job 2 first
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#cost tbody tr')].map(tr => [tr.cells[0].textContent, tr.cells[1].textContent, "
        "tr.cells[2].textContent, [...tr.querySelectorAll('rect')].map(r => [r.dataset.bucket, Math.round(r.getBBox().width)])])"
    )
    bar = [["startup", 36], ["productive", 252], ["validation", 54], ["lost", 18]]
    assert rows == [["0", "1", "70%", bar], ["1", "1", "70%", bar], ["2", "1", "70%", bar], ["3", "", "", []], ["4", "", "", []]]
    assert browser.execute_script("return document.querySelector('#cost rect title').textContent") == "startup: 360.0 s (10%)"
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors


# What a hostile run directory may hold: an HTML comment opening before a script tag (inside the
# page's data it switches the HTML parser into a state where the data's own </script> no longer
# closes it: the page went blank), and markup that Plotly renders in plot titles and legends.
COMMENT_OPENER = "<!--<script>"
LINKED_METRIC = '<a href="https://example.com/x">val/linked</a>'


@pytest.mark.browser
def test_seed_groups_draw_one_point_metrics_as_mean_bars_with_sd(tmp_path, capsys, browser):
    """Three seeds at each of two learning rates: test/acc as one bar per group, its height the mean
    and its error bar the standard deviation; unticking the groups gives one bar per run. One run
    is hostile (COMMENT_OPENER in its tags, LINKED_METRIC logged): the page still draws,
    and the markup shows as text, nowhere a link."""
    root = tmp_path / "sweep"
    for job, (lr, seed, acc) in enumerate(
        (lr, seed, acc) for lr, accs in ((0.01, (0.8, 0.82, 0.84)), (0.1, (0.9, 0.91, 0.92))) for seed, acc in enumerate(accs)
    ):
        hostile = {"tags": (COMMENT_OPENER,)} if job == 5 else {}
        make_run(root, str(job), lr=lr, accs=(0.5, acc), seed=seed, **hostile)
    with open(root / "5" / "metrics.csv", "a") as metrics:
        metrics.write("".join(f"{epoch},{step},,,,,,,{0.1 * epoch}\n" for epoch, step in ((0, 30), (1, 60))))
    header, *rows = (root / "5" / "metrics.csv").read_text().splitlines()
    (root / "5" / "metrics.csv").write_text("\n".join([f'{header},"{LINKED_METRIC.replace(chr(34), chr(34) * 2)}"', *rows]) + "\n")
    path = tmp_path / "report.html"
    code, _, err = compare(capsys, root, "--html", path)
    assert code == 0, err
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(path.as_uri())
    WebDriverWait(browser, 60).until(lambda d: d.execute_script("return document.querySelectorAll('#curves .main-svg').length > 0"))
    bars = "document.querySelector('#curves .plot[data-metric=\"test/acc\"]').data"
    grouped = browser.execute_script(f"return {bars}.map(t => [t.type, t.name, t.y[0], t.error_y.array[0]])")
    assert [g[:2] for g in grouped] == [["bar", "model.optimizer.lr=0.01 (n=3)"], ["bar", "model.optimizer.lr=0.1 (n=3)"]]
    # make_run's test/acc is the last val/acc + 0.005.
    assert [g[2] for g in grouped] == pytest.approx([0.825, 0.915])
    assert [g[3] for g in grouped] == pytest.approx([0.02, 0.01])
    browser.find_element(By.ID, "by-group").click()
    assert browser.execute_script(f"return {bars}.map(t => t.name)") == ["0", "1", "2", "3", "4", "5"]
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors

    # The hostile run: the whole page is there, its tags as text, its metric's title the markup as
    # text, and no link anywhere in the plots.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")) == 6
    assert COMMENT_OPENER in [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#runs tbody td")]
    linked = browser.execute_script(
        "return [...document.querySelectorAll('#curves .plot')].filter(d => d.dataset.metric === arguments[0])"
        ".map(d => d.querySelector('.gtitle').textContent)",
        LINKED_METRIC,
    )
    assert linked == [LINKED_METRIC]
    assert browser.execute_script("return document.querySelectorAll('#curves a, #scatters a, #parcoords a').length") == 0
