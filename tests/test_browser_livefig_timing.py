"""How fast the live figures answer a reader, measured in headless Chromium.

A benchmark, not a timed assertion. For each chapter page it prints how long
Python (Pyodide) took to load after the page did, how long the first slider
move took to redraw once the page had been idle, and, for every slider of
every live figure on the page, the median and maximum of its warm redraws
(one ArrowRight or ArrowLeft each, so that every move changes the value). It
writes them to ``_build/livefig-timings.json``. The targets
(book/_static/livefig.js): the first move redraws within 1 s, warm redraws take
under 16 ms (one frame) for every slider. It asserts only that every move was
drawn, with the positions of the move.

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
WARM_MOVES = 12  # per slider


def _wait_drawn(tab, fig, renders):
    tab.wait_for_function(
        "([el, n]) => Number(el.dataset.renders) > n || el.dataset.state === 'error'",
        arg=[fig.element_handle(), renders],
        timeout=90_000,
    )
    assert fig.get_attribute("data-state") == "live", fig.inner_text()


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
        value = slider.input_value()
        positions = json.loads(fig.get_attribute("data-positions"))
        assert float(positions[slider.get_attribute("name")]) == float(value)
        render_ms.append(float(fig.get_attribute("data-render-ms")))
    return render_ms


def measure(tab):
    """Timings of the live figures on the page open in ``tab``."""
    loaded = time.perf_counter()
    figs = tab.locator(".livefig[data-module]")
    fig = figs.first
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
        "warm redraw, slowest slider": slowest,
        "warm redraw, slowest slider (median ms)": sliders[slowest]["median ms"],
        "warm redraw, slowest slider (max ms)": sliders[slowest]["max ms"],
        "warm redraw, every slider": sliders,
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
