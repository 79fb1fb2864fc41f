"""The lab panel in a real browser: JupyterLab on 127.0.0.1, driven by headless Chromium.

Run, charts and history; a run with a loader worker stopped mid-run, leaving no process behind;
then a run that completes. Then a gauntlet of two drills (lk.drills): Start, answer, Reveal, Next, and the
score card. Screenshots go to $LABKIT_SCREENSHOTS (default: build/screenshots/).

The notebook is kept as tests/assets/panel_notebook.json (not .ipynb) so that nbval does not run it
as a notebook test of its own; it is copied into the server's folder as panel.ipynb.
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from labkit.base.jupyter_contents import OPTION as JUPYTER_CONTENTS
from labkit.base.page import anchor
from labkit.engine.launch import live_children

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("LABKIT_SCREENSHOTS", ROOT / "build" / "screenshots"))
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.browser


def _need(ok, why):
    """Skip where the browser stack is missing -- but on CI (env CI set) that is a failure."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI is set: the browser test must run)")
        pytest.skip(why)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a fresh settings folder; stopped (kernels too) after."""
    _need(os.path.exists(CHROMIUM), "Debian's chromium is not installed (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _need(False, "Python playwright is not installed")
    home = tmp_path_factory.mktemp("jupyter")
    shutil.copy(ROOT / "tests" / "assets" / "panel_notebook.json", home / "panel.ipynb")
    shutil.copy(ROOT / "tests" / "assets" / "drill_notebook.json", home / "drill.ipynb")
    shutil.copy(ROOT / "notebooks" / "03_gradient_accumulation.ipynb", home / "chapter.ipynb")
    # No news toast (nor its request to the internet): it would also cover part of the screenshots.
    notes = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notes.parent.mkdir(parents=True)
    notes.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={home}", "--ServerApp.port_retries=0",
           f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           JUPYTER_CONTENTS]  # as course.py lab starts it
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # JupyterLab refuses root without it (containers, CI)
    # Fresh Jupyter folders: no settings, kernels or extensions from whoever ran this before.
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_DATA_DIR": str(home / "data"), "PYTHONPATH": str(ROOT)}
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=home, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (home / "server.log").read_text()[-3000:])
                time.sleep(0.25)
        yield {"url": url, "token": token, "proc": proc, "log": home / "server.log"}
    finally:
        family = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for p in family:  # and whatever a kernel left behind, should it have
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        log.close()


def kernel_process(server):
    kids = psutil.Process(server["proc"].pid).children()
    kernels = [p for p in kids if "ipykernel" in " ".join(p.cmdline())]
    assert len(kernels) == 1, f"expected one kernel, found {kernels}"
    return kernels[0]


def workers_of(kernel):
    return live_children(kernel)


def test_panel_in_jupyterlab(server):
    _in_browser(server, "panel.ipynb", _drive, "panel-failure.png")


def test_drill_gauntlet_in_jupyterlab(server):
    """After the panel's test (its kernel check counts one kernel): this notebook starts a second."""
    _in_browser(server, "drill.ipynb", _drive_gauntlet, "drill-failure.png")


def _in_browser(server, notebook, drive, failure_shot):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            page.set_default_timeout(60_000)  # actions (clicks, navigation) ...
            expect.set_options(timeout=30_000)  # ... and assertions, whose own default is 5 s: too short on a busy CI box
            # ?reset: a fresh workspace, else the notebook of an earlier test reopens beside this one
            page.goto(f"{server['url']}/lab/tree/{notebook}?reset&token={server['token']}")
            drive(page, server, expect)
        except Exception:
            try:
                page.screenshot(path=str(SHOTS / failure_shot), full_page=True)
            except Exception:  # noqa: BLE001 -- the screenshot is a courtesy; the real error follows
                pass
            raise
        finally:
            browser.close()


