"""Exercise 5.1: a bf16 compression hook (chapter 5).

Read practice/exercises/09_bf16_compression_hook/README.md, write the hook,
then grade it:  python practice/judge.py 5.1
"""

import torch
import torch.distributed as dist


def bf16_hook(state, bucket):
    """All-reduce ``bucket`` as bfloat16.

    Returns a Future of the averaged float32 buffer.
    """
    raise NotImplementedError("write bf16_hook")
