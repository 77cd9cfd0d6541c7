"""Chapter 3 in JupyterLab, in a real (headless) browser: run the chapter up to its live
figure, press ArrowRight on the bucket-cap slider, and see the drawing change to what
the model says.

This is the reader's way in: `make lab`, open the chapter, run it, drag a slider. The
kernel handles a slider's message between cells, so the test runs the cells up to and
including the figure (not the whole chapter, whose later cells take a minute of
measurements; nbval runs those).

Needs Chromium (``apt-get install -y chromium``).
"""

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mylib.figures.livefig import Slider
from mylib.figures.timeline import BUCKETING_SLIDERS, bucketing_timelines

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "03_bucketing_overlap.ipynb"
browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root_dir):
    """A JupyterLab server on a free port serving ``root_dir``.

    Stopped, with its kernels, afterwards.
    """
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(root_dir / ".runtime"),
        "JUPYTER_CONFIG_DIR": str(root_dir / ".config"),
        "JUPYTER_DATA_DIR": os.environ.get(
            "JUPYTER_DATA_DIR", str(pathlib.Path(sys.prefix) / "share" / "jupyter")
        ),
    }
    log = open(root_dir / "lab.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ip=127.0.0.1",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--ServerApp.disable_check_xsrf=True",
            "--LabApp.expose_app_in_browser=True",
            f"--ServerApp.root_dir={root_dir}",
            f"--LabApp.workspaces_dir={root_dir / '.workspaces'}",
            "--ServerApp.open_browser=False",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    log.flush()
                    raise RuntimeError(
                        "JupyterLab did not start:\n"
                        f"{(root_dir / 'lab.log').read_text()[-3000:]}"
                    )
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(5)
        log.close()


def panel_numbers(page):
    """The figure's step times (one per timeline), read from the widget's SVG."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.jp-OutputArea-output text[data-metric="step_s"]'))
        .map(e => Number(e.dataset.value))""")


def test_slider_redraws_the_figure_in_jupyterlab(tmp_path):
    browser.require_chromium()
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    with jupyter_lab(tmp_path) as url, browser.launch_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(f"{url}/lab/tree/{NOTEBOOK.name}")
        page.wait_for_function(
            "() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
            "&& window.jupyterapp.shell.currentWidget.context",
            timeout=120_000,
        )
        page.wait_for_function(
            "() => "
            "window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel",
            timeout=120_000,
        )
        page.evaluate("""async () => {
            const panel = window.jupyterapp.shell.currentWidget;
            await panel.sessionContext.ready;
            const cells = panel.content.widgets;
            const index = cells.findIndex(c => c.model.type === 'code'
                && c.model.sharedModel.getSource()
                    .includes('LiveFigure(bucketing_figure'));
            panel.content.activeCellIndex = index;
            await window.jupyterapp.commands.execute('notebook:run-all-above');
            await window.jupyterapp.commands.execute('notebook:run-cell');
        }""")
        handles = page.locator(".widget-slider .noUi-handle")
        handles.nth(len(BUCKETING_SLIDERS) - 1).wait_for(timeout=180_000)
        page.wait_for_function(
            "() => document.querySelectorAll("
            "'.jp-OutputArea-output text[data-metric=\"step_s\"]').length === 3",
            timeout=60_000,
        )
        sliders = [Slider(**spec) for spec in BUCKETING_SLIDERS]
        defaults = {s.name: s.default for s in sliders}
        assert panel_numbers(page) == [
            t.step_s for t in bucketing_timelines(**defaults)
        ]

        cap = next(i for i, s in enumerate(sliders) if s.name == "bucket_cap_mb")
        before = panel_numbers(page)
        handles.nth(cap).focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "(before) => { const now = Array.from(document.querySelectorAll("
            "'.jp-OutputArea-output text[data-metric=\"step_s\"]'))"
            ".map(e => Number(e.dataset.value)); "
            "return now.length === 3 && now[2] !== before[2]; }",
            arg=before,
            timeout=60_000,
        )
        moved = dict(
            defaults,
            bucket_cap_mb=sliders[cap].options[
                sliders[cap].options.index(defaults["bucket_cap_mb"]) + 1
            ],
        )
        assert panel_numbers(page) == [t.step_s for t in bucketing_timelines(**moved)]
        page.screenshot(path=str(tmp_path / "lab.png"))
        context.close()
