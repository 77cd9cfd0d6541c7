"""The built site, opened page by page in a real browser (headless Chromium).

A reader opens the static site with no kernel and, often, no network. Every
page must load with no JavaScript error, no failed request and no request that
leaves the machine (math, fonts, figures and interactive figures are all served
by the site itself), and no link inside the site may be broken. Each chapter's
first screen is shot into ``_build/screenshots/`` for a human to look at (the whole
chapter with ``BOOK_FULL_SCREENSHOTS=1``, and in ``make bench``).

Needs the site built first (``make book``; ``make test`` builds it before running
these) and Chromium (``apt-get install -y chromium``).
"""

import html.parser
import posixpath
import re
import urllib.parse

import pytest
from conftest import SITE

pytestmark = pytest.mark.browser


browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)


def site_pages():
    """Every HTML page of the built site, as paths relative to its root."""
    if not (SITE / "index.html").exists():
        return []
    skip = ("_static/", "_sources/", "_images/")
    return sorted(
        p.relative_to(SITE).as_posix()
        for p in SITE.rglob("*.html")
        if not p.relative_to(SITE).as_posix().startswith(skip)
    )


def chapter_pages():
    return [p for p in site_pages() if p.startswith("notebooks/")]


# --- links: parsed from the HTML files themselves, so every href is checked ---