def _run_cell(page, index, expect, wait=True):
    """Select cell ``index`` (0 = the notebook's first cell), run it with Shift+Enter and (unless
    ``wait`` is False) wait until the kernel has run it: its prompt then shows a number."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    if wait:
        expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"), timeout=90_000)
    return cell


def _open(page, expect):
    notebook = page.locator(".jp-Notebook")
    expect(notebook).to_be_visible()
    # A kernel dialog may ask which kernel to use on first open: take the default.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog .jp-mod-accept")
        if dialog.count():
            dialog.first.click()
            break
        time.sleep(0.2)


def _drive_gauntlet(page, server, expect):
    _open(page, expect)
    _run_cell(page, 1, expect, wait=False)
    gauntlet = page.locator(".labkit-gauntlet")
    expect(gauntlet).to_be_visible(timeout=90_000)
    for i in range(2):
        drill = gauntlet.locator(".labkit-drill")
        expect(drill).to_contain_text(f"Drill {i + 1} of 2")
        drill.locator("button", has_text=re.compile(r"^\s*Start\s*$")).click()
        expect(drill.locator(".labkit-drill-table")).to_be_visible(timeout=90_000)  # the run's evidence
        drill.locator("input[type=radio]").nth(i).check()
        drill.locator("select").select_option(index=1)
        drill.locator("button", has_text=re.compile(r"^\s*Answer\s*$")).click()
        expect(drill.locator(".labkit-drill-score")).to_contain_text("Cause")
        expect(gauntlet.locator(".labkit-gauntlet-card")).to_contain_text(f"of {i + 1} causes right")
        drill.locator("button", has_text=re.compile(r"^\s*Reveal\s*$")).click()
        # revealed (what it says depends on the case drawn and the answer: a healthy case's says no fix is needed)
        expect(drill.locator(".labkit-drill-status")).to_have_text("revealed", timeout=90_000)
        expect(drill.locator(".labkit-drill-reveal")).not_to_be_empty()
        page.screenshot(path=str(SHOTS / f"drill-{i + 1}-revealed.png"), full_page=True)
        # every chart at its own size: never stretched past its pixels (blurred), never wider than a column
        for w, natural in drill.locator("img").evaluate_all("els => els.filter(e => e.offsetParent)"
                                                            ".map(e => [e.clientWidth, e.naturalWidth])"):
            assert 0 < w <= natural <= 880, (w, natural)
        if i == 0:
            gauntlet.locator("button", has_text="Next drill").click()
    expect(gauntlet.locator(".labkit-gauntlet-card")).to_contain_text("Score card")
    expect(gauntlet.locator("button", has_text="Next drill")).to_be_disabled()
    # the card lists every drill not right in both cause and fix, each linked to its chapter section
    both = int(re.search(r"(\d+) both", gauntlet.locator(".labkit-gauntlet-card").inner_text()).group(1))
    links = gauntlet.locator(".labkit-gauntlet-missed a")
    expect(links).to_have_count(2 - both)
    for href in links.evaluate_all("els => els.map(e => e.getAttribute('href'))"):
        # JupyterLab resolves the relative link (and opens the chapter in the app when it is clicked)
        assert re.search(r"/\d\d_\w+\.ipynb(\?[^#]*)?#\S+$", href), href


def _drive(page, server, expect):
    _open(page, expect)
    # the kernel needs 10-20 s to start and import labkit: the panel appears when it has
    _run_cell(page, 1, expect, wait=False)
    panel = page.locator(".labkit-lab")
    expect(panel).to_be_visible(timeout=90_000)
    run = panel.locator("button", has_text=re.compile(r"^\s*Run\s*$"))
    stop = panel.locator("button", has_text=re.compile(r"^\s*Stop\s*$"))
    status = panel.locator(".labkit-status")
    charts = panel.locator(".labkit-charts img")
    rows = panel.locator("table.labkit-history tbody tr")
    expect(charts.first).to_be_visible()
    before = charts.first.get_attribute("src")

    # 1. a run: charts appear, the history gets a row
    run.click()
    page.wait_for_function("([el, old]) => el.getAttribute('src') !== old",
                           arg=[charts.first.element_handle(), before])
    expect(rows).to_have_count(1)
    expect(status).to_contain_text("done")
    for i in range(charts.count()):
        img = charts.nth(i)
        if img.is_visible():
            assert img.evaluate("el => el.complete && el.naturalWidth > 0"), f"chart {i} did not load"
    page.screenshot(path=str(SHOTS / "panel-1-run.png"), full_page=True)

    # 2. a long run with a loader worker: Stop mid-run leaves no process behind
    kernel = kernel_process(server)
    _run_cell(page, 2, expect)
    run.click()
    expect(status).to_contain_text(re.compile(r"update \d+/100000"), timeout=60_000)  # training: the worker is up
    assert workers_of(kernel), "the run should have a DataLoader worker process"
    expect(stop).to_be_enabled()
    stop.click()
    expect(status).to_contain_text("stopped", timeout=30_000)
    deadline = time.monotonic() + 15
    while workers_of(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workers_of(kernel), f"processes outlived the stopped run: {workers_of(kernel)}"
    expect(rows).to_have_count(1)  # a stopped run is not added to the history
    page.screenshot(path=str(SHOTS / "panel-2-stopped.png"), full_page=True)

    # 3. the panel is still usable: a third run completes
    _run_cell(page, 3, expect)
    run.click()
    expect(rows).to_have_count(2, timeout=60_000)
    expect(status).to_contain_text("done")
    page.screenshot(path=str(SHOTS / "panel-3-again.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 2600})  # tall enough for the whole panel
    panel.locator(".labkit-history").scroll_into_view_if_needed()
    panel.screenshot(path=str(SHOTS / "panel-4-history.png"))  # history and comparison included


def test_a_chapter_opens_unmodified(server):
    """JupyterLab writes the kernel's language_info into a notebook when its kernel starts; the chapters store
    none of the version-dependent part, so without labkit's contents manager each opened marked unsaved."""
    _in_browser(server, "chapter.ipynb", _drive_opened_chapter, "chapter-failure.png")


