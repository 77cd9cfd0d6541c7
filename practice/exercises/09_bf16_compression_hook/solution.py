"""Exercise 5.1, reference solution."""

import torch
import torch.distributed as dist


def bf16_hook(state, bucket):
    """All-reduce ``bucket`` as bfloat16.

    Returns a Future of the averaged float32 buffer.
    """
    group = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    # Divide before the sum: the sum of N values cannot then grow past any one of them.
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress(fut):
        buffer.copy_(fut.value()[0])  # back to the bucket's dtype, in place
        return buffer

    return work.get_future().then(decompress)
