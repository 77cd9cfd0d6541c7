"""Dark mode and light mode: the text a reader reads meets WCAG AA contrast.

Each page is seen with the system in light and in dark mode (the site follows
it: ``default_mode: auto``), light at 390 px, dark at 1280 and 390 px, each mode
both as the page loads and switched in a loaded page (``site_visits``; contrast
does not depend on the width). In every
view, the caption under each live figure and the code in it, the figures' labels
and readouts, body text, inline code and table cells must reach 4.5:1 against
the colour actually behind them (``page_checks.CONTRAST_JS``). In dark mode the
pictures of cell outputs keep their colours: no dimming filter, on a light card
(the drawings are made for a light background; ``book/_static/book.css``).
The theme button switches between light and dark, each click a visible change.

Needs the built site and Chromium, like ``tests/test_browser_site.py``.
"""

import browser
import pytest
from conftest import SITE, only_redirects
from test_browser_site import site_pages

pytestmark = pytest.mark.browser

VIEWS = ("390 light", "1280 dark", "390 dark")
AA = 4.5


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_text_contrast(visits, page, view):
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    if only_redirects(page):
        pytest.skip(f"{page} only redirects")
    seen = visits.of(page, view)
    assert seen["theme"] == view.split()[1], seen["theme"]
    low = [
        f"{kind}: {facts['min']}:1 ({facts['where']!r})"
        for kind, facts in seen["contrast"]["text"].items()
        if facts["min"] < AA
    ]
    assert not low, f"{page} ({view}): contrast below {AA}:1:\n" + "\n".join(low)
    if seen["theme"] == "dark":
        dimmed = [i for i in seen["contrast"]["images"] if i["filter"] != "none"]
        assert not dimmed, f"{page} ({view}): dimmed pictures: {dimmed[:3]}"
        dark = [i for i in seen["contrast"]["images"] if sum(i["background"][:3]) < 600]
        assert not dark, f"{page} ({view}): pictures on a dark background: {dark[:3]}"
    assert not seen["problems"], f"{page} ({view}):\n" + "\n".join(seen["problems"])


def test_caption_contrast_in_both_themes(visits):
    """The caption under a live figure reads in light and dark mode (chapter 3)."""
    page = "notebooks/03_bucketing_overlap.html"
    if not (SITE / page).exists():
        pytest.skip(f"no built chapter 3 in {SITE}: build it first with `make book`")
    # the caption as the page arrives (once Python runs, it says so instead)
    for view in ("390 light", "390 dark"):
        caption = visits.of(page, view)["contrast"]["text"]
        for kind in ("caption", "caption code"):
            assert caption[kind]["min"] >= AA, (view, kind, caption[kind])


def test_theme_button_switches_light_and_dark(site, chromium):
    """Each click of the theme button changes the theme: light, dark, light."""
    for scheme in ("light", "dark"):
        with browser.open_page(
            chromium, f"{site}/book/intro.html", color_scheme=scheme
        ) as (tab, problems):
            seen = [tab.evaluate("() => document.documentElement.dataset.theme")]
            for _ in range(3):
                tab.locator(".theme-switch-button").first.click()
                seen.append(
                    tab.evaluate("() => document.documentElement.dataset.theme")
                )
            other = "dark" if scheme == "light" else "light"
            assert seen == [scheme, other, scheme, other], seen
            tab.reload()
            assert (
                tab.evaluate("() => document.documentElement.dataset.theme") == other
            ), "the chosen theme is not kept"
        assert not problems, "\n".join(problems)
