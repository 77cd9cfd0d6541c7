"""Sphinx extension: ship mylib's standard-library modules for the interactive figures.

The static site redraws figures with the book's own Python running in the
page (Pyodide). This extension

* copies every mylib module that imports only the standard library (and
  other such modules; see ``mylib/figures/browser.py``) into
  ``_static/mylib/`` of the built HTML, at build time, so the one source in
  ``mylib/`` is what the page runs and nothing is copied into git;
* adds ``_static/livefig.js`` and ``_static/livefig.css`` (from
  ``book/_static``) to every page, and ``planner.js`` and ``planner.css``
  (the "Plan your run" page, which uses livefig.js's Python); the scripts
  do nothing on pages without a live figure or a planner. The Python runs in
  a Web Worker, ``_static/livefig-worker.js`` (``book/_static``, copied with
  the other static files), which livefig.js starts.

Enabled in ``_config.yml``: ``sphinx: local_extensions: {mylib_static: book/_ext}``.
"""

import importlib.util
import os
import shutil

from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MYLIB = os.path.join(ROOT, "mylib")


def _browser_module():
    # Load mylib/figures/browser.py by path: importing the mylib package would
    # import torch.
    path = os.path.join(MYLIB, "figures", "browser.py")
    spec = importlib.util.spec_from_file_location("_mylib_browser", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_mylib(app, exception):
    """After an HTML build, put the browser-safe mylib modules in ``_static/mylib/``."""
    if exception is not None or app.builder.format != "html":
        return
    dest = os.path.join(app.outdir, "_static", "mylib")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    browser = _browser_module()
    names = browser.browser_modules(MYLIB)
    for name in names:  # "models.timeline" -> models/timeline.py, folders kept
        target = browser.module_path(name, dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(browser.module_path(name, MYLIB), target)
    # The browser's mylib is a bare package: the real __init__ names the library's
    # classes, which need torch.
    with open(os.path.join(dest, "__init__.py"), "w", encoding="utf-8") as f:
        f.write(
            '"""mylib in the browser: only its standard-library modules '
            '(copied by book/_ext/mylib_static.py)."""\n'
        )
    logger.info(
        f"mylib_static: copied {len(names)} mylib modules to _static/mylib: "
        f"{', '.join(names)}"
    )


def setup(app):
    app.add_js_file("livefig.js")
    app.add_css_file("livefig.css")
    app.add_js_file("planner.js")  # the "Plan your run" page (mylib.figures.planner)
    app.add_css_file("planner.css")
    app.connect("build-finished", copy_mylib)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
