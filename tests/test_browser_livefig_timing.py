"""How fast the live figures answer a reader, measured in headless Chromium.

A benchmark, not a timed assertion. For each chapter page with live figures, its
visit (``site_timing.py``) records:

* while Python loads: a slider moved 0.3 s after the page's load event, how long
  its key waited for the page's main thread and how long until the move was
  drawn; the long tasks (over 50 ms) of the page's main thread in the 10 s after
  the load; and, in a second visit, how long the right arrow (next chapter)
  pressed 0.3 s after the load takes to leave the page;
* once Python is ready: the first move, then for every slider of every live
  figure the median of its warm redraws (``LIVEFIG_WARM_MOVES`` presses each):
  Python's time in the worker and the time from the key's input event to the
  drawing in place, with the maximum.

In ``make test`` it checks, at less cost, that every move is drawn: two presses a
slider, long tasks counted until the move made while loading is drawn, no second
visit. ``make bench`` measures (``LIVEFIG_BENCH=1``: 12 presses a slider, the 10 s
window, the second visit) and puts the table on the benchmarks page
(tests/bench_livefig.py).

This test prints them and writes them to ``_build/livefig-timings.json``. The
targets (book/_static/livefig.js): no long task after the load (Python runs in a
Web Worker), the move made while loading drawn once Python is ready, warm redraws
under 16 ms (one frame). The visit asserts only that every move was drawn, with
the positions of the move.

Run: ``pytest tests/test_browser_livefig_timing.py -m browser -s``.
"""

import json

import pytest
import site_timing
from conftest import SITE
from test_browser_site import live_figure_pages

pytestmark = pytest.mark.browser

RESULTS = SITE.parent / "livefig-timings.json"


@pytest.mark.parametrize("page", live_figure_pages() or ["(no live figure built)"])
def test_live_figure_timings(visits, chromium, site, page):
    if page == "(no live figure built)":
        pytest.skip("no chapter with a live figure in the built site yet")
    seen = visits.of(page)
    result = {"page": page, **seen["loading"]}
    if site_timing.BENCH:
        result["right arrow 0.3 s after load: next page after (ms)"] = (
            site_timing.next_page_during_loading(chromium, f"{site}/{page}")
        )
    result.update(seen["timings"])
    print("\nlivefig timing: " + json.dumps(result))
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous[page] = result
    RESULTS.write_text(json.dumps(previous, indent=1))
    assert not seen["problems"], f"{page}:\n" + "\n".join(seen["problems"])
