"""Running the checks, and the words for every outcome.

:func:`run_checks` runs the checks of an exercise one by one and turns each
outcome (a pass, a wrong answer, an exception in the reader's code, a
missing function, a hang of ranks, an exit) into a plain dict; :func:`describe`
and :func:`headline` turn such a dict into the lines the reader sees;
:func:`overall` gives the verdict of a whole run.

Standard library only, on purpose: the same file runs in the judge's child
process and, through Pyodide, in the browser, so a wrong answer gets the
same message in the terminal and on the book's practice page.
"""

import os
import re
import traceback

from _judge.checking import Mismatch, MissingName, show

# ----------------------------------------------------------------------------
# Running the checks
# ----------------------------------------------------------------------------


class Solution:
    """The reader's module, seen by the checks: a missing name is a clear verdict."""

    def __init__(self, module, path):
        self._module = module
        self._path = path

    def __getattr__(self, name):
        try:
            return getattr(self._module, name)
        except AttributeError:
            raise MissingName(name, self._path) from None


def collect_checks(checks_module):
    """The check functions of a checks module, in the order they are written."""
    return [
        obj
        for obj in vars(checks_module).values()
        if callable(obj) and hasattr(obj, "check_name")
    ]


def run_checks(checks, solution, path, on_start=None, on_result=None, guard=None):
    """Run each check on ``solution``; return one result dict per check.

    ``path`` is the reader's file: frames in it are "your code", any other
    frame is the checks' or a library's. ``guard(name)`` (optional) is a
    context manager around each check, e.g. a per-check time limit. A check
    that finds the reader's function not written yet, or ranks that hang,
    stops the run (so does running out of memory): the checks after it are
    reported as skipped, since they would say the same thing slower.
    """
    results = []
    stop_reason = None
    for index, fn in enumerate(checks):
        name = fn.check_name
        if stop_reason:
            result = {"name": name, "status": "skipped", "message": stop_reason}
        else:
            if on_start:
                on_start(index, name)
            result = run_one(fn, solution, path, guard)
            if result.pop("stop", False) or result["status"] in (
                "todo",
                "hang",
                "timeout",
                "exit",
            ):
                stop_reason = (
                    f"not run: check {index + 1} "
                    f"({checks[index].check_name}) must pass first"
                )
        results.append(result)
        if on_result:
            on_result(index, result)
    return results


def run_one(fn, solution, path, guard=None):
    """Run one check; classify its outcome (see :func:`run_checks`)."""
    name = fn.check_name
    try:
        if guard is None:
            fn(solution)
        else:
            with guard(name):
                fn(solution)
    except Mismatch as e:
        shown_input = (
            e.input if isinstance(e.input, str) or e.input is None else show(e.input)
        )
        return {
            "name": name,
            "status": "failed",
            "message": e.message,
            "input": shown_input,
            "expected": _opt(e.expected),
            "got": _opt(e.got),
            **({"where": e.where} if e.where else {}),
        }
    except MissingName as e:
        return {
            "name": name,
            "status": "failed",
            "stop": True,  # every later check would say the same
            "message": f"your file defines no `{e.name}`: "
            "keep the names the starter file gives",
        }
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # the reader's code may raise anything
        if hasattr(e, "judge_result"):  # the reader's process ended (remote.py)
            return {**e.judge_result, "name": name, "stop": True}
        if getattr(e, "from_reader_process", False):  # it raised (remote.py)
            return {**e.result, "name": name}
        return classify_exception(name, e, path)
    return {"name": name, "status": "passed"}


def _opt(value):
    return None if value is None else show(value)


