"""FSDP2 state saved with torch.distributed.checkpoint, loaded at another world size.

torchrun --nproc-per-node=4 ... dcp_reshard.py OUT save     # each rank its shard
torchrun --nproc-per-node=2 ... dcp_reshard.py OUT resume   # read back on 2 ranks
torchrun --nproc-per-node=2 ... dcp_reshard.py OUT async    # async_save, timed
Rank 0 writes every rank's figures to OUT/<mode>-<world size>.json.
"""

import argparse
import json
import os

import torch.distributed as dist

from mylib import init_from_env
from mylib.experiments import checkpoint_sharded as cs

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("mode", choices=["save", "resume", "async"])
args = parser.parse_args()
rank, world, _ = init_from_env(timeout_s=120)
run = {"save": cs.save_both, "resume": cs.resume_both, "async": cs.time_async_save}
mine = run[args.mode](args.out)
everyone = [None] * world
dist.all_gather_object(everyone, mine)
if rank == 0:
    with open(os.path.join(args.out, f"{args.mode}-{world}.json"), "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
