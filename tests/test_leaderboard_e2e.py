"""End to end: `streamlit run leaderboard/app.py` in a subprocess, driven by real headless Chromium at 1366×768,
and the static export (`privbench board export`) opened from disk in the same browser.

Uses Debian's /usr/bin/chromium and /usr/bin/chromedriver, passed explicitly (Service(executable_path=...),
options.binary_location), so Selenium Manager never runs and nothing is downloaded. Skips only when the
browser or its driver is absent (CI installs them: `apt-get install chromium chromium-driver`).
Screenshots go to $PRIVBENCH_E2E_ARTIFACTS if set, else to pytest's tmp dir; their paths are printed
(`pytest -s` shows them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "leaderboard" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="Debian chromium/chromedriver not installed (apt-get install chromium chromium-driver)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(port: int, proc: subprocess.Popen, timeout: float = 45.0) -> None:
    url = f"http://127.0.0.1:{port}/_stcore/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"streamlit exited with {proc.returncode}: {out}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"streamlit did not answer {url} within {timeout:.0f} s")


HOSTILE = "<script>alert(1)</script> **bold**"


def _add_hostile_run(path: Path) -> None:
    """One more run whose plugin-supplied task/defense names and params are HTML and markdown."""
    from bench.metrics import MetricRow
    from bench.store import Store

    store = Store(str(path))
    run_id, _ = store.begin_run(run_key="e2e-hostile", suite="e2e", config={"note": HOSTILE}, config_hash="e2e",
                                code_version="e2e", plugin_versions={}, seeds=[0], hardware={}, command="e2e")
    labels = [1] * 10 + [0] * 10
    store.write_evaluation(run_id, "hostile", task="zz_hostile", model="micro", defense=HOSTILE,
                           defense_params={"note": HOSTILE}, seed=0, game="adapt", attack="loss", attack_params={},
                           world_key="w", target_ids=[f"t{i}" for i in range(20)], labels=labels,
                           scores=[float(i % 7) for i in range(20)],
                           metrics=[MetricRow("auc", 0.5, 0.4, 0.6, 10, 10)], duration_s=0.1)
    store.finish_run(run_id, status="complete", duration_s=0.1)
    store.close()


@pytest.fixture()
def database(tmp_path) -> Path:
    """A copy of the repo's results.db (or the unit tests' toy database if the repo has none), plus one run
    with hostile plugin text and the unit tests' track runs (the `quick` track first, with a hostile defense)."""
    from tests.boards import populate_tracks
    copy = tmp_path / "results.db"
    src = ROOT / "results.db"
    if src.exists():
        from tests.db_snapshot import upgraded_copy
        upgraded_copy(src, copy)
    else:
        from tests.boards import populate_demo
        populate_demo(copy)
    _add_hostile_run(copy)
    populate_tracks(copy)
    return copy


@pytest.fixture()
def server(database):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--server.fileWatcherType", "none",
         "--", "--db", str(database)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_health(port, proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture()
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1366,768"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PRIVBENCH_E2E_ARTIFACTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


TABLE_CELLS_JS = """
const t = arguments[0];
return Array.from(t.querySelectorAll('tr')).map(r => Array.from(r.querySelectorAll('th,td')).map(c => c.textContent));
"""


def _wait_for_chart(browser, wait, css: str = '[data-testid="stVegaLiteChart"]'):
    from selenium.webdriver.common.by import By
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{css} canvas, {css} svg"))
    chart = browser.find_element(By.CSS_SELECTOR, css)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", chart)
    time.sleep(1.0)  # let vega finish drawing before the screenshot
    return chart


def _pick(browser, wait, label: str, needle: str) -> None:
    """Open the selectbox labelled ``label`` and click the first option containing ``needle``."""
    from selenium.webdriver.common.by import By
    box = next(el for el in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSelectbox"]') if label in el.text)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
    box.find_element(By.TAG_NAME, "input").click()
    option = wait.until(lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, '[role="option"]')
                                        if needle in o.text), False))
    option.click()


