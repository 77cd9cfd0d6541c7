"""Grading a file: a snapshot, a separate process for the reader's code, checks here.

:func:`grade_file` reads the reader's file once (every check and every rank
grades that snapshot, whatever is saved meanwhile), checks the exercise's
files against the manifest, and has a fork server (``server.py``) start a
process that loads the snapshot. The checks run in this process, on a
stand-in for the reader's module (``remote.py``): that process only
computes values, and this one compares them. It never raises for anything
the reader's code does.

A :class:`Server` is started per grade, or kept by ``watch`` and ``all``
(``with Server(...) as server: grade_file(..., server=server)``), so torch is
imported once for many grades.
"""

import ast
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

# Every module of the judge that a grade uses, imported now: nothing is imported
# while (or after) the reader's code runs, when it might have written a module.
from _judge import (  # noqa: F401
    checking,
    child,
    collectives,
    confine,
    forkranks,
    loading,
    manifest,
    ranks,
    spy,
    tamper,
    wire,
)
from _judge.remote import Client, ProcessEnded, checks_turn
from _judge.running import collect_checks, overall, run_checks

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")
PRACTICE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(PRACTICE_DIR)

OUTPUT_CAP_BYTES = 4 * 1024 * 1024  # more than this much printing is a runaway loop
# Address space for exercises without torch (torch alone maps more than this; rank
# exercises get no cap).
MEMORY_CAP_BYTES = 1024 * 1024 * 1024
LOAD_LIMIT_S = 10.0  # loading a file defines functions: longer is a loop at the top
SERVER_START_S = 180.0  # a cold fork server imports torch first: slow on a busy machine
SHOWN_OUTPUT_CHARS = 1500  # how much of what the reader's code printed a report shows
TORCH_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.optim",
    "torch.distributed._functional_collectives",
    "_judge.ranks",
    "_judge.spy",
    "_judge.collectives",
    "_judge.forkranks",
    "_judge.child",
)


@dataclasses.dataclass
class Report:
    """What grading one file found.

    ``verdict`` is one of: passed, failed, syntax error, import error,
    load error, timeout, hang, crash, exit, too much output, refused.
    ``message`` says what happened in words; ``results`` are the per-check
    dicts of :mod:`running`; ``printed`` is an excerpt of what the code
    printed.
    """

    verdict: str
    message: str
    results: list
    printed: str = ""
    where: str = ""
    seconds: float = 0.0
    graded_hash: str = ""  # sha256 of the snapshot that was graded

    @property
    def passed(self):
        return self.verdict == "passed"


class Server:
    """A fork server; ``preload`` names the modules it imports once."""

    def __init__(self, preload=()):
        self.preload = tuple(preload)
        self._sending = threading.Lock()  # grades on several threads share it
        ours, theirs = socket.socketpair()
        self.ctl = ours
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, str(theirs.fileno()), *self.preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            cwd=tempfile.gettempdir(),
        )
        theirs.close()

    def start_job(self, job):
        ours, theirs = socket.socketpair()
        with self._sending:
            socket.send_fds(self.ctl, [json.dumps(job).encode()], [theirs.fileno()])
        theirs.close()
        return ours

    def close(self):
        with contextlib.suppress(OSError):
            self.ctl.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def preload_for(exercises, checks_modules=()):
    """What a fork server for these exercises imports once: torch and RANK_PRELOAD."""
    names = list(TORCH_PRELOAD) if any(ex.ranks for ex in exercises) else []
    wanted = [getattr(m, "RANK_PRELOAD", ()) for m in checks_modules]
    if not checks_modules:
        wanted = [_rank_preload(ex) for ex in exercises if ex.ranks]
    for more in wanted:
        names += [n for n in more if isinstance(n, str) and n not in names]
    return names


def _rank_preload(exercise):
    """``RANK_PRELOAD`` of a checks.py, read without running it."""
    try:
        tree = ast.parse(manifest.verified(exercise, "checks.py"))
    except (manifest.Tampered, OSError, SyntaxError):
        return ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "RANK_PRELOAD" for t in node.targets
        ):
            try:
                return tuple(ast.literal_eval(node.value))
            except ValueError:
                return ()
    return ()


