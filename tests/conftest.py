"""Fixtures shared by the browser tests of the built site.

And one rule for every process a test starts: torch's FutureWarnings (what it
will remove) are errors there, as in the tests' own process (pyproject.toml's
``filterwarnings``), in ranks, torchrun's agents and workers, and scripts alike.
"""

import os
import pathlib

import pytest
from hypothesis import settings

# No timing asserts: hypothesis fails an example slower than 200 ms by default, which
# a loaded machine trips (make test runs three to five processes on two cores; a
# chunking example of 137 elements took 420 ms there). No property test has a deadline.
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")

os.environ["PYTHONWARNINGS"] = ",".join(
    filter(None, [os.environ.get("PYTHONWARNINGS"), "error::FutureWarning"])
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
# BOOK_SITE points the tests at a site built elsewhere (jupyter-book --path-output).
SITE = pathlib.Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html")).resolve()


def only_redirects(page):
    """Whether the site's ``page`` (a path under SITE) only sends the reader on."""
    return 'http-equiv="Refresh"' in (SITE / page).read_text(encoding="utf-8")


def pytest_collection_modifyitems(items):
    """Files that hold a slow test first (stable otherwise).

    ``make test`` spreads files over two workers (``--dist loadfile``), each taking
    the next file in this order when it is free: a long file taken last would leave
    the other worker idle at the end.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


def _browser():
    return pytest.importorskip(
        "browser", reason="tests/browser.py (shared browser helpers) is missing"
    )


@pytest.fixture(scope="session")
def site():
    """The built site, served on 127.0.0.1 (skips when it is not built)."""
    if not (SITE / "index.html").exists():
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    with _browser().serve_site(SITE) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (skips, saying how to install it, when it is missing)."""
    with _browser().launch_chromium() as b:
        yield b


@pytest.fixture(scope="session")
def visits(site, chromium):
    """Each page of the site opened once, for every per-page check (site_visits.py)."""
    import json

    import site_visits

    visits = site_visits.Visits(site, chromium, SITE.parent / "screenshots")
    yield visits
    summary = visits.summary()
    if summary:  # widths and contrast of the pages viewed, for comparisons
        path = SITE.parent / "page-views.json"
        previous = json.loads(path.read_text()) if path.exists() else {}
        for page, views in summary.items():
            previous.setdefault(page, {}).update(views)
        path.write_text(json.dumps(previous, indent=1, sort_keys=True))
