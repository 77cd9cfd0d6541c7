"""Chapter 6's live figures in a real browser: memory calculator and ZeRO-3 timeline.

On the built site, with no kernel and no network, moving a slider must redraw
the figure with the numbers Python computes for the same slider positions
(the page runs the very same mylib functions in Pyodide). Needs the site built
(``make book``, or BOOK_SITE pointing at a build) and Chromium.
"""

import os
import pathlib

import pytest

from mylib.figures.livefig import Slider
from mylib.figures.memory import MEMORY_SLIDERS, memory_figure
from mylib.figures.timeline_zero3 import ZERO3_TIMELINE_SLIDERS, zero3_timeline_figure

pytestmark = pytest.mark.browser

browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = pathlib.Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html")).resolve()
PAGE = "notebooks/06_zero.html"

READ_METRICS = """fig => Object.fromEntries(
    Array.from(fig.querySelectorAll('.livefig-figure [data-metric]')).map(e => [
        (e.dataset.row === undefined ? '' : e.dataset.row + ':') + e.dataset.metric,
        e.dataset.value
    ]))"""


def python_metrics(svg):
    import xml.etree.ElementTree as ET

    return {
        (f"{e.get('data-row')}:" if e.get("data-row") is not None else "")
        + e.get("data-metric"): e.get("data-value")
        for e in ET.fromstring(svg).iter()
        if e.get("data-metric")
    }


@pytest.fixture(scope="module")
def page(site, chromium):
    if not (SITE / PAGE).exists():
        pytest.skip(
            f"no built chapter 6 in {SITE}: build the site first with `make book`"
        )
    with browser.open_page(chromium, f"{site}/{PAGE}") as (tab, problems):
        yield tab, problems


def values_at(sliders, positions):
    return {
        s.name: s.value_at(positions[s.name]) if s.name in positions else s.default
        for s in sliders
    }


@pytest.mark.parametrize(
    "function, specs, render, positions",
    [
        (
            "memory_figure",
            MEMORY_SLIDERS,
            memory_figure,
            # 70B on 8 ranks at ZeRO-2 (does not fit, at any rank count), then K = 8
            [{"params_b": 9, "world_size": 3, "stage": 2}, {"k": 8}],
        ),
        (
            "zero3_timeline_figure",
            ZERO3_TIMELINE_SLIDERS,
            zero3_timeline_figure,
            [{"nics_per_node": 3, "n_layers": 6}],
        ),
    ],
)
def test_sliders_redraw_with_pythons_numbers(page, function, specs, render, positions):
    tab, problems = page
    fig = tab.locator(f'.livefig[data-function="{function}"]')
    assert fig.count() == 1, f"chapter 6 has no live {function}"
    fig.scroll_into_view_if_needed()
    sliders = [Slider(**s) for s in specs]
    # The default drawing is there before any Python loads.
    assert fig.evaluate(READ_METRICS) == python_metrics(
        render(**values_at(sliders, {}))
    )
    moved = {}
    for step in positions:
        browser.set_sliders(tab, fig, step)
        moved.update(step)
        want = python_metrics(render(**values_at(sliders, moved)))
        assert fig.evaluate(READ_METRICS) == want
    assert not problems, "\n".join(problems)


def test_memory_calculator_says_what_fits(page):
    tab, _ = page
    fig = tab.locator('.livefig[data-function="memory_figure"]')
    browser.set_sliders(
        tab, fig, {"params_b": 9, "world_size": 5, "stage": 3, "k": 12}
    )  # 70B, 32 ranks, ZeRO-3
    metrics = fig.evaluate(READ_METRICS)
    assert metrics["fits"] == "True" and metrics["min_ranks"] == "14"
    assert float(metrics["total_gb"]) == pytest.approx(16 * 70 / 32)