class _Anchors(html.parser.HTMLParser):
    """Collects each page's link targets and the ids it defines."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("link", "script", "img") and (attrs.get("href") or attrs.get("src")):
            target = attrs.get("href") or attrs.get("src")
            if tag != "link" or attrs.get("rel") in (
                "stylesheet",
                "preload",
                "icon",
                "prev",
                "next",
            ):
                self.links.append(target)


def _parse(page):
    parser = _Anchors()
    parser.feed((SITE / page).read_text(encoding="utf-8"))
    return parser


def test_site_has_the_book():
    pages = site_pages()
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    for expected in (
        "book/intro.html",
        "book/setup.html",
        "book/glossary.html",
        "book/references.html",
        "book/benchmarks.html",
        "search.html",
    ):
        assert expected in pages, (
            f"{expected} missing from the built site; is it in _toc.yml?"
        )


def test_no_broken_internal_link():
    pages = site_pages()
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    parsed = {page: _parse(page) for page in pages}
    broken = []
    for page, anchors in parsed.items():
        for href in anchors.links:
            url = urllib.parse.urlsplit(href)
            if (
                url.scheme in ("http", "https", "mailto", "data", "javascript")
                or url.netloc
            ):
                continue
            path = urllib.parse.unquote(url.path)
            target = (
                posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
                if path
                else page
            )
            if target.startswith(".."):
                broken.append(f"{page}: {href} points outside the site")
                continue
            file = SITE / target
            if file.is_dir():
                file = file / "index.html"
                target = posixpath.join(target, "index.html")
            if not file.exists():
                broken.append(f"{page}: {href} -> {target} does not exist")
            elif url.fragment and target.endswith(".html") and target in parsed:
                if url.fragment not in parsed[target].ids:
                    broken.append(
                        f"{page}: {href} -> no id '{url.fragment}' in {target}"
                    )
    assert not broken, "broken links in the built site:\n" + "\n".join(broken)


# --- every page in the browser ---


@pytest.mark.parametrize("page", site_pages() or ["(site not built)"])
def test_page_loads_offline(visits, page):
    """No JavaScript error, failed request or request that leaves the machine.

    For the whole visit (site_visits.py): while the page loads, while every live
    figure's sliders move, while every fold opens. Chapters are screenshot.
    """
    if page == "(site not built)":
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    seen = visits.of(page)
    assert seen["title"], f"{page} has no title"
    assert not seen["problems"], f"{page}:\n" + "\n".join(seen["problems"])


def test_math_renders_offline(site, chromium):
    with browser.open_page(chromium, f"{site}/book/glossary.html") as (tab, problems):
        tab.wait_for_selector("mjx-container", timeout=15000)
        assert tab.locator("mjx-container").count() >= 5
    assert not problems, "\n".join(problems)


def test_arrow_keys_go_to_the_next_and_previous_page(site, chromium):
    with browser.open_page(chromium, f"{site}/book/intro.html") as (tab, problems):
        next_href = tab.locator("a.right-next").get_attribute("href")
        assert next_href, "the introduction has no 'next' link"
        tab.keyboard.press("ArrowRight")
        tab.wait_for_url(
            "**/" + posixpath.basename(next_href.split("#")[0]), timeout=10000
        )
        tab.keyboard.press("ArrowLeft")
        tab.wait_for_url("**/book/intro.html", timeout=10000)
    assert not problems, "\n".join(problems)


def test_search_finds_a_glossary_term(site, chromium):
    with browser.open_page(chromium, f"{site}/search.html?q=all-reduce") as (
        tab,
        problems,
    ):
        tab.wait_for_selector("#search-results ul.search li", timeout=20000)
        hits = tab.locator("#search-results ul.search li a").evaluate_all(
            "els => els.map(e => e.href)"
        )
        assert any("glossary" in h for h in hits), hits
    assert not problems, "\n".join(problems)


def repository_url():
    """``repository.url`` of ``_config.yml`` (empty when the book names none)."""
    import yaml

    config = yaml.safe_load((SITE.parent.parent / "_config.yml").read_text())
    return ((config.get("repository") or {}).get("url") or "").strip()


def test_page_buttons(site, chromium):
    """Every page offers its source for download (chapters their .ipynb too).

    The edit, issues and repository buttons appear only when ``_config.yml``
    names the repository, and then point at that address.
    """
    url = repository_url()
    pages = ["book/intro.html"] + chapter_pages()[:1]
    for page in pages:
        with browser.open_page(chromium, f"{site}/{page}") as (tab, problems):
            edit = tab.locator("a.btn-source-edit-button")
            repo_links = tab.locator(
                ".article-header-buttons a[href*='://']"
            ).evaluate_all("els => els.map(e => e.href)")
            if url:
                assert edit.count() == 1, f"{page}: no 'edit this page' button"
                assert edit.get_attribute("href").startswith(url + "/edit/")
                assert all(h.startswith(url) for h in repo_links), repo_links
            else:
                assert edit.count() == 0 and not repo_links, (
                    f"{page}: repository buttons with no repository.url set: "
                    f"{repo_links}"
                )
            downloads = tab.locator(".dropdown-download-buttons a").evaluate_all(
                "els => els.map(e => e.href)"
            )
            source = "ipynb" if page.startswith("notebooks/") else "md"
            assert any(h.endswith("." + source) for h in downloads), (
                f"{page}: no .{source} download in {downloads}"
            )
            for href in downloads:
                if href.startswith(site):
                    assert tab.request.get(href).ok, f"{page}: download {href} fails"
        assert not problems, f"{page}:\n" + "\n".join(problems)


# An address the project once printed and nothing confirms.
UNVERIFIED_ADDRESSES = ("github.com/data-parallel-from-scratch",)


def test_no_page_names_an_unconfirmed_repository_address():
    """The repository's address is written once, in ``_config.yml``.

    No page names another: a repository link on a page is the configured
    address (or there is none), and the address nobody confirmed is gone.
    """
    pages = site_pages()
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    url = repository_url()
    found = []
    for page in pages:
        text = (SITE / page).read_text(encoding="utf-8")
        for address in UNVERIFIED_ADDRESSES:
            if address in text and address not in url:
                found.append(f"{page}: {address}")
    assert not found, "pages name an address nobody confirmed:\n" + "\n".join(found)


def test_one_search_box_and_slash_opens_it(site, chromium):
    """One search box (the sidebar's; no top bar with a second one).

    '/' and 's' open the search, as on mdBook and Sphinx sites; Ctrl+K too.
    """
    with browser.open_page(chromium, f"{site}/book/intro.html") as (tab, problems):
        visible = tab.locator(".search-button-field:visible")
        assert visible.count() == 1, f"{visible.count()} search boxes on the page"
        assert (
            tab.locator(".bd-header").count() == 0
            or not tab.locator(".bd-header").is_visible()
        ), "the theme's top bar is back"
        for key in ("/", "s", "Control+k"):
            # No field has focus (a click could land on a link and leave the page).
            tab.evaluate(
                "() => document.activeElement && document.activeElement.blur()"
            )
            tab.keyboard.press(key)
            dialog = tab.locator("#pst-search-dialog")
            tab.wait_for_function(
                "() => document.querySelector('#pst-search-dialog').open",
                timeout=5000,
            )
            focused = tab.evaluate("() => document.activeElement.name")
            assert focused == "q", f"{key}: the search field has no focus"
            tab.keyboard.type("all-reduce")
            assert dialog.locator("input").input_value() == "all-reduce"
            tab.keyboard.press("Escape")
            tab.wait_for_function(
                "() => !document.querySelector('#pst-search-dialog').open",
                timeout=5000,
            )
    assert not problems, "\n".join(problems)


def test_question_mark_lists_the_keys(site, chromium):
    """'?' opens a dialog listing the site's keys; Esc closes it."""
    with browser.open_page(chromium, f"{site}/book/intro.html") as (tab, problems):
        tab.evaluate("() => document.activeElement && document.activeElement.blur()")
        tab.keyboard.press("?")
        dialog = tab.locator("dialog.book-keys")
        dialog.wait_for(state="visible", timeout=5000)
        text = dialog.inner_text()
        for key in ("/", "s", "Ctrl", "K", "?", "Esc", "\u2190", "\u2192"):
            assert key in text, f"{key!r} is not in the key list: {text}"
        tab.keyboard.press("Escape")
        dialog.wait_for(state="hidden", timeout=5000)
        # in a text field, '?' is a character
        tab.keyboard.press("/")
        tab.wait_for_function(
            "() => document.querySelector('#pst-search-dialog').open", timeout=5000
        )
        tab.keyboard.press("?")
        assert not dialog.is_visible()
        assert tab.locator("#pst-search-dialog input").input_value() == "?"
    assert not problems, "\n".join(problems)


def test_every_page_has_an_icon():
    """Each page names an icon that the site has (no /favicon.ico 404), the
    ``index.html`` that sends the reader on included."""
    pages = site_pages()
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    missing = []
    for page in pages:
        html_text = (SITE / page).read_text(encoding="utf-8")
        icon = re.search(r'<link rel="icon" href="([^"]+)"', html_text)
        if not icon:
            missing.append(f"{page}: no <link rel=icon>")
            continue
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page), icon[1]))
        if not (SITE / target).exists():
            missing.append(f"{page}: {icon[1]} does not exist")
    assert not missing, "\n".join(missing)


