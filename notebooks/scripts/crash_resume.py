"""Train, checkpointing every few steps; rank 1 may die at a chosen step.

Start it with:
torchrun --nproc-per-node=2 --max-restarts=1 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:PORT crash_resume.py OUT [--crash-at K]
torchrun restarts the group once; the restarted run resumes from the newest
checkpoint in OUT/ckpt and writes its final state to OUT/final.pt.
"""

import time

t_start = time.time()  # before importing torch: the restart's cost includes it

import argparse  # noqa: E402

from mylib.checkpoint import init_for_restarts  # noqa: E402
from mylib.experiments.checkpoint_resume import train  # noqa: E402
from mylib.experiments.faults import Fault  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--crash-at", type=int, default=None)
parser.add_argument("--restore", default="data,rng", help="or 'data', 'rng', ''")
args = parser.parse_args()
init_for_restarts(timeout_s=60)
train(
    args.out,
    faults=[Fault(args.crash_at, "exit", rank=1)] if args.crash_at else [],
    restore=tuple(filter(None, args.restore.split(","))),
    t_start=t_start,
)
