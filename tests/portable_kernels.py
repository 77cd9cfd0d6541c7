"""The CPU kernels of ``make test-portable``, for the notebooks and for a test.

ATen compiles its CPU kernels once per SIMD level and picks one when a process
starts using them; MKL picks a code path by processor. ``ATEN_CPU_CAPABILITY=default``
and ``MKL_CBWR=AVX2`` choose others than this machine's own (book/setup.md, "On
another CPU"). ``make test-portable`` runs the notebooks under them. A chapter's
longest run is checked there by its test instead (a cell tagged
``nbval-portable-test:FILE::TEST``, which the portable run skips): the test runs the
chapter's function under these kernels and asserts the chapter's claims, so the
chapter runs once under each set of kernels, not twice under one.

``python tests/portable_kernels.py`` prints :data:`ENV` for the Makefile.
"""

import os
import pickle
import subprocess
import sys
import tempfile

ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2"}

# Run in a new Python: the kernels are chosen once per process, so the ranks must
# come from a process that starts under ENV (mylib.run_ranks forks them from a server
# it starts, which inherits the environment).
_PROGRAM = """
import importlib, pickle, sys
import torch
from mylib import run_ranks
module, name, world_size, timeout_s, out = sys.argv[1:]
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
function = getattr(importlib.import_module(module), name)
results = run_ranks(function, int(world_size), timeout_s=float(timeout_s))
with open(out, "wb") as f:
    pickle.dump(results, f)
"""


def run_ranks_on_portable_kernels(function, world_size, timeout_s):
    """``mylib.run_ranks(function, world_size)`` in a new Python under :data:`ENV`.

    ``function`` must be importable (a module's top-level function). Returns the
    ranks' results. Past ``timeout_s`` (plus a minute to start) the Python is killed,
    and its ranks die with it.
    """
    # mylib importable (the repository on PYTHONPATH), as for a launched script; here,
    # not at the top: the Makefile runs this file with a Python that has no mylib
    from mylib.experiments.torchrun import worker_env

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "results.pickle")
        done = subprocess.run(
            [sys.executable, "-c", _PROGRAM, function.__module__, function.__name__]
            + [str(world_size), str(timeout_s), out],
            env=worker_env(**ENV),
            capture_output=True,
            text=True,
            timeout=timeout_s + 60,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{function.__name__} on the portable kernels failed:\n"
                + done.stderr[-4000:]
            )
        with open(out, "rb") as f:
            return pickle.load(f)


if __name__ == "__main__":
    print(" ".join(f"{key}={value}" for key, value in ENV.items()))
