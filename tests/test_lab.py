"""The chapters in JupyterLab, in a real (headless) browser, as ``make lab`` opens them.

``make lab`` opens copies of the chapters (book/_ext/lab_copies.py, in ``.lab/``);
here the copies are written to a temporary folder, with the IPython start-up
file ``make lab`` gives the kernels.

First, every chapter opened as a reader opens it, before any cell runs (the
notebook is untrusted: JupyterLab sanitizes its stored HTML and draws no stored
SVG or widget): each stored figure shows its picture, never its SVG's text or
a ``<SVG ...>`` repr; no site-only note shows; MyST renders (jupyterlab-myst:
no raw ``{term}`` or ``{glue``, dropdowns closed); a glossary link opens the
glossary at its term; the exercises read as on the site ("Exercise (The best
cap)") and a link to one reaches it; and the notebook is not marked modified. Each is
screenshot into ``_build/screenshots/lab_*.png``.

Then chapter 3: run the chapter up to its live figure, press ArrowRight on the
bucket-cap slider, and see the drawing change to what the model says; the
folded cell after it, run, says so in its output; saving writes the copy, and the
repository's ``git status`` is what it was. The kernel handles a slider's
message between cells, so the test runs the cells up to and including the
figure (not the whole chapter, whose later cells take a minute of measurements;
nbval runs those).

Needs Chromium (``apt-get install -y chromium``).
"""

import contextlib
import json
import os
import pathlib
import re
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
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import lab_copies  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "03_bucketing_overlap.ipynb"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "_build" / "screenshots"
# What the site says next to a live figure, which is not true in JupyterLab.
SITE_NOTES = ("Move a slider", "The first move loads Python", "redraws the figure in")
browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root_dir, ipython_dir=None):
    """A JupyterLab server on a free port serving ``root_dir``.

    Its kernels read IPython's start-up files from ``ipython_dir`` (as under
    ``make lab``). Stopped, with its kernels, afterwards.
    """
    port = free_port()
    env = {
        **os.environ,
        **({"IPYTHONDIR": str(ipython_dir)} if ipython_dir else {}),
        "JUPYTER_RUNTIME_DIR": str(root_dir / ".runtime"),
        "JUPYTER_CONFIG_DIR": str(root_dir / ".config"),
        "JUPYTER_DATA_DIR": os.environ.get(
            "JUPYTER_DATA_DIR", str(pathlib.Path(sys.prefix) / "share" / "jupyter")
        ),
    }
    # No news pop-up; every cell in the page (no windowing), so the test sees them all.
    settings = root_dir / ".config" / "lab" / "user-settings" / "@jupyterlab"
    for name, value in (
        ("notebook-extension/tracker", {"windowingMode": "none"}),
        ("apputils-extension/notification", {"fetchNews": "false"}),
    ):
        path = settings / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium):
    """One JupyterLab on ``make lab``'s copies, and Chromium: ``(url, chromium, root)``.

    Starting JupyterLab takes seconds; the tests share one. The chapters' first
    looks share one page too (``lab_tab``), a notebook open at a time; the run of
    chapter 3 has a browser context and a workspace of its own (``?reset``). Each
    test shuts its kernel down.
    """
    root = tmp_path_factory.mktemp("lab")
    _, _, problems = lab_copies.build(fresh=True, dest=str(root))
    assert not problems, "\n".join(problems)
    with jupyter_lab(root, ipython_dir=root / ".ipython") as url:
        yield url, chromium, root


@pytest.fixture(scope="module")
def lab_tab(lab):
    """One JupyterLab page for the chapters' first looks, a notebook at a time.

    Loading JupyterLab costs a browser seconds of CPU; opening one more notebook in
    it, a fraction of that.
    """
    url, chromium, root = lab
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{url}/lab?reset")
        page.wait_for_function("() => window.jupyterapp", timeout=120_000)
        page.evaluate("async () => { await window.jupyterapp.restored; }")
        yield page
    finally:
        context.close()


def shut_kernel_down(page):
    page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()"
    )


def open_notebook(page, url, name):
    """Open ``notebooks/name`` alone (a fresh workspace); wait for its kernel."""
    page.goto(f"{url}/lab/tree/notebooks/{name}?reset")
    wait_for_kernel(page)


def wait_for_kernel(page):
    """Until the current notebook is loaded and has its kernel."""
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
        "&& window.jupyterapp.shell.currentWidget.context "
        "&& window.jupyterapp.shell.currentWidget.context.isReady",
        timeout=120_000,
    )
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel",
        timeout=120_000,
    )


