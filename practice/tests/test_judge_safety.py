"""Nothing a reader writes can hang the judge, crash it, or lose their work.

Each case writes a reader's file, grades it, and checks the verdict and the
message: a syntax error (with its line), an import error, an exception, an
infinite loop (caught by the per-check alarm, by the process deadline, and
at import time), a hang of ranks in a collective, sys.exit(), os._exit(), a
segfault and a flood of output. The file is never modified by grading.
"""

import hashlib
import os
import subprocess
import sys
import textwrap
import time

import pytest

from _judge import catalog
from _judge.sandbox import grade_file

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(PRACTICE_DIR, "judge.py")
EXERCISES = catalog.load_exercises()
BUCKETS = catalog.find(EXERCISES, "06")  # a fast, standard-library exercise
RING = catalog.find(EXERCISES, "01")  # an exercise on ranks


def write(tmp_path, source, name="mine.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def grade(exercise, path, **kwargs):
    before = digest(path)
    started = time.monotonic()
    report = grade_file(exercise, str(path), **kwargs)
    assert digest(path) == before, "grading must never change the reader's file"
    report.wall = time.monotonic() - started
    return report


def first_problem(report):
    return next(r for r in report.results if r["status"] != "passed")


def test_syntax_error_names_the_line(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            return [[i for i in range(len(param_bytes))]
        x = (
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "syntax error"
    assert "line 3" in report.message or "line 2" in report.message
    assert "^" in report.where


def test_import_error_names_the_module(tmp_path):
    path = write(tmp_path, "import no_such_module_here\n")
    report = grade(BUCKETS, path)
    assert report.verdict == "import error"
    assert "no_such_module_here" in report.message
    assert "line 1" in report.where


def test_exception_while_loading(tmp_path):
    path = write(tmp_path, "x = 1\nraise RuntimeError('boom at the top')\n")
    report = grade(BUCKETS, path)
    assert report.verdict == "load error"
    assert "RuntimeError: boom at the top" in report.message
    assert "line 2" in report.where


def test_exception_in_the_function_points_at_its_line(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            ratio = cap_bytes / 0
            return []
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "failed"
    problem = first_problem(report)
    assert problem["status"] == "error"
    assert "ZeroDivisionError" in problem["message"]
    assert (
        "line 2, in buckets_for_parameters: ratio = cap_bytes / 0" in problem["where"]
    )


def test_missing_function_is_named(tmp_path):
    path = write(
        tmp_path, "def assign_bucket(param_bytes, cap_bytes):\n    return []\n"
    )
    problem = first_problem(grade(BUCKETS, path))
    assert problem["status"] == "failed"
    assert "defines no `buckets_for_parameters`" in problem["message"]


def test_wrong_type_is_a_failed_check_not_a_crash(tmp_path):
    path = write(
        tmp_path,
        "def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):\n"
        "    pass\n",
    )
    problem = first_problem(grade(BUCKETS, path))
    assert problem["status"] == "failed"
    assert "should be a list, but it is a NoneType" in problem["message"]


def test_infinite_loop_is_stopped_by_the_check_alarm(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            while True:
                pass
    """,
    )
    report = grade(BUCKETS, path, check_timeout_s=2)
    assert report.verdict == "timeout"
    problem = first_problem(report)
    assert problem["status"] == "timeout" and "time limit of 2 s" in problem["message"]
    assert "line 2" in problem["where"] or "line 3" in problem["where"]
    assert all(r["status"] == "skipped" for r in report.results[1:])
    assert report.wall < 30


def test_loop_that_swallows_the_alarm_is_killed_at_the_deadline(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
    """,
    )
    report = grade(BUCKETS, path, time_limit_s=5, check_timeout_s=1)
    assert report.verdict == "timeout"
    assert "time limit of 1 s" in report.message
    assert "did not stop when its alarm rang" in report.message
    assert (
        "the first example of the statement" in report.message
    )  # the check that was running
    # The judge asked the process for its stack before killing it: the reader's line.
    assert "in buckets_for_parameters" in first_problem(report)["where"]
    assert report.wall < 30


def test_loop_that_ignores_alarm_and_term_shows_its_line(tmp_path):
    path = write(
        tmp_path,
        """        import signal
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            x = 0
            while True:
                x += 1
    """,
    )
    report = grade(BUCKETS, path, check_timeout_s=2)
    assert report.verdict == "timeout"
    where = first_problem(report)["where"]
    assert "line 6" in where or "line 7" in where, where


def test_infinite_loop_at_import_time(tmp_path):
    path = write(tmp_path, "while True:\n    pass\n")
    report = grade(BUCKETS, path, check_timeout_s=2)
    assert report.verdict == "timeout"
    assert "loading your file" in report.message


def test_sys_exit_in_the_function(tmp_path):
    path = write(
        tmp_path,
        """\
        import sys
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            sys.exit(3)
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "exit"
    problem = first_problem(report)
    assert problem["status"] == "exit" and "sys.exit(3)" in problem["message"]
    assert "line 3" in problem["where"]


def test_sys_exit_while_loading(tmp_path):
    path = write(tmp_path, "import sys\nsys.exit()\n")
    report = grade(BUCKETS, path)
    assert report.verdict == "exit"
    assert "sys.exit()" in report.message


def test_os_exit_ends_the_process_mid_check(tmp_path):
    path = write(
        tmp_path,
        """\
        import os
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            os._exit(0)
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "exit"
    assert "the first example of the statement" in report.message
    assert "os._exit()" in report.message


def test_segfault_is_a_crash_with_the_line(tmp_path):
    path = write(
        tmp_path,
        """\
        import ctypes
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            return ctypes.string_at(0)
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "crash"
    assert "segmentation fault" in report.message
    assert "line 3" in report.printed  # faulthandler's stack names the reader's line
    assert first_problem(report)["status"] == "error"


def test_huge_output_is_cut_short(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            while True:
                print("spam " * 200)
    """,
    )
    report = grade(BUCKETS, path)
    assert report.verdict == "too much output"
    assert "printed more than 4 MB" in report.message
    assert len(report.printed) < 10_000  # only an excerpt comes back
    assert report.wall < 30


def test_hang_in_a_collective_shows_where_each_rank_waits(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "JUDGE_RANK_TIMEOUT", "15"
    )  # long enough for busy machines to reach the recv
    path = write(
        tmp_path,
        """\
        import torch
        import torch.distributed as dist


        def ring_all_reduce(tensor):
            rank, n = dist.get_rank(), dist.get_world_size()
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, (rank - 1) % n)  # everyone receives first: nobody sends
            dist.send(tensor, (rank + 1) % n)
            return tensor
    """,
    )
    report = grade(RING, path)
    assert report.verdict == "hang"
    problem = first_problem(report)
    assert problem["status"] == "hang"
    assert "rank 0" in problem["where"] and "rank 1" in problem["where"]
    assert (
        "line 8, in ring_all_reduce: dist.recv(incoming, (rank - 1) % n)"
        in problem["where"]
    )
    assert all(r["status"] == "skipped" for r in report.results[1:])


def test_exception_on_a_rank_names_rank_and_line(tmp_path):
    path = write(
        tmp_path,
        """\
        import torch.distributed as dist


        def ring_all_reduce(tensor):
            if dist.get_rank() == 1:
                raise ValueError("rank one disagrees")
            return tensor
    """,
    )
    report = grade(RING, path)
    problem = first_problem(report)
    assert problem["status"] == "error"
    assert (
        "on rank 1 your code raised ValueError: rank one disagrees"
        in problem["message"]
    )
    assert "line 6" in problem["where"]


def test_the_cli_never_shows_its_own_traceback(tmp_path):
    """Through the command line: a clear verdict, exit status 1, no judge traceback."""
    cases = {
        "syntax.py": "def buckets_for_parameters(:\n",
        "raises.py": "def buckets_for_parameters(p, c, f=None):\n"
        "    return {}['missing']\n",
        "exits.py": "import sys\nsys.exit(1)\n",
    }
    for name, source in cases.items():
        path = write(tmp_path, source, name)
        out = subprocess.run(
            [sys.executable, JUDGE, "06", "--file", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "JUDGE_HOME": str(tmp_path)},
        )
        assert out.returncode == 1, (name, out.stdout, out.stderr)
        assert "Traceback" not in out.stdout + out.stderr, (name, out.stdout)
        assert out.stderr == "", (name, out.stderr)


def test_a_broken_exercise_folder_is_a_clear_error_not_a_traceback(tmp_path):
    broken = tmp_path / "exercises"
    (broken / "01_broken").mkdir(parents=True)
    (broken / "chapters.toml").write_text("[titles]\n")
    with pytest.raises(catalog.CatalogError, match="lacks"):
        catalog.load_exercises(str(broken))


def test_memory_that_grows_forever_is_a_memory_error(tmp_path):
    path = write(
        tmp_path,
        """\
        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            hoard = []
            while True:
                hoard.append(bytearray(3 * 10**8))
    """,
    )
    report = grade(BUCKETS, path)
    problem = first_problem(report)
    assert problem["status"] == "error" and "ran out of memory" in problem["message"]
    assert "line 4" in problem["where"]
