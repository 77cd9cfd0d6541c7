"""Shared fixtures of the judge's tests.

The exercises, and every solution and starter graded once.
"""

import concurrent.futures
import os
import sys

import pytest

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PRACTICE_DIR not in sys.path:
    sys.path.insert(0, PRACTICE_DIR)

from _judge import catalog  # noqa: E402
from _judge.sandbox import grade_file  # noqa: E402

# Two at a time: the machine has 2 cores, and rank exercises spend much of their time
# waiting.
JOBS = int(os.environ.get("JUDGE_TEST_JOBS", "2"))


def grade_everything(exercises):
    """Every reference solution and untouched starter, graded once, ``JOBS`` at a time.

    One pool for both keeps both cores busy to the end; rank exercises go first, being
    the slowest.
    """
    jobs = [(ex, name) for name in ("solution.py", "starter.py") for ex in exercises]
    jobs.sort(key=lambda job: not job[0].ranks)
    with concurrent.futures.ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = {
            (ex.id, name): pool.submit(grade_file, ex, ex.path(name))
            for ex, name in jobs
        }
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="session")
def exercises():
    return catalog.load_exercises()


@pytest.fixture(scope="session")
def graded(exercises):
    return grade_everything(exercises)


@pytest.fixture(scope="session")
def graded_solutions(exercises, graded):
    """Every reference solution's report, by exercise id."""
    return {ex.id: graded[ex.id, "solution.py"] for ex in exercises}


@pytest.fixture(scope="session")
def graded_starters(exercises, graded):
    """Every untouched starter's report, by exercise id."""
    return {ex.id: graded[ex.id, "starter.py"] for ex in exercises}
