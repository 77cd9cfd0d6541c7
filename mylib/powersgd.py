"""Chapter 5. PowerSGD: send a low-rank approximation of each gradient matrix.

After Vogels et al., 2019.

A weight's gradient is a matrix ``M`` (n x m: a conv kernel is read as
n x everything-else). PowerSGD replaces it by ``P Q^T`` with ``P`` n x r and
``Q`` m x r, found by one step of power iteration::

    P = M Q          all-reduce P (a sum)      n r numbers instead of n m
    P = orthonormalise(P)
    Q = M^T P        all-reduce Q, / ranks     m r numbers
    M ~ P Q^T

Every step is linear in ``M`` and every rank uses the same ``Q``, so summing
the ``M_k Q`` of the ranks is ``(sum_k M_k) Q``: the all-reduces compute the
approximation of the *average* gradient. Two ideas make it train well:

* **error feedback**: what the approximation missed, ``M - P Q^T``, is kept
  on each rank and added to the next step's gradient, so no part of a
  gradient is lost, only delayed;
* **warm start**: the next step starts from this step's ``Q`` instead of a
  random one, so the power iteration continues across steps and the
  approximation keeps improving while the gradients change slowly.

Vectors (biases, norms) and matrices too small to gain
(``(n + m) r x min_compression_rate >= n m``) are all-reduced as they are, and
the first ``start_powerSGD_iter`` steps all-reduce everything plainly: early
training is the most sensitive to a rough gradient.

The state and the hook mirror PyTorch's
``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`` (same
argument names, same rule for what to compress, the same random start for a
given seed), so the two agree step for step (``tests/test_powersgd.py``).
One difference is on purpose: PyTorch issues the second and third
all-reduces from future callbacks, which run on a communication thread and
may reach the process group before or after the next bucket's all-reduce;
this hook issues all of them from the calling thread, so every rank issues
every collective in the same order, whatever the number of buckets. It also
keeps less: per bucket the error and Q (PyTorch keeps P too), and the error's
buffer holds the corrected gradient during the step, where PyTorch clones the
bucket (``mylib.experiments.powersgd_costs`` counts both).
"""

import numpy as np
import torch
import torch.distributed as dist

from mylib import comm
from mylib.ddp import allreduce_average_hook


class PowerSGDState:
    """The settings of PowerSGD and what it remembers between steps.

    Per bucket it remembers the error of the last approximation and the last Q.
    """

    def __init__(
        self,
        process_group=None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=10,
        min_compression_rate=2.0,
        use_error_feedback=True,
        warm_start=True,
        random_seed=0,
    ):
        if (
            not isinstance(matrix_approximation_rank, int)
            or matrix_approximation_rank < 1
        ):
            raise ValueError(
                f"matrix_approximation_rank must be an int >= 1 (1 to 4 is usual), "
                f"got {matrix_approximation_rank!r}"
            )
        if not isinstance(start_powerSGD_iter, int) or start_powerSGD_iter < 0:
            raise ValueError(
                f"start_powerSGD_iter must be an int >= 0 (steps of plain all-reduce "
                f"first), got {start_powerSGD_iter!r}"
            )
        if (use_error_feedback or warm_start) and start_powerSGD_iter < 2:
            # As PyTorch's PowerSGDState: MyDDP, like DDP, rebuilds its buckets
            # after the first step, and the error and Q kept per bucket would
            # then belong to buckets that no longer exist.
            raise ValueError(
                "start_powerSGD_iter must be >= 2 with error feedback or warm start "
                "(the buckets are rebuilt after the first step), got "
                f"{start_powerSGD_iter!r}"
            )
        if not min_compression_rate > 0:
            raise ValueError(
                f"min_compression_rate must be > 0, got {min_compression_rate!r}"
            )
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        # Q's random start, as in PyTorch: one seed per bucket drawn from this stream.
        self.rng = np.random.RandomState(random_seed)
        # bucket index -> what the approximation missed last time (flat, on this rank)
        self.error_dict = {}
        self.q_memory_dict = {}  # bucket index -> last step's Qs (flat), the warm start
        self.iter = 0  # steps seen (counted at each step's last bucket)
        # numbers to send without and with compression, all steps
        self.numel_before = self.numel_after = 0

    def compression_rate(self):
        """Numbers a plain all-reduce would have sent, divided by the numbers sent.

        Over the compressed steps so far; NaN before the first.
        """
        return (
            self.numel_before / self.numel_after if self.numel_after else float("nan")
        )

    def maybe_increase_iter(self, bucket):
        """Count a step when its last bucket goes by."""
        if bucket.is_last():
            self.iter += 1