def open_alone(page, name):
    """Close what is open, open ``notebooks/name``; wait for its kernel."""
    page.evaluate(
        """async (path) => {
            const app = window.jupyterapp;
            await app.commands.execute('application:close-all');
            await app.commands.execute('docmanager:open', {path});
        }""",
        f"notebooks/{name}",
    )
    wait_for_kernel(page)


def stored_pictures(notebook):
    """How many stored outputs are drawings (an SVG or a live figure's twin)."""
    count = 0
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/svg+xml" in data or 'class="livefig"' in "".join(
                data.get("text/html", "")
            ):
                count += 1
    return count


# What a reader sees: visible text of outputs and Markdown, and the pictures.
LOOK_JS = """() => {
  const visible = e => e.getClientRects().length > 0
    && getComputedStyle(e).visibility !== 'hidden';
  const outputs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const markdown = [...document.querySelectorAll('.jp-MarkdownCell .jp-InputArea')];
  const imgs = outputs.flatMap(o => [...o.querySelectorAll('img')]);
  const panel = window.jupyterapp.shell.currentWidget;
  return {
    dirty: panel.context.model.dirty,
    outputText: outputs.map(o => o.innerText).join('\\n'),
    markdownText: markdown.map(m => m.innerText).join('\\n'),
    markdownCells: markdown.length,
    openDetails: [...document.querySelectorAll('.jp-MarkdownCell details')]
      .filter(d => d.open).length,
    details: document.querySelectorAll('.jp-MarkdownCell details').length,
    pictures: imgs.filter(i => visible(i) && i.naturalWidth > 0
      && i.getBoundingClientRect().width > 100).length,
    brokenPictures: imgs.filter(i => i.complete && i.naturalWidth === 0).length,
    visibleSiteParts: outputs.flatMap(o => [...o.querySelectorAll('.livefig-site')])
      .filter(visible).length,
  };
}"""


# The links the copies' Markdown shows: to the glossary, to exercises.
LINKS_JS = """() => {
  const visible = e => e.getClientRects().length > 0;
  const cells = [...document.querySelectorAll('.jp-MarkdownCell .jp-InputArea')];
  const links = cells.flatMap(c => [...c.querySelectorAll('a[href]')]);
  const target = a => {
    const u = new URL(a.href);
    return [u.pathname, u.hash.slice(1)];
  };
  return {
    glossary: links.filter(a => target(a)[0].endsWith('/book/glossary.md'))
      .map(a => ({term: target(a)[1], visible: visible(a)})),
    inPage: links.filter(a => a.getAttribute('href').startsWith('#'))
      .map(a => ({text: a.textContent, id: a.getAttribute('href').slice(1),
                  found: !!document.getElementById(a.getAttribute('href').slice(1))})),
    practice: links.filter(a => target(a)[0].endsWith('/book/practice.md'))
      .map(a => ({text: a.textContent, id: target(a)[1]})),
    empty: links.filter(a => ['', '#'].includes(a.getAttribute('href'))).length,
  };
}"""


def open_glossary_link(page, term):
    """Click the first visible link to ``term``: the glossary opens at the term."""
    page.locator(
        f'.jp-MarkdownCell a[href*="/book/glossary.md"][href$="#{term}"]'
    ).first.click()
    page.wait_for_function(
        """(term) => {
            const w = window.jupyterapp.shell.currentWidget;
            return w && w.title.label === 'glossary.md'
                && w.node.querySelector('[id="' + term + '"]'); }""",
        arg=term,
        timeout=30_000,
    )


