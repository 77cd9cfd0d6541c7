"""Loading the reader's file and an exercise's checks, with a verdict for each failure.

Standard library only: the judge's child process and the browser (Pyodide)
load files the same way, so a syntax error or a failing import reads the
same in both.
"""

import contextlib
import importlib.util
import os
import sys
import types

from _judge.running import _reader_frames, classify_exception


def load_solution(path, guard=None):
    """Run the reader's file as the module ``solution``.

    Returns ``(module, None)``, or ``(None, problem)`` where ``problem`` is a
    dict with the verdict (syntax error, import error, load error, exit,
    timeout), a message that names the problem, and ``where`` (the lines of
    the reader's file involved). ``guard()`` (optional) is a context manager
    around running the file, e.g. a time limit.
    """
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        return None, {
            "verdict": "load error",
            "message": f"cannot read your file: {e.strerror}",
            "where": "",
        }
    return load_solution_source(source, path, guard)


def load_solution_source(source, path, guard=None):
    """Like :func:`load_solution`, for the file's bytes read once (a snapshot).

    Tracebacks still name ``path`` and its lines.
    """
    if not source.strip():
        return None, {
            "verdict": "load error",
            "message": "your file is empty: start again from the starter "
            "(`reset`), which defines the functions to write",
            "where": "",
        }
    try:
        code = compile(source, path, "exec")
    except SyntaxError as e:
        return None, syntax_problem(e)
    except ValueError as e:  # e.g. a NUL byte in the file
        return None, {
            "verdict": "syntax error",
            "message": f"your file is not valid Python: {e}",
            "where": "",
        }
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    try:
        with guard() if guard else contextlib.nullcontext():
            exec(code, module.__dict__)
    except SystemExit as e:
        code_text = "" if e.code is None else repr(e.code)
        return None, {
            "verdict": "exit",
            "where": _reader_frames(e.__traceback__, path),
            "message": f"your file called sys.exit({code_text}) "
            "while loading: a solution defines functions and "
            "returns answers instead of ending the process",
        }
    except ImportError as e:
        missing = getattr(e, "name", None)
        hint = (
            f"there is no module named '{missing}' here: "
            "check the spelling, or use only what the starter imports"
            if isinstance(e, ModuleNotFoundError) and missing
            else str(e)
        )
        return None, {
            "verdict": "import error",
            "message": f"an import in your file failed: {hint}",
            "where": _reader_frames(e.__traceback__, path),
        }
    except BaseException as e:  # anything the reader's top level raises
        result = classify_exception("load", e, path)
        if result["status"] == "timeout":
            return None, {
                "verdict": "timeout",
                "message": result["message"],
                "where": result.get("where", ""),
            }
        return None, {
            "verdict": "load error",
            "message": "while loading, " + result["message"],
            "where": result.get("where", ""),
        }
    return module, None


def syntax_problem(e):
    """The verdict for a SyntaxError: its line, and a caret under the column."""
    where = ""
    if e.lineno:
        caret = " " * max((e.offset or 1) - 1, 0) + "^"
        where = f"    line {e.lineno}: {(e.text or '').rstrip()}\n            {caret}"
    at = f" on line {e.lineno}" if e.lineno else ""
    return {
        "verdict": "syntax error",
        "message": f"your file is not valid Python{at}: {e.msg}",
        "where": where,
    }


def load_checks(exercise_dir):
    """Import the exercise's ``checks.py`` under a name of its own."""
    name = "checks_" + os.path.basename(os.path.normpath(exercise_dir))
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(exercise_dir, "checks.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