def _drive_opened_chapter(page, server, expect):
    _open(page, expect)
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=90_000)
    time.sleep(2)  # noqa: sleep-ok -- the metadata update lands just after the kernel's first idle
    assert page.locator(".lm-TabBar-tab.jp-mod-dirty").count() == 0, "the chapter opened marked unsaved"


def test_a_russian_section_link_scrolls_to_its_heading(server):
    """JupyterLab scrolls to no Cyrillic heading's anchor (it compares the percent-encoded fragment with the id,
    jupyterlab#12402): the Russian build points a section link at the heading's cell, #cell-id=..., which it
    does scroll to."""
    shutil.copy(ROOT / "notebooks" / "ru" / "00_start_here.ipynb", server["log"].parent / "ru_chapter.ipynb")
    _in_browser(server, "ru_chapter.ipynb", _drive_section_link, "ru-link-failure.png")


def _drive_section_link(page, server, expect):
    _open(page, expect)
    link = page.locator(".jp-MarkdownOutput details a[href^='#cell-id=']").first
    for _ in range(200):  # the notebook draws the cells near the view only: scroll down to the first link
        if link.count():
            break
        page.locator(".jp-WindowedPanel-outer").first.evaluate("e => e.scrollBy(0, 600)")
        time.sleep(0.1)
    link.evaluate("a => a.closest('details').open = true")  # the link sits in a question's answer
    cell_id = link.get_attribute("href").removeprefix("#cell-id=")
    cells = json.loads((server["log"].parent / "ru_chapter.ipynb").read_text(encoding="utf-8"))["cells"]
    heading = re.search(r"^#+ (.+)$", "".join(next(c for c in cells if c["id"] == cell_id)["source"]), re.M)
    # the heading as JupyterLab 4 renders it: its anchor in data-jupyter-id
    target = page.locator(f".jp-MarkdownOutput [data-jupyter-id='{anchor(heading.group(1))}']")
    expect(target).not_to_be_in_viewport()
    link.click()
    expect(target).to_be_in_viewport()
