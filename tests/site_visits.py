"""Visits of each page of the built site: every per-page check from few loads.

Each page is seen in four views: 1280 x 900 and 390 x 844 (a phone), each with
the system in light and in dark mode (the site follows it, ``default_mode:
auto``). Loading a page costs seconds of CPU (its HTML, the theme's styles and
scripts, MathJax), so a page is loaded twice, and the system's mode is switched
in the loaded page for the other two views, as a reader's system does at dusk:

* ``1280 light``, the reader's visit: read the page as it loads (a slider moved
  at once, ``site_timing.while_loading``), unfold every fold, check that no block
  scrolls sideways, move every slider of every live figure
  (``site_timing.warm``), then each figure's first slider to its other end. Then
  the system turns dark: ``1280 dark``.
* ``390 dark`` opened in dark mode, then the system turns light: ``390 light``.
  These two, and ``1280 dark``, record the layout: the page's width (nothing may
  scroll sideways at 390 px), the live figures' controls and text size, the
  contrast of the text that matters (``page_checks.py``), screenshots. A
  chapter's live figures arrive drawn, so the phone views do not load their
  Python (``browser.NO_WORKER_JS``); the pages that Python fills in after the
  load (``PYTHON_FILLS``) load it.

So every page is checked in a mode it loaded in and in a mode it switched to, both
ways.
"""

import os

import browser
import page_checks
import site_timing

VIEWS = {
    "1280 light": ((1280, 900), "light"),
    "390 light": ((390, 844), "light"),
    "1280 dark": ((1280, 900), "dark"),
    "390 dark": ((390, 844), "dark"),
}

# BOOK_FULL_SCREENSHOTS=1: the reader's visit shoots a chapter whole (make bench
# does), not only its first screen.
FULL_PAGE_SHOTS = os.environ.get("BOOK_FULL_SCREENSHOTS") == "1" or site_timing.BENCH

# The views seen in one load of a page: the first opened, then the system's mode
# switched for the next.
LOADS = (("1280 light", "1280 dark"), ("390 dark", "390 light"))

# Pages whose content Python writes after the load: the planner's tables, the
# exercises' editors.
PYTHON_FILLS = ("notebooks/10_plan_your_run.html", "book/practice.html")

# Unfold everything a reader can unfold: folded cells and dropdowns.
UNFOLD_JS = """() => {
  for (const d of document.querySelectorAll("main details")) d.open = true;
  for (const b of document.querySelectorAll("main button.toggle-button")) {
    if (b.classList.contains("toggle-button-hidden")) b.click();
  }
}"""

# For each visible output and <pre> on the page: is its content wider than its box?
OVERFLOW_JS = """() => {
  const found = [];
  let columns = null;
  // Outputs that are not <pre>: tables, HTML, pictures, live figures.
  for (const out of document.querySelectorAll("main .cell_output > *")) {
    if (!out.offsetParent) continue;
    if (out.scrollWidth > out.clientWidth + 1) {
      const text = out.innerText.split("\\n").reduce(
        (a, b) => (b.length > a.length ? b : a), "");
      found.push(`output ${out.scrollWidth} px in ${out.clientWidth} px: `
        + text.slice(0, 70));
    }
  }
  // Tables of Markdown pages (the benchmarks): wider than the column, they
  // must scroll in a box of their own.
  for (const table of document.querySelectorAll("main table")) {
    if (!table.offsetParent || table.closest(".cell_output")) continue;
    const box = table.parentElement;
    const scrolls = /auto|scroll/.test(getComputedStyle(box).overflowX);
    if (table.scrollWidth > box.clientWidth + 1 && !scrolls) {
      found.push(`table ${table.scrollWidth} px in ${box.clientWidth} px, no scroll`);
    }
  }
  for (const pre of document.querySelectorAll("main pre")) {
    if (!pre.offsetParent) continue;  // folded away: not on screen
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(100);
    probe.style.position = "absolute";
    probe.style.visibility = "hidden";
    pre.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const style = getComputedStyle(pre);
    const inner = pre.clientWidth - parseFloat(style.paddingLeft)
      - parseFloat(style.paddingRight);
    columns = Math.floor(inner / charWidth);
    if (pre.scrollWidth > pre.clientWidth + 1) {
      const lines = pre.textContent.split("\\n");
      const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      found.push(`${longest.length} columns: ${longest.slice(0, 70)}`);
    }
  }
  return {columns, found};
}"""


class Visits:
    """A test session's visits: per page, one load a width, made when first asked."""

    def __init__(self, base_url, chromium, shots):
        self.base_url, self.chromium, self.shots = base_url, chromium, shots
        self._done = {}

    def of(self, page, view="1280 light"):
        """The record of ``page``'s visit in ``view`` (a dict).

        Raises the visit's error, if it had one.
        """
        if (page, view) not in self._done:
            together = next(group for group in LOADS if view in group)
            records = {v: {"page": page, "view": v} for v in together}
            url = f"{self.base_url}/{page}"
            try:
                if together[0] == "1280 light":
                    light, dark = records.values()
                    visit(self.chromium, url, page, light, self.shots, dark=dark)
                else:
                    look(self.chromium, url, page, together, records, self.shots)
            except Exception as e:  # every test of the page and view reports it
                for record in records.values():
                    record.setdefault("error", e)
            for v, record in records.items():
                self._done[(page, v)] = record
        record = self._done[(page, view)]
        if "error" in record:
            raise record["error"]
        return record

    def summary(self):
        """What the layout views measured, page by page: widths, text, contrast.

        For before/after comparisons (conftest.py writes it to page-views.json).
        """
        out = {}
        for (page, view), record in sorted(self._done.items()):
            if "error" in record or view == "1280 light":
                continue
            text = record.get("contrast", {}).get("text", {})
            out.setdefault(page, {})[view] = {
                "width": record.get("width"),
                "smallest figure text (px)": min(
                    (
                        f["smallest_text_px"]
                        for f in record.get("figures", [])
                        if f["smallest_text_px"] is not None
                    ),
                    default=None,
                ),
                "contrast": {kind: facts["min"] for kind, facts in text.items()},
            }
        return out


