"""The judge's command line, as a reader uses it, in a scratch JUDGE_HOME.

The table and the next step, grading with exit statuses, hints one at a
time, reset with a backup, progress kept between runs, watch mode (polling),
plain output when piped and colour when forced, and clear errors for bad
commands.
"""

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest

from _judge import catalog

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(PRACTICE_DIR, "judge.py")
EXERCISES = catalog.load_exercises()
BUCKETS = catalog.find(EXERCISES, "06")


@pytest.fixture
def home(tmp_path):
    return tmp_path


def judge(home, *args, env=None, timeout=120):
    environment = {
        **os.environ,
        "JUDGE_HOME": str(home),
        "COLUMNS": "160",
        **(env or {}),
    }
    environment.pop("FORCE_COLOR", None) if not (env and "FORCE_COLOR" in env) else None
    out = subprocess.run(
        [sys.executable, JUDGE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=os.path.dirname(PRACTICE_DIR),
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


def workspace(home, exercise):
    return home / "workspace" / f"{exercise.id}.py"


def test_list_shows_every_exercise_progress_and_next_step(home):
    out = judge(home)
    assert out.returncode == 0
    # Listed in the book's order, by their one id.
    listed = [out.stdout.find(f"{ex.short} ") for ex in EXERCISES]
    assert -1 not in listed and listed == sorted(listed)
    for ex in EXERCISES:
        assert ex.title[:20] in out.stdout
    assert f"Progress: 0 of {len(EXERCISES)} passed" in out.stdout
    # Next: the first exercise of the first chapter.
    assert "Next: 1.1 " in out.stdout
    assert "01_ring_all_reduce.py" in out.stdout
    assert "practice/judge.py 1.1" in out.stdout
    # The file the listing names exists from the first listing on.
    for ex in EXERCISES:
        assert workspace(home, ex).read_text() == open(ex.path("starter.py")).read()
        assert f"({ex.number})" not in out.stdout


def test_grading_creates_the_file_from_the_starter_and_fails(home):
    out = judge(home, "06")
    assert out.returncode == 1
    path = workspace(home, BUCKETS)
    assert path.read_text() == open(BUCKETS.path("starter.py")).read()
    assert "TODO" in out.stdout and "not written yet" in out.stdout
    assert "hint 3.1" in out.stdout


def test_passing_records_progress_and_points_to_the_next(home):
    judge(home, "06")
    shutil.copyfile(BUCKETS.path("solution.py"), workspace(home, BUCKETS))
    out = judge(home, "6")
    assert out.returncode == 0, out.stdout
    # Next: the following one in the book: 3.2.
    following = EXERCISES[EXERCISES.index(BUCKETS) + 1]
    assert following.short == "3.2"
    assert "PASSED" in out.stdout and f"Next: {following.short} " in out.stdout
    progress = json.loads((home / ".progress.json").read_text())
    assert progress["exercises"][BUCKETS.id]["state"] == "passed"
    assert progress["exercises"][BUCKETS.id]["attempts"] == 2
    table = judge(home).stdout
    assert f"Progress: 1 of {len(EXERCISES)} passed" in table
    # Editing after a pass is shown; the pass still counts.
    with open(workspace(home, BUCKETS), "a") as f:
        f.write("\n# more thoughts\n")
    assert "passed, edited since" in judge(home).stdout


def test_ids_can_be_numbers_slugs_or_paths(home):
    for name in (
        "3.1",
        "06",
        "6",
        "assign_buckets",
        "06_assign_buckets",
        "practice/workspace/06_assign_buckets.py",
    ):
        out = judge(home, "show", name)
        assert (
            out.returncode == 0 and "# 3.1 · Assign parameters to buckets" in out.stdout
        )


def test_unknown_id_and_bad_commands_name_the_fix(home):
    out = judge(home, "99")
    assert out.returncode == 2
    assert (
        "there is no exercise '99'" in out.stdout and "practice/judge.py" in out.stdout
    )
    out = judge(home, "3.9")
    assert out.returncode == 2 and "there is no exercise '3.9'" in out.stdout
    out = judge(home, "hint")
    assert out.returncode == 2 and "needs an exercise id" in out.stdout
    out = judge(home, "06", "07")
    assert out.returncode == 2 and "too many words" in out.stdout


def test_hints_come_one_at_a_time(home):
    hints = BUCKETS.hints()
    first = judge(home, "hint", "3.1").stdout
    assert f"Hint 1 of {len(hints)} for 3.1 " in first and hints[0][:30] in first
    second = judge(home, "hint", "06").stdout
    assert f"Hint 2 of {len(hints)}" in second and hints[1][:30] in second
    everything = judge(home, "hint", "06", "--all").stdout
    assert all(f"Hint {i + 1} of" in everything for i in range(len(hints)))


def test_reset_restores_the_starter_and_keeps_a_backup(home):
    judge(home, "06")
    path = workspace(home, BUCKETS)
    path.write_text("def buckets_for_parameters(p, c, f=None):\n    return 'my work'\n")
    out = judge(home, "reset", "06")
    assert out.returncode == 0 and "saved as" in out.stdout
    assert path.read_text() == open(BUCKETS.path("starter.py")).read()
    backups = list((home / ".backup").iterdir())
    assert len(backups) == 1 and "my work" in backups[0].read_text()
    # Resetting an untouched file makes no backup.
    judge(home, "reset", "06")
    assert len(list((home / ".backup").iterdir())) == 1


def test_reset_forgets_the_pass(home):
    judge(home, "06")
    shutil.copyfile(BUCKETS.path("solution.py"), workspace(home, BUCKETS))
    assert judge(home, "06").returncode == 0
    assert f"Progress: 1 of {len(EXERCISES)}" in judge(home).stdout
    judge(home, "reset", "06")
    listing = judge(home).stdout
    assert f"Progress: 0 of {len(EXERCISES)}" in listing


def test_two_judges_at_once_lose_no_progress(home):
    """Progress writes are locked read-modify-writes: neither judge's grade is lost."""
    second = catalog.find(EXERCISES, "02")
    judge(home)
    for ex in (BUCKETS, second):
        shutil.copyfile(ex.path("solution.py"), workspace(home, ex))
    env = {**os.environ, "JUDGE_HOME": str(home)}
    procs = [
        subprocess.Popen(
            [sys.executable, JUDGE, ex.number],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        for ex in (BUCKETS, second, BUCKETS, second)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    records = json.loads((home / ".progress.json").read_text())["exercises"]
    assert records[BUCKETS.id]["attempts"] == 2
    assert records[second.id]["attempts"] == 2
    assert f"Progress: 2 of {len(EXERCISES)}" in judge(home).stdout


def test_help_is_help(home):
    for words in (["help"], ["--help"]):
        out = judge(home, *words)
        assert out.returncode == 0
        assert "usage: judge.py" in out.stdout and "no exercise" not in out.stdout


def test_a_closed_pipe_keeps_the_exit_status(home):
    """`judge.py 06 | head -1` exits 0 on a pass (and 1 on a failure)."""
    judge(home)
    shutil.copyfile(BUCKETS.path("solution.py"), workspace(home, BUCKETS))
    env = {**os.environ, "JUDGE_HOME": str(home)}
    for target, status in (("06", 0), ("02", 1)):
        out = subprocess.run(
            f"set -o pipefail; {sys.executable} {JUDGE} {target} | head -1",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == status, (target, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr and "Broken pipe" not in out.stderr


def test_show_writes_math_as_text(home):
    out = judge(home, "show", "2.1")
    assert out.returncode == 0
    for latex in ("\\frac", "_{", "\\sum", "$$"):
        assert latex not in out.stdout, latex
    assert "∇ 1/B Σ[i=1..B] ℓ_i = 1/N Σ[r=1..N] ∇ 1/(B/N) Σ[i ∈ r] ℓ_i" in out.stdout


def test_any_python_finds_the_books_environment(home, tmp_path):
    """Run with a Python that lacks the packages: the judge re-runs under .venv once.

    Without a .venv it names `make setup`.
    """
    bare = tmp_path / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True
    )
    python = str(bare / "bin" / "python")
    env = {"JUDGE_HOME": str(home), "PATH": os.environ["PATH"], "COLUMNS": "160"}
    out = subprocess.run(
        [python, JUDGE], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("using the book's environment") == 1
    assert "Progress: 0 of" in out.stdout
    # A copy of the judge in a tree without .venv: the command that creates it.
    tree = tmp_path / "tree"
    shutil.copytree(
        PRACTICE_DIR,
        tree / "practice",
        ignore=shutil.ignore_patterns(
            "workspace", ".backup", ".progress*", "__pycache__"
        ),
    )
    out = subprocess.run(
        [python, str(tree / "practice" / "judge.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode != 0 and "make setup" in out.stderr


def test_grading_never_changes_the_readers_file(home):
    judge(home, "06")
    path = workspace(home, BUCKETS)
    path.write_text(
        "def buckets_for_parameters(p, c, f=None):\n    while True:\n        pass\n"
    )
    before = path.read_bytes()
    judge(home, "06", "--check-timeout", "1")
    assert path.read_bytes() == before


def test_damaged_progress_file_is_ignored_with_a_warning(home):
    (home / ".progress.json").write_text("{not json")
    out = judge(home)
    assert out.returncode == 0 and "ignored a damaged progress file" in out.stdout
    judge(home, "06")
    json.loads((home / ".progress.json").read_text())  # rewritten whole


def test_piped_output_has_no_colour_and_forced_colour_has(home):
    plain = judge(home, "06").stdout
    assert "\x1b[" not in plain
    coloured = judge(home, "06", env={"FORCE_COLOR": "1"}).stdout
    assert "\x1b[" in coloured


def test_maintainer_flags_grade_solutions_and_starters(home):
    out = judge(
        home, "all", "02", "--solutions", timeout=600
    )  # every solution: test_judge_exercises.py
    assert out.returncode == 0, out.stdout[-3000:]
    assert "PASSED" in out.stdout and "Grades" in out.stdout
    assert not (home / ".progress.json").exists(), (
        "maintainer runs do not touch the reader's progress"
    )
    out = judge(home, "02", "--starters")
    assert out.returncode == 1


def test_watch_regrades_on_save_without_file_events(home):
    judge(home, "06")
    path = workspace(home, BUCKETS)
    env = {**os.environ, "JUDGE_HOME": str(home), "JUDGE_WATCH_MAX_GRADES": "2"}
    proc = subprocess.Popen(
        [sys.executable, JUDGE, "watch", "06", "--poll"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in proc.stdout], daemon=True
    ).start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while not any("Watching" in line for line in seen):
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        shutil.copyfile(BUCKETS.path("solution.py"), path)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while not lines.empty():
        seen.append(lines.get())
    text = "".join(seen)
    assert "TODO" in text and "PASSED" in text
    assert text.index("TODO") < text.index("Watching") < text.index("PASSED")


def test_a_second_grade_reuses_the_grading_service(home):
    """The service outlives a command briefly (so the next grade imports nothing),
    answers `stop`, and then is gone: nothing is left behind."""
    import tempfile

    from _judge import service

    run = tempfile.mkdtemp(prefix="jr-", dir="/tmp")  # a short path for the socket
    env = {"JUDGE_SERVER_IDLE_S": "60", "JUDGE_RUNTIME_DIR": run}
    try:
        pids = []
        for _ in range(2):
            out = judge(home, "06", "--solutions", env=env)
            assert out.returncode == 0, out.stdout
            folder = os.path.join(run, "data-parallel-judge")
            sockets = [n for n in os.listdir(folder) if n.endswith(".sock")]
            assert len(sockets) == 1, sockets
            pids.append(service.ping(os.path.join(folder, sockets[0])))
        assert pids[0] and pids[0] == pids[1], pids
        out = judge(home, "stop", env=env)
        assert f"stopped the grading service (pid {pids[0]})" in out.stdout
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pids[0]}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pids[0]}"), "the service outlived stop"
        assert "no grading service" in judge(home, "stop", env=env).stdout
    finally:
        service_env = {**os.environ, "JUDGE_RUNTIME_DIR": run}
        subprocess.run(
            [sys.executable, JUDGE, "stop"], env=service_env, capture_output=True
        )
        shutil.rmtree(run, ignore_errors=True)
