"""Every code and output block of the site fits its column at 1280 px.

mylib, practice/ and the notebooks' cells are formatted at 88 columns (ruff,
pyproject.toml); ``book/_static/book.css`` sizes the code font and the right
table of contents so that 88 columns fit, and wraps printed output. A block
that scrolls sideways hides the end of a line, and often the end of a printed
conclusion, so each page's visit (``site_visits.py``) opens it in Chromium at
1280 x 900, unfolds every folded cell (``hide-input``, ``hide-output``,
dropdowns), and this test fails on any code block (``pre``) or cell output
(printed text, tables, HTML, pictures) whose content is wider than its block,
naming the page and the line.

Needs the built site and Chromium, like ``tests/test_browser_site.py``.
"""

import pytest
from conftest import SITE
from test_browser_site import site_pages

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_no_code_or_output_block_scrolls_sideways(visits, page):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    found = visits.of(page)["overflow"]
    assert not found, f"{page}: blocks wider than the column:\n" + "\n".join(found)
