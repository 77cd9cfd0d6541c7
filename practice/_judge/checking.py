"""How a check says what went wrong: the vocabulary of every ``checks.py``.

A check is a function decorated with :func:`check` that takes the reader's
solution (their module) and raises :class:`Mismatch` (through :func:`fail`
and the ``expect_*`` helpers) when an answer is wrong, showing the input as
the reader would type it, what was expected and what came back.
:mod:`running` runs the checks and words every verdict.

Standard library only, on purpose: the same file runs in the judge's child
process and, through Pyodide, in the browser, so a wrong answer gets the
same message in the terminal and on the book's practice page.
"""

import math

# How many characters of a value a message shows before it elides the rest.
MAX_VALUE_CHARS = 400


# ----------------------------------------------------------------------------
# What checks.py uses
# ----------------------------------------------------------------------------


def check(name):
    """Mark a ``checks.py`` function as one check, shown to the reader as ``name``."""

    def mark(fn):
        fn.check_name = name
        return fn

    return mark


class Mismatch(AssertionError):
    """The reader's answer is wrong: says what was asked, expected and returned."""

    def __init__(self, message, *, input=None, expected=None, got=None, where=""):
        super().__init__(message)
        self.message = message
        self.input = input
        self.expected = expected
        self.got = got
        self.where = where


class MissingName(AttributeError):
    """The reader's file lacks a function or class that the checks call."""

    def __init__(self, name, path):
        super().__init__(name)
        self.name = name
        self.path = path


def fail(message, *, input=None, expected=None, got=None, where=""):
    """Stop the check with a wrong-answer verdict.

    ``where``: lines that locate the problem (shown under the message).
    """
    raise Mismatch(message, input=input, expected=expected, got=got, where=where)


def show(value):
    """A short, exact text for a value in a message (repr, elided when long)."""
    text = value if isinstance(value, str) and value.startswith("\x00") else repr(value)
    text = text.lstrip("\x00")
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 40] + f" ... ({len(text)} characters in all)"
    return text


def verbatim(text):
    """Wrap text so that :func:`show` prints it as is, not as a quoted string."""
    return "\x00" + text


def expect_type(got, types, *, input, what="the result"):
    """Fail unless ``got`` is an instance of ``types``.

    ``bool`` never counts as a number.
    """
    types = types if isinstance(types, tuple) else (types,)
    numeric = any(t in (int, float) for t in types)
    if isinstance(got, types) and not (
        numeric and isinstance(got, bool) and bool not in types
    ):
        return
    names = " or ".join(t.__name__ for t in types)
    fail(
        f"{what} should be a {names}, but it is a {type(got).__name__}",
        input=input,
        expected=verbatim(f"a {names}"),
        got=got,
    )


def expect_equal(got, expected, *, input, what="the result"):
    """Fail unless ``got`` equals ``expected`` in type and value (:func:`same`)."""
    if not same(got, expected):
        fail(f"wrong answer for {what}", input=input, expected=expected, got=got)


def same(got, expected):
    """Equal in type and value, leaf by leaf; decided here, never by ``got``.

    Containers must be of the same kind (a list is not a tuple) with equal
    items; numbers equal numbers (``2 == 2.0``) but a bool only a bool; any
    other leaf must be of exactly the expected type before ``==`` is asked,
    so an object of the reader's whose ``__eq__`` always says yes equals
    nothing.
    """
    if isinstance(expected, dict):
        return (
            type(got) is dict
            and got.keys() == expected.keys()
            and all(same(got[k], v) for k, v in expected.items())
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(got) is type(expected)
            and len(got) == len(expected)
            and all(same(g, e) for g, e in zip(got, expected))
        )
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is bool and type(expected) is bool and got == expected
    if isinstance(expected, (int, float)):
        return type(got) in (int, float) and got == expected
    if type(got) is not type(expected):
        return False
    try:
        return bool(got == expected)
    except Exception:  # e.g. a tensor of several elements: not a leaf to compare
        return False


def expect_close(got, expected, *, input, what="the result", rel=1e-9, abs_tol=1e-12):
    """Fail unless numbers agree within tolerance.

    The numbers may be nested in lists, tuples and dicts.
    """
    problem = _closeness_problem(got, expected, rel, abs_tol, path="")
    if problem:
        fail(
            f"wrong answer for {what}{problem}", input=input, expected=expected, got=got
        )


def _closeness_problem(got, expected, rel, abs_tol, path):
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f": expected a dict, got a {type(got).__name__}"
        missing = [k for k in expected if k not in got]
        if missing:
            return f": the key {missing[0]!r} is missing"
        for key, value in expected.items():
            problem = _closeness_problem(
                got[key], value, rel, abs_tol, f"{path}[{key!r}]"
            )
            if problem:
                return problem
        return ""
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{_at(path)}: expected a sequence, got a {type(got).__name__}"
        if len(got) != len(expected):
            return f"{_at(path)}: expected {len(expected)} items, got {len(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            problem = _closeness_problem(g, e, rel, abs_tol, f"{path}[{i}]")
            if problem:
                return problem
        return ""
    if isinstance(expected, bool) or not isinstance(expected, (int, float)):
        return (
            ""
            if same(got, expected)
            else f"{_at(path)}: expected {show(expected)}, got {show(got)}"
        )
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return f"{_at(path)}: expected a number, got a {type(got).__name__}"
    if math.isnan(got) and not math.isnan(expected):
        return f"{_at(path)}: got NaN"
    if not math.isclose(got, expected, rel_tol=rel, abs_tol=abs_tol):
        return (
            f"{_at(path)}: {show(got)} is not within "
            f"{rel:g} (relative) of {show(expected)}"
        )
    return ""


def _at(path):
    return f" at {path}" if path else ""


def expect_raises(call, exceptions, *, input, what="your function"):
    """Fail unless ``call()`` raises one of ``exceptions``.

    Bad input must be refused.
    """
    exceptions = exceptions if isinstance(exceptions, tuple) else (exceptions,)
    names = " or ".join(e.__name__ for e in exceptions)
    try:
        returned = call()
    except exceptions:
        return
    fail(
        f"{what} should refuse this input with a {names} that names the fix, "
        "but it returned",
        input=input,
        expected=verbatim(f"raise {names}"),
        got=returned,
    )
