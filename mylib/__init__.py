"""mylib: the small library that Data Parallel from Scratch builds, one concept per file."""

from mylib.launch import RankError, RankTimeout, current_device, init_from_env, run_ranks
from mylib.ddp import MyDDP

__all__ = ["MyDDP", "RankError", "RankTimeout", "current_device", "init_from_env", "run_ranks"]
