"""Shared helpers for the browser tests: serve the built site, drive headless Chromium.

The browser tests (pytest marker ``browser``) open the static site the way a
reader does, in a real browser, with no network: anything a page requests from
outside 127.0.0.1 is blocked and reported. Usage::

    import browser
    with browser.serve_site(SITE) as base_url, browser.launch_chromium() as chromium:
        url = f"{base_url}/book/intro.html"
        with browser.open_page(chromium, url) as (page, problems):
            page.click(...)
        assert not problems, "\\n".join(problems)

``problems`` collects, for the whole time the page is open: JavaScript errors
(uncaught exceptions and ``console.error``), failed requests, HTTP errors and
requests that leave the machine.

Chromium comes from the system (``apt-get install -y chromium``), never from
``playwright install``; without it every browser test is skipped with that
instruction.
"""

import contextlib
import functools
import http.server
import os
import shutil
import sys
import threading
import urllib.parse

import pytest

CHROMIUM_CANDIDATES = (
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
)
INSTALL_HINT = "install Chromium: apt-get install -y chromium"
LOCAL_HOSTS = ("127.0.0.1", "localhost")


def chromium_path():
    """The system Chromium's path, or None."""
    env = os.environ.get("CHROMIUM")
    for path in ((env,) if env else ()) + CHROMIUM_CANDIDATES:
        if path and os.path.exists(path):
            return path
    return shutil.which("chromium")


