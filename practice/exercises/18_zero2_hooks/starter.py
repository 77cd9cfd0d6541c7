"""Exercise 6.3: ZeRO-2, reduce-scatter from hooks in bounded memory (chapter 6).

Read practice/exercises/18_zero2_hooks/README.md, write the class,
then grade it:  python practice/judge.py 6.3
"""

import math
from collections import deque

import torch
import torch.distributed as dist


class Zero2SGD:
    """SGD whose gradients are reduce-scattered from hooks, one parameter at a time."""

    def __init__(self, model, lr):
        raise NotImplementedError("write Zero2SGD.__init__")

    def step(self):
        raise NotImplementedError("write Zero2SGD.step")
