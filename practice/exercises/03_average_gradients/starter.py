"""Exercise 2.1: average gradients after backward (chapter 2).

Read practice/exercises/03_average_gradients/README.md, write the function,
then grade it:  python practice/judge.py 2.1
"""

import torch
import torch.distributed as dist


def average_gradients(model):
    """Replace each parameter's .grad by its mean over all ranks.

    Skip parameters whose .grad is None.
    """
    raise NotImplementedError("write average_gradients")
