"""One visit per page of the built site: every per-page browser check from one load.

Four test files check each page: that it loads offline with no error
(``test_browser_site``), that its live figures draw and redraw (the same), how
fast they answer (``test_browser_livefig_timing``), and that no block scrolls
sideways (``test_browser_overflow``). Opening a chapter costs seconds (its
figures load Python in the page), so a visit opens the page once and does what
a reader does, in a reader's order: read the page as it loads, unfold every fold,
move every slider of every live figure. (Overflow is measured at the figures'
default positions.) It records what each check needs, and
the tests assert on the record; a visit that fails part-way keeps its error,
and each test of that page reports it.
"""

import json
import os
import statistics
import time

import browser

# Warm redraws timed per slider. The benchmark's median needs a few; every move
# is also checked to be drawn at its slider's position. LIVEFIG_WARM_MOVES=12
# measures more closely.
WARM_MOVES = int(os.environ.get("LIVEFIG_WARM_MOVES", "6"))

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
    """The visits of one test session, one per page, made when first asked for."""

    def __init__(self, base_url, chromium, shots):
        self.base_url, self.chromium, self.shots = base_url, chromium, shots
        self._done = {}

    def of(self, page):
        """The record of ``page``'s visit (a dict); raises the visit's error if any."""
        if page not in self._done:
            record = {"page": page}
            try:
                visit(
                    self.chromium, f"{self.base_url}/{page}", page, record, self.shots
                )
            except Exception as e:  # every test of the page reports it
                record["error"] = e
            self._done[page] = record
        record = self._done[page]
        if "error" in record:
            raise record["error"]
        return record


def visit(chromium, url, page, record, shots):
    """Open ``url`` once and record what the per-page checks assert on."""
    with browser.open_page(chromium, url) as (tab, problems):
        loaded = time.perf_counter()
        record["problems"] = problems  # the same list: it fills while the page is open
        record["title"] = tab.title()
        if (
            tab.locator("mjx-container").count() == 0
            and tab.locator("span.math, div.math").count() > 0
        ):
            tab.wait_for_selector("mjx-container", timeout=15000)  # after load
        if page.startswith("notebooks/"):
            shots.mkdir(parents=True, exist_ok=True)
            name = page.replace("/", "_")[:-5] + ".png"
            tab.screenshot(path=str(shots / name), full_page=True)
        tab.evaluate(UNFOLD_JS)
        tab.wait_for_timeout(200)
        record["overflow"] = tab.evaluate(OVERFLOW_JS)["found"]
        figures = tab.locator(".livefig[data-module]")
        if figures.count():
            record["figures"] = [
                _default_drawing(figures.nth(i)) for i in range(figures.count())
            ]
            record["timings"] = measure(tab, loaded)
            for i, facts in enumerate(record["figures"]):
                facts.update(
                    _jump_to_the_other_end(tab, figures.nth(i), facts["before"])
                )
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
    _wait_drawn(tab, fig, renders)
    return {
        "state": fig.get_attribute("data-state"),
        "status": fig.locator(".livefig-status").inner_text(),
        "changed": fig.locator(".livefig-figure").inner_html() != before,
    }


def _wait_drawn(tab, fig, renders):
    tab.wait_for_function(
        "([el, n]) => Number(el.dataset.renders) > n || el.dataset.state === 'error'",
        arg=[fig.element_handle(), renders],
        timeout=90_000,
    )


def _warm_moves(tab, fig, slider, moves, key="ArrowRight"):
    """``moves`` redraws of ``fig`` by ``slider``, one key press each; their times (ms).

    The keys go back and forth between the slider's ends, so that every move
    changes the value; each drawing must show the slider's new value.
    """
    slider.focus()
    render_ms = []
    for _ in range(moves):
        renders = int(fig.get_attribute("data-renders") or 0)
        at = slider.evaluate(
            "e => Number(e.value) >= Number(e.max) ? 1 : "
            "Number(e.value) <= Number(e.min) ? -1 : 0"
        )
        key = "ArrowLeft" if at == 1 else "ArrowRight" if at == -1 else key
        slider.press(key)
        _wait_drawn(tab, fig, renders)
        assert fig.get_attribute("data-state") == "live", fig.inner_text()
        value = slider.input_value()
        positions = json.loads(fig.get_attribute("data-positions"))
        assert float(positions[slider.get_attribute("name")]) == float(value)
        render_ms.append(float(fig.get_attribute("data-render-ms")))
    return render_ms


def measure(tab, loaded):
    """Timings of the live figures on the page open in ``tab``, loaded at ``loaded``.

    How long Python (Pyodide) took to be ready after the page loaded, how long
    the first slider move took to redraw once it was, and for every slider of
    every live figure the median and maximum of its warm redraws.
    """
    figs = tab.locator(".livefig[data-module]")
    fig = figs.first
    fig.scroll_into_view_if_needed()
    # The reader reads for a moment: wait until Python is ready (or 20 s, for a
    # page that loads Python only on the first move).
    ready_s = None
    try:
        tab.wait_for_function(
            "() => document.documentElement.dataset.livefigPython === 'ready'",
            timeout=20_000,
        )
        ready_s = time.perf_counter() - loaded
    except Exception:  # an older livefig.js: no preload
        pass
    slider = fig.locator(".livefig-controls input[type=range]").first
    slider.focus()
    at_max = slider.evaluate("e => Number(e.value) >= Number(e.max)")
    renders = int(fig.get_attribute("data-renders") or 0)
    started = time.perf_counter()
    slider.press("ArrowLeft" if at_max else "ArrowRight")
    _wait_drawn(tab, fig, renders)
    first_ms = (time.perf_counter() - started) * 1e3
    sliders = {}
    for i in range(figs.count()):
        each = figs.nth(i)
        each.scroll_into_view_if_needed()
        name = each.get_attribute("data-function")
        for s in each.locator(".livefig-controls input[type=range]").all():
            ms = _warm_moves(tab, each, s, WARM_MOVES)
            sliders[f"{name}.{s.get_attribute('name')}"] = {
                "median ms": round(statistics.median(ms), 1),
                "max ms": round(max(ms), 1),
            }
    slowest = max(sliders, key=lambda k: sliders[k]["median ms"])
    load_ms = tab.evaluate("() => window.mylibLivefig.loadMs || null")
    return {
        "figure": fig.get_attribute("data-module")
        + "."
        + fig.get_attribute("data-function"),
        "python ready after load (s)": ready_s and round(ready_s, 2),
        "Pyodide load (ms)": load_ms and round(load_ms),
        "first move to drawing (ms)": round(first_ms),
        "warm moves per slider": WARM_MOVES,
        "warm redraw, slowest slider": slowest,
        "warm redraw, slowest slider (median ms)": sliders[slowest]["median ms"],
        "warm redraw, slowest slider (max ms)": sliders[slowest]["max ms"],
        "warm redraw, every slider": sliders,
    }
