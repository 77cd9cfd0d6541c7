"""Chapter 9's live figure in a real browser: hours lost per checkpoint interval.

On the built site, with no kernel and no network, the default drawing shows
before any Python loads, and moving the sliders (checkpoint cost, MTBF per
node, nodes, restart time) redraws it with the numbers Python computes for
the same positions: the page runs mylib.figures.checkpoint_interval in
Pyodide. Needs the site built (``make book``, or BOOK_SITE pointing at a
build) and Chromium.
"""

import os
import pathlib
import xml.etree.ElementTree as ET

import pytest

from mylib.figures.checkpoint_interval import (
    CHECKPOINT_SLIDERS,
    checkpoint_interval_figure,
)
from mylib.figures.livefig import Slider

pytestmark = pytest.mark.browser

browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = pathlib.Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html")).resolve()
PAGE = "notebooks/09_when_a_rank_dies.html"
SLIDERS = [Slider(**spec) for spec in CHECKPOINT_SLIDERS]

READ_METRICS = """fig => Object.fromEntries(
    Array.from(fig.querySelectorAll('.livefig-figure [data-value]')).map(e => [
        e.dataset.metric, e.dataset.value]))"""


def python_metrics(svg):
    return {
        e.get("data-metric"): e.get("data-value")
        for e in ET.fromstring(svg).iter()
        if e.get("data-value") is not None
    }


@pytest.fixture(scope="module")
def page(site, chromium):
    if not (SITE / PAGE).exists():
        pytest.skip(
            f"no built chapter 9 in {SITE}: build the site first with `make book`"
        )
    with browser.open_page(chromium, f"{site}/{PAGE}") as (tab, problems):
        yield tab, problems


def values_at(positions):
    return {
        s.name: s.value_at(positions[s.name]) if s.name in positions else s.default
        for s in SLIDERS
    }


def test_sliders_redraw_with_pythons_numbers(page):
    tab, problems = page
    fig = tab.locator('.livefig[data-function="checkpoint_interval_figure"]')
    assert fig.count() == 1, "chapter 9 has no live checkpoint_interval_figure"
    assert fig.get_attribute("data-state") == "static"
    fig.scroll_into_view_if_needed()
    assert fig.evaluate(READ_METRICS) == python_metrics(
        checkpoint_interval_figure(**values_at({}))
    )
    moved = {}
    # 10 min checkpoints, then 8 nodes, then a 1-minute restart
    for step in ({"cost_s": 7}, {"nodes": 1}, {"restart_s": 1}):
        browser.set_sliders(tab, fig, step)
        moved.update(step)
        want = python_metrics(checkpoint_interval_figure(**values_at(moved)))
        assert fig.evaluate(READ_METRICS) == want
    assert not problems, "\n".join(problems)
