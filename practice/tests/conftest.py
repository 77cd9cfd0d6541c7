"""Shared fixtures of the judge's tests: the exercises, and every solution and starter graded once."""

import concurrent.futures
import os
import sys

import pytest

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PRACTICE_DIR not in sys.path:
    sys.path.insert(0, PRACTICE_DIR)

from _judge import catalog  # noqa: E402
from _judge.sandbox import grade_file  # noqa: E402

# Two at a time: the machine has 2 cores, and rank exercises spend much of their time waiting.
JOBS = int(os.environ.get("JUDGE_TEST_JOBS", "2"))


def grade_all(exercises, filename):
    with concurrent.futures.ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = {ex.id: pool.submit(grade_file, ex, ex.path(filename)) for ex in exercises}
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="session")
def exercises():
    return catalog.load_exercises()


@pytest.fixture(scope="session")
def graded_solutions(exercises):
    """Every reference solution, graded once per test session (in parallel)."""
    return grade_all(exercises, "solution.py")


@pytest.fixture(scope="session")
def graded_starters(exercises):
    """Every untouched starter, graded once per test session (in parallel)."""
    return grade_all(exercises, "starter.py")
