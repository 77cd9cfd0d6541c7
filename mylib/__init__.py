"""mylib: the small data-parallel library that Data Parallel from Scratch builds.

The top level is the library itself, one concept per file, in the order the
chapters build it:

* chapter 0: ``launch`` (N ranks from a notebook, or under ``torchrun``)
* chapter 1: ``comm`` (collectives that count bytes), ``ring`` (ring all-reduce)
* chapter 2: ``averaging`` (equal replicas, disjoint data, mean gradients), ``loss``
* chapter 3: ``ddp_steps`` (DDP in four steps), ``ddp`` (:class:`MyDDP`)
* chapter 5: ``comm_hooks``, ``powersgd``
* chapter 6: ``zero1``, ``zero2``, ``zero3_flat`` and ``zero3``
* chapter 7: ``local_sgd``
* chapter 8: ``debug``, ``ledger`` (every rank's collectives, for hangs), ``ddp_checks``
  (what MyDDP refuses, and unused parameters)
* chapter 9: ``checkpoint`` (a checkpoint that resumes bit-exactly)

Beneath it: ``mylib.models`` (what-if models, standard library only: the
browser runs them), ``mylib.figures`` (what goes on a page) and
``mylib.experiments`` (the chapters' runs on real ranks). The library never
imports ``figures`` or ``experiments`` (``tests/test_layering.py``).
"""

from mylib.checkpoint import ResumableSampler, load_checkpoint, save_checkpoint
from mylib.ddp import MyDDP
from mylib.launch import (
    RankError,
    RankTimeout,
    current_device,
    init_from_env,
    run_ranks,
)
from mylib.zero1 import ShardedOptimizer
from mylib.zero2 import ShardedGradOptimizer
from mylib.zero3 import ShardedModel

__all__ = [
    "MyDDP",
    "ShardedGradOptimizer",
    "ShardedModel",
    "ShardedOptimizer",
    "RankError",
    "RankTimeout",
    "ResumableSampler",
    "current_device",
    "init_from_env",
    "load_checkpoint",
    "run_ranks",
    "save_checkpoint",
]
