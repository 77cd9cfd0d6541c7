"""The command line's side of the grading service: grades that do not import torch.

``judge.py`` never grades in its own process. It asks a *grading service*
(``server.py --listen``) to grade, and prints the report that comes back
(JSON). The service has imported torch once and outlives the command for
``JUDGE_SERVER_IDLE_S`` seconds (120 by default), so the next grade within
that time starts at once: a rank exercise graded a second time takes about
a second instead of several. There are two services, one with torch (rank
exercises) and one without; each is keyed by the judge's own source, its
Python and its folder, so an edited judge never talks to an old service.

``JUDGE_SERVER_IDLE_S=0``: no service outlives the command (the command's
own is stopped when it ends); the tests use that.

The socket lives in a folder only this user can enter
(``$XDG_RUNTIME_DIR`` or ``/tmp/judge-UID``); the service answers only this
user, and never the processes that run graded code (``server.py``).
"""

import contextlib
import fcntl
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time

from _judge import sandbox, server

DEFAULT_IDLE_S = 120.0
CONNECT_S = 180.0  # a cold service imports torch first: slow on a busy machine


class ServiceError(RuntimeError):
    """The grading service could not be started or reached (the message says why)."""


def idle_s():
    try:
        return max(float(os.environ.get("JUDGE_SERVER_IDLE_S", DEFAULT_IDLE_S)), 0.0)
    except ValueError:
        return DEFAULT_IDLE_S


def runtime_dir():
    """A folder only this user can use, for the service's socket; None if unsafe."""
    base = os.environ.get("JUDGE_RUNTIME_DIR") or os.environ.get("XDG_RUNTIME_DIR")
    folder = os.path.join(base, "data-parallel-judge") if base else None
    if folder is None or len(folder) > 80:  # a Unix socket's path: 107 bytes at most
        folder = os.path.join("/tmp", f"judge-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.makedirs(folder, mode=0o700)
    st = os.lstat(folder)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(folder):
        return None
    return folder


def _key(with_torch):
    """Which service: this judge's sources, this Python, this folder, this kind."""
    h = hashlib.sha256()
    h.update(f"{os.path.realpath(sandbox.PRACTICE_DIR)}\0{sys.executable}\0".encode())
    h.update(f"{with_torch}\0".encode())
    judge_dir = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(judge_dir)):
        if name.endswith(".py"):
            with open(os.path.join(judge_dir, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


class Service:
    """Grades through a service; ``with Service(exercises) as s: s.grade(...)``."""

    def __init__(self, exercises):
        self.exercises = list(exercises)
        self.idle_s = idle_s()
        self._spawned = {}  # kind -> Popen of a service this command started
        self._paths = {}

    def _address(self, with_torch):
        folder = runtime_dir() if self.idle_s > 0 else None
        if folder is None:  # a service for this command only
            folder = self._private = getattr(self, "_private", None) or (
                tempfile.mkdtemp(prefix="judge-service-")
            )
            name = f"{'torch' if with_torch else 'plain'}.sock"
        else:
            name = f"{_key(with_torch)}.sock"
        return os.path.join(folder, name)

    def _connect(self, exercise):
        """A connection to the service for ``exercise``'s kind, started if need be.

        A service started now imports torch and what this exercise's checks
        list (``RANK_PRELOAD``); a running one imports what a later exercise
        lists before grading it, once.
        """
        with_torch = bool(exercise.ranks)
        preload = sandbox.preload_for([exercise]) if with_torch else []
        path = self._address(with_torch)
        self._paths[with_torch] = path
        deadline = time.monotonic() + CONNECT_S
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # one command starts it
            sock = _try(path)
            if sock is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # a service that died left its socket
                self._spawn(with_torch, path, preload)
                while sock is None and time.monotonic() < deadline:
                    proc = self._spawned[with_torch]
                    if proc.poll() is not None and not os.path.exists(path):
                        raise ServiceError(
                            f"the grading service exited at start (status "
                            f"{proc.returncode}): run again with JUDGE_DEBUG=1"
                        )
                    time.sleep(0.02)
                    sock = _try(path)
        if sock is None:
            raise ServiceError(f"the grading service did not answer at {path}")
        return sock

    def _spawn(self, with_torch, path, preload):
        owner = [] if self.idle_s > 0 else ["--owner", str(os.getpid())]
        idle = self.idle_s if self.idle_s > 0 else 1e9
        debug = os.environ.get("JUDGE_DEBUG")
        self._spawned[with_torch] = subprocess.Popen(
            [sys.executable, sandbox.SERVER, "--listen", path, "--idle", str(idle)]
            + owner
            + list(preload),
            stdin=subprocess.DEVNULL,
            stdout=None if debug else subprocess.DEVNULL,
            stderr=None if debug else subprocess.DEVNULL,
            env=sandbox._child_env(),
            cwd=tempfile.gettempdir(),
            start_new_session=True,  # not the command's: a Ctrl-C there stops a grade
        )

    def grade(self, exercise, path, time_limit_s=None, check_timeout_s=None):
        """Grade the file at ``path``: a :class:`sandbox.Report`."""
        request = {
            "op": "grade",
            "exercises_dir": os.path.dirname(exercise.dir),
            "id": exercise.id,
            "path": os.path.abspath(path),
            # this command's limits (JUDGE_TIME_SCALE included), not the service's
            "time_limit_s": time_limit_s or exercise.time_limit_s,
            "check_timeout_s": check_timeout_s or exercise.check_timeout_s,
        }
        if exercise.ranks:
            request["preload"] = sandbox.preload_for([exercise])
        with self._connect(exercise) as sock:
            server.send_json(sock, request)
            limit = (time_limit_s or exercise.time_limit_s) + CONNECT_S
            answer = server.recv_json(sock, limit)
        if not isinstance(answer, dict) or "report" not in answer:
            why = answer.get("error") if isinstance(answer, dict) else None
            raise ServiceError(
                f"the grading service failed ({why or 'no answer'}): "
                "run again with JUDGE_DEBUG=1, and please report it"
            )
        return sandbox.report_from_plain(answer["report"])

    def close(self):
        """Stop the services this command started when they must not outlive it."""
        if self.idle_s > 0:
            return
        for with_torch, proc in self._spawned.items():
            sock = _try(self._paths[with_torch])
            if sock is not None:
                with sock, contextlib.suppress(OSError):
                    server.send_json(sock, {"op": "stop"})
                    server.recv_json(sock, 5.0)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        private = getattr(self, "_private", None)
        if private:
            import shutil

            shutil.rmtree(private, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _try(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def ping(path):
    """The pid of the service at ``path``, or None."""
    sock = _try(path)
    if sock is None:
        return None
    with sock:
        server.send_json(sock, {"op": "ping"})
        answer = server.recv_json(sock, 5.0)
    return answer.get("pid") if isinstance(answer, dict) else None


def stop_all():
    """Stop every service of this user that answers; return their pids."""
    folder = runtime_dir()
    stopped = []
    if folder is None:
        return stopped
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".sock"):
            continue
        sock = _try(os.path.join(folder, name))
        if sock is None:
            continue
        with sock:
            server.send_json(sock, {"op": "stop"})
            answer = server.recv_json(sock, 5.0)
        if isinstance(answer, dict) and answer.get("pid"):
            stopped.append(answer["pid"])
    return stopped
