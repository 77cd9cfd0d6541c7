"""Chapter 5. Communication hooks that send fewer bytes: 16-bit gradients.

``MyDDP`` (like PyTorch's DDP) hands every full bucket to a *communication
hook*, ``hook(state, bucket) -> Future``, whose future holds the averaged flat
gradient. The default hook (:func:`mylib.ddp.allreduce_average_hook`) sends
the bucket as it is: 4 bytes per fp32 gradient. The hooks here cast the
bucket to a 16-bit float first, all-reduce that, and cast the result back
into the bucket, so every rank sends half the bytes:

* ``fp16`` (IEEE half): 10 mantissa bits, so a value is rounded by at most
  ``2**-11`` (about 5e-4) of itself; but only 5 exponent bits, so values
  under about 6e-5 lose precision and under 6e-8 vanish, and values over
  65504 overflow.
* ``bf16`` (bfloat16): fp32's 8 exponent bits, so nothing over- or
  underflows that fits in fp32; only 7 mantissa bits, a rounding of at most
  ``2**-8`` (about 4e-3).

Both divide by the world size *before* the sum, so the sum of ``n`` ranks
stays in the range of one rank's gradient (fp16 would otherwise overflow
sooner). This is exactly what PyTorch's
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``
and ``bf16_compress_hook`` do; chapter 5 checks that the two agree, on
MyDDP and on PyTorch's DDP. The low-rank end of the same idea is
:mod:`mylib.powersgd`.

Usage, on every rank::

    model = MyDDP(net)
    # state: the process group (None: everyone)
    model.register_comm_hook(None, bf16_compress_hook)
"""

import torch
import torch.distributed as dist

from mylib import comm

# The unit roundoff of each wire format: rounding to it moves a value by at most
# this fraction of itself.
UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
}


def _compress_hook(dtype, process_group, bucket):
    """All-reduce ``bucket`` in ``dtype``: cast, sum, cast back into the bucket.

    The cast copy is divided by the world size before the sum.
    """
    flat = bucket.buffer()
    if not flat.is_floating_point():
        raise TypeError(
            "a compression hook needs floating-point gradients, got a bucket of "
            f"{flat.dtype}"
        )
    compressed = flat.to(dtype).div_(dist.get_world_size(process_group))
    work = comm.all_reduce(compressed, group=process_group, async_op=True)

    def decompress(future):
        # Back into the bucket's own buffer: p.grad are views of it, so nothing
        # else has to be copied.
        flat.copy_(future.value()[0])
        return flat

    return work.get_future().then(decompress)


def fp16_compress_hook(process_group, bucket):
    """Average ``bucket`` over ranks, sending fp16 (IEEE half): half fp32's bytes."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group, bucket):
    """Average ``bucket`` over ranks, sending bfloat16: half fp32's bytes.

    bfloat16 keeps fp32's range, with coarser rounding.
    """
    return _compress_hook(torch.bfloat16, process_group, bucket)


HOOKS = {"fp16": fp16_compress_hook, "bf16": bf16_compress_hook}
WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def rounding_error_in_units(averaged, rank_gradients, dtype):
    """How far a low-precision average is from the exact one, in units of rounding.

    ``rank_gradients`` are every rank's own gradient (one tensor each, in
    float64 for the reference), ``averaged`` what the hook produced. The
    error of each element is divided by ``u x mean_r |g_r|``: the format's
    unit roundoff times the size of a typical rank's *whole* gradient (not
    of its share ``g_r / n``), because the hook rounds ``g_r`` when it casts
    it, before dividing by ``n`` (:func:`rounding_bound_in_units` gives the
    bound and why). Below fp16's normal range (6.1e-5) fp16 rounds to a fixed
    step instead, so for fp16 the scale is at least that floor. Returns the
    largest ratio over the elements.
    """
    stacked = torch.stack([g.double() for g in rank_gradients])
    exact = stacked.mean(dim=0)
    scale = stacked.abs().mean(dim=0)
    if dtype == torch.float16:
        scale = scale.clamp_min(torch.finfo(torch.float16).tiny)
    scale = scale.clamp_min(torch.finfo(torch.float64).tiny)
    return (
        ((averaged.double() - exact).abs() / (UNIT_ROUNDOFF[dtype] * scale))
        .max()
        .item()
    )


def rounding_bound_in_units(world_size):
    """The most a 16-bit hook's average can be off, in :func:`rounding_error_in_units`.

    To first order in the unit roundoff ``u``, with ``m = mean_r |g_r|``:

    * the cast moves each rank's whole gradient ``g_r`` by up to ``u |g_r|``;
      divided by ``n`` and summed over the ranks: ``u m``;
    * the division by ``n`` is exact when ``n`` is a power of two (in the
      normal range), else it rounds each share once more: another ``u m``;
    * the ring's ``n - 1`` additions each round a partial sum
      ``s_k = sum_{j <= k} g_j / n``, and ``|s_k| <= m``: ``(n - 1) u m``.

    So ``n`` units for 2, 4, 8 ... ranks, ``n + 1`` for the others.
    """
    n = int(world_size)
    if n < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    power_of_two = n & (n - 1) == 0
    return n if power_of_two else n + 1
