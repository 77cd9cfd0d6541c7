#!/usr/bin/env python3
"""The judge: grades your solutions to the book's exercises, on this machine.

    python practice/judge.py              every exercise, your progress, what to do next
    python practice/judge.py 3.1          grade exercise 3.1 (chapter 3, first one);
                                          its folder number works too: 06
    python practice/judge.py hint 3.1     the next hint (--all: every hint)
    python practice/judge.py show 3.1     the statement
    python practice/judge.py all          grade every exercise
    python practice/judge.py watch [3.1]  re-grade each time you save the file
    python practice/judge.py reset 3.1    start again from the starter (yours is
                                          backed up)
    python practice/judge.py stop         stop the grading service now (it stops
                                          by itself after two idle minutes)
    python practice/judge.py help         this text

Maintainers: ``--solutions`` grades the reference solutions and ``--starters``
the untouched starters instead of your files; ``--file PATH`` grades any file.

Your code runs in a separate, confined process with time limits; the checks
run in the judge's grading service and compare what it returns. Exit status:
0 when everything graded passes, 1 when not, 2 for a command the judge does
not understand.
"""

import argparse
import concurrent.futures
import os
import sys

PRACTICE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(PRACTICE_DIR)
NEEDED = ("rich", "torch", "cloudpickle")


def _environment():
    """Run under the book's .venv when this Python lacks its packages (say so once)."""
    import importlib.util

    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    venv = os.path.join(REPO_DIR, ".venv")
    venv_python = os.path.join(venv, "bin", "python")
    inside = os.path.realpath(sys.prefix) == os.path.realpath(venv)
    if os.path.exists(venv_python) and not inside:
        if not os.environ.get("JUDGE_REEXEC"):
            print(
                f"judge: this Python ({sys.executable}) lacks {', '.join(missing)}; "
                "using the book's environment, .venv/bin/python",
                file=sys.stderr,
            )
            os.environ["JUDGE_REEXEC"] = "1"
            os.execv(
                venv_python, [venv_python, os.path.abspath(__file__), *sys.argv[1:]]
            )
    sys.exit(
        f"judge: this Python ({sys.executable}) lacks the packages "
        f"{', '.join(missing)}. Create the book's environment once with "
        "`make setup` (from the repository's root), then run "
        "`python practice/judge.py` again."
    )


def _boot():
    """Import the judge from its sources only, with practice/ off sys.path (boot.py)."""
    boot = os.path.join(PRACTICE_DIR, "_judge", "boot.py")
    with open(boot, "rb") as f:
        exec(compile(f.read(), boot, "exec"), {"__file__": boot, "__name__": "_boot"})


if __name__ == "__main__":
    _boot()
    _environment()

from _judge import catalog, report, state  # noqa: E402
from _judge.service import Service, ServiceError, stop_all  # noqa: E402

COMMANDS = ("list", "hint", "show", "all", "watch", "reset", "stop", "help")


class UsageError(Exception):
    """The command line asks for something that does not exist.

    The message names the fix.
    """


def parse(argv):
    p = argparse.ArgumentParser(
        prog="judge.py",
        description="Grade your solutions to the exercises "
        "of Data Parallel from Scratch.",
        epilog="Examples: judge.py | judge.py 3.1 | judge.py 06 | judge.py hint 3.1 "
        "| judge.py watch | judge.py reset 3.1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "words",
        nargs="*",
        metavar="[COMMAND] [ID]",
        help="an exercise id to grade, or one of "
        f"{', '.join(COMMANDS)} followed by an id",
    )
    p.add_argument(
        "--all",
        dest="all_hints",
        action="store_true",
        help="hint: show every hint at once",
    )
    p.add_argument(
        "--poll",
        action="store_true",
        help="watch: poll the file instead of using file events",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--solutions",
        action="store_true",
        help="grade the reference solutions (maintainers)",
    )
    which.add_argument(
        "--starters",
        action="store_true",
        help="grade the untouched starters (maintainers)",
    )
    which.add_argument("--file", help="grade this file instead of your workspace file")
    p.add_argument(
        "--timeout", type=float, help="time limit for one exercise, in seconds"
    )
    p.add_argument(
        "--check-timeout", type=float, help="time limit for one check, in seconds"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="all: grade this many exercises at once"
    )
    args = p.parse_args(argv)
    words = list(args.words)
    args.command = (
        words.pop(0)
        if words and words[0] in COMMANDS
        else ("grade" if words else "list")
    )
    if len(words) > 1:
        raise UsageError(
            f"too many words: {' '.join(args.words)}. "
            f"Give one exercise id, e.g. `{report.command('06')}`"
        )
    args.target = words[0] if words else None
    args.help_text = p.format_help()
    if args.command in ("hint", "show", "reset") and args.target is None:
        raise UsageError(
            f"`{args.command}` needs an exercise id, e.g. "
            f"`{report.command(args.command, '06')}`"
        )
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    return args


