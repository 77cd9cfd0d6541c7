"""The practice page in a real browser: exercises written and graded there, offline.

The page is generated from the judge's metadata, and grades the exercises
that need only Python on Pyodide with the judge's own checks. Here, in
headless Chromium with no network: every reference solution passes in the
page; a wrong answer fails with the same lines the terminal judge prints; a
syntax error reads the same; an infinite loop is stopped and the next
grading still works; the reader's code survives a reload.

Needs the site built first (``make book``; or ``BOOK_SITE`` pointing at a site
built elsewhere) and Chromium (``apt-get install -y chromium``).
"""

import os
import pathlib
import sys

import pytest

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = pathlib.Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html")).resolve()
PAGE = "book/practice.html"
sys.path.insert(0, str(ROOT / "practice"))

from _judge import catalog  # noqa: E402
from _judge.browser import report_lines  # noqa: E402
from _judge.sandbox import grade_file  # noqa: E402

browser = pytest.importorskip(
    "browser", reason="tests/browser.py (shared browser helpers) is missing"
)

EXERCISES = catalog.load_exercises()
IN_PAGE = [ex for ex in EXERCISES if ex.browser]
BUCKETS = catalog.find(EXERCISES, "06")

WRONG_BUCKETS = """\
def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    # Wrong on purpose: forward order instead of backward order.
    buckets, current, size = [], [], 0
    for i, b in enumerate(param_bytes):
        current.append(i)
        size += b
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
"""


@pytest.fixture(scope="module")
def page(site, chromium):
    if not (SITE / PAGE).exists():
        pytest.skip(
            f"no practice page in {SITE}: build the site first with `make book`"
        )
    with browser.open_page(chromium, f"{site}/{PAGE}") as (p, problems):
        p.problems = problems
        yield p


def grade_in_page(page, exercise, code, timeout_ms=120_000):
    """Type ``code`` into the exercise's editor, press Grade, wait.

    Returns (verdict, text).
    """
    box = page.locator(f'.practice-editor[data-exercise="{exercise.id}"]')
    box.locator(".practice-code").fill(code)
    box.locator(".practice-grade").click()
    page.wait_for_function(
        "id => { const r = "
        "document.querySelector(`.practice-editor[data-exercise='${id}'] "
        ".practice-result`); return r && r.dataset.verdict; }",
        arg=exercise.id,
        timeout=timeout_ms,
    )
    result = box.locator(".practice-result")
    return result.get_attribute("data-verdict"), result.inner_text()


def judge_lines(exercise, code, tmp_path):
    """What the terminal judge says about the same code, as the page's lines."""
    path = tmp_path / "mine.py"
    path.write_text(code)
    report = grade_file(exercise, str(path))
    return report, [
        text
        for _, text in report_lines(
            {
                "verdict": report.verdict,
                "message": report.message,
                "where": report.where,
                "results": report.results,
            }
        )
    ]


def test_the_page_lists_every_exercise_from_the_metadata(page):
    for ex in EXERCISES:
        assert page.locator(f"#{ex.label}").count() == 1, (
            f"no section labelled {ex.label}"
        )
        heading = page.locator(f"xpath=//*[@id='{ex.label}']/following::h2[1]")
        assert f"{ex.short} · {ex.title}" in heading.inner_text().replace(
            "\u2019", "'"
        )  # smart quotes
    editors = page.locator(".practice-editor")
    assert sorted(
        editors.evaluate_all("els => els.map(e => e.dataset.exercise)")
    ) == sorted(ex.id for ex in IN_PAGE)
    # The starter is in the page before any script runs: readable at once.
    first = IN_PAGE[0]
    assert (
        "raise NotImplementedError"
        in page.locator(
            f'.practice-editor[data-exercise="{first.id}"] textarea'
        ).input_value()
    )