def classify_exception(name, exc, path):
    """Turn an exception escaping a check into a result dict that names the problem."""
    if isinstance(exc, SystemExit):
        return {
            "name": name,
            "status": "exit",
            "where": _reader_frames(exc.__traceback__, path),
            "message": "your code called "
            f"sys.exit({'' if exc.code is None else show(exc.code)}): "
            "a solution returns its answer instead of ending the process",
        }
    if hasattr(exc, "stuck"):  # mylib.RankTimeout: ranks stuck in collectives
        return _hang_result(name, exc, path)
    if hasattr(exc, "rank") and hasattr(exc, "rank_traceback"):  # mylib.RankError
        return _rank_error_result(name, exc, path)
    if getattr(exc, "check_timeout", False):
        return {
            "name": name,
            "status": "timeout",
            "message": str(exc),
            "where": _reader_frames(exc.__traceback__, path),
        }
    where = _reader_frames(exc.__traceback__, path)
    kind = type(exc).__name__
    text = f"{kind}: {exc}" if str(exc) else kind
    if isinstance(exc, NotImplementedError) and where:
        return {
            "name": name,
            "status": "todo",
            "where": where,
            "message": f"not written yet: your code raises {text}. "
            "Replace the `raise` with your solution",
        }
    if isinstance(exc, MemoryError):
        return {
            "name": name,
            "status": "error",
            "where": where,
            "stop": True,  # the next checks would too
            "message": "your code ran out of memory (MemoryError): "
            "is a list or tensor growing without end?",
        }
    if isinstance(exc, RecursionError):
        return {
            "name": name,
            "status": "error",
            "where": where[-600:],
            "message": "your code recursed too deeply (RecursionError): "
            "does the recursion reach its base case?",
        }
    if where:
        return {
            "name": name,
            "status": "error",
            "where": where,
            "message": f"your code raised {text}",
        }
    if isinstance(
        exc, ModuleNotFoundError
    ):  # the checks' own import: the environment, not the reader
        return {
            "name": name,
            "status": "error",
            "message": f"the judge's Python lacks the module '{exc.name}': "
            "run it with the book's environment (`make test` creates .venv once; "
            "then `.venv/bin/python practice/judge.py`)",
        }
    return {
        "name": name,
        "status": "error",
        "message": f"the check could not use what your code returned ({text}): "
        f"compare the type and shape of your result with the statement",
    }


def _hang_result(name, exc, path):
    lines = []
    busy = getattr(exc, "busy", False)
    for rank, stack in sorted(exc.stuck.items()):
        frames = _reader_frames_from_text(stack, path)
        calls = re.findall(r'File "[^"]+", line \d+ in (\w+)', stack)
        inside = f" (waiting inside {calls[0]})" if calls and not busy else ""
        lines.append(f"rank {rank}{inside}:\n" + (frames or "    (not in your code)"))
    if busy:
        return {
            "name": name,
            "status": "timeout",
            "where": "\n".join(lines),
            "message": f"ranks {sorted(exc.stuck)} were still computing after "
            f"{getattr(exc, 'seconds', 0):.0f} s, busy on the CPU rather than "
            "waiting for each other: a loop whose end condition is never met? "
            "Where each rank was:",
        }
    return {
        "name": name,
        "status": "hang",
        "where": "\n".join(lines),
        "message": f"the ranks hung: ranks {sorted(exc.stuck)} all waited, "
        f"none making progress for {_HANG_S:g} s. "
        "Usually ranks wait for each other: a recv whose send never comes, "
        "or ranks calling different collectives (or the same ones in a "
        "different order, or with different sizes). Where each rank was stuck:",
    }


_HANG_S = float(os.environ.get("JUDGE_HANG_S", "3"))


