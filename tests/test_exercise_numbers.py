"""Exercises numbered within their chapter: 6.1, 6.2 ...

book/_ext/exercise_numbers.py renumbers them.

The renumbering itself is checked here; on the built site, each chapter's first
exercise must read "Exercise N.1" and no chapter may show a book-wide number.
"""

import re
import sys

import pytest
from conftest import ROOT, SITE

sys.path.insert(0, str(ROOT / "book" / "_ext"))
import exercise_numbers  # noqa: E402


def test_chapter_of_reads_the_number_that_starts_the_notebook_name():
    assert exercise_numbers.chapter_of("notebooks/06_zero") == 6
    assert exercise_numbers.chapter_of("notebooks/00_quickstart") == 0
    assert exercise_numbers.chapter_of("book/practice") is None


def test_per_chapter_keeps_the_page_order_and_restarts_at_one():
    book_wide = {"ex-b": (17,), "ex-a": (16,), "ex-c": (18,)}
    assert exercise_numbers.per_chapter(book_wide, 6) == {
        "ex-a": (6, 1),
        "ex-b": (6, 2),
        "ex-c": (6, 3),
    }


# It reads the built site, which `make test` builds after the unit tests: it runs
# with the browser tests (after test-book), not before the site exists.
@pytest.mark.browser
def test_the_site_numbers_exercises_within_their_chapter():
    pages = sorted((SITE / "notebooks").glob("0*.html"))
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    numbered = 0
    for page in pages:
        chapter = int(page.name[:2])
        text = page.read_text(encoding="utf-8")
        shown = re.findall(r"Exercise (\d+(?:\.\d+)?)", text)
        for number in shown:
            assert number.startswith(f"{chapter}."), f"{page.name}: Exercise {number}"
        if shown:
            assert f"Exercise {chapter}.1" in text, page.name
            numbered += 1
    assert numbered, "no chapter page shows a numbered exercise"
