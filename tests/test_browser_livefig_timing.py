"""How fast the live figures answer a reader, measured in headless Chromium.

A benchmark, not a timed assertion: it prints, for the first live figure of
each chapter page, how long Python (Pyodide) took to load after the page did,
how long the first slider move took to redraw once the page had been idle,
and the median and maximum of 20 warm redraws (one ArrowRight each), and writes
them to ``_build/livefig-timings.json``. The targets (book/_static/livefig.js):
the first move redraws within 1 s, warm redraws take under 16 ms (one frame).
It asserts only that every move was drawn, with the positions of the move.

Run: ``pytest tests/test_browser_livefig_timing.py -m browser -s``.
"""

import json
import statistics
import time

import pytest
from conftest import SITE
from test_browser_site import live_figure_pages

pytestmark = pytest.mark.browser

browser = pytest.importorskip("browser", reason="tests/browser.py is missing")

RESULTS = SITE.parent / "livefig-timings.json"
WARM_MOVES = 20


def _wait_drawn(tab, fig, renders):
    tab.wait_for_function(
        "([el, n]) => Number(el.dataset.renders) > n || el.dataset.state === 'error'",
        arg=[fig.element_handle(), renders],
        timeout=90_000,
    )
    assert fig.get_attribute("data-state") == "live", fig.inner_text()


def measure(tab):
    """Timings of the first live figure on the page open in ``tab``."""
    loaded = time.perf_counter()
    fig = tab.locator(".livefig[data-module]").first
    fig.scroll_into_view_if_needed()
    # The site shows the drawing and its sliders, never JupyterLab's image.
    assert fig.locator(".livefig-figure").is_visible(), "the drawing is hidden"
    assert fig.locator(".livefig-controls").is_visible(), "the sliders are hidden"
    assert not fig.locator(".livefig-jupyter").is_visible(), "Lab's image shows"
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
    key = "ArrowLeft" if at_max else "ArrowRight"
    renders = int(fig.get_attribute("data-renders") or 0)
    started = time.perf_counter()
    slider.press(key)
    _wait_drawn(tab, fig, renders)
    first_ms = (time.perf_counter() - started) * 1e3
    warm_input, warm_render = [], []
    for i in range(WARM_MOVES):
        renders = int(fig.get_attribute("data-renders"))
        # back and forth between the ends, so that every move changes the value
        at = slider.evaluate(
            "e => Number(e.value) >= Number(e.max) ? 1 : "
            "Number(e.value) <= Number(e.min) ? -1 : 0"
        )
        key = "ArrowLeft" if at == 1 else "ArrowRight" if at == -1 else key
        slider.press(key)
        _wait_drawn(tab, fig, renders)
        value = slider.input_value()
        positions = json.loads(fig.get_attribute("data-positions"))
        assert float(positions[slider.get_attribute("name")]) == float(value)
        warm_render.append(float(fig.get_attribute("data-render-ms")))
        if fig.get_attribute("data-input-ms"):
            warm_input.append(float(fig.get_attribute("data-input-ms")))
    load_ms = tab.evaluate("() => window.mylibLivefig.loadMs || null")
    return {
        "figure": fig.get_attribute("data-module")
        + "."
        + fig.get_attribute("data-function"),
        "python ready after load (s)": ready_s and round(ready_s, 2),
        "Pyodide load (ms)": load_ms and round(load_ms),
        "first move to drawing (ms)": round(first_ms),
        "warm redraw, Python + page (median ms)": round(
            statistics.median(warm_render), 1
        ),
        "warm redraw, Python + page (max ms)": round(max(warm_render), 1),
        "warm input to drawing (median ms)": warm_input
        and round(statistics.median(warm_input), 1),
    }


@pytest.mark.parametrize("page", live_figure_pages() or ["(no live figure built)"])
def test_live_figure_timings(site, chromium, page):
    if page == "(no live figure built)":
        pytest.skip("no chapter with a live figure in the built site yet")
    with browser.open_page(chromium, f"{site}/{page}") as (tab, problems):
        result = {"page": page, **measure(tab)}
    print("\nlivefig timing: " + json.dumps(result))
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous[page] = result
    RESULTS.write_text(json.dumps(previous, indent=1))
    assert not problems, f"{page}:\n" + "\n".join(problems)
