"""The process that runs the reader's code: load their file, run the checks, report.

The judge starts this file in a fresh process (``sandbox.py``) and never runs
the reader's code itself, so nothing they write can hang it, crash it or
print over it. This process reports what happens as JSON lines in an events
file, one per step, flushed at once: if it dies half-way, the judge still
knows which check was running.

    python child.py EXERCISE_DIR SOLUTION_FILE EVENTS_FILE CHECK_TIMEOUT_S
    OUTPUT_CAP_BYTES MEMORY_CAP_BYTES
"""

import contextlib
import faulthandler
import json
import os
import signal
import sys

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PRACTICE_DIR not in sys.path:
    sys.path.insert(0, PRACTICE_DIR)

from _judge.loading import load_checks, load_solution  # noqa: E402
from _judge.running import Solution, collect_checks, run_checks  # noqa: E402


class CheckTimeout(Exception):
    """A check ran past its time limit; raised by the alarm inside the reader's code."""

    check_timeout = True


def limit_resources(output_cap_bytes, memory_cap_bytes):
    """Caps that turn a runaway into a clear verdict.

    Instead of a full disk, a full memory or a core dump.
    """
    import resource

    # Huge output: writing past the cap kills this process with SIGXFSZ (Python ignores
    # that
    # signal by default, which would turn the flood into an OSError inside the reader's
    # code).
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_cap_bytes, output_cap_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if (
        memory_cap_bytes
    ):  # a list that grows forever ends in MemoryError, not in the machine swapping
        resource.setrlimit(resource.RLIMIT_AS, (memory_cap_bytes, memory_cap_bytes))


@contextlib.contextmanager
def alarm(seconds, what):
    """Raise :class:`CheckTimeout` in this thread after ``seconds``.

    It stops an infinite loop or a sleep.
    """

    def ring(signum, frame):
        raise CheckTimeout(
            f"{what} ran past its time limit of {seconds:g} s: an infinite loop, "
            f"or a loop whose end condition is never met?"
        )

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def main(argv):
    (
        exercise_dir,
        solution_path,
        events_path,
        check_timeout_s,
        output_cap,
        memory_cap,
    ) = argv[1:7]
    check_timeout_s, output_cap, memory_cap = (
        float(check_timeout_s),
        int(output_cap),
        int(memory_cap),
    )
    solution_path = os.path.abspath(solution_path)
    limit_resources(output_cap, memory_cap)
    # a segfault prints the Python stack (the reader's line) before dying
    faulthandler.enable()
    events = open(events_path, "w", encoding="utf-8", buffering=1)

    def emit(**event):
        events.write(json.dumps(event) + "\n")
        events.flush()

    module, problem = load_solution(
        solution_path, guard=lambda: alarm(check_timeout_s, "loading your file")
    )
    if problem:
        emit(event="load_error", **problem)
        return 0
    emit(event="loaded")
    checks = collect_checks(load_checks(exercise_dir))
    emit(event="checks", names=[c.check_name for c in checks])
    run_checks(
        checks,
        Solution(module, solution_path),
        solution_path,
        on_start=lambda i, name: emit(event="check_start", index=i, name=name),
        on_result=lambda i, result: emit(event="check", index=i, result=result),
        guard=lambda name: alarm(check_timeout_s, f"the check '{name}'"),
    )
    sys.stdout.flush()
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
