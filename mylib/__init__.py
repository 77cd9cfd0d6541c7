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

import importlib

# What ``from mylib import X`` gives, and the module that defines it. Each is
# imported on first use (PEP 562), not by ``import mylib``: the what-if models and
# the terminal planner (``python -m mylib.plan``) then start without torch, on the
# standard library only, as they run in the browser.
_EXPORTS = {
    "MyDDP": "mylib.ddp",
    "ShardedGradOptimizer": "mylib.zero2",
    "ShardedModel": "mylib.zero3",
    "ShardedOptimizer": "mylib.zero1",
    "RankError": "mylib.launch",
    "RankTimeout": "mylib.launch",
    "ResumableSampler": "mylib.checkpoint",
    "current_device": "mylib.launch",
    "init_from_env": "mylib.launch",
    "load_checkpoint": "mylib.checkpoint",
    "run_ranks": "mylib.launch",
    "save_checkpoint": "mylib.checkpoint",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mylib' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
