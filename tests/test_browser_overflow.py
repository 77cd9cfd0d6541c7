"""Every page fits its screen: no block scrolls sideways at 1280 px, no page at 390 px.

mylib, practice/ and the notebooks' cells are formatted at 88 columns (ruff,
pyproject.toml); ``book/_static/book.css`` sizes the code font and the right
table of contents so that 88 columns fit, and wraps printed output. A block
that scrolls sideways hides the end of a line, and often the end of a printed
conclusion, so each page's visit (``site_visits.py``) opens it in Chromium at
1280 x 900, unfolds every folded cell (``hide-input``, ``hide-output``,
dropdowns), and this test fails on any code block (``pre``) or cell output
(printed text, tables, HTML, pictures) whose content is wider than its block,
naming the page and the line, and on a Markdown table wider than the column
that does not scroll in a box of its own.

On a phone (390 x 844, light and dark) a page must not scroll sideways at all:
long inline code wraps, wide tables and code blocks scroll inside their own box.
The live figures reflow: each slider on its own row under its label and readout
(readouts on screen), and the drawing keeps its natural size, so that its
smallest text stays at least 10 CSS px, scrolling inside its box with a visible
cue when it is wider than the screen (``book/_static/livefig.css``).

Needs the built site and Chromium, like ``tests/test_browser_site.py``.
"""

import pytest
from conftest import SITE
from test_browser_site import site_pages

pytestmark = pytest.mark.browser

PHONE_VIEWS = ("390 light", "390 dark")
SMALLEST_TEXT_PX = 10


@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_no_code_or_output_block_scrolls_sideways(visits, page):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    found = visits.of(page)["overflow"]
    assert not found, f"{page}: blocks wider than the column:\n" + "\n".join(found)


@pytest.mark.parametrize("view", PHONE_VIEWS)
@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_page_fits_a_phone(visits, page, view):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    seen = visits.of(page, view)
    assert seen["width"] <= seen["viewport"], (
        f"{page} at {view}: the page is {seen['width']} px wide in a "
        f"{seen['viewport']} px screen; sticking out:\n" + "\n".join(seen["wider"])
    )
    assert not seen["uncued"], f"{page} at {view}: tables scroll with no cue: " + str(
        seen["uncued"]
    )
    assert not seen["problems"], f"{page} at {view}:\n" + "\n".join(seen["problems"])


@pytest.mark.parametrize("view", PHONE_VIEWS)
@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_live_figures_fit_a_phone(visits, page, view):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    figures = visits.of(page, view)["figures"]
    if not figures:
        pytest.skip(f"{page} has no live figure")
    for i, fig in enumerate(figures):
        where = f"{page} at {view}, figure {i}"
        assert not fig["readouts_off_screen"], (
            f"{where}: readouts off screen: {fig['readouts_off_screen']}"
        )
        assert fig["narrowest_slider"] is None or fig["narrowest_slider"] >= 200, (
            f"{where}: a slider is {fig['narrowest_slider']} px wide"
        )
        smallest = fig["smallest_text_px"]
        assert smallest is None or smallest >= SMALLEST_TEXT_PX - 0.01, (
            f"{where}: the drawing's smallest text is {smallest:.1f} CSS px"
        )
        if fig["box_scrolls"]:
            assert fig["box_overflow"] in ("auto", "scroll"), (
                f"{where}: the drawing is wider than its box, which does not scroll"
            )
            assert fig["box_cue"], f"{where}: the drawing scrolls with no cue"