def _shot_name(page, view):
    return page.replace("/", "_")[:-5] + "_" + view.replace(" ", "_") + ".png"


def _wait_for_math(tab):
    if (
        tab.locator("mjx-container").count() == 0
        and tab.locator("span.math, div.math").count() > 0
    ):
        tab.wait_for_selector("mjx-container", timeout=15000)  # after load


def visit(chromium, url, page, record, shots, dark=None):
    """Open ``url`` once, as a reader at 1280 px, and record what the checks need.

    Then, if ``dark`` is a dict, the system turns dark and ``dark`` gets the
    layout record of that view (:func:`record_look`).
    """
    with browser.open_page(chromium, url) as (tab, problems):
        record["problems"] = problems  # the same list: it fills while the page is open
        record["title"] = tab.title()
        figures = tab.locator(".livefig[data-module]")
        if figures.count():
            record["loading"] = site_timing.while_loading(tab)
        _wait_for_math(tab)
        if page.startswith("notebooks/"):
            shots.mkdir(parents=True, exist_ok=True)
            name = page.replace("/", "_")[:-5] + ".png"
            # the whole chapter (seconds of CPU) when asked, else what a reader
            # sees first
            tab.screenshot(path=str(shots / name), full_page=FULL_PAGE_SHOTS)
        tab.evaluate(UNFOLD_JS)
        tab.wait_for_timeout(200)
        record["overflow"] = tab.evaluate(OVERFLOW_JS)["found"]
        if figures.count():
            record["figures"] = [
                _default_drawing(figures.nth(i)) for i in range(figures.count())
            ]
            record["timings"] = site_timing.warm(tab)
            for i, facts in enumerate(record["figures"]):
                facts.update(
                    _jump_to_the_other_end(tab, figures.nth(i), facts["before"])
                )
        record["problems"] = list(problems)
        if dark is not None:
            problems.clear()  # each view reports what went wrong in it
            _switch_scheme(tab, "dark")
            record_look(tab, page, "1280 dark", dark, problems, shots)


def look(chromium, url, page, views, records, shots):
    """Open ``url`` in the first of ``views`` (one width), then switch the system's
    mode to each next one; record each view's layout and contrast in ``records``.
    """
    viewport, scheme = VIEWS[views[0]]
    assert all(VIEWS[v][0] == viewport for v in views), views
    with browser.open_page(
        chromium,
        url,
        viewport=viewport,
        color_scheme=scheme,
        python=page in PYTHON_FILLS,
    ) as (tab, problems):
        _wait_for_math(tab)
        tab.evaluate(UNFOLD_JS)
        tab.wait_for_timeout(300)
        for view in views:
            if VIEWS[view][1] != scheme:
                problems.clear()  # each view reports what went wrong in it
                scheme = VIEWS[view][1]
                _switch_scheme(tab, scheme)
            record_look(tab, page, view, records[view], problems, shots)


def _switch_scheme(tab, scheme):
    """The system's mode turns ``scheme``: the page follows it (no reload)."""
    tab.emulate_media(color_scheme=scheme)
    tab.wait_for_function(
        f"() => document.documentElement.dataset.theme === '{scheme}'", timeout=5000
    )
    tab.wait_for_timeout(300)  # any transition of colours has ended


def record_look(tab, page, view, record, problems, shots):
    """The layout and contrast of ``tab`` as it is now, seen as ``view``."""
    record["theme"] = tab.evaluate("() => document.documentElement.dataset.theme")
    record.update(tab.evaluate(page_checks.LAYOUT_JS))
    record["contrast"] = tab.evaluate(page_checks.CONTRAST_JS)
    shots.mkdir(parents=True, exist_ok=True)
    first = tab.locator(".livefig, .planner, table").first
    if first.count():
        first.scroll_into_view_if_needed()
    tab.screenshot(path=str(shots / _shot_name(page, view)))
    record["problems"] = list(problems)


def _default_drawing(fig):
    """What a live figure shows before any slider moves."""
    fig.scroll_into_view_if_needed()
    slider = fig.locator("input[type=range]").first
    return {
        "before": fig.locator(".livefig-figure").inner_html(),
        "figure_visible": fig.locator(".livefig-figure").is_visible(),
        "controls_visible": fig.locator(".livefig-controls").is_visible(),
        "jupyter_visible": fig.locator(".livefig-jupyter").is_visible(),
        "slider_width": slider.bounding_box()["width"],
    }


def _jump_to_the_other_end(tab, fig, before):
    """Move the first slider to the other end of its range; what is drawn then."""
    fig.scroll_into_view_if_needed()
    slider = fig.locator(".livefig-controls input[type=range]").first
    renders = int(fig.get_attribute("data-renders") or 0)
    slider.focus()
    at_max = slider.evaluate("e => Number(e.value) >= Number(e.max)")
    slider.press("Home" if at_max else "End")
    site_timing.wait_drawn(tab, fig, renders)
    return {
        "state": fig.get_attribute("data-state"),
        "status": fig.locator(".livefig-status").inner_text(),
        "changed": fig.locator(".livefig-figure").inner_html() != before,
    }