def require_chromium():
    """Skip the calling test, naming the fix, when Chromium or playwright is missing."""
    path = chromium_path()
    if path is None:
        pytest.skip(INSTALL_HINT)
    pytest.importorskip(
        "playwright.sync_api",
        reason="pip install playwright (no `playwright install` needed)",
    )
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".js": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
    }

    def log_message(self, format, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # The browser closed the connection while a file was still being sent (a
        # page left before Pyodide arrived): a reader does that, the site is fine.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve_site(root):
    """Serve directory ``root`` on 127.0.0.1 (a free port); yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def launch_chromium(headless=True):
    """Start the system Chromium through playwright; yield the playwright Browser."""
    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=path,
            headless=headless,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            # Every request that leaves 127.0.0.1 goes to a proxy that is not there,
            # so it fails at once; open_page reports it. (Playwright's request
            # interception would do the same, but it turns the HTTP cache off, and
            # each chapter fetched Pyodide again: the browser tests took 411 s of CPU
            # with it, 361 s without, measured here, one run each.)
            proxy={"server": "http://127.0.0.1:9", "bypass": ",".join(LOCAL_HOSTS)},
        )
        try:
            yield chromium
        finally:
            close_tabs(chromium)
            chromium.close()


def is_local(url):
    """Whether a request stays on this machine.

    The served site, data: and blob: URLs stay local.
    """
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname in LOCAL_HOSTS


# Before any script of the page: record its long tasks (over 50 ms on its main
# thread).
WATCH_JS = """(() => {
  window.__longTasks = [];
  try {
    new PerformanceObserver(list => {
      for (const e of list.getEntries()) {
        window.__longTasks.push([e.startTime, e.duration]);
      }
    }).observe({type: "longtask", buffered: true});
  } catch (e) { /* no Long Tasks API */ }
})();"""


# Before any script of the page, for visits that look at the layout only: no Web
# Worker starts, so the live figures' Python (Pyodide: seconds of CPU) never loads.
# The figures keep the drawing they arrive with, which is Python's own first drawing
# (mylib.figures.livefig.LiveFigure.static_html).
NO_WORKER_JS = """(() => {
  window.Worker = class { postMessage() {} terminate() {} addEventListener() {} };
})();"""


def _icon_left_behind(request):
    """The page's icon, still loading when the reader went to another page.

    The browser fetches it last and drops it on leaving: not a failure.
    """
    return request.url.endswith("favicon.svg") and "ERR_ABORTED" in str(request.failure)


# Opening a page in a new browser context costs about 2 s of CPU more than opening
# it in a tab that is already open, with the same page or another (measured here:
# 3.5 against 1.4 s for a chapter without its Python, 11.1 against 9.0 s with it), a
# fifth of the browser tests' time. So a test session keeps one open tab per kind of
# visit (the figures' Python or not) and each ``open_page`` reuses it, as a reader
# who goes from page to page does: the browser's cache warm (launch_chromium says
# why nothing intercepts requests), nothing else kept. It
# sets the viewport and the system's colour scheme; on leaving, the site's local and
# session storage (the theme picked, the exercises' code) are cleared and the tab goes
# to about:blank. A visit that raised leaves its tab closed. The benchmark
# (``LIVEFIG_BENCH=1``) still opens each page in a new context: a first visit.
BENCH = os.environ.get("LIVEFIG_BENCH") == "1"  # site_timing.py reads it too
_tabs = {}  # (browser, python) -> _Tab

CLEAR_STORAGE_JS = (
    "() => { localStorage.clear(); sessionStorage.clear(); return true; }"
)


class _Tab:
    """A browser context with one tab, its checks reported to the current visit."""

    def __init__(self, chromium, python):
        self.problems = None  # the open visit's list
        self.context = chromium.new_context()
        self.context.add_init_script(WATCH_JS)
        if not python:
            self.context.add_init_script(NO_WORKER_JS)
        self.context.on("request", self._check_request)  # workers' requests too
        page = self.page = self.context.new_page()
        page.on("pageerror", lambda exc: self._report(f"JavaScript error: {exc}"))
        page.on(
            "console",
            lambda msg: (
                self._report(f"console.{msg.type}: {msg.text}")
                if msg.type == "error"
                else None
            ),
        )
        page.on(
            "requestfailed",
            lambda req: (
                self._report(f"request failed: {req.url} ({req.failure})")
                if is_local(req.url) and not _icon_left_behind(req)
                else None
            ),
        )
        page.on(
            "response",
            lambda resp: (
                self._report(f"HTTP {resp.status}: {resp.url}")
                if resp.status >= 400
                else None
            ),
        )

    def _report(self, problem):
        if self.problems is not None:
            self.problems.append(problem)

    def _check_request(self, request):
        if not is_local(request.url):  # it fails: no proxy (launch_chromium)
            self._report(f"request leaves the machine: {request.url}")

    def leave(self):
        """Clear the site's storage and go to about:blank; False if the tab failed."""
        self.problems = None
        try:
            if self.page.url.startswith("http"):
                self.page.wait_for_function(CLEAR_STORAGE_JS, timeout=10_000)
            self.page.goto("about:blank", timeout=10_000)
            return True
        except Exception:
            return False


@contextlib.contextmanager
def open_page(
    chromium,
    url,
    viewport=(1280, 900),
    wait_until="load",
    settle_ms=300,
    color_scheme="light",
    python=True,
):
    """Open ``url`` in a browser tab as a first visit; yield ``(page, problems)``.

    Requests that leave 127.0.0.1 are blocked and reported, so a page that
    would need the network fails here instead of waiting for a timeout.
    ``color_scheme`` is the system's ("light" or "dark"): the site follows it
    until the reader picks a theme. The page records its long tasks from its
    start (``WATCH_JS``). With ``python=False`` no Web Worker starts
    (``NO_WORKER_JS``): for visits that only look at the layout.
    """
    key = (chromium, python)
    tab = _tabs.pop(key, None)
    if tab is None or BENCH:
        tab = _Tab(chromium, python)
    tab.page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
    tab.page.emulate_media(color_scheme=color_scheme)
    problems = tab.problems = []
    kept = False
    try:
        tab.page.goto(url, wait_until=wait_until)
        tab.page.wait_for_timeout(settle_ms)
        yield tab.page, problems
        kept = not BENCH and tab.leave()
    finally:
        if kept and key not in _tabs:  # (a visit opened inside this one kept its own)
            _tabs[key] = tab
        else:
            tab.context.close()


def close_tabs(chromium):
    """Close the tabs ``open_page`` keeps open in ``chromium``."""
    for key in [k for k in _tabs if k[0] is chromium]:
        _tabs.pop(key).context.close()


def set_sliders(tab, fig, positions):
    """Set a live figure's sliders (name -> raw position); wait for each redraw.

    Each position is set as a reader's drag would, with an ``input`` event, and
    the figure must come back ``live`` (not ``error``) with one more render.
    """
    for name, position in positions.items():
        renders = int(fig.get_attribute("data-renders") or 0)
        fig.locator(f'.livefig-controls input[name="{name}"]').evaluate(
            "(el, v) => { el.value = String(v); "
            "el.dispatchEvent(new Event('input', {bubbles: true})); }",
            position,
        )
        tab.wait_for_function(
            "([el, n]) => "
            "Number(el.dataset.renders) > n || el.dataset.state === 'error'",
            arg=[fig.element_handle(), renders],
            timeout=120000,
        )
        assert fig.get_attribute("data-state") == "live", fig.locator(
            ".livefig-status"
        ).inner_text()
