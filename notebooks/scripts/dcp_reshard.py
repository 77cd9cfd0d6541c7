"""FSDP2 state saved with torch.distributed.checkpoint, loaded at another world size.

torchrun --nproc-per-node=4 ... dcp_reshard.py OUT save       # each rank its shard
torchrun --nproc-per-node=2 ... dcp_reshard.py OUT resume-from-4 save async
torchrun --nproc-per-node=4 ... dcp_reshard.py OUT resume-from-2
A launch runs its steps in order (each launch starts Python and torch on every rank
again, seconds of CPU). save writes OUT/saved-on-<world size>, resume-from-N reads
OUT/saved-on-N, async times async_save in OUT/async. Rank 0 writes every rank's
figures of a step to OUT/<step>-on-<world size>.json.
"""

import argparse
import json
import os
import re

import torch.distributed as dist

from mylib import init_from_env
from mylib.experiments import checkpoint_sharded as cs


def step(text):
    if text in ("save", "async") or re.fullmatch(r"resume-from-\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not save, resume-from-N or async")


parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("steps", nargs="+", type=step)
args = parser.parse_args()
rank, world, _ = init_from_env(timeout_s=120)
for name in args.steps:
    if name == "save":
        mine = cs.save_both(os.path.join(args.out, f"saved-on-{world}"))
    elif name == "async":
        mine = cs.time_async_save(os.path.join(args.out, "async"))
    else:
        saved_on = name.removeprefix("resume-from-")
        mine = cs.resume_both(os.path.join(args.out, f"saved-on-{saved_on}"))
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        with open(os.path.join(args.out, f"{name}-on-{world}.json"), "w") as f:
            json.dump(everyone, f)
dist.destroy_process_group()
