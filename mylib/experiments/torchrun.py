"""A script under ``torchrun`` from a notebook cell or a test, and nothing left behind.

``torchrun`` starts its workers in sessions of their own, so killing
``torchrun`` alone leaves them running. :func:`run_torchrun` (one
``torchrun --standalone`` on this machine) remembers every process below it
while it runs, and past its time limit kills them all. :mod:`elastic`'s
agents use the same helpers.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def torchrun_path():
    """The ``torchrun`` of this Python (the virtual environment's)."""
    return str(pathlib.Path(sys.executable).with_name("torchrun"))


def worker_env(**extra):
    """The environment a launched script gets: one thread per process, ``mylib``
    importable from any folder (the repository on ``PYTHONPATH``), plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def run_torchrun(script, nproc=2, args=(), cwd=None, timeout_s=300, env=None):
    """``torchrun --standalone --nproc-per-node=nproc script *args`` in ``cwd``.

    ``env``: more environment variables, for ``torchrun`` and its workers.
    Returns the finished ``subprocess.CompletedProcess``, output captured as
    text. Past ``timeout_s`` seconds ``torchrun`` and every process it started
    are killed, and ``subprocess.TimeoutExpired`` is raised.
    """
    script = str(script)
    command = [torchrun_path(), "--standalone", f"--nproc-per-node={nproc}", script]
    command += [str(a) for a in args]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=worker_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen, deadline = set(), time.monotonic() + timeout_s
    while True:
        try:
            out, err = proc.communicate(timeout=0.5)
            return subprocess.CompletedProcess(command, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            seen.update(descendants(proc.pid))  # workers, while torchrun lives
            if time.monotonic() > deadline:
                kill_all([proc.pid, *seen], script)
                proc.communicate()
                raise


def descendants(pid):
    """Pids of every living process below ``pid`` (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def runs(pid, text):
    """Whether process ``pid`` has ``text`` on its command line (a pid is reused
    after its process exits: check before signalling it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


def kill_all(pids, script):
    """SIGKILL every pid in ``pids`` that still runs ``script``."""
    for pid in sorted(set(pids)):
        if runs(pid, script):
            send(pid, signal.SIGKILL)


def send(pid, sig):
    """``os.kill``, quiet when the process is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