def _ranking_cells(browser) -> list[list[str]]:
    from selenium.webdriver.common.by import By
    table = browser.find_element(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    return browser.execute_script(TABLE_CELLS_JS, table)


def test_first_screen_ranking_plot_and_defense_page(server, browser, database, tmp_path):
    """The default track's ranking fits 1366×768 without scrolling sideways; the plot draws; a defense page opens."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from leaderboard.aggregate import DISPLAY_COLUMNS
    from tests.boards import HOSTILE, TRACK_RANKS, board_of

    wait = WebDriverWait(browser, 40)
    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
    browser.get(server)
    wait.until(lambda d: "Ranked by Pareto layer" in body())
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '[data-testid="stDataFrame"] table tr')))
    time.sleep(1.0)
    first = body()
    assert "privbench leaderboard" in first and "quick (track)" in first and "Selection bias" in first
    cells = _ranking_cells(browser)
    shown = board_of(database).groups["quick"].display
    assert cells[0] == DISPLAY_COLUMNS  # every ranking column is there
    assert cells[1:] == shown.values.tolist() and [r[0] for r in cells[1:]] == TRACK_RANKS
    # 1366×768: no horizontal scrolling, neither of the page nor of the table; the table starts on the first screen
    geo = browser.execute_script("""
        const e = document.querySelector('[data-testid="stDataFrame"]'); const r = e.getBoundingClientRect();
        const s = e.querySelector('.dvn-scroller');
        return {inner: window.innerWidth, innerH: window.innerHeight, page: document.documentElement.scrollWidth,
                left: r.left, right: r.right, top: r.top, sw: s.scrollWidth, cw: s.clientWidth};""")
    assert geo["page"] <= geo["inner"], geo
    assert geo["sw"] <= geo["cw"] + 1, f"the ranking table scrolls sideways: {geo}"
    assert 0 <= geo["left"] and geo["right"] <= geo["inner"] and geo["top"] < geo["innerH"] / 2, geo
    out = _artifacts(tmp_path)
    shots = [out / "board_first_screen.png"]
    assert browser.save_screenshot(str(shots[-1]))

    # the headline plot, below the table
    _wait_for_chart(browser, wait)
    shots.append(out / "board_plot.png")
    assert browser.save_screenshot(str(shots[-1])) and shots[-1].stat().st_size > 10_000

    # a defense page, opened from the ranking
    _pick(browser, wait, "open the page of", "dp-eps8")
    wait.until(lambda d: "Games × attacks" in body() and "Provenance" in body())
    page = body()
    assert "Defense page" in page and "dp_adapt 0.2.0" not in first
    facts = _ranking_cells(browser)
    assert ["plugin", "dp_adapt 0.2.0"] in facts and ["rank", "3"] in facts
    _wait_for_chart(browser, wait)
    shots.append(out / "board_defense_page.png")
    assert browser.save_screenshot(str(shots[-1]))

    # plugin text is shown verbatim as text: the configuration picker lists the hostile label as typed
    picker = next(el for el in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSelectbox"]')
                  if "defense configuration" in el.text)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", picker)
    picker.find_element(By.TAG_NAME, "input").click()
    options = wait.until(lambda d: [o.text for o in d.find_elements(By.CSS_SELECTOR, '[role="option"]')] or False)
    assert any(HOSTILE in o for o in options), options
    picker.find_element(By.TAG_NAME, "input").send_keys(Keys.ESCAPE)
    assert not browser.find_elements(By.XPATH, "//strong[contains(., 'bold')] | //b[contains(., 'bold')]")
    assert not browser.find_elements(By.XPATH, "//script[contains(., 'alert(1)')]")
    try:
        alert = browser.switch_to.alert.text
    except NoAlertPresentException:
        alert = None
    assert alert is None, f"plugin text ran as script: {alert}"
    print("screenshots: " + " ".join(map(str, shots)))


def test_export_renders_with_the_apps_top5(server, browser, database, tmp_path):
    """`privbench board export` writes an index.html that renders in Chromium from disk (no network, no script)
    with the same top-5 ranking as the app shows for the default track."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from bench.cli import main

    wait = WebDriverWait(browser, 40)
    browser.get(server)
    wait.until(lambda d: "Ranked by Pareto layer" in d.find_element(By.TAG_NAME, "body").text)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '[data-testid="stDataFrame"] table tr')))
    time.sleep(1.0)
    app_top5 = _ranking_cells(browser)[1:6]
    assert len(app_top5) == 5

    out = tmp_path / "board"
    assert main(["board", "export", "--out", str(out), "--db", str(database)]) == 0
    browser.get((out / "index.html").as_uri())
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section table.ranking")))
    section = browser.find_element(By.CSS_SELECTOR, "section")  # the first group is the default track
    assert section.get_attribute("data-group") == "quick"
    cells = browser.execute_script(TABLE_CELLS_JS, section.find_element(By.CSS_SELECTOR, "table.ranking"))
    assert cells[1:6] == app_top5
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    assert section.find_elements(By.CSS_SELECTOR, "svg circle.point, svg rect.point")  # the plot, inline SVG
    shot = _artifacts(tmp_path) / "board_export.png"
    assert browser.save_screenshot(str(shot))
    # a defense page of the export opens from its link
    section.find_element(By.CSS_SELECTOR, "table.ranking tbody tr td a").click()
    wait.until(lambda d: "Games × attacks" in d.find_element(By.TAG_NAME, "body").text)
    print(f"screenshots: {shot}")