def _rank_error_result(name, exc, path):
    tb = exc.rank_traceback or ""
    last = next(
        (
            line
            for line in reversed(tb.strip().splitlines())
            if line and not line.startswith(" ")
        ),
        "",
    )
    where = _reader_frames_from_text(tb, path)
    if last.startswith("NotImplementedError") and where:
        return {
            "name": name,
            "status": "todo",
            "where": where,
            "message": f"not written yet: on rank {exc.rank} your code raises {last}. "
            f"Replace the `raise` with your solution",
        }
    if last.startswith("SystemExit"):
        return {
            "name": name,
            "status": "exit",
            "where": where,
            "message": f"your code called sys.exit() on rank {exc.rank}: "
            f"a solution returns its answer instead of ending the process",
        }
    if "without returning a result" in str(exc).splitlines()[0]:
        first = str(exc).splitlines()[0]
        said = [
            line.strip()
            for line in tb.splitlines()
            if "what():" in line or "Error" in line
        ]
        detail = f" ({said[-1].split('what():')[-1].strip()})" if said else ""
        if "mismatch" in tb or "doesn't match" in tb:
            return {
                "name": name,
                "status": "error",
                "where": where,
                "stop": True,
                "message": f"{first}{detail}: the ranks called "
                "different collectives, or with different sizes. "
                "Every rank must make the same collective calls in the same order",
            }
        return {
            "name": name,
            "status": "error",
            "where": where,
            "message": f"{first}{detail}. Did your code call os._exit(), or crash?",
        }
    if where:
        note = ""
        if "by peer" in last or "Connection reset" in last:
            note = (
                ". Another rank stopped or called a different collective "
                "at that moment: ranks that disagree on which collectives "
                "to call, or how many times, fail (or hang) like this"
            )
        return {
            "name": name,
            "status": "error",
            "where": where,
            "stop": bool(note),  # a mismatch repeats
            "message": f"on rank {exc.rank} your code raised {last}{note}",
        }
    return {
        "name": name,
        "status": "error",
        "where": _tail(tb, 1200),
        "message": f"rank {exc.rank} failed outside your code: {last}",
    }


def _tail(text, n):
    return text if len(text) <= n else "..." + text[-n:]


def _reader_frames(tb, path):
    """The frames of a traceback that lie in the reader's file, as text."""
    frames = [f for f in traceback.extract_tb(tb) if _same_file(f.filename, path)]
    return "\n".join(
        f"    line {f.lineno}, in {f.name}: {(f.line or '').strip()}"
        for f in frames[-4:]
    )


_FRAME = re.compile(
    r'File "([^"]+)", line (\d+),? in (\S+)(?:\n[ \t]+(?![ \t]*File ")(.+))?'
)


def _reader_frames_from_text(text, path):
    """Like :func:`_reader_frames`, for a traceback or stack dump received as text."""
    out = []
    for filename, lineno, func, code in _FRAME.findall(text):
        if _same_file(filename, path):
            code = code.strip() if code else _source_line(path, int(lineno))
            out.append(f"    line {lineno}, in {func}: {code}")
    return "\n".join(out[-4:])


def _source_line(path, lineno):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if i == lineno:
                    return line.strip()
    except OSError:
        pass
    return ""


def _same_file(a, b):
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


# ----------------------------------------------------------------------------
# Words for the reader (the terminal and the browser print the same lines)
# ----------------------------------------------------------------------------

MARKS = {
    "passed": "PASS",
    "failed": "FAIL",
    "error": "ERROR",
    "todo": "TODO",
    "hang": "HANG",
    "timeout": "TIMEOUT",
    "exit": "EXIT",
    "skipped": "SKIP",
}


def describe(result):
    """The detail lines under a check's verdict line (empty for a pass)."""
    if result["status"] == "passed":
        return []
    lines = [result.get("message", "")]
    for label in ("input", "expected", "got"):
        if result.get(label) is not None:
            lines.append(f"{label + ':':<10}{result[label]}")
    if result.get("where"):
        lines.append("where:")
        lines.extend(result["where"].splitlines())
    return lines


def overall(results):
    """The verdict of a whole run of checks and its summary line: (verdict, message)."""
    statuses = [r["status"] for r in results]
    if all(s == "passed" for s in statuses):
        return "passed", f"all {len(results)} checks passed"
    first_bad = next(r for r in results if r["status"] != "passed")
    verdict = (
        first_bad["status"]
        if first_bad["status"] in ("hang", "timeout", "exit")
        else "failed"
    )
    return verdict, f"{statuses.count('passed')} of {len(results)} checks passed"


def headline(result):
    """``PASS  name`` / ``FAIL  name``: the first line of a check's report."""
    return f"{MARKS.get(result['status'], result['status'].upper()):<8}{result['name']}"
