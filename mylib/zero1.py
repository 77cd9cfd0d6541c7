"""Chapter 6. ZeRO-1: each rank keeps the optimizer state of its own shard.

Adam holds two numbers per parameter (more in mixed precision); under DDP
every rank holds all of them and runs the same update on the same numbers,
N times over. ZeRO-1 cuts that redundancy: the parameters are laid out back
to back in one flat buffer, cut into N equal shards, and rank r keeps the
optimizer state of shard r only. A step is then:

1. gradients averaged: either already done by DDP (the way PyTorch's
   ``ZeroRedundancyOptimizer`` is used), or a reduce-scatter that leaves each
   rank the average of its own shard only (``average_gradients=True``, the
   paper's ZeRO-1: it sends half of an all-reduce);
2. each rank updates its shard with the wrapped optimizer (Adam, SGD, ...);
3. an all-gather of the shards gives every rank all updated parameters.

The wrapped optimizer never sees whole parameters: it sees *pieces*, 1-D
views of the parameters' storage, one per parameter that overlaps this
rank's shard, each in the parameter group of its parameter. Updating a piece
in place updates the parameter, and an element-wise optimizer (SGD, Adam,
AdamW, RMSprop, Adagrad, ...) gives exactly the update it gives unsharded.
An optimizer that looks at a whole tensor at once (LAMB's trust ratio, say)
needs whole parameters per rank, as in PyTorch's ZeroRedundancyOptimizer.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist

from mylib import comm
from mylib.models.buckets import MB


class FlatParams:
    """A layout: tensors back to back in a flat buffer, cut in equal shards.

    There are ``world_size`` shards, one per rank. The buffer is padded at
    the end to a multiple of ``world_size`` elements, so that a
    reduce-scatter and an all-gather see equal shards. Rank r owns elements
    ``[r * shard_numel, (r + 1) * shard_numel)``.
    """

    def __init__(self, params, world_size, rank):
        self.params = list(params)
        self.numels = [p.numel() for p in self.params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(self.params))]
        # ceil division
        self.shard_numel = -(-sum(self.numels) // world_size)
        self.numel = self.shard_numel * world_size
        self.world_size = world_size
        self.shard_start = rank * self.shard_numel
        self.shard_end = self.shard_start + self.shard_numel

    def pieces(self):
        """``(i, start, end)`` for each parameter i that overlaps this rank's shard.

        ``start`` and ``end`` are positions in the flat buffer.
        """
        for i, (offset, numel) in enumerate(zip(self.offsets, self.numels)):
            start = max(offset, self.shard_start)
            end = min(offset + numel, self.shard_end)
            if start < end:
                yield i, start, end

    def flatten(self, tensors):
        """One padded flat tensor holding ``tensors`` in this layout.

        A None among ``tensors`` counts as zeros.
        """
        like = self.params[0]
        flat = torch.zeros(self.numel, dtype=like.dtype, device=like.device)
        for t, offset, numel in zip(tensors, self.offsets, self.numels):
            if t is not None:
                flat[offset : offset + numel].copy_(t.reshape(-1))
        return flat

    def shard_slices(self, tensors, start, end):
        """Elements ``[start, end)`` of every shard, back to back, from ``tensors``.

        ``tensors`` are laid out as the parameters. What a reduce-scatter of
        that slice of every shard sends: rank r receives its own shard's
        ``[start, end)``. A None counts as zeros.
        """
        like, width = self.params[0], end - start
        out = torch.zeros(self.world_size * width, dtype=like.dtype, device=like.device)
        for r in range(self.world_size):
            lo = r * self.shard_numel + start  # where the slice lies in the flat buffer
            for t, offset, numel in zip(tensors, self.offsets, self.numels):
                a, b = max(lo, offset), min(lo + width, offset + numel)
                if t is not None and a < b:
                    out[r * width + a - lo : r * width + b - lo].copy_(
                        t.reshape(-1)[a - offset : b - offset]
                    )
        return out

    def bind_params(self):
        """Move the parameters into one flat buffer, each ``p.data`` a view.

        Then an all-gather into the buffer updates every parameter, no copy.
        """
        with torch.no_grad():
            self.flat = self.flatten([p.detach() for p in self.params])
        for p, offset, numel in zip(self.params, self.offsets, self.numels):
            p.data = self.flat[offset : offset + numel].view_as(p)


class Piece(NamedTuple):
    """This rank's share of one parameter: a 1-D view of the parameter's own storage."""

    tensor: torch.Tensor  # what the wrapped optimizer sees and updates in place
    param: torch.Tensor
    bucket: FlatParams
    index: int  # the parameter's place in the bucket
    start: int  # [start, end): where the piece lies in this rank's shard of the bucket
    end: int

    @property
    def in_param(self):
        """Where the piece lies in the flattened parameter."""
        offset = self.bucket.offsets[self.index] - self.bucket.shard_start
        return slice(self.start - offset, self.end - offset)


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: ``optimizer_class`` runs on this rank's shard only.

    After each step every rank gets all parameters back.

    Same signature as ``torch.distributed.optim.ZeroRedundancyOptimizer``:
    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``
    (parameter groups too). With ``average_gradients=False`` (the default)
    the gradients must already be averaged over ranks, by ``MyDDP`` or
    PyTorch's DDP. With ``average_gradients=True`` the model is not wrapped:
    ``step()`` reduce-scatters the gradients itself, so each rank receives the
    average of its own shard only; a parameter without a gradient then counts
    as a zero gradient, as in FSDP and DeepSpeed. It sends them in
    reduce-scatters of at most ``reduce_scatter_mb`` each, so that the copy
    being sent stays small beside the gradients. Parameters that do not
    require a gradient are never sharded nor updated.
    """

    def __init__(
        self,
        params,
        optimizer_class,
        process_group=None,
        average_gradients=False,
        reduce_scatter_mb=25.0,
        **defaults,
    ):
        _check_arguments(optimizer_class, reduce_scatter_mb)
        self.reduce_scatter_mb = reduce_scatter_mb
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.average_gradients = average_gradients
        group_of = {
            p: g for g, group in enumerate(self.param_groups) for p in group["params"]
        }
        trainable = [
            p for group in self.param_groups for p in group["params"] if p.requires_grad
        ]
        self.buckets = [
            FlatParams(ps, self.world_size, self.rank)
            for ps in self._bucket_params(trainable)
        ]
        # Pieces: this rank's share of each parameter, a 1-D view of the
        # parameter's own storage.
        self.pieces = []
        inner_groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": []}
            for g in self.param_groups
        ]
        for bucket in self.buckets:
            bucket.bind_params()
            for i, start, end in bucket.pieces():
                piece = Piece(
                    bucket.flat.detach()[start:end],
                    bucket.params[i],
                    bucket,
                    i,
                    start - bucket.shard_start,
                    end - bucket.shard_start,
                )
                inner_groups[group_of[piece.param]]["params"].append(piece.tensor)
                self.pieces.append(piece)
        # A rank whose shard misses a whole group still steps it (empty).
        for group in inner_groups:
            if not group["params"]:
                group["params"].append(torch.zeros(0))
        self.optim = optimizer_class(inner_groups, **defaults)
        # betas, eps, ...: visible on the outer groups, as when unsharded
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for key, value in inner.items():
                outer.setdefault(key, value)
        self._consolidated = None

    def _bucket_params(self, params):
        """Group the parameters into flat buffers: here one per dtype and device."""
        by_key = {}
        for p in params:
            by_key.setdefault((p.dtype, p.device), []).append(p)
        return list(by_key.values())

    @torch.no_grad()
    def step(self, closure=None):
        """Update this rank's shard, then all-gather the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # An LR scheduler edits the outer groups: pass its values on.
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        self._shard_gradients()
        self.optim.step()
        for bucket in self.buckets:
            shard = bucket.flat[bucket.shard_start : bucket.shard_end].clone()
            comm.all_gather_single(bucket.flat, shard, group=self.process_group)
        return loss

    def _shard_gradients(self):
        """Give each piece its share of the averaged gradient."""
        if not self.average_gradients:
            # Already averaged: a piece's gradient is a view of the parameter's.
            for piece in self.pieces:
                grad = piece.param.grad
                piece.tensor.grad = (
                    None if grad is None else grad.reshape(-1)[piece.in_param]
                )
            return
        for bucket in self.buckets:
            grads = [p.grad for p in bucket.params]
            like = bucket.params[0]
            bucket.grad_shard = torch.empty(
                bucket.shard_numel, dtype=like.dtype, device=like.device
            )
            # Not one flat copy of the whole gradient: slices of every shard at
            # a time, at most reduce_scatter_mb sent per call.
            cap = int(self.reduce_scatter_mb * MB)
            width = max(1, cap // (self.world_size * like.element_size()))
            for start in range(0, bucket.shard_numel, width):
                end = min(start + width, bucket.shard_numel)
                # Divide, then sum: the mean, as MyDDP and DDP's reducer do.
                # (No name for the copy sent: it is freed before the next one.)
                comm.reduce_scatter_single(
                    bucket.grad_shard[start:end],
                    bucket.shard_slices(grads, start, end).div_(self.world_size),
                    group=self.process_group,
                )
        self._attach_grad_shards()

    def _attach_grad_shards(self):
        for piece in self.pieces:
            shard = getattr(piece.bucket, "grad_shard", None)
            piece.tensor.grad = (
                None if shard is None else shard[piece.start : piece.end]
            )

    def zero_grad(self, set_to_none=True):
        """Clear the parameters' gradients and this rank's gradient shards."""
        super().zero_grad(set_to_none)
        self.optim.zero_grad(set_to_none)
        for bucket in self.buckets:
            bucket.grad_shard = None

    # -- checkpoints ---------------------------------------------------------------
    # The full state, gathered on one rank, in the unsharded optimizer's format.

    def consolidate_state_dict(self, to=0):
        """Gather the whole optimizer state on rank ``to`` (every rank must call it).

        Afterwards ``state_dict()`` on that rank returns exactly what
        ``optimizer_class(params).state_dict()`` of unsharded training would.
        """
        index = {
            p: i
            for i, p in enumerate(p for g in self.param_groups for p in g["params"])
        }
        tensor_keys, scalars = set(), {}
        for piece in self.pieces:
            for key, value in self.optim.state.get(piece.tensor, {}).items():
                if torch.is_tensor(value) and value.shape == piece.tensor.shape:
                    tensor_keys.add(key)
                else:  # step counters and the like: equal on every piece of a parameter
                    scalars.setdefault(index[piece.param], {})[key] = _copy(value)
        everyone = [None] * self.world_size
        dist.all_gather_object(
            everyone, (sorted(tensor_keys), scalars), group=self.process_group
        )
        state = {}
        for _, rank_scalars in everyone:
            for i, values in rank_scalars.items():
                state.setdefault(i, {}).update(values)
        for key in sorted(set().union(*(set(keys) for keys, _ in everyone))):
            for bucket in self.buckets:
                shard = torch.zeros(
                    bucket.shard_numel,
                    dtype=bucket.flat.dtype,
                    device=bucket.flat.device,
                )
                for piece in self.pieces:
                    if piece.bucket is bucket and key in self.optim.state.get(
                        piece.tensor, {}
                    ):
                        shard[piece.start : piece.end] = self.optim.state[piece.tensor][
                            key
                        ]
                full = torch.empty(bucket.numel, dtype=shard.dtype, device=shard.device)
                comm.all_gather_single(full, shard, group=self.process_group)
                for p, offset, numel in zip(
                    bucket.params, bucket.offsets, bucket.numels
                ):
                    if index[p] in state:
                        state[index[p]][key] = (
                            full[offset : offset + numel].view_as(p).clone()
                        )
        groups, start = [], 0
        for g in self.param_groups:
            groups.append(
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": list(range(start, start + len(g["params"]))),
                }
            )
            start += len(g["params"])
        self._consolidated = (
            {"state": state, "param_groups": groups} if self.rank == to else None
        )

    def state_dict(self):
        """The consolidated state, on the rank it was gathered to.

        See :meth:`consolidate_state_dict`.
        """
        if self._consolidated is None:
            raise RuntimeError(
                "the optimizer state is sharded: call consolidate_state_dict(to=rank) "
                "on every rank first, then state_dict() on that rank"
            )
        return self._consolidated

    def load_state_dict(self, state_dict):
        """Load a consolidated state dict; each rank keeps its pieces.

        Every rank passes the same dict.
        """
        index = {
            p: i
            for i, p in enumerate(p for g in self.param_groups for p in g["params"])
        }
        for outer, saved in zip(self.param_groups, state_dict["param_groups"]):
            outer.update({k: v for k, v in saved.items() if k != "params"})
        self.optim.state.clear()
        for piece in self.pieces:
            saved = state_dict["state"].get(index[piece.param])
            if saved is not None:
                self.optim.state[piece.tensor] = {
                    key: value.reshape(-1)[piece.in_param].clone()
                    if _per_element(key, value, piece.param)
                    else _copy(value)
                    for key, value in saved.items()
                }


# Optimizer state that is one number per parameter tensor, not one per element.
SCALAR_STATE_KEYS = {"step", "mu_product"}


# -- guard rails ----------------------------------------------------------------------


def _check_arguments(optimizer_class, reduce_scatter_mb):
    if not (
        isinstance(optimizer_class, type)
        and issubclass(optimizer_class, torch.optim.Optimizer)
    ):
        raise TypeError(
            "optimizer_class must be a torch.optim.Optimizer subclass such as "
            "torch.optim.AdamW (the class, not an instance), "
            f"got {optimizer_class!r}"
        )
    if not reduce_scatter_mb > 0:
        raise ValueError(
            "reduce_scatter_mb must be > 0 (the most MB one reduce-scatter sends), "
            f"got {reduce_scatter_mb}"
        )
    if not dist.is_initialized():
        raise RuntimeError(
            "ShardedOptimizer needs a process group: call dist.init_process_group "
            "first (mylib.run_ranks and torchrun do it for you)"
        )


def _copy(value):
    """A state value that the optimizer will not change behind the checkpoint's back."""
    return value.clone() if torch.is_tensor(value) else value


def _per_element(key, value, param):
    """Whether a saved state entry holds one value per element of ``param``.

    Momentum does; the step count does not.
    """
    return (
        torch.is_tensor(value)
        and value.shape == param.shape
        and (param.dim() > 0 or key not in SCALAR_STATE_KEYS)
    )