def orthonormalize_(matrix):
    """Gram-Schmidt, in place, on the columns of ``matrix`` (n x r, r <= n).

    A zero column stays zero (PyTorch would divide by 0 there) and otherwise
    the result is PyTorch's. Gram-Schmidt rather than QR because r is small.
    """
    tiny = torch.finfo(matrix.dtype).tiny
    for i in range(matrix.shape[1]):
        column = matrix[:, i : i + 1]
        column /= column.norm().clamp_min(tiny)
        rest = matrix[:, i + 1 :]
        rest -= (column * rest).sum(dim=0, keepdim=True) * column


def compression_plan(gradients, state):
    """Split a bucket's gradients into matrices to compress and the rest.

    Returns ``(matrix view, rank)`` pairs to compress, and the gradients to send
    as they are.
    """
    compress, plain = [], []
    for grad in gradients:
        matrix = grad.view(grad.shape[0], -1) if grad.dim() > 0 else grad.view(1, 1)
        n, m = matrix.shape
        rank = min(n, m, state.matrix_approximation_rank)
        if (n + m) * rank * state.min_compression_rate < n * m:
            compress.append((matrix, rank))
        else:
            plain.append(grad)
    return compress, plain


def _views(flat, shapes):
    """Consecutive views of ``flat`` with the given 2-D shapes."""
    views, offset = [], 0
    for rows, cols in shapes:
        views.append(flat[offset : offset + rows * cols].view(rows, cols))
        offset += rows * cols
    return views


def powersgd_hook(state, bucket):
    """Average ``bucket`` over ranks with PowerSGD.

    Returns a future of the bucket, holding the approximated average.
    """
    group = state.process_group
    world = dist.get_world_size(group)
    flat = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_average_hook(group, bucket)
    index = bucket.index()
    if state.use_error_feedback:
        error = state.error_dict.get(index)
        if error is None:  # the first compressed step: no error yet
            error = state.error_dict[index] = torch.zeros_like(flat)
        flat.add_(error)
        # What we want to send, kept in the error's own buffer: minus what arrives,
        # it is next step's error. No copy of the bucket per step (PyTorch's hook
        # clones it, and allocates the new error besides).
        error.copy_(flat)
    compress, plain = compression_plan(bucket.gradients(), state)
    state.numel_before += flat.numel()
    state.numel_after += sum(g.numel() for g in plain) + sum(
        (m.shape[0] + m.shape[1]) * r for m, r in compress
    )

    # P and Q of all the bucket's matrices live in one flat tensor each: one
    # all-reduce for all of them.
    p_flat = flat.new_empty(sum(m.shape[0] * r for m, r in compress))
    ps = _views(p_flat, [(m.shape[0], r) for m, r in compress])
    q_shapes = [(m.shape[1], r) for m, r in compress]
    q_flat = state.q_memory_dict.get(index) if state.warm_start else None
    if q_flat is None:  # a random start, seeded so that every rank draws the same Q
        generator = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
        q_flat = flat.new_empty(sum(rows * cols for rows, cols in q_shapes))
        for q in _views(q_flat, q_shapes):
            q.copy_(torch.randn(q.shape, generator=generator, dtype=flat.dtype))
    qs = _views(q_flat, q_shapes)
    for q in qs:
        orthonormalize_(q)

    plain_flat = torch.cat([g.reshape(-1) for g in plain]) if plain else None
    plain_work = (
        comm.all_reduce(plain_flat, group=group, async_op=True) if plain else None
    )
    for (matrix, _), p, q in zip(compress, ps, qs):
        torch.matmul(matrix, q, out=p)
    comm.all_reduce(p_flat, group=group)  # wait here: Q = M^T P needs the summed P
    for p in ps:
        orthonormalize_(p)
    for (matrix, _), p, q in zip(compress, ps, qs):
        torch.matmul(matrix.t(), p, out=q)
    q_work = comm.all_reduce(q_flat, group=group, async_op=True)

    def decompress(_):
        if plain:
            plain_flat.div_(world)
            offset = 0
            for grad in plain:
                grad.copy_(plain_flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        q_flat.div_(world)
        for (matrix, _), p, q in zip(compress, ps, qs):
            # the matrices are views of the bucket: this fills it
            torch.matmul(p, q.t(), out=matrix)
        if state.use_error_feedback:
            error.sub_(flat)
        if state.warm_start:
            state.q_memory_dict[index] = q_flat
        state.maybe_increase_iter(bucket)
        return flat

    works = [plain_work, q_work] if plain else [q_work]
    return torch.futures.collect_all([w.get_future() for w in works]).then(decompress)
