"""How fast a chapter's live figures answer a reader: the measurements of a page visit.

``while_loading`` runs first, right after the page's load event, as a reader who
starts at once: it moves a slider 0.3 s after the load (while Python is still
loading), and records how long until the page answered that key and until the
move was drawn, and the page's long tasks (over 50 ms on its main
thread, from ``browser.WATCH_JS``): in the benchmark, in the 10 s after the load;
in ``make test``, until that move is drawn. ``warm`` then times every slider of
every figure once Python is ready. ``next_page_during_loading`` (the benchmark
only) opens the page again and presses the right arrow (next chapter) 0.3 s after
its load. Benchmarks, printed by tests/test_browser_livefig_timing.py and by
``make bench`` (tests/bench_livefig.py); the visit asserts only that each move
was drawn at its slider's position.
"""

import json
import os
import statistics
import time

import browser

# `make test` checks that every move is drawn at its slider's position: two moves
# a slider (there and back), long tasks counted until the move made while loading
# is drawn. The benchmark (`make bench`, tests/bench_livefig.py, LIVEFIG_BENCH=1)
# times: 12 warm redraws a slider for the medians, long tasks in the 10 s after the
# load, and the next chapter's arrow key pressed while Python loads.
BENCH = browser.BENCH
WARM_MOVES = int(os.environ.get("LIVEFIG_WARM_MOVES", "12" if BENCH else "2"))
AFTER_LOAD_S = 10  # the benchmark's window in which long tasks are counted

LOAD_PHASE_JS = """(windowMs) => {
  const load = performance.getEntriesByType('navigation')[0].loadEventEnd;
  const tasks = window.__longTasks.filter(t => t[0] >= load && t[0] < load + windowMs);
  return {
    load,
    long_tasks: tasks.length,
    long_ms: tasks.reduce((a, t) => a + t[1], 0),
    longest_ms: tasks.reduce((a, t) => Math.max(a, t[1]), 0),
  };
}"""


def wait_drawn(tab, fig, renders, timeout=90_000):
    tab.wait_for_function(
        "([el, n]) => Number(el.dataset.renders) > n || el.dataset.state === 'error'",
        arg=[fig.element_handle(), renders],
        timeout=timeout,
    )


def python_state(tab):
    return tab.evaluate("() => document.documentElement.dataset.livefigPython")


def while_loading(tab):
    """A slider moved 0.3 s after the load (``open_page`` settles that long).

    Times run from then: every step here (focusing the slider, reading it,
    pressing the key) needs the page's main thread, so a page busy loading Python
    on it answers only when that is done.
    """
    started = time.perf_counter()
    fig = tab.locator(".livefig[data-module]").first
    slider = fig.locator(".livefig-controls input[type=range]").first
    slider.evaluate("e => e.focus({preventScroll: true})")
    state = python_state(tab)
    at_max = slider.evaluate("e => Number(e.value) >= Number(e.max)")
    slider.press("ArrowLeft" if at_max else "ArrowRight")
    answered_ms = (time.perf_counter() - started) * 1e3
    wait_drawn(tab, fig, 0, timeout=120_000)
    drawn_wall_ms = (time.perf_counter() - started) * 1e3
    assert fig.get_attribute("data-state") == "live", fig.inner_text()
    positions = json.loads(fig.get_attribute("data-positions"))
    assert float(positions[slider.get_attribute("name")]) == float(
        slider.input_value()
    ), "the move made while Python loaded is not the one drawn"
    drawn_ms = float(fig.get_attribute("data-input-ms"))
    try:
        tab.wait_for_function(
            "() => document.documentElement.dataset.livefigPython === 'ready'",
            timeout=60_000,
        )
    except Exception:  # a page whose figures load Python only on the first move
        pass
    since_load_s = tab.evaluate(
        "() => (performance.now() - "
        "performance.getEntriesByType('navigation')[0].loadEventEnd) / 1000"
    )
    window_s = AFTER_LOAD_S if BENCH else round(since_load_s, 1)
    if since_load_s < window_s:
        tab.wait_for_timeout((window_s - since_load_s) * 1000 + 100)
    phase = tab.evaluate(LOAD_PHASE_JS, window_s * 1000)
    return {
        "python when the page answered": state,
        "move 0.3 s after load: key answered (ms)": round(answered_ms),
        "move 0.3 s after load: drawn after (ms)": round(drawn_wall_ms),
        "move 0.3 s after load: input event to drawn (ms)": round(drawn_ms),
        "long tasks after load: window (s)": window_s,
        "long tasks after load": phase["long_tasks"],
        "long tasks after load (total ms)": round(phase["long_ms"]),
        "longest task after load (ms)": round(phase["longest_ms"]),
    }


