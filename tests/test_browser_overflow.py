"""Every code and output block of the site fits its column at 1280 px.

mylib, practice/ and the notebooks' cells are formatted at 88 columns (ruff,
pyproject.toml); ``book/_static/book.css`` sizes the code font and the right
table of contents so that 88 columns fit, and wraps printed output. A block
that scrolls sideways hides the end of a line, and often the end of a printed
conclusion, so this test opens every page in Chromium at 1280 x 900, unfolds
every folded cell (``hide-input``, ``hide-output``, dropdowns), and fails on any
code block (``pre``) or cell output (printed text, tables, HTML, pictures)
whose content is wider than its block, naming the page and the line.

Needs the built site and Chromium, like ``tests/test_browser_site.py``.
"""

import pytest
from conftest import SITE
from test_browser_site import site_pages

pytestmark = pytest.mark.browser

browser = pytest.importorskip("browser", reason="tests/browser.py is missing")

# For each visible <pre> on the page: is its content wider than the block?
# Unfold everything a reader can unfold: folded cells and dropdowns.
UNFOLD_JS = """() => {
  for (const d of document.querySelectorAll("main details")) d.open = true;
  for (const b of document.querySelectorAll("main button.toggle-button")) {
    if (b.classList.contains("toggle-button-hidden")) b.click();
  }
}"""

OVERFLOW_JS = """() => {
  const found = [];
  let columns = null;
  // Outputs that are not <pre>: tables, HTML, pictures, live figures.
  for (const out of document.querySelectorAll("main .cell_output > *")) {
    if (!out.offsetParent) continue;
    if (out.scrollWidth > out.clientWidth + 1) {
      const text = out.innerText.split("\\n").reduce(
        (a, b) => (b.length > a.length ? b : a), "");
      found.push(`output ${out.scrollWidth} px in ${out.clientWidth} px: `
        + text.slice(0, 70));
    }
  }
  for (const pre of document.querySelectorAll("main pre")) {
    if (!pre.offsetParent) continue;  // folded away: not on screen
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(100);
    probe.style.position = "absolute";
    probe.style.visibility = "hidden";
    pre.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const style = getComputedStyle(pre);
    const inner = pre.clientWidth - parseFloat(style.paddingLeft)
      - parseFloat(style.paddingRight);
    columns = Math.floor(inner / charWidth);
    if (pre.scrollWidth > pre.clientWidth + 1) {
      const lines = pre.textContent.split("\\n");
      const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      found.push(`${longest.length} columns: ${longest.slice(0, 70)}`);
    }
  }
  return {columns, found};
}"""


@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_no_code_or_output_block_scrolls_sideways(site, chromium, page):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    with browser.open_page(chromium, f"{site}/{page}", viewport=(1280, 900)) as (
        tab,
        problems,
    ):
        tab.evaluate(UNFOLD_JS)
        tab.wait_for_timeout(200)
        result = tab.evaluate(OVERFLOW_JS)
    assert not result["found"], f"{page}: blocks wider than the column:\n" + "\n".join(
        result["found"]
    )
