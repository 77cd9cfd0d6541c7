"""Grading a file in a separate process, with a time limit, and reading the verdict.

The reader's code runs in ``child.py``, in a process group of its own (ranks
it starts included). This module waits for it with a deadline, watches the
size of what it prints, kills the whole group when either runs out, and
turns what happened (the events the child wrote, its exit status) into one
:class:`Report`. It never raises for anything the reader's code does.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _judge.running import overall

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(PRACTICE_DIR)

OUTPUT_CAP_BYTES = 4 * 1024 * 1024  # more than this much printing is a runaway loop
# Address space for exercises without torch (torch alone maps more than this; rank
# exercises get no cap).
MEMORY_CAP_BYTES = 1024 * 1024 * 1024
SHOWN_OUTPUT_CHARS = 1500  # how much of what the reader's code printed a report shows


@dataclasses.dataclass
class Report:
    """What grading one file found.

    ``verdict`` is one of: passed, failed, syntax error, import error,
    load error, timeout, hang, crash, exit, too much output. ``message`` says
    what happened in words; ``results`` are the per-check dicts of
    :mod:`checking`; ``printed`` is an excerpt of what the code printed.
    """

    verdict: str
    message: str
    results: list
    printed: str = ""
    where: str = ""
    seconds: float = 0.0

    @property
    def passed(self):
        return self.verdict == "passed"


def grade_file(exercise, path, *, time_limit_s=None, check_timeout_s=None):
    """Grade the reader's file ``path`` against ``exercise``'s checks.

    Returns a :class:`Report`.
    """
    time_limit_s = time_limit_s or exercise.time_limit_s
    check_timeout_s = check_timeout_s or exercise.check_timeout_s
    work = tempfile.mkdtemp(prefix="judge-")
    out_path = os.path.join(work, "output.txt")
    events_path = os.path.join(work, "events.jsonl")
    started = time.monotonic()
    killed_for = None
    try:
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    CHILD,
                    exercise.dir,
                    os.path.abspath(path),
                    events_path,
                    str(check_timeout_s),
                    str(OUTPUT_CAP_BYTES),
                    str(0 if exercise.ranks else MEMORY_CAP_BYTES),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                env=_child_env(),
                start_new_session=True,
            )
            try:
                killed_for = _wait(proc, time_limit_s, out_path)
            finally:
                _kill_group(proc)
        seconds = time.monotonic() - started
        events = _read_events(events_path)
        printed, printed_bytes = _read_output(out_path)
        return _report(
            proc.returncode,
            killed_for,
            events,
            printed,
            printed_bytes,
            time_limit_s,
            seconds,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _child_env():
    env = dict(os.environ)
    # The checks import _judge (practice/) and mylib (the repo root), also in the ranks
    # they start.
    env["PYTHONPATH"] = os.pathsep.join(
        [PRACTICE_DIR, REPO_DIR]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _wait(proc, time_limit_s, out_path):
    """Wait for the child; return why it was killed (None if it ended by itself)."""
    deadline = time.monotonic() + time_limit_s
    pause = 0.01
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return "timeout"
        with contextlib.suppress(OSError):
            if os.path.getsize(out_path) >= OUTPUT_CAP_BYTES:
                return "output"
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
    return None


def _kill_group(proc):
    """Kill the child and everything it started (ranks, fork servers).

    Never leave a process behind.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _read_events(path):
    events = []
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:  # a line cut short when the process died
                    break
    return events


def _read_output(path):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(SHOWN_OUTPUT_CHARS)
            if size > 2 * SHOWN_OUTPUT_CHARS:
                f.seek(size - SHOWN_OUTPUT_CHARS)
                tail = f.read()
                text = (
                    head.decode("utf-8", "replace")
                    + f"\n... ({size} bytes in all) ...\n"
                    + tail.decode("utf-8", "replace")
                )
            else:
                text = (head + f.read()).decode("utf-8", "replace")
        return text, size
    except OSError:
        return "", 0


def _report(
    returncode, killed_for, events, printed, printed_bytes, time_limit_s, seconds
):
    """Decide the verdict from how the child ended and what it reported."""
    by_kind = {}
    for e in events:
        by_kind.setdefault(e["event"], []).append(e)
    names = by_kind.get("checks", [{}])[0].get("names", [])
    results = [None] * len(names)
    for e in by_kind.get("check", []):
        if e["index"] < len(results):
            results[e["index"]] = e["result"]
    started = [e for e in by_kind.get("check_start", [])]
    running = (
        started[-1]["name"]
        if started and results[started[-1]["index"]] is None
        else None
    )
    during = (
        f" during the check '{running}'"
        if running
        else ("" if "loaded" in by_kind else " while loading your file")
    )

    def finish(verdict, message, where=""):
        # The check that was running gets the verdict; the ones after it never ran.
        for i, name in enumerate(names):
            if results[i] is None:
                if name == running:
                    status = verdict if verdict in ("timeout", "exit") else "error"
                    results[i] = {"name": name, "status": status, "message": message}
                else:
                    results[i] = {
                        "name": name,
                        "status": "skipped",
                        "message": "not run: the process had ended",
                    }
        return Report(verdict, message, results, printed, where, seconds)

    if killed_for == "timeout":
        return finish(
            "timeout",
            f"your code ran past the time limit of {time_limit_s:g} s{during} and was "
            f"stopped: an infinite loop, or a wait that never ends?",
        )
    if (
        killed_for == "output"
        or returncode == -getattr(signal, "SIGXFSZ", 25)
        or printed_bytes >= OUTPUT_CAP_BYTES
    ):
        return finish(
            "too much output",
            "your code printed more than "
            f"{OUTPUT_CAP_BYTES // (1024 * 1024)} MB{during} and was stopped: "
            "is a print inside a loop that never ends?",
        )
    if "load_error" in by_kind:
        e = by_kind["load_error"][0]
        return Report(
            e["verdict"], e["message"], [], printed, e.get("where", ""), seconds
        )
    if returncode is not None and returncode < 0:
        name = _signal_name(-returncode)
        what = (
            "a segmentation fault (it read or wrote memory it does not own)"
            if name == "SIGSEGV"
            else name
        )
        return finish(
            "crash",
            f"the process running your code was killed by {what}{during}. "
            f"What it printed (below) shows the line that crashed",
            "",
        )
    if "done" not in by_kind:
        return finish(
            "exit",
            f"the process running your code ended{during} with "
            f"exit status {returncode} before the checks were done: "
            "does your code call sys.exit() or os._exit()?",
        )
    verdict, message = overall(results)
    return Report(verdict, message, results, printed, "", seconds)


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
