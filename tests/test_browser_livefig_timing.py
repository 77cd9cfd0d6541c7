"""How fast the live figures answer a reader, measured in headless Chromium.

A benchmark, not a timed assertion. For each chapter page its visit
(``site_visits.measure``) times how long Python (Pyodide) took to load after
the page did, how long the first slider move took to redraw once the page had
been idle, and, for every slider of every live figure on the page, the median
and maximum of its warm redraws (``LIVEFIG_WARM_MOVES`` ArrowRight or ArrowLeft
presses each, 6 unless set, so that every move changes the value). This test
prints them and writes them to ``_build/livefig-timings.json``. The targets
(book/_static/livefig.js): the first move redraws within 1 s, warm redraws take
under 16 ms (one frame) for every slider. The visit asserts only that every
move was drawn, with the positions of the move.

Run: ``pytest tests/test_browser_livefig_timing.py -m browser -s``.
"""

import json

import pytest
from conftest import SITE
from test_browser_site import live_figure_pages

pytestmark = pytest.mark.browser

RESULTS = SITE.parent / "livefig-timings.json"


@pytest.mark.parametrize("page", live_figure_pages() or ["(no live figure built)"])
def test_live_figure_timings(visits, page):
    if page == "(no live figure built)":
        pytest.skip("no chapter with a live figure in the built site yet")
    seen = visits.of(page)
    result = {"page": page, **seen["timings"]}
    print("\nlivefig timing: " + json.dumps(result))
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous[page] = result
    RESULTS.write_text(json.dumps(previous, indent=1))
    assert not seen["problems"], f"{page}:\n" + "\n".join(seen["problems"])
