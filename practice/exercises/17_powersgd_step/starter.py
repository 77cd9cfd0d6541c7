"""Exercise 5.2: one PowerSGD step with error feedback (chapter 5).

Read practice/exercises/17_powersgd_step/README.md, write the function,
then grade it:  python practice/judge.py 5.2
"""

import torch
import torch.distributed as dist


def powersgd_step(grad, q, error):
    """One rank-r PowerSGD step with error feedback.

    Returns ``(approx, new_q, new_error)``.
    """
    raise NotImplementedError("write powersgd_step")