class _Output:
    """stdout that survives a reader who stops reading (`judge.py 06 | head -1`).

    Once the pipe is closed, the rest goes nowhere and the grade still ends
    with its own exit status.
    """

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv=None):
    """The command line: the grading service grades, this prints and remembers.

    No code of the reader's runs in this process or below it (``service.py``).
    """
    sys.stdout = _Output(sys.stdout)
    console = report.make_console()
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.command == "help":
            console.print(args.help_text, markup=False)
            console.print(
                __doc__.split("\n\n", 1)[1].split("\n\nMaintainers")[0], markup=False
            )
            return 0
        exercises = catalog.load_exercises()
        return run(args, exercises, console)
    except (UsageError, catalog.CatalogError) as e:
        console.print(f"judge: {e}", markup=False)
        return 2
    except ServiceError as e:
        console.print(f"judge: {e}", markup=False)
        return 3
    except KeyboardInterrupt:
        console.print("\nstopped.", markup=False)
        return 130
    except (
        BrokenPipeError
    ):  # `judge.py | head`: the reader stopped reading, nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # the judge never shows its own traceback to a reader
        if os.environ.get("JUDGE_DEBUG"):
            raise
        console.print(
            f"judge: internal error ({type(e).__name__}: {e}). "
            "Your files are untouched. Run again with JUDGE_DEBUG=1 for details, "
            "and please report it.",
            markup=False,
        )
        return 3


def run(args, exercises, console):
    progress = state.Progress()
    if args.command == "list":
        for ex in exercises:  # the files the table names exist from the start
            state.ensure_workspace(ex)
        report.print_table(
            console, exercises, _states(exercises, progress), progress.warning
        )
        return 0
    if args.command == "stop":
        stopped = stop_all()
        console.print(
            f"stopped the grading service (pid {', '.join(map(str, stopped))})"
            if stopped
            else "no grading service was running",
            markup=False,
        )
        return 0
    with Service(exercises) as args.service:
        return _run_grades(args, exercises, console, progress)


def _run_grades(args, exercises, console, progress):
    if args.command == "all":
        return grade_many(args, exercises, console, progress)
    if args.command == "watch":
        from _judge.watch import watch

        return watch(args, exercises, console, progress, grade_one)
    ex = catalog.find(exercises, args.target)
    if args.command == "show":
        with open(ex.path("README.md"), encoding="utf-8") as f:
            console.print(report.plain_math(f.read()), markup=False)
        console.print(
            f"Your file: {report.rel(state.ensure_workspace(ex))}   "
            f"Grade: {report.command(ex.short)}",
            markup=False,
        )
        return 0
    if args.command == "hint":
        return show_hint(ex, args, console, progress)
    if args.command == "reset":
        backup = state.reset(ex)
        progress.forget_pass(ex.id)
        saved = (
            f"; your previous file is saved as {report.rel(backup)}" if backup else ""
        )
        console.print(
            f"{report.rel(ex.workspace)} is the starter again{saved}.", markup=False
        )
        return 0
    return 0 if grade_one(args, ex, console, progress).passed else 1


def _states(exercises, progress):
    return {ex.id: state.state_of(ex, progress) for ex in exercises}


def target_file(args, ex):
    """Which file to grade: the reader's, or the one a flag names.

    The reader's file is created from the starter.
    """
    if args.solutions:
        return ex.path("solution.py")
    if args.starters:
        return ex.path("starter.py")
    if args.file:
        if not os.path.isfile(args.file):
            raise UsageError(f"--file {args.file}: no such file")
        return args.file
    return state.ensure_workspace(ex)


def grade_one(args, ex, console, progress, quiet=False):
    """Grade one exercise, print its report, and remember the outcome.

    The outcome is remembered for the reader's own file only.
    """
    path = target_file(args, ex)
    result = args.service.grade(
        ex, path, time_limit_s=args.timeout, check_timeout_s=args.check_timeout
    )
    own_file = not (args.solutions or args.starters or args.file)
    if own_file:
        progress.note_grade(ex, result, result.graded_hash)
    if not quiet:
        report.print_report(console, ex, result, path, hints_total=len(ex.hints()))
        if own_file and result.passed:
            console.print()
            report.print_next(
                console,
                catalog.load_exercises(),
                _states(catalog.load_exercises(), progress),
                after=ex,
            )
    return result


def grade_many(args, exercises, console, progress):
    """Grade every exercise, ``--jobs`` at a time; print each report, then a summary."""
    chosen = [catalog.find(exercises, args.target)] if args.target else exercises
    paths = {ex.id: target_file(args, ex) for ex in chosen}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            ex.id: pool.submit(
                args.service.grade,
                ex,
                paths[ex.id],
                time_limit_s=args.timeout,
                check_timeout_s=args.check_timeout,
            )
            for ex in chosen
        }
        rows = []
        for ex in chosen:
            result = futures[ex.id].result()
            if not (args.solutions or args.starters or args.file):
                progress.note_grade(ex, result, result.graded_hash)
            report.print_report(
                console, ex, result, paths[ex.id], hints_total=len(ex.hints())
            )
            console.print(report.Text("-" * 60, style="dim"))
            rows.append((ex, result))
    report.print_summary(console, rows)
    return 0 if all(r.passed for _, r in rows) else 1


def show_hint(ex, args, console, progress):
    """The next hint not seen yet (or all of them with --all)."""
    hints = ex.hints()
    seen = progress.record(ex.id).get("hints_seen", 0)
    # One new hint per call (the last one again once all are seen); --all shows them
    # all.
    indices = range(len(hints)) if args.all_hints else [min(seen, len(hints) - 1)]
    for i in indices:
        console.print(
            report.Text(
                f"Hint {i + 1} of {len(hints)} for {ex.short} {ex.title}", style="bold"
            )
        )
        console.print(hints[i], markup=False)
        console.print()
    upto = indices[-1] + 1
    progress.note_hint(ex.id, max(seen, upto))
    if upto < len(hints):
        console.print(
            f"Still stuck? `{report.command('hint', ex.short)}` "
            f"again for hint {upto + 1}.",
            markup=False,
        )
    else:
        console.print(
            "That was the last hint. The statement: "
            f"{report.rel(ex.path('README.md'))}",
            markup=False,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
