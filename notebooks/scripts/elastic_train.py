"""Data-parallel training that survives losing a machine.

Start one agent per machine (here: two on this one), each with one process:
torchrun --nnodes=1:2 --nproc-per-node=1 --max-restarts=1 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=chapter9 elastic_train.py OUT \
    [--kill-at K]
With --kill-at K, the process on the agent started with ELASTIC_NODE=B kills
its agent and itself after step K, as a lost machine would. The other agent
restarts its worker; it resumes from the newest checkpoint in OUT/ckpt at
world size 1, accumulating two micro-batches per step instead of one.
"""

import time

t_start = time.time()  # before importing torch: the restart's cost includes it

import argparse  # noqa: E402
import os  # noqa: E402

from mylib.checkpoint import init_for_restarts  # noqa: E402
from mylib.experiments.checkpoint_resume import train  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--kill-at", type=int, default=None)
args = parser.parse_args()
rank, world, _ = init_for_restarts(timeout_s=60)
doomed = os.environ.get("ELASTIC_NODE") == "B"
train(
    args.out,
    dropout=0.0,  # the survivor's random numbers cannot match a group of two
    crash_at=args.kill_at,
    crash_rank=rank if doomed else -1,
    crash="kill-agent",
    restore=("data",),
    t_start=t_start,
)