def test_exercises_link_to_their_solutions(site, chromium):
    """sphinx-exercise: numbered exercises; each solution links back to its exercise."""
    pages = [
        p
        for p in chapter_pages()
        if 'class="solution' in (SITE / p).read_text(encoding="utf-8")
    ]
    if not pages:
        pytest.skip("no chapter with an {exercise}/{solution} pair built yet")
    for page in pages:
        parsed = _parse(page)
        text = (SITE / page).read_text(encoding="utf-8")
        assert "Exercise 1" in text or "Exercise " in text, (
            f"{page}: exercises are not numbered"
        )
        solution_links = [
            h for h in parsed.links if h.startswith("#") and h[1:] in parsed.ids
        ]
        assert solution_links, f"{page}: no solution links to its exercise"


def live_figure_pages():
    """Chapter pages whose built HTML holds an interactive (Pyodide-backed) figure."""
    return [
        p
        for p in chapter_pages()
        if 'class="livefig"' in (SITE / p).read_text(encoding="utf-8")
        and "data-module=" in (SITE / p).read_text(encoding="utf-8")
    ]


@pytest.mark.parametrize("page", live_figure_pages() or ["(no live figure built)"])
def test_every_chapter_live_figure_redraws(visits, page):
    """On each chapter with live figures, the default drawing shows.

    Then sliders move (each redraw at its slider's position: site_visits.measure),
    and a last jump of each figure's first slider to the other end of its range
    redraws it with the book's Python.
    """
    if page == "(no live figure built)":
        pytest.skip("no chapter with a live figure in the built site yet")
    for i, fig in enumerate(visits.of(page)["figures"]):
        before = fig["before"]
        assert "<svg" in before or "<table" in before, (
            f"{page}: figure {i} shows no default drawing"
        )
        assert fig["figure_visible"], f"{page}: figure {i}'s drawing is hidden"
        assert fig["controls_visible"], f"{page}: figure {i}'s sliders are hidden"
        assert not fig["jupyter_visible"], (
            f"{page}: figure {i} shows JupyterLab's picture on the site"
        )
        width = fig["slider_width"]
        assert width >= 200, f"{page}: figure {i}'s sliders are {width} px wide"
        assert fig["state"] == "live", (
            f"{page}: figure {i} ended in state {fig['state']}: {fig['status']}"
        )
        assert fig["changed"], (
            f"{page}: figure {i} did not change when its slider moved"
        )
