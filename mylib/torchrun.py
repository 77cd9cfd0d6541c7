"""Chapter 0. The production path: the same worker code under ``torchrun`` on GPUs.

In the notebooks :func:`mylib.run_ranks` starts the ranks. On a cluster
``torchrun`` starts one process per GPU and describes the group in
environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); a script joins it with
:func:`init_from_env` and computes on :func:`current_device`.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist


def current_device():
    """The device this rank should compute on: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env(timeout_s=300.0):
    """Join the process group that ``torchrun`` describes in the environment.

    Picks NCCL when CUDA is available, gloo otherwise, and pins the rank to
    its local GPU. Returns ``(rank, world_size, device)``. Use it at the top of
    a script started with ``torchrun --standalone --nproc-per-node=N script.py``.
    """
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(
                f"environment variable {var} is not set: start this script with "
                "`torchrun --standalone --nproc-per-node=N "
                f"{os.path.basename(sys.argv[0])}`"
            )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), current_device()
