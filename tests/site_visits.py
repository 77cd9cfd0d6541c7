"""Visits of each page of the built site: every per-page browser check from few loads.

Each page is opened in four views: 1280 x 900 and 390 x 844 (a phone), each with
the system in light and in dark mode (the site follows it, ``default_mode:
auto``). Opening a chapter costs seconds, so a view opens the page once and
records what the checks need; the tests assert on the record. A visit that fails
part-way keeps its error, and each test of that page and view reports it.

* ``1280 light``, the reader's visit: read the page as it loads (a slider moved
  at once, ``site_timing.while_loading``), unfold every fold, check that no block
  scrolls sideways, move every slider of every live figure
  (``site_timing.warm``), then each figure's first slider to its other end.
* the other three, the layout: the page's width (nothing may scroll sideways at
  390 px), the live figures' controls and text size, the contrast of the text
  that matters (``page_checks.py``), screenshots. A chapter's live figures arrive
  drawn, so these visits do not load their Python (``browser.NO_WORKER_JS``);
  the pages that Python fills in after the load (``PYTHON_FILLS``) load it.
"""

import browser
import page_checks
import site_timing

VIEWS = {
    "1280 light": ((1280, 900), "light"),
    "390 light": ((390, 844), "light"),
    "1280 dark": ((1280, 900), "dark"),
    "390 dark": ((390, 844), "dark"),
}

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
    """The visits of one test session, one per page and view, made when first asked."""

    def __init__(self, base_url, chromium, shots):
        self.base_url, self.chromium, self.shots = base_url, chromium, shots
        self._done = {}

    def of(self, page, view="1280 light"):
        """The record of ``page``'s visit in ``view`` (a dict).

        Raises the visit's error, if it had one.
        """
        key = (page, view)
        if key not in self._done:
            record = {"page": page, "view": view}
            url = f"{self.base_url}/{page}"
            try:
                if view == "1280 light":
                    visit(self.chromium, url, page, record, self.shots)
                else:
                    look(self.chromium, url, page, view, record, self.shots)
            except Exception as e:  # every test of the page reports it
                record["error"] = e
            self._done[key] = record
        record = self._done[key]
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


def visit(chromium, url, page, record, shots):
    """Open ``url`` once, as a reader at 1280 px, and record what the checks need."""
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
            tab.screenshot(path=str(shots / name), full_page=True)
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


def look(chromium, url, page, view, record, shots):
    """Open ``url`` in ``view`` and record its layout and contrast."""
    viewport, scheme = VIEWS[view]
    with browser.open_page(
        chromium,
        url,
        viewport=viewport,
        color_scheme=scheme,
        python=page in PYTHON_FILLS,
    ) as (tab, problems):
        record["problems"] = problems
        record["theme"] = tab.evaluate("() => document.documentElement.dataset.theme")
        _wait_for_math(tab)
        tab.evaluate(UNFOLD_JS)
        tab.wait_for_timeout(300)
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
