"""Printing for the judge: the table of exercises, a grade report, hints.

Colour where the terminal supports it (rich), plain text when piped or when
``NO_COLOR`` is set. The detail lines of a failed check come from
:func:`checking.describe`, the same function the book's page uses, so the
terminal and the browser say the same thing.
"""

import os
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from _judge.running import describe, headline

STATUS_STYLE = {
    "passed": "green",
    "failed": "red",
    "error": "red",
    "todo": "yellow",
    "hang": "magenta",
    "timeout": "magenta",
    "exit": "red",
    "skipped": "dim",
}
STATE_STYLE = {
    "passed": "green",
    "passed, edited since": "green",
    "failed": "red",
    "edited": "yellow",
    "not started": "dim",
}
DIFFICULTY_STYLE = {"easy": "green", "medium": "yellow", "hard": "red"}


def make_console(file=None):
    """A console that colours only a real terminal (and never under NO_COLOR)."""
    file = file or sys.stdout
    is_tty = hasattr(file, "isatty") and file.isatty()
    width = None if is_tty else int(os.environ.get("COLUMNS", "100"))
    return Console(
        file=file,
        highlight=False,
        soft_wrap=False,
        width=width,
        no_color=bool(os.environ.get("NO_COLOR")),
        emoji=False,
    )


def command(*words):
    """The command line a reader types, as it would work from their current folder."""
    judge = os.path.relpath(
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "judge.py"
        )
    )
    python = "python"
    exe = os.path.abspath(sys.executable)
    if exe.startswith(os.path.abspath(os.getcwd()) + os.sep):
        python = os.path.relpath(exe)
    return " ".join([python, judge, *words])


def rel(path):
    """A path relative to the reader's current folder, when that is shorter."""
    r = os.path.relpath(path)
    return r if len(r) < len(path) else path


def print_table(console, exercises, states, progress_warning=None):
    """Every exercise with its state, the progress, and what to do next."""
    if progress_warning:
        console.print(Text(progress_warning, style="yellow"))
    table = Table(
        title="Data Parallel from Scratch: graded exercises",
        title_justify="left",
        expand=False,
    )
    for name, kwargs in (
        ("id", {}),
        ("exercise", {}),
        ("chapter", {"justify": "right"}),
        ("difficulty", {}),
        ("where", {}),
        ("state", {}),
    ):
        table.add_column(name, **kwargs)
    for ex in exercises:
        state = states[ex.id]
        table.add_row(
            ex.short,
            ex.title,
            str(ex.chapter),
            Text(ex.difficulty, style=DIFFICULTY_STYLE[ex.difficulty]),
            "ranks" if ex.ranks else ("browser too" if ex.browser else "local"),
            Text(state, style=STATE_STYLE.get(state, "")),
        )
    console.print(table)
    done = sum(1 for ex in exercises if states[ex.id].startswith("passed"))
    console.print(
        Text(
            f"Progress: {done} of {len(exercises)} passed "
            f"({100 * done // max(len(exercises), 1)}%)",
            style="bold",
        )
    )
    print_next(console, exercises, states)


def next_exercise(exercises, states, after=None):
    """The first exercise not passed yet (after ``after``, wrapping around).

    In the book's order: by chapter, then place in the chapter.
    """
    order = sorted(exercises, key=lambda ex: ex.order)
    if after is not None:
        i = [ex.id for ex in order].index(after.id)
        order = order[i + 1 :] + order[: i + 1]
    return next((ex for ex in order if not states[ex.id].startswith("passed")), None)


def print_next(console, exercises, states, after=None):
    ex = next_exercise(exercises, states, after)
    if ex is None:
        console.print(
            Text(
                "Every exercise passes. Well done: "
                "you have built data-parallel training from scratch.",
                style="bold green",
            )
        )
        return
    console.print(
        Text.assemble(
            ("Next: ", "bold"),
            f"{ex.short} {ex.title} (chapter {ex.chapter}, {ex.difficulty})",
        )
    )
    console.print(f"  read   {rel(ex.path('README.md'))}")
    console.print(f"  edit   {rel(ex.workspace)}")
    console.print(f"  grade  {command(ex.short)}")


def print_report(console, ex, report, graded_path, hints_total=0):
    """One exercise's grade: a line per check, failure details, what to do next."""
    console.print(
        Text.assemble(
            (f"{ex.short} {ex.title}", "bold"),
            f"  (chapter {ex.chapter}, {ex.difficulty})",
        )
    )
    console.print(Text(f"grading {rel(graded_path)}", style="dim"))
    console.print()
    if not report.results:  # it did not get as far as the checks
        console.print(
            Text(report.verdict.upper(), style="bold red"), Text(report.message)
        )
        if report.where:
            console.print(Text(report.where))
    said = None
    for result in report.results:
        style = STATUS_STYLE.get(result["status"], "")
        console.print(Text("  ") + Text(headline(result), style=style))
        lines = describe(result)
        if (
            result["status"] == "skipped"
        ):  # one reason for a run of skipped checks is enough
            lines, said = ([] if lines == said else lines), lines
        for line in lines:
            # soft_wrap: long inputs wrap in the terminal, not in the middle of our
            # indentation
            console.print(
                Text(
                    "          " + line,
                    style="dim" if result["status"] == "skipped" else "",
                ),
                soft_wrap=True,
            )
    if report.printed.strip() and not report.passed:
        console.print()
        console.print(Text("What your code printed:", style="bold"))
        console.print(Text(report.printed.rstrip()))
    console.print()
    seconds = f" ({report.seconds:.1f} s)"
    if report.passed:
        console.print(Text(f"PASSED: {report.message}{seconds}", style="bold green"))
        return
    # Said once: a file that never reached the checks had its message at the top.
    said = report.message if report.results else ""
    console.print(
        Text(
            f"{report.verdict.upper()}{': ' + said if said else ''}{seconds}",
            style="bold red",
        )
    )
    if hints_total:
        console.print(
            f"Stuck? {command('hint', ex.short)}  "
            f"({hints_total} hint{'s' if hints_total > 1 else ''})"
        )
    console.print(f"Statement: {rel(ex.path('README.md'))}")


