"""Exercise 3.3: a DDP with one async all-reduce per parameter (chapter 3).

Read practice/exercises/14_per_parameter_ddp/README.md, write the class,
then grade it:  python practice/judge.py 3.3
"""

import torch
import torch.distributed as dist


class PerParameterDDP:
    """One async all-reduce per parameter, launched as its gradient is ready."""

    def __init__(self, model):
        raise NotImplementedError("write PerParameterDDP.__init__")

    def finish_gradient_sync(self):
        """Wait for every all-reduce launched in the last backward."""
        raise NotImplementedError("write PerParameterDDP.finish_gradient_sync")
