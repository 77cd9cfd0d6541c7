"""Running a script under ``torchrun --standalone`` on CPU ranks, for the tests."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_torchrun(script, cwd, nproc=2, timeout=300):
    """``torchrun --standalone --nproc-per-node=nproc script`` in ``cwd``.

    One thread per rank, the repository on ``PYTHONPATH`` (so ``import mylib``
    works from any folder). Returns the finished process, output captured.
    """
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run(
        [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
