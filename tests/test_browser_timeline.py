"""Chapter 3's live figure on the static site: headless Chromium, no kernel, no network.

The page must show the default drawing before any Python has loaded; moving a
slider must load Pyodide from the site, redraw with the book's own Python, and
give exactly the numbers the Python model gives for that position, at every
position each slider offers.

Needs the built site (``make book``, or BOOK_SITE=<dir> for a build elsewhere)
and Chromium (``apt-get install -y chromium``).
"""

import json
import os
import pathlib

import pytest

from mylib.figures.livefig import Slider
from mylib.figures.timeline import BUCKETING_SLIDERS, bucketing_timelines
from mylib.models.timeline import METRIC_KEYS

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = pathlib.Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html")).resolve()
PAGE = "notebooks/03_bucketing_overlap.html"
SLIDERS = [Slider(**spec) for spec in BUCKETING_SLIDERS]
SHOWN = (
    "step_s",
    "exposed_comm_s",
    "overlap",
    "n_buckets",
)  # the numbers in the figure's panel

browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)


@pytest.fixture(scope="module")
def page(site, chromium):
    if not (SITE / PAGE).exists():
        pytest.skip(
            f"no built chapter 3 in {SITE}: build the site first with `make book`"
        )
    requested = []
    with browser.open_page(chromium, f"{site}/{PAGE}") as (pg, problems):
        pg.on("request", lambda request: requested.append(request.url))
        yield pg, problems, requested


def pyodide_requests(pg):
    """Requests for the site's own Pyodide, by the page or its Python worker."""
    names = "() => performance.getEntriesByType('resource').map(e => e.name)"
    urls = pg.evaluate(names)
    for worker in pg.workers:
        urls += worker.evaluate(names)
    return [u for u in urls if "_static/pyodide/" in u]


def values_at(positions):
    return {s.name: s.value_at(positions[s.name]) for s in SLIDERS}


def expected_numbers(values):
    return [[getattr(t, key) for key in SHOWN] for t in bucketing_timelines(**values)]


def shown_numbers(pg):
    cells = pg.locator(".livefig .livefig-figure text[data-metric]").evaluate_all(
        "els => els.map(e => [Number(e.dataset.timeline), "
        "e.dataset.metric, e.dataset.value])"
    )
    rows = {}
    for k, key, value in cells:
        rows.setdefault(k, {})[key] = float(value)
    return [[rows[k][key] for key in SHOWN] for k in sorted(rows)]


def move(pg, name, key, presses=1):
    figure = pg.locator(".livefig").first
    before = int(figure.get_attribute("data-renders"))
    pg.locator(f".livefig input[name={name}]").focus()
    for _ in range(presses):
        pg.keyboard.press(key)
    # Each press may start a redraw; wait until the drawing shows the slider's final
    # position.
    pg.wait_for_function(
        """([before, name, want]) => {
             const f = document.querySelector('.livefig');
             return Number(f.dataset.renders) > before && f.dataset.state === 'live'
                    && JSON.parse(f.dataset.positions)[name] === want; }""",
        arg=[
            before,
            name,
            float(pg.locator(f".livefig input[name={name}]").input_value()),
        ],
        timeout=120_000,
    )
    return json.loads(figure.get_attribute("data-positions"))


def test_default_figure_shows_before_python_loads(page):
    pg, problems, _ = page
    figure = pg.locator(".livefig").first
    assert figure.get_attribute("data-state") == "static"
    assert figure.get_attribute("data-module") == "mylib.figures.timeline"
    assert pg.locator(".livefig .livefig-figure svg").count() == 1
    defaults = {s.name: s.default for s in SLIDERS}
    assert shown_numbers(pg) == expected_numbers(defaults)
    # Python loads by itself (in a worker) once the page has loaded, and leaves the
    # drawing alone.
    pg.wait_for_function(
        "() => document.documentElement.dataset.livefigPython === 'ready'",
        timeout=120_000,
    )
    assert figure.get_attribute("data-state") == "static"
    assert figure.get_attribute("data-renders") == "0"
    assert shown_numbers(pg) == expected_numbers(defaults)
    assert pyodide_requests(pg), "Pyodide did not load from the site"
    for s in SLIDERS:
        assert pg.locator(
            f".livefig input[name={s.name}] + output"
        ).inner_text() == s.text(s.default)
    assert not problems, "\n".join(problems)


def test_moving_sliders_redraws_with_the_python_model(page):
    pg, problems, _ = page
    before_svg = pg.locator(".livefig .livefig-figure").inner_html()
    moves = [
        ("bucket_cap_mb", "ArrowRight", 1),
        ("bandwidth_gb_s", "ArrowLeft", 2),
        ("n_layers", "ArrowLeft", 3),
        ("latency_us", "End", 1),
        ("backward_ms_per_layer", "ArrowRight", 2),
    ]
    for name, key, presses in moves:
        positions = move(pg, name, key, presses)
        values = values_at(positions)
        assert shown_numbers(pg) == expected_numbers(values), (name, values)
        slider = next(s for s in SLIDERS if s.name == name)
        assert pg.locator(
            f".livefig input[name={name}] + output"
        ).inner_text() == slider.text(values[name])
    figure = pg.locator(".livefig").first
    assert figure.get_attribute("data-state") == "live"
    assert pg.locator(".livefig .livefig-figure").inner_html() != before_svg
    assert pyodide_requests(pg), "the redraw should come from the site's Pyodide"
    assert not problems, "\n".join(problems)


def test_every_slider_position_agrees_with_the_python_model(page):
    """Each slider through all its positions, the others at their defaults.

    The page's Pyodide (in its worker) computes each one.
    """
    pg, problems, _ = page
    cases = []
    for s in SLIDERS:
        positions = (
            range(len(s.options))
            if s.kind == "options"
            else [
                s.min + k * s.step
                for k in range(int(round((s.max - s.min) / s.step)) + 1)
            ]
        )
        for position in positions:
            cases.append({s.name: position})
    script = """
import json
from mylib.figures.livefig import Slider
from mylib.figures.timeline import BUCKETING_SLIDERS, bucketing_timelines
sliders = [Slider(**spec) for spec in BUCKETING_SLIDERS]
out = []
for case in json.loads(CASES):
    values = {
        s.name: s.value_at(case[s.name]) if s.name in case else s.default
        for s in sliders
    }
    timelines = bucketing_timelines(**values)
    out.append([[getattr(t, key) for key in SHOWN] for t in timelines])
json.dumps(out)
"""
    got = pg.evaluate(
        """async ([cases, shown, script]) => JSON.parse(
             await window.mylibLivefig.run(script, {CASES: cases, SHOWN: shown},
               JSON.parse(document.querySelector('.livefig').dataset.modules)))""",
        [json.dumps(cases), list(SHOWN), script],
    )
    assert len(got) == len(cases) > 150
    for case, numbers in zip(cases, got):
        values = {
            s.name: s.value_at(case[s.name]) if s.name in case else s.default
            for s in SLIDERS
        }
        assert numbers == expected_numbers(values), case
    assert set(SHOWN) <= set(METRIC_KEYS)
    assert not problems, "\n".join(problems)
