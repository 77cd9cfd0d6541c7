"""One numbering: a number names a graded exercise, and nothing else.

The graded exercises have ids by chapter (3.1 is the practice page's "Assign
parameters to buckets"; practice/tests/test_judge_exercises.py checks every text
that names one). A chapter's own exercises, answered in a dropdown beside them,
carry a title instead (``:::{exercise} The best cap`` with ``:nonumber:``): the
site shows "Exercise (The best cap)", never an "Exercise 3.1" that would be
another exercise than the graded 3.1.
"""

import json
import re

import pytest
from conftest import ROOT, SITE

EXERCISE = re.compile(
    r"^(:{3,})\{exercise\}(?P<title>[^\n]*)\n(?P<opts>(?::[^\n]*\n)*)", re.M
)


def chapter_exercises():
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            if cell["cell_type"] == "markdown":
                for match in EXERCISE.finditer("".join(cell["source"])):
                    yield notebook.name, match


def test_a_chapters_own_exercises_are_titled_not_numbered():
    found = list(chapter_exercises())
    assert len(found) >= 20
    for name, match in found:
        assert match["title"].strip(), f"{name}: an exercise without a title"
        assert ":nonumber:" in match["opts"], f"{name}: {match['title']} is numbered"


# It reads the built site, which `make test` builds after the unit tests: it runs
# with the browser tests (after test-book), not before the site exists.
@pytest.mark.browser
def test_the_site_shows_no_numbered_chapter_exercise():
    pages = sorted((SITE / "notebooks").glob("0*.html"))
    if not pages:
        pytest.skip(f"no built site in {SITE}: build it first with `make book`")
    titled = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        titles = [
            re.sub(r"<[^>]+>", "", t)
            for t in re.findall(r'<p class="admonition-title">(.*?)</p>', text, re.S)
        ]
        for title in titles:
            assert not re.match(r"(Solution to )?Exercise \d", title), (
                page.name,
                title,
            )
        titled += sum(t.startswith("Exercise (") for t in titles)
    assert titled >= 20, "the chapters show fewer titled exercises than they have"
