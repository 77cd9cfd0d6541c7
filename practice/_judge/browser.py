"""Grading in the book's page (Pyodide), with the terminal's loading, checks and words.

``book/_static/practice-worker.js`` writes ``_judge/`` (this package's
standard-library modules), the exercise's ``checks.py`` and the reader's code
into Pyodide's file system, then calls :func:`grade`. There is no separate
process here: the page runs this in a Web Worker and terminates the worker
when it runs past its time limit.
"""

import json

from _judge.loading import load_checks, load_solution
from _judge.running import (
    Solution,
    collect_checks,
    describe,
    headline,
    overall,
    run_checks,
)


def grade(exercise_dir, path, on_start=None):
    """Grade the file at ``path``; return the report as JSON.

    The report holds the verdict, the message, the results and the lines.

    ``on_start(index, name)`` is called as each check starts (the page uses
    it to name the running check if the time limit stops it).
    """
    module, problem = load_solution(path)
    if problem:
        report = {
            "verdict": problem["verdict"],
            "message": problem["message"],
            "where": problem["where"],
            "results": [],
        }
    else:
        results = run_checks(
            collect_checks(load_checks(exercise_dir)),
            Solution(module, path),
            path,
            on_start=on_start,
        )
        verdict, message = overall(results)
        report = {
            "verdict": verdict,
            "message": message,
            "where": "",
            "results": results,
        }
    report["lines"] = report_lines(report)
    return json.dumps(report)


def report_lines(report):
    """The report as (kind, text) lines, as the terminal prints them, without colour."""
    lines = []
    if not report["results"]:
        lines.append(("verdict", f"{report['verdict'].upper()}  {report['message']}"))
        lines.extend(("detail", line) for line in report["where"].splitlines())
    said = None
    for result in report["results"]:
        lines.append((result["status"], "  " + headline(result)))
        details = describe(result)
        if result["status"] == "skipped":
            details, said = ([] if details == said else details), details
        lines.extend(("detail", "          " + line) for line in details)
    if report["results"]:
        word = "PASSED" if report["verdict"] == "passed" else report["verdict"].upper()
        lines.append(("verdict", f"{word}: {report['message']}"))
    return lines