# After a redraw: once the drawing is on screen (two animation frames later), what
# the figure says about it, read in one call.
DRAWN_JS = """([fig, slider]) => new Promise(done => requestAnimationFrame(() =>
  requestAnimationFrame(() => done({
    state: fig.dataset.state,
    shown: JSON.parse(fig.dataset.positions)[slider.name],
    value: slider.value,
    python: Number(fig.dataset.renderMs),
    input: Number(fig.dataset.inputMs),
    place: Number(fig.dataset.placeMs),
  }))))"""


def _warm_moves(tab, fig, slider, moves, key="ArrowRight"):
    """``moves`` redraws of ``fig`` by ``slider``, one key press each.

    Their times (ms): Python's (data-render-ms), putting the SVG in place
    (data-place-ms) and from the key's input event to the drawing in place
    (data-input-ms). The keys go back and forth between the slider's ends, so
    that every move changes the value; each drawing must show the slider's new
    value. Each key is pressed once the last drawing is on screen, as a reader
    who looks at it does (not while the page still paints it).
    """
    slider.focus()
    python_ms, input_ms, place_ms = [], [], []
    handles = [fig.element_handle(), slider.element_handle()]
    for _ in range(moves):
        renders = int(fig.get_attribute("data-renders") or 0)
        at = slider.evaluate(
            "e => Number(e.value) >= Number(e.max) ? 1 : "
            "Number(e.value) <= Number(e.min) ? -1 : 0"
        )
        key = "ArrowLeft" if at == 1 else "ArrowRight" if at == -1 else key
        slider.press(key)
        wait_drawn(tab, fig, renders)
        seen = tab.evaluate(DRAWN_JS, handles)
        assert seen["state"] == "live", fig.inner_text()
        assert float(seen["shown"]) == float(seen["value"])
        python_ms.append(seen["python"])
        input_ms.append(seen["input"])
        place_ms.append(seen["place"])
    return python_ms, input_ms, place_ms


def warm(tab):
    """Once Python is ready: the first move, then every slider's warm redraws."""
    figs = tab.locator(".livefig[data-module]")
    fig = figs.first
    fig.scroll_into_view_if_needed()
    slider = fig.locator(".livefig-controls input[type=range]").first
    slider.focus()
    at_max = slider.evaluate("e => Number(e.value) >= Number(e.max)")
    renders = int(fig.get_attribute("data-renders") or 0)
    started = time.perf_counter()
    slider.press("ArrowLeft" if at_max else "ArrowRight")
    wait_drawn(tab, fig, renders)
    first_ms = (time.perf_counter() - started) * 1e3
    sliders = {}
    for i in range(figs.count()):
        each = figs.nth(i)
        each.scroll_into_view_if_needed()
        name = each.get_attribute("data-function")
        for s in each.locator(".livefig-controls input[type=range]").all():
            python_ms, input_ms, place_ms = _warm_moves(tab, each, s, WARM_MOVES)
            sliders[f"{name}.{s.get_attribute('name')}"] = {
                "python median ms": round(statistics.median(python_ms), 1),
                "SVG in place median ms": round(statistics.median(place_ms), 1),
                "input to drawn median ms": round(statistics.median(input_ms), 1),
                "input to drawn max ms": round(max(input_ms), 1),
            }
    slowest = max(sliders, key=lambda k: sliders[k]["input to drawn median ms"])
    load_ms = tab.evaluate("() => window.mylibLivefig.loadMs || null")
    return {
        "figure": fig.get_attribute("data-module")
        + "."
        + fig.get_attribute("data-function"),
        "Pyodide load (ms)": load_ms and round(load_ms),
        "first move once ready, to drawing (ms)": round(first_ms),
        "warm moves per slider": WARM_MOVES,
        "warm redraw, slowest slider": slowest,
        **{
            f"warm redraw, slowest slider ({k})": v for k, v in sliders[slowest].items()
        },
        "warm redraw, every slider": sliders,
    }


def next_page_during_loading(chromium, url):
    """The right arrow (next chapter) pressed 0.3 s after the load.

    Milliseconds until the next page is on its way (its navigation committed).
    """
    with browser.open_page(chromium, url) as (tab, _):
        started = time.perf_counter()
        href = tab.locator("a.right-next").get_attribute("href")
        if not href:
            return None
        tab.evaluate("() => document.activeElement && document.activeElement.blur()")
        tab.keyboard.press("ArrowRight")
        target = "**/" + href.split("#")[0].split("/")[-1]
        tab.wait_for_url(target, timeout=60_000, wait_until="commit")
        return round((time.perf_counter() - started) * 1e3)
