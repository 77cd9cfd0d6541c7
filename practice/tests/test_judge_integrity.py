"""The judge reports only what its checks found: six ways to fake a pass, each refused.

Each case is a reader's file that tries to make the judge say PASS without
solving the exercise (the starter's ``NotImplementedError`` stays in place,
or the answer is wrong), as the issue that asked for this judge found they
could: replace the judge's ``run_one``; make ``fail`` and ``expect_*``
no-ops; forge the messages the judge reads and exit; rewrite the
exercise's ``checks.py``; leave a detached process that writes the progress
file after the run; in exercise 01, reach ``all_reduce`` by a path a
module-level spy does not wrap.

What makes each fail: the checks run in the judge's process, not in the one
running the reader's code (fakes 1, 2, 3); ``checks.py`` is checked against
``MANIFEST.sha256`` and sent as bytes before the reader's code runs, and the
reader's code cannot write it (4; the attacks of issue 29, graded code
rewriting the checks and the manifest among them, are in
test_judge_attacks.py); every process below the run is killed at its end
(5); the spy sees every path to a collective (6).
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

from _judge import catalog, manifest
from _judge.sandbox import grade_file

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(PRACTICE_DIR, "judge.py")
EXERCISES = catalog.load_exercises()
BUCKETS = catalog.find(EXERCISES, "06")
RING = catalog.find(EXERCISES, "01")
STARTER_BODY = """
def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    raise NotImplementedError("write buckets_for_parameters")
"""


def write(tmp_path, source, name="mine.py", then=""):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source) + then)
    return path


def test_fake_1_replacing_run_one_changes_nothing(tmp_path):
    path = write(
        tmp_path,
        """\
        import sys
        import _judge.running

        def passed(fn, solution, path, guard=None):
            return {"name": fn.check_name, "status": "passed"}

        _judge.running.run_one = passed
        for module in list(sys.modules.values()):
            if hasattr(module, "run_one"):
                module.run_one = passed
        """,
        then=STARTER_BODY,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.results[0]["status"] == "todo"


def test_fake_2_no_op_fail_and_expect_change_nothing(tmp_path):
    path = write(
        tmp_path,
        """\
        import sys
        import _judge.checking

        def nothing(*args, **kwargs):
            return None

        NAMES = ("fail", "expect_equal", "expect_close", "expect_type",
                 "expect_raises")
        for module in list(sys.modules.values()):
            for name in NAMES:
                if hasattr(module, name):
                    setattr(module, name, nothing)

        def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
            return [[0]]
        """,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.results[0]["status"] == "failed"


def test_fake_3_forged_messages_and_exit_are_an_exit(tmp_path):
    """Writing 'passed' wherever it can (every open file and socket), then exiting."""
    path = write(
        tmp_path,
        """\
        import json, os, pickle, struct, sys
        from _judge import wire

        lines = [json.dumps({"event": "check", "index": i,
                             "result": {"name": "x", "status": "passed"}})
                 for i in range(20)] + [json.dumps({"event": "done"})]
        for arg in sys.argv[1:]:
            try:
                with open(arg, "a") as f:
                    f.write("\\n".join(lines) + "\\n")
            except OSError:
                pass
        for fd in map(int, os.listdir("/proc/self/fd")):
            for message in (("ok", [[0], [1]], ()), ("loaded",), ("passed",)):
                data = pickle.dumps(message)
                try:
                    os.write(fd, struct.pack("!Q", len(data)) + data)
                except OSError:
                    pass
        os._exit(0)
        """,
        then=STARTER_BODY,
    )
    report = grade_file(BUCKETS, str(path))
    assert not report.passed
    assert report.verdict in ("exit", "load error", "failed"), report.verdict


def copy_exercise(tmp_path, exercise):
    """A private copy of an exercise and its manifest, for the reader to vandalise."""
    root = tmp_path / "exercises"
    shutil.copytree(exercise.dir, root / os.path.basename(exercise.dir))
    shutil.copy(os.path.join(catalog.EXERCISES_DIR, "chapters.toml"), root)
    manifest.write(str(root))
    return catalog.load_exercises(str(root))[0]


def test_fake_4_rewriting_checks_py_is_refused_by_name(tmp_path):
    """A checks.py changed on disk (here by the test: graded code cannot write it,
    test_judge_attacks.py) is refused by name, with the command that restores it."""
    exercise = copy_exercise(tmp_path, BUCKETS)
    with open(exercise.path("checks.py"), "a") as f:
        f.write("\n# changed\n")
    starter = grade_file(exercise, exercise.path("starter.py"))
    assert starter.verdict == "refused"
    assert "checks.py has been changed" in starter.message
    assert "git checkout -- " in starter.message


def test_fake_5_a_detached_process_dies_with_the_run(tmp_path):
    pid_file, wrote = tmp_path / "daemon.pid", tmp_path / "daemon.wrote"
    progress = tmp_path / ".progress.json"
    path = write(
        tmp_path,
        f"""\
        import json, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open({str(pid_file)!r}, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(4)
                everything = {{"version": 1, "exercises": {{
                    name: {{"state": "passed"}} for name in
                    {[ex.id for ex in EXERCISES]!r}}}}}
                with open({str(progress)!r}, "w") as f:
                    json.dump(everything, f)
                open({str(wrote)!r}, "w").close()
            os._exit(0)
        """,
        then=STARTER_BODY,
    )
    out = subprocess.run(
        [sys.executable, JUDGE, "06", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    )
    assert out.returncode == 1, out.stdout
    # (On a busy machine the run may end, and kill it, before it writes its pid.)
    if pid_file.exists() and pid_file.read_text():
        daemon = int(pid_file.read_text())
        assert not os.path.exists(f"/proc/{daemon}") or _zombie(daemon), (
            "the detached process outlived the run"
        )
    time.sleep(5)
    assert not wrote.exists()
    listing = subprocess.run(
        [sys.executable, JUDGE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    ).stdout
    assert "Progress: 0 of" in listing


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


RING_FAKE = """\
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    {call}
    if n > 1:  # the bytes a real ring would send, so that the byte count matches
        size = 2 * (n - 1) * tensor.numel() // n
        reqs = [dist.isend(torch.zeros(size, dtype=tensor.dtype), (rank + 1) % n),
                dist.irecv(torch.zeros(size, dtype=tensor.dtype), (rank - 1) % n)]
        for r in reqs:
            r.wait()
    return tensor
"""


def test_fake_6_every_path_to_all_reduce_is_refused(tmp_path):
    for name, call in (
        ("c10d", "c10d.all_reduce(tensor)"),
        ("method", "c10d._get_default_group().allreduce([tensor]).wait()"),
        (
            "backend",
            "c10d._get_default_group()._get_backend(torch.device('cpu'))"
            ".allreduce([tensor]).wait()",
        ),
        ("unwrapped", "dist.all_reduce.__wrapped__(tensor)"),
        (
            "functional",
            "import torch.distributed._functional_collectives as fc\n"
            "    tensor.copy_(fc.all_reduce(tensor, 'sum', c10d._get_default_group()))",
        ),
        (
            "functional-op",
            "tensor.copy_(torch.ops._c10d_functional.wait_tensor(\n"
            "        torch.ops._c10d_functional.all_reduce(tensor, 'sum', '0')))",
        ),
        (
            "c10d-op",
            "torch.ops.c10d.allreduce_.default([tensor], "
            "c10d._get_default_group(), None, None, None, False, -1)",
        ),
    ):
        path = write(tmp_path, RING_FAKE.format(call=call), f"{name}.py")
        report = grade_file(RING, str(path))
        assert not report.passed, name
        problem = next(r for r in report.results if r["status"] != "passed")
        assert "does not allow torch.distributed.all_reduce" in (problem["message"]), (
            name,
            problem,
        )


def test_the_manifest_is_current():
    """Whoever changes an exercise regenerates it: `make practice-manifest`."""
    with open(manifest.MANIFEST, encoding="utf-8") as f:
        assert f.read() == manifest.render(), "run `make practice-manifest`"


def test_progress_written_outside_the_judge_is_not_counted(tmp_path):
    with open(tmp_path / ".progress.json", "w") as f:
        json.dump({"version": 1, "exercises": {BUCKETS.id: {"state": "passed"}}}, f)
    out = subprocess.run(
        [sys.executable, JUDGE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_HOME": str(tmp_path)},
    ).stdout
    assert "Progress: 0 of" in out and "changed outside the judge" in out


def test_every_check_and_rank_grades_one_snapshot(tmp_path):
    """A save during grading changes nothing: the file is read once.

    Here the file is overwritten with a broken version while it loads (it
    waits a moment at the top); every check (and every rank) still grades what
    was read.
    """
    average = catalog.find(EXERCISES, "03")
    solution = open(average.path("solution.py"), encoding="utf-8").read()
    path = tmp_path / "mine.py"
    path.write_text("import time\ntime.sleep(1.0)\n" + solution)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        graded = pool.submit(grade_file, average, str(path))
        time.sleep(0.3)
        path.write_text("def average_gradients(model):\n    raise ValueError\n")
        report = graded.result()
    assert report.passed, report.results
    assert "raise ValueError" in path.read_text()  # it did change on disk
