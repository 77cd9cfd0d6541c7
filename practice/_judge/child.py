"""The process that runs the reader's code: load their file, run the checks, report.

The judge starts this file in a fresh process (``sandbox.py``) and never runs
the reader's code itself, so nothing they write can hang it, crash it or
print over it. This process reports what happens as JSON lines in an events
file, one per step, flushed at once: if it dies half-way, the judge still
knows which check was running.

    python child.py EXERCISE_DIR SOLUTION_FILE EVENTS_FILE CHECK_TIMEOUT_S OUTPUT_CAP_BYTES
"""

import contextlib
import faulthandler
import importlib.util
import json
import os
import signal
import sys
import types

PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PRACTICE_DIR not in sys.path:
    sys.path.insert(0, PRACTICE_DIR)

from _judge.checking import classify_exception, collect_checks, run_checks, Solution  # noqa: E402


class CheckTimeout(Exception):
    """A check ran past its time limit (raised by the alarm inside the reader's code)."""

    check_timeout = True


def limit_resources(output_cap_bytes):
    """Caps that turn a runaway into a clear verdict instead of a full disk or a core dump."""
    import resource
    # Huge output: writing past the cap kills this process with SIGXFSZ.
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_cap_bytes, output_cap_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@contextlib.contextmanager
def alarm(seconds, what):
    """Raise :class:`CheckTimeout` in this thread after ``seconds`` (an infinite loop, a sleep)."""
    def ring(signum, frame):
        raise CheckTimeout(f"{what} ran past its time limit of {seconds:g} s: an infinite loop, "
                           f"or a loop whose end condition is never met?")
    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def main(argv):
    exercise_dir, solution_path, events_path, check_timeout_s, output_cap = argv[1:6]
    check_timeout_s, output_cap = float(check_timeout_s), int(output_cap)
    solution_path = os.path.abspath(solution_path)
    limit_resources(output_cap)
    faulthandler.enable()  # a segfault prints the Python stack (the reader's line) before dying
    events = open(events_path, "w", encoding="utf-8", buffering=1)

    def emit(**event):
        events.write(json.dumps(event) + "\n")
        events.flush()

    module = load_solution(solution_path, emit, check_timeout_s)
    if module is None:
        return 0
    emit(event="loaded")
    checks = collect_checks(load_checks(exercise_dir))
    emit(event="checks", names=[c.check_name for c in checks])
    run_checks(
        checks, Solution(module, solution_path), solution_path,
        on_start=lambda i, name: emit(event="check_start", index=i, name=name),
        on_result=lambda i, result: emit(event="check", index=i, result=result),
        guard=lambda name: alarm(check_timeout_s, f"the check '{name}'"),
    )
    sys.stdout.flush()
    emit(event="done")
    return 0


def load_solution(path, emit, timeout_s):
    """Compile and run the reader's file as the module ``solution``; None if that failed."""
    try:
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec")
    except OSError as e:
        emit(event="load_error", kind="missing", message=f"cannot read your file: {e.strerror}")
        return None
    except SyntaxError as e:
        emit(event="syntax_error", line=e.lineno, col=e.offset, text=(e.text or "").rstrip("\n"),
             message=e.msg)
        return None
    except ValueError as e:  # e.g. a NUL byte in the file
        emit(event="syntax_error", line=None, col=None, text="", message=str(e))
        return None
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    try:
        with alarm(timeout_s, "loading your file"):
            exec(code, module.__dict__)
    except SystemExit as e:
        emit(event="load_error", kind="exit",
             message=f"your file called sys.exit({'' if e.code is None else repr(e.code)}) while loading: "
                     f"a solution defines functions and returns answers instead of ending the process",
             where=_where(e, path))
        return None
    except ImportError as e:
        missing = getattr(e, "name", None)
        hint = (f"there is no module named '{missing}' here: check the spelling, or use only what the starter imports"
                if isinstance(e, ModuleNotFoundError) and missing else str(e))
        emit(event="load_error", kind="import", message=f"an import in your file failed: {hint}", where=_where(e, path))
        return None
    except BaseException as e:  # anything the reader's top level raises
        result = classify_exception("load", e, path)
        emit(event="load_error", kind="timeout" if result["status"] == "timeout" else "exception",
             message=("while loading, " + result["message"]) if result["status"] != "timeout" else result["message"],
             where=result.get("where", ""))
        return None
    return module


def _where(exc, path):
    from _judge.checking import _reader_frames
    return _reader_frames(exc.__traceback__, path)


def load_checks(exercise_dir):
    """Import the exercise's ``checks.py`` under a name of its own."""
    name = "checks_" + os.path.basename(os.path.normpath(exercise_dir))
    spec = importlib.util.spec_from_file_location(name, os.path.join(exercise_dir, "checks.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(main(sys.argv))
