"""Chapter 6. ZeRO-3's storage: a unit's parameters as a shard and a full buffer.

:class:`ShardedFlat` holds the parameters of one unit (of one dtype and
``requires_grad``) laid out back to back as in ZeRO-1
(:class:`mylib.zero1.FlatParams`): a persistent *shard*, this rank's 1/N, and
a transient *full* buffer, a leaf tensor that requires grad. Gathering resizes
the full buffer's storage to its size and all-gathers the shards into it;
freeing resizes it to zero bytes. Views of the buffer stay valid across a
free and the next gather, so the views autograd saved in the forward see the
parameters again in the backward. Between forward and backward each original
parameter holds *its piece* of the shard (a 1-D view, empty where the shard
misses it), and after the backward its ``.grad`` is the matching piece of the
averaged gradient shard.

Mixed precision as FSDP2 names it (:class:`MixedPrecisionPolicy`): the shard
stays in the parameters' own dtype (fp32: the master copy the optimizer
steps); it is cast to ``param_dtype`` before the all-gather, so a bf16 gather
sends half the bytes; the gradient shard is kept in the shard's dtype.
:mod:`mylib.zero3` schedules the gathers, frees and reduce-scatters.
"""

import dataclasses

import torch

from mylib import comm
from mylib.zero1 import FlatParams


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """FSDP2's mixed precision, field for field (``torch.distributed.fsdp``'s).

    ``param_dtype``: the dtype parameters are all-gathered and computed in
    (None: their own). ``reduce_dtype``: the dtype gradients are
    reduce-scattered in (None: the dtype they were computed in).
    ``output_dtype``: cast each unit's floating-point outputs to it (None:
    leave them). ``cast_forward_inputs``: cast each unit's floating-point
    inputs to ``param_dtype``. PyTorch's own policy object works here too.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


class ShardedFlat:
    """Parameters of one unit with the same requires_grad and dtype.

    They are held as a persistent shard (in their dtype) and a transient full
    buffer (in the policy's ``param_dtype``).
    """

    def __init__(self, params, places, world_size, rank, process_group, policy):
        self.layout = FlatParams(params, world_size, rank)
        self.params, self.places, self.process_group = (
            self.layout.params,
            places,
            process_group,
        )
        self.shapes = [p.shape for p in self.params]
        self.trainable = params[0].requires_grad
        with torch.no_grad():
            flat = self.layout.flatten([p.detach() for p in self.params])
        self.shard = flat[self.layout.shard_start : self.layout.shard_end].clone()
        # As FSDP2 (FSDPParam.init_dtype_attrs): compute in param_dtype, reduce
        # in reduce_dtype; a policy naming the dtype already there changes nothing.
        compute = policy.param_dtype if flat.is_floating_point() else None
        self.compute_dtype = compute or flat.dtype
        self.reduce_dtype = policy.reduce_dtype or self.compute_dtype
        self.full = torch.empty_like(flat, dtype=self.compute_dtype)
        self.full.requires_grad_(self.trainable)
        self.full_bytes = self.full.numel() * self.full.element_size()
        self.grad_shard = None
        for p, offset, numel in zip(
            self.params, self.layout.offsets, self.layout.numels
        ):
            start = min(
                max(offset - self.layout.shard_start, 0), self.layout.shard_numel
            )
            end = min(
                max(offset + numel - self.layout.shard_start, 0),
                self.layout.shard_numel,
            )
            # this rank's piece of p: all the optimizer will see
            p.data = self.shard[start:end]
        self.free()

    def gather(self, async_op=False):
        """Allocate the full buffer, all-gather the shards into it.

        Returns the work if ``async_op``.
        """
        self.full.untyped_storage().resize_(self.full_bytes)
        # The master shard cast first (no copy without a policy): a bf16 gather
        # sends half the bytes of an fp32 one.
        self.sent = self.shard.to(self.compute_dtype)
        # Write through .data: autograd must not count the refill as an
        # in-place change of the views it saved.
        return comm.all_gather_single(
            self.full.data, self.sent, group=self.process_group, async_op=async_op
        )

    def free(self):
        """Give the full buffer's memory back, and the cast shard's.

        Views of it stay valid, and the next gather refills them.
        """
        self.full.untyped_storage().resize_(0)
        self.sent = None

    def use_full(self):
        """Point every module slot of every parameter at a view of the full buffer.

        Autograd tracks the views. Returns the autograd node that will
        concatenate the views' gradients into the flat ``full.grad`` (None
        when no gradient is recorded).
        """
        padding = self.layout.numel - sum(self.layout.numels)
        # One split: its backward builds the whole flat gradient in one concatenation.
        views = self.full.split(self.layout.numels + [padding])
        for view, shape, places in zip(views, self.shapes, self.places):
            for module, name in places:
                module._parameters[name] = view.view(shape)
        return views[0].grad_fn

    def use_pieces(self):
        """Put the original parameters back into their module slots.

        They hold this rank's pieces.
        """
        for p, places in zip(self.params, self.places):
            for module, name in places:
                module._parameters[name] = p

    def drop_cleared_grad_shard(self):
        """After ``zero_grad()`` (a piece's ``.grad`` is None) free the old shard now.

        Otherwise it would live on until the new one arrives.
        """
        if any(p.grad is None for p in self.params):
            self.grad_shard = None

    def add_grad_shard(self, received):
        """Keep this rank's averaged gradient shard; expose its pieces as ``p.grad``.

        It is kept in the shard's dtype (fp32 under a bf16 policy), as FSDP2.
        """
        received = received.to(self.shard.dtype)
        if self.grad_shard is None or any(
            p.grad is None for p in self.params
        ):  # zero_grad() ran
            self.grad_shard = received
        else:  # gradient accumulation: several backwards before a step
            self.grad_shard += received
        for p in self.params:
            offset = p.data.storage_offset() - self.shard.storage_offset()
            p.grad = self.grad_shard[offset : offset + p.numel()]

    @torch.no_grad()
    def full_copies(self, shard=None):
        """``{parameter: full tensor}``: every rank's shard gathered, then copied.

        ``shard`` is this rank's shard of the parameters (the default) or of
        anything laid out like them, such as :attr:`grad_shard`.
        """
        shard = self.shard if shard is None else shard
        buffer = torch.empty(self.layout.numel, dtype=shard.dtype, device=shard.device)
        comm.all_gather_single(buffer, shard, group=self.process_group)
        return {
            p: buffer[offset : offset + numel].view(shape).clone()
            for p, shape, offset, numel in zip(
                self.params, self.shapes, self.layout.offsets, self.layout.numels
            )
        }


def cast_floating(dtype, obj):
    """``obj`` with every floating-point tensor in it cast to ``dtype``.

    ``obj`` is a tensor, or tuples, lists and dicts of them.
    """
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_floating(dtype, item) for item in obj)
    if isinstance(obj, dict):
        return {key: cast_floating(dtype, item) for key, item in obj.items()}
    return obj


def cast_at_the_edges(module, policy):
    """Mixed precision, as FSDP2 per module: inputs in, outputs out.

    Floating-point inputs are cast to ``param_dtype`` (after the gather, whose
    hook runs first), outputs to ``output_dtype`` (after the hooks on them).
    """
    if policy.cast_forward_inputs and policy.param_dtype is not None:
        module.register_forward_pre_hook(
            lambda m, args, kwargs: cast_floating(policy.param_dtype, (args, kwargs)),
            with_kwargs=True,
        )
    if policy.output_dtype is not None:
        module.register_forward_hook(
            lambda m, args, out: cast_floating(policy.output_dtype, out)
        )
