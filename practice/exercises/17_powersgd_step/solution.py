"""Exercise 5.2, reference solution."""

import torch.distributed as dist


def orthonormalise_(matrix):
    """Gram-Schmidt, in place, on the columns of ``matrix``."""
    for i in range(matrix.shape[1]):
        column = matrix[:, i : i + 1]
        column /= column.norm()
        rest = matrix[:, i + 1 :]
        rest -= (column * rest).sum(dim=0, keepdim=True) * column


def powersgd_step(grad, q, error):
    """One rank-r PowerSGD step with error feedback: (approx, new_q, new_error)."""
    world = dist.get_world_size()
    m = grad + error  # error feedback: what the last step did not send
    p = m @ q
    dist.all_reduce(p)  # the sum over ranks of M_k Q: n x r numbers
    orthonormalise_(p)
    new_q = m.t() @ p
    dist.all_reduce(new_q)  # m x r numbers
    new_q /= world
    approx = p @ new_q.t()
    return approx, new_q, m - approx