def print_summary(console, rows):
    """After grading several: one line per exercise."""
    table = Table(title="Grades", title_justify="left")
    for name in ("id", "exercise", "verdict", "checks", "seconds"):
        table.add_column(name)
    for ex, report in rows:
        n_pass = sum(1 for r in report.results if r["status"] == "passed")
        table.add_row(
            ex.short,
            ex.title,
            Text(report.verdict, style="green" if report.passed else "red"),
            f"{n_pass}/{len(report.results)}",
            f"{report.seconds:.1f}",
        )
    console.print(table)


# ----------------------------------------------------------------------------
# LaTeX in a terminal: the statements' math as plain text
# ----------------------------------------------------------------------------

SYMBOLS = {
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "Delta": "Δ",
    "epsilon": "ε",
    "eta": "η",
    "theta": "θ",
    "lambda": "λ",
    "mu": "μ",
    "pi": "π",
    "rho": "ρ",
    "sigma": "σ",
    "tau": "τ",
    "nabla": "∇",
    "ell": "ℓ",
    "sum": "Σ",
    "prod": "Π",
    "cdot": "·",
    "times": "×",
    "in": "∈",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "approx": "≈",
    "neq": "≠",
    "pm": "±",
    "infty": "∞",
    "to": "→",
    "rightarrow": "→",
    "lceil": "⌈",
    "rceil": "⌉",
    "lfloor": "⌊",
    "rfloor": "⌋",
    "ldots": "…",
    "dots": "…",
    "cdots": "…",
    "log": "log",
    "min": "min",
    "max": "max",
    "exp": "exp",
    "sqrt": "√",
}
_SPACES = {",": " ", ";": " ", ":": " ", " ": " ", "!": "", "quad": "  "}
_TEXT = ("text", "mathrm", "mathbf", "mathit", "operatorname", "textrm", "mathtt")


def plain_math(markdown):
    """Markdown with its ``$...$`` and ``$$...$$`` math written as plain text.

    ``\\frac{a}{b}`` becomes ``a/b`` (with parentheses when needed), sub- and
    superscripts stay attached (``x_i``, ``ℓ_(i ∈ r)``), symbols become their
    Unicode characters: a terminal shows what the statement means, and no
    line breaks inside a subscript.
    """
    import re

    def block(m):
        return "    " + latex_to_text(m.group(1)).strip()

    text = re.sub(r"\$\$(.+?)\$\$", block, markdown, flags=re.S)
    return re.sub(
        r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?!\w)",
        lambda m: latex_to_text(m.group(1)),
        text,
    )


def latex_to_text(latex):
    text, _ = _parse(latex, 0)
    return " ".join(text.split())


def _simple(text):
    import re

    return re.fullmatch(r"[\w.′]+", text) is not None


def _wrap(text):
    return text if _simple(text) else f"({text})"


def _group(s, i):
    """The argument at ``s[i]``: a ``{...}`` group, a command, or one character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return "", i
    if s[i] == "{":
        return _parse(s, i + 1)
    if s[i] == "\\":
        return _command(s, i)
    return s[i], i + 1


def _command(s, i):
    j = i + 1
    while j < len(s) and s[j].isalpha():
        j += 1
    name = s[i + 1 : j] if j > i + 1 else s[i + 1 : i + 2]
    j = max(j, i + 2)
    if name in _SPACES:
        return _SPACES[name], j
    if name in ("{", "}", "%", "$", "_", "#", "&"):
        return name, j
    if name in ("left", "right", "big", "Big", "bigl", "bigr", "displaystyle"):
        return "", j
    if name in ("frac", "dfrac", "tfrac"):
        top, j = _group(s, j)
        bottom, j = _group(s, j)
        return f"{_wrap(top.strip())}/{_wrap(bottom.strip())}", j
    if name in _TEXT:
        inner, j = _group(s, j)
        return inner, j
    if name in ("sum", "prod"):
        lower = upper = ""
        while j < len(s) and s[j] in "_^":
            arg, k = _group(s, j + 1)
            lower, upper = (arg, upper) if s[j] == "_" else (lower, arg)
            j = k
        limits = lower + (f"..{upper}" if upper else "")
        return f" {SYMBOLS[name]}" + (f"[{limits.strip()}] " if limits else " "), j
    return SYMBOLS.get(name, name), j


def _parse(s, i):
    out = []
    while i < len(s):
        c = s[i]
        if c == "}":
            return "".join(out), i + 1
        if c == "{":
            inner, i = _parse(s, i + 1)
            out.append(inner)
        elif c == "\\":
            text, i = _command(s, i)
            out.append(f" {text} " if text in ("∈", "≤", "≥", "≈", "≠", "→") else text)
        elif c in "_^":
            arg, i = _group(s, i + 1)
            arg = " ".join(arg.split())
            out.append(c + (arg if _simple(arg) else f"({arg})"))
        else:
            out.append(c)
            i += 1
    return "".join(out), i