@pytest.mark.parametrize("exercise_id", [ex.id for ex in IN_PAGE])
def test_reference_solution_passes_in_the_page(page, exercise_id):
    ex = catalog.find(EXERCISES, exercise_id)
    verdict, text = grade_in_page(
        page, ex, open(ex.path("solution.py"), encoding="utf-8").read()
    )
    assert verdict == "passed", text
    assert "PASSED: all" in text


def test_wrong_answer_fails_with_the_judges_own_lines(page, tmp_path):
    verdict, text = grade_in_page(page, BUCKETS, WRONG_BUCKETS)
    report, lines = judge_lines(BUCKETS, WRONG_BUCKETS, tmp_path)
    assert verdict == report.verdict == "failed"
    assert "FAIL    the first example of the statement" in text
    for line in lines:  # every line the terminal prints, the page prints too
        assert line.strip() in text, (
            f"the page lacks the judge's line {line!r}\n--- page ---\n{text}"
        )


def test_untouched_starter_says_not_written_yet(page, tmp_path):
    starter = open(BUCKETS.path("starter.py"), encoding="utf-8").read()
    verdict, text = grade_in_page(page, BUCKETS, starter)
    report, lines = judge_lines(BUCKETS, starter, tmp_path)
    assert verdict == "failed" and "TODO" in text and "not written yet" in text
    assert [line.strip() for line in lines if line.strip()] == [
        line.strip() for line in text.splitlines() if line.strip()
    ]


def test_syntax_error_reads_as_in_the_terminal(page, tmp_path):
    code = "def buckets_for_parameters(param_bytes, cap_bytes:\n    return []\n"
    verdict, text = grade_in_page(page, BUCKETS, code)
    report, _ = judge_lines(BUCKETS, code, tmp_path)
    assert verdict == report.verdict == "syntax error"
    assert report.message in text


def test_infinite_loop_is_stopped_and_the_page_recovers(page):
    page.evaluate("window.PRACTICE_TIME_LIMIT_S = 3")
    try:
        loop = (
            "def buckets_for_parameters(param_bytes, cap_bytes, "
            "first_cap_bytes=None):\n"
            "    while True:\n"
            "        pass\n"
        )
        verdict, text = grade_in_page(page, BUCKETS, loop)
        assert verdict == "timeout"
        assert (
            "time limit of 3 s during the check 'the first example of the statement'"
            in text
        )
    finally:
        page.evaluate("window.PRACTICE_TIME_LIMIT_S = undefined")
    verdict, text = grade_in_page(
        page, BUCKETS, open(BUCKETS.path("solution.py"), encoding="utf-8").read()
    )
    assert verdict == "passed", text


def test_code_is_kept_across_a_reload_and_hints_show(page):
    box = page.locator(f'.practice-editor[data-exercise="{BUCKETS.id}"]')
    box.locator(".practice-code").fill("# my work in progress\n")
    box.locator(".practice-code").dispatch_event("input")
    page.reload()
    box = page.locator(f'.practice-editor[data-exercise="{BUCKETS.id}"]')
    assert box.locator(".practice-code").input_value() == "# my work in progress\n"
    box.locator(".practice-hint").click()
    page.wait_for_selector(
        f'.practice-editor[data-exercise="{BUCKETS.id}"] .practice-hint-text'
    )
    hint = box.locator(".practice-hint-text").first
    assert hint.inner_text().startswith(f"Hint 1 of {len(BUCKETS.hints())}")
    # The hint's Markdown is rendered: code as code, no backticks, no hard breaks.
    if "`" in BUCKETS.hints()[0]:
        assert hint.locator("code").count() > 0
    assert "`" not in hint.inner_text()
    assert hint.evaluate("e => getComputedStyle(e).whiteSpace") == "normal"
    box.locator(".practice-reset").click()
    page.wait_for_function(
        "id => document.querySelector(`.practice-editor[data-exercise='${id}'] "
        "textarea`).value.includes('NotImplementedError')",
        arg=BUCKETS.id,
    )


def test_no_errors_and_no_network(page):
    assert not page.problems, "\n".join(page.problems)
