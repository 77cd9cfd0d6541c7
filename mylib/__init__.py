"""mylib: the small library that Data Parallel from Scratch builds, one concept per file."""

from mylib.launch import RankError, RankTimeout, run_ranks
from mylib.torchrun import current_device, init_from_env
from mylib.ddp import MyDDP
from mylib.zero1 import ShardedOptimizer
from mylib.zero2 import ShardedGradOptimizer
from mylib.zero3 import ShardedModel

__all__ = ["MyDDP", "ShardedGradOptimizer", "ShardedModel", "ShardedOptimizer", "RankError", "RankTimeout", "current_device", "init_from_env", "run_ranks"]