def check_links(page, notebook, root):
    """Glossary terms, exercise titles and exercise links resolve, as on the site."""
    name, source = notebook.name, notebook.read_text(encoding="utf-8")
    links = page.evaluate(LINKS_JS)
    assert links["empty"] == 0, f"{name}: links to nothing"
    if "{term}" in source:
        assert links["glossary"], f"{name}: no glossary link"
        glossary = (root / "book" / "glossary.md").read_text(encoding="utf-8")
        for link in links["glossary"]:
            assert f"({link['term']})=" in glossary, f"{name}: {link['term']}"
        term = next(g["term"] for g in links["glossary"] if g["visible"])
        open_glossary_link(page, term)
    lost = [link for link in links["inPage"] if not link["found"]]
    assert not lost, f"{name}: links to no element of the notebook: {lost}"
    if "{exercise}" in source:
        text = page.evaluate(
            "() => [...document.querySelectorAll('.jp-MarkdownCell')]"
            ".map(c => c.innerText).join('\\n')"
        )
        assert "Exercise (" in text, f"{name}: not the site's exercise titles"
        assert not re.search(r"Exercise \d", text), f"{name}: a numbered exercise"
        solutions = [
            link for link in links["inPage"] if link["text"].startswith("Exercise (")
        ]
        assert solutions, f"{name}: no link to an exercise"
    practice = (root / "book" / "practice.md").read_text(encoding="utf-8")
    for link in links["practice"]:
        if link["id"]:  # an exercise of the practice page, not the page itself
            assert f"({link['id']})=" in practice, f"{name}: {link}"


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_shows_the_book_before_any_cell_runs(lab, lab_tab, notebook):
    url, chromium, root = lab
    page = lab_tab
    open_alone(page, notebook.name)
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext"
        ".session.kernel.status === 'idle'",
        timeout=60_000,
    )
    page.wait_for_timeout(2000)  # kernel info applied, Markdown rendered
    look = page.evaluate(LOOK_JS)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"lab_{notebook.stem}.png"))
    shut_kernel_down(page)
    check_links(page, notebook, root)
    name = notebook.name
    assert not look["dirty"], (
        f"{name}: JupyterLab marks it modified on opening (kernelspec or format "
        "differs from what it writes); run python book/_ext/lab_notebooks.py "
        "notebooks/*.ipynb"
    )
    assert "<SVG " not in look["outputText"], f"{name}: a figure shows as text"
    assert "<svg" not in look["outputText"] and "</text>" not in look["outputText"]
    for note in SITE_NOTES:
        assert note not in look["outputText"], f"{name}: shows the site's note {note!r}"
    assert look["visibleSiteParts"] == 0, f"{name}: the site's controls show"
    assert look["brokenPictures"] == 0, f"{name}: a stored picture does not load"
    assert look["pictures"] >= stored_pictures(notebook), (
        f"{name}: {look['pictures']} pictures drawn, {stored_pictures(notebook)} stored"
    )
    assert look["markdownCells"] > 0
    for raw in ("{term}", "{cite", "{ref}", "{doc}", "{glue", ":::{", "```{"):
        assert raw not in look["markdownText"], (
            f"{name}: MyST shows raw ({raw}); is jupyterlab-myst installed?"
        )
    assert look["openDetails"] == 0, f"{name}: a dropdown (answers) is open"


def test_stored_notebooks_open_unmodified():
    """Every notebook has the kernelspec and format JupyterLab writes."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "book" / "_ext" / "lab_notebooks.py"), "--check"]
        + [str(p) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def panel_numbers(page):
    """The figure's step times (one per timeline), read from the widget's SVG."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.jp-OutputArea-output text[data-metric="step_s"]'))
        .map(e => Number(e.dataset.value))""")


def git_status():
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    ).stdout


# Run the first folded code cell (input hidden) after the live figure; its output.
RUN_FOLDED_JS = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets;
  const figure = cells.findIndex(c => c.model.type === 'code'
    && c.model.sharedModel.getSource().includes('LiveFigure(bucketing_figure'));
  const index = cells.findIndex((c, i) => i > figure && c.model.type === 'code'
    && c.inputHidden);
  panel.content.activeCellIndex = index;
  await window.jupyterapp.commands.execute('notebook:run-cell');
  while (panel.sessionContext.session.kernel.status !== 'idle') {
    await new Promise(r => setTimeout(r, 200));
  }
  return cells[index].outputArea.node.innerText;
}"""


def test_slider_redraws_the_figure_in_jupyterlab(lab):
    url, chromium, root = lab
    status_before = git_status()
    copy = root / "notebooks" / NOTEBOOK.name
    copy_before = copy.read_text(encoding="utf-8")
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        open_notebook(page, url, NOTEBOOK.name)
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
        # Slider labels fit: no description is cut (text wider than its box).
        cut = page.evaluate("""() => [...document.querySelectorAll(
            '.widget-slider .widget-label')]
            .filter(l => l.scrollWidth > l.clientWidth + 1).map(l => l.textContent)""")
        assert not cut, f"slider labels cut: {cut}"
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "lab_03_after_run.png"))
        folded = page.evaluate(RUN_FOLDED_JS)
        assert "(folded cell) ran in" in folded, folded[:300]
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
            timeout=30_000,
        )
        shut_kernel_down(page)
    finally:
        context.close()
    assert copy.read_text(encoding="utf-8") != copy_before, "the run was not saved"
    assert git_status() == status_before, (
        "running and saving in JupyterLab changed the repository:\n" + git_status()
    )
