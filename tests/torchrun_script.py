"""Running a script under ``torchrun --standalone`` on CPU ranks, for the tests."""

import os

from mylib.experiments import torchrun


def run_torchrun(script, cwd, nproc=2, timeout=300, args=(), env=None):
    """``torchrun --standalone --nproc-per-node=nproc script *args`` in ``cwd``.

    One thread per rank, the repository on ``PYTHONPATH`` (so ``import mylib``
    works from any folder), and torch's FutureWarnings errors there too, as in
    every process a test starts (tests/conftest.py), plus ``env``. Returns the
    finished process, output captured. Past ``timeout`` seconds every process it
    started is killed (:func:`mylib.experiments.torchrun.run_torchrun`).
    """
    return torchrun.run_torchrun(
        script, nproc, args, cwd=cwd, timeout_s=timeout, env=env
    )


def left_behind(text):
    """Pids of the processes still running with ``text`` on their command line."""
    return [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if (pid != os.getpid() and torchrun.runs(pid, str(text)))
    ]
