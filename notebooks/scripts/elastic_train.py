"""Data-parallel training whose machines crash, freeze or join.

Start one agent per machine (here: several on this one), one process each:
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ELASTIC_NODE=A torchrun --nnodes=1:2 \
    --nproc-per-node=1 --max-restarts=1 --rdzv-backend=c10d \
    --rdzv-endpoint=HOST:PORT --rdzv-id=chapter9 elastic_train.py OUT \
    [--fault STEP:MACHINE:ACTION ...] [--dropout P] [--timeout-s S]
A fault strikes once, after STEP, on the machine named MACHINE (its
ELASTIC_NODE): exit (the process crashes), freeze (it waits to be frozen
from outside), busy (it works outside any collective). Every round resumes
from the newest checkpoint in OUT/ckpt; at world size 1 a rank accumulates
two micro-batches per step instead of one.
"""

import time

t_start = time.time()  # before importing torch: the restart's cost includes it

import argparse  # noqa: E402

from mylib.checkpoint import init_for_restarts  # noqa: E402
from mylib.experiments.checkpoint_resume import train  # noqa: E402
from mylib.experiments.faults import Fault  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fault", action="append", default=[], type=Fault.parse)
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--timeout-s", type=float, default=60.0)
args = parser.parse_args()
init_for_restarts(timeout_s=args.timeout_s)
train(args.out, dropout=args.dropout, faults=args.fault, t_start=t_start)