def grade_file(exercise, path, *, time_limit_s=None, check_timeout_s=None, server=None):
    """Grade the reader's file ``path`` against ``exercise``'s checks.

    Returns a :class:`Report`.
    """
    started = time.monotonic()
    check_timeout_s = check_timeout_s or exercise.check_timeout_s
    time_limit_s = time_limit_s or exercise.time_limit_s
    try:
        checks_source = manifest.verified(exercise, "checks.py")
        for name in ("exercise.toml", "starter.py"):
            manifest.verified(exercise, name)
    except manifest.Tampered as e:
        return Report("refused", str(e), [], seconds=time.monotonic() - started)
    except OSError as e:
        return Report("refused", f"cannot read the exercise: {e}", [])
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as f:
            source = f.read()  # the snapshot: read once, graded everywhere
    except OSError as e:
        return Report("load error", f"cannot read your file: {e.strerror}", [])
    if exercise.ranks:  # tensors come back: torch here now, before the reader's code
        import torch  # noqa: F401
    checks = _load_checks(exercise, checks_source)
    own = server is None
    if own:
        server = Server(preload_for([exercise], [checks]))
    work = tempfile.mkdtemp(prefix="judge-")
    exercises_dir = os.path.dirname(exercise.dir)
    practice = os.path.dirname(exercises_dir)
    job = {
        "out_path": os.path.join(work, "output.txt"),
        "cwd": work,
        # Not readable by the reader's code: the reference solutions and git's copy.
        "hidden": [exercises_dir, os.path.join(os.path.dirname(practice), ".git")],
        "references": [exercises_dir],
        "reader_path": path,
        "repo": os.path.dirname(practice),  # on the child's path: mylib, for the code
    }
    before = tamper.take(exercises_dir)
    client = None
    try:
        sock = server.start_job(job)
        client = Client(sock, job["out_path"], OUTPUT_CAP_BYTES, path, source)
        client.server = server
        report = _grade(
            exercise,
            client,
            checks,
            checks_source,
            source,
            path,
            check_timeout_s,
            time_limit_s,
        )
        noticed = client.noticed()
        client.close()
        report = _refuse_if_tampered(report, before, noticed, exercise)
        report.printed = _excerpt(client.printed())
        report.seconds = time.monotonic() - started
        report.graded_hash = hashlib.sha256(source).hexdigest()
        return report
    finally:
        if client is not None:
            client.close()
        if own:
            server.close()
        shutil.rmtree(work, ignore_errors=True)


def _refuse_if_tampered(report, before, noticed, exercise):
    """A grade whose code wrote outside its folder, or read the answers, is refused.

    What it created is removed and what it changed is put back (tamper.py).
    """
    created, changed = tamper.changes(before)
    practice = os.path.dirname(os.path.dirname(exercise.dir))
    shown = [
        os.path.relpath(p, practice) if p.startswith(practice) else p
        for p in created + changed
    ]
    if created or changed:
        left = tamper.undo(before, created, changed)
        undone = (
            "; the judge removed or restored them"
            if not left
            else f"; restore these yourself: {', '.join(left[:5])}"
        )
        return Report(
            "refused",
            f"your code changed files outside its work folder "
            f"({', '.join(shown[:5])}{' ...' if len(shown) > 5 else ''}), which a "
            f"graded file may not do: this grade does not count{undone}",
            report.results,
        )
    problems = []
    if noticed.get("read"):
        problems.append(
            "opened the exercise's own files ("
            + ", ".join(os.path.relpath(p, practice) for p in noticed["read"][:3])
            + ")"
        )
    if noticed.get("called"):
        problems.append(
            "called the checks' own "
            + ", ".join(f"{n}()" for n in noticed["called"][:3])
        )
    if noticed.get("wrote"):
        problems.append(
            "tried to write outside its work folder ("
            + ", ".join(noticed["wrote"][:3])
            + "; refused)"
        )
    if problems:
        return Report(
            "refused",
            "your code "
            + " and ".join(problems)
            + ": a pass must come from your own code, so this grade does not count",
            report.results,
        )
    return report


def report_to_plain(report):
    """A :class:`Report` as JSON-able data (the grading service sends it so)."""
    return json.loads(json.dumps(dataclasses.asdict(report), default=str))


def report_from_plain(data):
    fields = {f.name for f in dataclasses.fields(Report)}
    return Report(**{k: v for k, v in data.items() if k in fields})


def _load_checks(exercise, source):
    """The checks, from the verified bytes (never re-read from disk)."""
    name = "checks_" + os.path.basename(exercise.dir)
    module = types.ModuleType(name)
    module.__file__ = exercise.path("checks.py")
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), vars(module))
    return module


def _init_message(
    exercise, checks, checks_source, source, path, check_timeout_s, trusted=False
):
    """What a child is told first: the verified checks, then the file to load."""
    return {
        "checks_name": checks.__name__,
        "checks_path": checks.__file__,
        "checks_source": checks_source,
        "path": path,
        "source": source,
        "check_timeout_s": min(check_timeout_s, LOAD_LIMIT_S),
        "output_cap": OUTPUT_CAP_BYTES,
        "memory_cap": 0 if exercise.ranks else MEMORY_CAP_BYTES,
        "preload": list(getattr(checks, "RANK_PRELOAD", ())),
        "trusted": trusted,  # the checks' reference ranks: no file to load
    }