def test_all_results_browser(server, browser, tmp_path):
    """The database browser (All results page): filters change the table, ROC curves draw."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 40)
    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731

    def text_shown(needle: str):
        return lambda d: needle in body()

    browser.get(server)
    wait.until(text_shown("Ranked by Pareto layer"))
    wait.until(lambda d: next((lab for lab in d.find_elements(By.CSS_SELECTOR, '[data-testid="stRadio"] label')
                               if lab.text.strip() == "All results"), False)).click()
    wait.until(text_shown("Defense configurations"))
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '[data-testid="stDataFrame"]')))
    before = body()
    assert "privbench leaderboard" in before and "read-only" in before
    assert "games: pretrain, adapt" in before  # all games before filtering
    out = _artifacts(tmp_path)
    browser.save_screenshot(str(out / "leaderboard_main.png"))

    # change a filter: keep only the `adapt` game
    games = next(el for el in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stMultiSelect"]')
                 if "game (stage)" in el.text)
    games.find_element(By.TAG_NAME, "input").click()
    games.find_element(By.TAG_NAME, "input").send_keys("adapt")
    option = wait.until(lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, '[role="option"]')
                                        if o.text.strip() == "adapt"), False))
    option.click()
    games.find_element(By.TAG_NAME, "input").send_keys(Keys.ESCAPE)
    wait.until(text_shown("games: adapt · "))
    filtered = body()
    assert filtered != before and "games: pretrain" not in filtered

    # open the ROC view
    next(lab for lab in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stRadio"] label')
         if lab.text.strip() == "ROC curves").click()
    wait.until(text_shown("ROC curves (log–log)"))
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, '
                                                          '[data-testid="stVegaLiteChart"] svg'))
    roc = body()
    assert "Defense configurations" not in roc and "sklearn roc_curve" in roc
    chart = browser.find_element(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", chart)
    time.sleep(1.0)  # let vega finish drawing before the screenshot
    shot = out / "leaderboard_roc.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # plugin text is shown verbatim as text: the configuration picker lists the hostile name as typed
    picker = next(el for el in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSelectbox"]')
                  if "defense configuration" in el.text)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", picker)
    picker.find_element(By.TAG_NAME, "input").click()
    picker.find_element(By.TAG_NAME, "input").send_keys("zz_hostile")  # the option list is long and virtualised
    options = wait.until(lambda d: [o.text for o in d.find_elements(By.CSS_SELECTOR, '[role="option"]')] or False)
    assert any(f"zz_hostile | micro | {HOSTILE} | " in o for o in options), options
    picker.find_element(By.TAG_NAME, "input").send_keys(Keys.ESCAPE)
    assert not browser.find_elements(By.XPATH, "//strong[contains(., 'bold')] | //b[contains(., 'bold')]")
    assert not browser.find_elements(By.XPATH, "//script[contains(., 'alert(1)')]")
    try:
        alert = browser.switch_to.alert.text
    except NoAlertPresentException:
        alert = None
    assert alert is None, f"plugin text ran as script: {alert}"
    print(f"screenshots: {out / 'leaderboard_main.png'} {shot}")
