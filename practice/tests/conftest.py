"""Shared fixtures of the judge's tests.

The exercises, and every solution and starter graded once. And no test
leaves anything behind: every temporary file of the session (the judge's
work folders, pytest's own) lies in one folder that must hold nothing else
at the end, and no process of a test outlives it.
"""

import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
import types

import pytest
from hypothesis import settings

# No timing asserts (tests/conftest.py says why): no deadline for any example.
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")

# The judge commands the tests run start their own grading service and stop it
# when they end: no process outlives a test.
os.environ["JUDGE_SERVER_IDLE_S"] = "0"
# `make test` runs these beside the library's tests and the notebooks, on 2 cores: a
# check on ranks that takes 4 s alone took more than its 12 s limit there. The tests
# of the limits themselves give theirs explicitly.
os.environ.setdefault("JUDGE_TIME_SCALE", "3")
SESSION_TMP = tempfile.mkdtemp(prefix="practice-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TMP
PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PRACTICE_DIR not in sys.path:
    sys.path.insert(0, PRACTICE_DIR)

from _judge import catalog, sandbox  # noqa: E402
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


@pytest.fixture(scope="session", autouse=True)
def one_fork_server(exercises):
    """One fork server for every grade of the session, as ``judge.py``'s grading
    service is for a reader's grades: torch is imported once, not once a grade.

    ``grade_file`` starts a server of its own when given none; here it gets this
    one, which a grade does not close.
    """
    shared = sandbox.Server(sandbox.preload_for(exercises))
    server_per_grade = sandbox.Server

    def server_for_a_grade(preload=()):
        if not set(preload) <= set(shared.preload):
            return server_per_grade(preload)
        return types.SimpleNamespace(
            preload=shared.preload, start_job=shared.start_job, close=lambda: None
        )

    sandbox.Server = server_for_a_grade
    try:
        yield shared
    finally:
        sandbox.Server = server_per_grade
        shared.close()


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


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """After each test, no new process below this one (servers, ranks, detached
    ones); helpers that were there before (multiprocessing's) do not count."""
    from _judge import server

    before = set(server.descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 10.0
    while set(server.descendants(os.getpid())) - before:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)  # a service asked to stop is still on its way out
    left = sorted(set(server.descendants(os.getpid())) - before)
    for pid in left:
        server.kill_descendants(pid)
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    assert not left, f"processes left behind: {left}"


def pytest_sessionfinish(session, exitstatus):
    """Every temporary file the session made is gone, but pytest's own folder."""
    import multiprocessing.util

    # torch's own per-user cache folder (made when torch._dynamo is imported, in
    # every program that imports it, as in /tmp normally) is not the judge's, nor
    # multiprocessing's folder, which it removes itself at exit.
    theirs = ("pytest-of-", "torchinductor_", "pymp-")
    left = sorted(n for n in os.listdir(SESSION_TMP) if not n.startswith(theirs))
    for name in os.listdir(SESSION_TMP):
        if not name.startswith("pymp-"):
            shutil.rmtree(os.path.join(SESSION_TMP, name), ignore_errors=True)
    # The folder itself after multiprocessing's (exit priority -100) is gone.
    multiprocessing.util.Finalize(None, _remove_folder, exitpriority=-101)
    if left and exitstatus == 0:
        session.exitstatus = 1
        print(f"\ntemporary files left behind by the tests: {left}", file=sys.stderr)


def _remove_folder():
    try:
        os.rmdir(SESSION_TMP)
    except OSError:
        pass
