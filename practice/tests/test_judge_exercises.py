"""Exercises are complete, reference solutions pass, untouched starters fail."""

import ast
import glob
import os
import re
import sys

import pytest

from _judge import catalog

EXERCISES = catalog.load_exercises()
IDS = [ex.id for ex in EXERCISES]


def test_there_are_enough_exercises_and_every_chapter_has_one():
    assert len(EXERCISES) >= 27
    assert {ex.chapter for ex in EXERCISES} == set(range(1, 10))
    assert {ex.difficulty for ex in EXERCISES} == {"easy", "medium", "hard"}
    assert len({ex.slug for ex in EXERCISES}) == len(EXERCISES), (
        "slugs (and so book labels) must be unique"
    )
    assert sorted(ex.number for ex in EXERCISES) == [
        f"{i:02d}" for i in range(1, len(EXERCISES) + 1)
    ]


def test_exercises_come_in_the_book_s_order_with_one_id_each():
    """Chapter by chapter, each chapter's numbered 1, 2, ... in folder order."""
    assert [ex.order for ex in EXERCISES] == sorted(ex.order for ex in EXERCISES)
    for chapter in {ex.chapter for ex in EXERCISES}:
        mine = [ex for ex in EXERCISES if ex.chapter == chapter]
        assert [ex.index for ex in mine] == list(range(1, len(mine) + 1))
        assert [ex.number for ex in mine] == sorted(ex.number for ex in mine)
    assert len({ex.short for ex in EXERCISES}) == len(EXERCISES)


def test_at_least_six_bug_hunts_each_citing_a_public_thread_over_three_levels():
    hunts = [ex for ex in EXERCISES if ex.bug_hunt]
    assert len(hunts) >= 6
    for ex in hunts:
        readme = open(ex.path("README.md"), encoding="utf-8").read()
        assert "## The symptom" in readme or ex.number == "13", ex.id
        assert "## Where it comes from" in readme, ex.id
        cited = readme.split("## Where it comes from", 1)[1]
        assert re.search(
            r"https://github\.com/[\w.-]+/[\w.-]+/(pull|issues)/\d+", cited
        ), f"{ex.id} cites no public thread"
    assert {ex.difficulty for ex in hunts} == {"easy", "medium", "hard"}


# Where a reader meets an exercise's id: every one is an id of the catalog, and a
# two-digit folder number is never shown as one.
ID_TEXTS = [
    os.path.join(os.path.dirname(catalog.EXERCISES_DIR), "README.md"),
    os.path.join(
        os.path.dirname(os.path.dirname(catalog.EXERCISES_DIR)), "book", "practice.md"
    ),
] + [
    ex.path(name)
    for ex in EXERCISES
    for name in ("README.md", "hints.md", "starter.py", "solution.py", "checks.py")
]
# The chapters and the book's pages name the graded exercises by the same ids.
_ROOT = os.path.dirname(os.path.dirname(catalog.EXERCISES_DIR))
ID_TEXTS += sorted(glob.glob(os.path.join(_ROOT, "notebooks", "*.ipynb")))
ID_TEXTS += sorted(glob.glob(os.path.join(_ROOT, "book", "*.md")))
ID_TEXTS.append(os.path.join(_ROOT, "README.md"))


def test_every_text_names_exercises_by_their_one_id():
    shorts = {ex.short for ex in EXERCISES}
    named = re.compile(
        r"(?:[Ee]xercises?|judge\.py(?: hint| show| reset| watch)?|Hints? for) "
        r"(\d+(?:\.\d+)?)(?![\d_])"
    )
    for path in ID_TEXTS:
        text = open(path, encoding="utf-8").read()
        for m in named.finditer(text):
            assert m[1] in shorts, (
                f"{os.path.relpath(path)}: {m[0]!r} is no exercise id"
            )


@pytest.mark.parametrize("exercise_id", IDS)
def test_exercise_is_complete(exercise_id):
    ex = catalog.find(EXERCISES, exercise_id)
    assert len(ex.hints()) >= 1
    readme = open(ex.path("README.md"), encoding="utf-8").read()
    for section in ("## What to write", "## Example", "## What is checked"):
        assert section in readme, f"{ex.id}/README.md lacks '{section}'"
    assert readme.startswith(f"# {ex.short} · {ex.title}\n")
    hints = open(ex.path("hints.md"), encoding="utf-8").read()
    assert hints.startswith(f"# Hints for {ex.short} · {ex.title}\n")
    starter = open(ex.path("starter.py"), encoding="utf-8").read()
    assert starter.startswith(f'"""Exercise {ex.short}: ')
    assert f"python practice/judge.py {ex.short}" in starter, (
        "the starter says how to grade it"
    )
    from _judge.loading import load_checks
    from _judge.running import collect_checks

    assert len(collect_checks(load_checks(ex.dir))) >= 3


@pytest.mark.parametrize("exercise_id", [ex.id for ex in EXERCISES if ex.browser])
def test_browser_exercises_need_only_the_standard_library(exercise_id):
    """What the page runs must import only the standard library.

    Pyodide has no torch or numpy.
    """
    ex = catalog.find(EXERCISES, exercise_id)
    assert not ex.ranks
    for name in ("checks.py", "solution.py", "starter.py"):
        tree = ast.parse(open(ex.path(name), encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                )
                for module in modules:
                    top = module.split(".")[0]
                    assert top in sys.stdlib_module_names or top == "_judge", (
                        f"{ex.id}/{name} imports {module}"
                    )


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("exercise_id", IDS)
def test_reference_solution_passes(exercise_id, graded_solutions):
    report = graded_solutions[exercise_id]
    failures = [r for r in report.results if r["status"] != "passed"]
    assert report.passed, (
        f"{exercise_id}: {report.verdict}: "
        f"{report.message}\n{failures}\n{report.printed}"
    )


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("exercise_id", IDS)
def test_untouched_starter_fails(exercise_id, graded_starters):
    report = graded_starters[exercise_id]
    assert not report.passed
    assert report.results, (
        f"{exercise_id}: the starter must load and reach the checks ({report.message})"
    )
    first = next(r for r in report.results if r["status"] != "passed")
    # An untouched starter says "not written yet", except a bug hunt's, whose
    # starter is the script with its bug: it runs, and a check finds the bug.
    if catalog.find(EXERCISES, exercise_id).bug_hunt:
        assert first["status"] in ("failed", "hang", "error"), first
    else:
        assert first["status"] == "todo", first


def test_the_readme_lists_every_exercise_for_chapter_authors():
    readme = open(
        os.path.join(os.path.dirname(catalog.EXERCISES_DIR), "README.md"),
        encoding="utf-8",
    ).read()
    rows = [
        f"| {ex.short} | `{ex.id}` | `{ex.label}` | {ex.difficulty} |"
        for ex in EXERCISES
    ]
    found = [
        row for line in readme.splitlines() for row in rows if line.startswith(row)
    ]
    assert found == rows, "the table lists every exercise, in the book's order"