def _handshake(client, check_timeout_s):
    """Wait for the child to load; a :class:`Report` if loading failed, else None."""
    client.check_timeout_s = check_timeout_s
    try:
        # The fork server may still be importing torch (not the reader's code).
        hello = client.receive(SERVER_START_S)
        if hello[0] == "hello":
            client.pid = int(hello[1])
            client.check_timeout_s = min(check_timeout_s, LOAD_LIMIT_S)
            hello = client.receive(client.check_timeout_s + 2.0)
        if hello[0] == "load_error":
            problem = hello[1]
            return Report(
                str(problem["verdict"]),
                str(problem["message"]),
                [],
                where=str(problem.get("where", "")),
            )
    except ProcessEnded as e:
        verdict = {"output": "too much output", "crash": "crash"}.get(e.kind, e.kind)
        message = e.judge_result["message"].replace(
            " during loading your file", " while loading your file"
        )
        return Report(verdict, message, [], where=e.judge_result.get("where", ""))
    return None


class _References:
    """A second child, running no code of the reader's, for PyTorch's own behaviour.

    Started at the first ``reference_on_ranks`` of a grade: its ranks run the
    checks' workers with PyTorch's DDP, hooks or optimizers, in a process tree
    of their own and a work folder the reader's process cannot write.
    """

    def __init__(self, server, exercise, checks, checks_source, check_timeout_s):
        self.server, self.exercise = server, exercise
        self.init = _init_message(
            exercise, checks, checks_source, b"", "<reference>", check_timeout_s, True
        )
        self.check_timeout_s = check_timeout_s
        self.work = None
        self._client = None

    def client(self):
        if self._client is None:
            self.work = tempfile.mkdtemp(prefix="judge-reference-")
            exercises_dir = os.path.dirname(self.exercise.dir)
            job = {
                "out_path": os.path.join(self.work, "output.txt"),
                "cwd": self.work,
                "hidden": [exercises_dir],
                "references": [exercises_dir],
                "reader_path": None,
                "repo": os.path.dirname(os.path.dirname(exercises_dir)),
            }
            sock = self.server.start_job(job)
            client = Client(sock, job["out_path"], OUTPUT_CAP_BYTES, "<reference>", b"")
            wire.send(client.sock, self.init)
            problem = _handshake(client, self.check_timeout_s)
            if problem is not None:
                client.close()
                raise RuntimeError(f"the checks' reference ranks: {problem.message}")
            self._client = client
        return self._client

    def close(self):
        if self._client is not None:
            self._client.close()
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


def _grade(
    exercise, client, checks, checks_source, source, path, check_timeout_s, time_limit_s
):
    wire.send(
        client.sock,
        _init_message(exercise, checks, checks_source, source, path, check_timeout_s),
    )
    problem = _handshake(client, check_timeout_s)
    if problem is not None:
        return problem
    references = _References(
        client.server, exercise, checks, checks_source, check_timeout_s
    )
    ranks._CURRENT.client = client
    ranks._CURRENT.reference = references.client
    deadline = time.monotonic() + time_limit_s
    try:

        def guard(name):
            left = max(min(check_timeout_s, deadline - time.monotonic()), 0.1)
            return client.check(name, left)

        with checks_turn():
            results = run_checks(
                collect_checks(checks), client.module(), path, guard=guard
            )
    finally:
        ranks._CURRENT.client = None
        ranks._CURRENT.reference = None
        references.close()
    if client.ended is not None:  # the process ended: that is the news
        kind = client.ended.kind
        verdict = {"output": "too much output"}.get(kind, kind)
        return Report(verdict, client.ended.judge_result["message"], results)
    verdict, message = overall(results)
    return Report(verdict, message, results)


def _child_env():
    env = dict(os.environ)
    # practice/ and the repository's root stay off the path (boot.py): the server
    # finds _judge itself, and mylib through its installed package.
    env["PYTHONPATH"] = os.pathsep.join(
        p
        for p in env.get("PYTHONPATH", "").split(os.pathsep)
        if p and os.path.realpath(p) not in (PRACTICE_DIR, REPO_DIR)
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _excerpt(text):
    if len(text) > 2 * SHOWN_OUTPUT_CHARS:
        return (
            text[:SHOWN_OUTPUT_CHARS]
            + f"\n... ({len(text)} characters in all) ...\n"
            + text[-SHOWN_OUTPUT_CHARS:]
        )
    return text
