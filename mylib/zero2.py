"""Chapter 6. ZeRO-2: each rank keeps only its shard of the averaged gradient.

ZeRO-1 still materialises every full gradient on every rank, though each
rank needs only its shard of it to update its shard. ZeRO-2 reduce-scatters
the gradients during the backward pass, bucket by bucket, as soon as a
bucket's gradients are ready (the overlap of chapter 3, with a
reduce-scatter in place of the all-reduce). After ``loss.backward()`` a rank
holds 1/N of the gradients.

Buckets are formed in backward order by the same rule as DDP
(:func:`mylib.models.buckets.assign_buckets`); each bucket is one flat buffer
of parameters, cut into N shards as in ZeRO-1 (:class:`mylib.zero1.FlatParams`),
so the reduce-scatter of a bucket's gradient leaves rank r the average of its
shard r, exactly the part that rank r's optimizer updates.

The saving must hold at the peak, not only after the backward. Each
gradient is copied into its bucket's flat gradient as soon as autograd has
made it, and freed; a bucket's flat gradient lives from its first gradient
to the end of its reduce-scatter, and at most ``MAX_FLAT_GRADS`` of them are
alive at once (DeepSpeed's two alternating buffers): before a third is
allocated, the oldest reduce-scatter is waited for and its buffer freed. So
at its peak a rank holds its shard, two buckets, and the gradients autograd
has just made, not the whole gradient.
"""

from collections import deque

import torch

from mylib import comm
from mylib.models.buckets import MB, assign_buckets
from mylib.zero1 import ShardedOptimizer

# Full-size flat gradients alive at once: one filling while one is reduced.
MAX_FLAT_GRADS = 2


class ShardedGradOptimizer(ShardedOptimizer):
    """ZeRO stage 2: ZeRO-1 plus gradients reduce-scattered during the backward.

    Each bucket is reduce-scattered as soon as its gradients are ready.

    ``ShardedGradOptimizer(model.parameters(), torch.optim.AdamW,
    bucket_cap_mb=25, lr=1e-3)`` on a model that is *not* wrapped in DDP: the
    optimizer hooks the parameters itself. Every ``backward()`` adds this rank's
    shard of the averaged gradient to the shard it holds (so gradient
    accumulation works); ``step()`` updates the shard and all-gathers the
    parameters; ``zero_grad()`` clears the shards. As in DDP, every rank must
    run the same backward (the same parameters get gradients), or ranks would
    reduce-scatter different buckets. A parameter that gets no gradient counts
    as a zero gradient. Buckets follow the reverse of the order the
    parameters are given in; with parameter groups (which list, say, every
    matrix before every bias) pass ``module=model``, and they follow the
    reverse of ``model.parameters()``, the backward order, as in DDP.
    Otherwise a bucket may wait for the end of the backward, and every bucket
    with it.
    """

    def __init__(
        self,
        params,
        optimizer_class,
        process_group=None,
        bucket_cap_mb=25.0,
        module=None,
        **defaults,
    ):
        if bucket_cap_mb < 0:
            raise ValueError(
                "bucket_cap_mb must be >= 0 (0 = one bucket per parameter), "
                f"got {bucket_cap_mb}"
            )
        self.bucket_cap_mb = bucket_cap_mb
        self.module = module
        super().__init__(
            params,
            optimizer_class,
            process_group=process_group,
            average_gradients=True,
            **defaults,
        )
        # parameter -> (its bucket, where its gradient lies in the bucket)
        self._place = {
            p: (b, offset, numel)
            for b, bucket in enumerate(self.buckets)
            for p, offset, numel in zip(bucket.params, bucket.offsets, bucket.numels)
        }
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
            for p in self._place
        ]
        # launched from hooks during the last backward
        self.reduce_scatters_in_backward = 0
        self._new_backward()

    def _bucket_params(self, params):
        """Buckets in backward order, as DDP forms them.

        Backward order is the reverse of the parameter order: of
        ``module.parameters()`` if a module was given.
        """
        if self.module is not None:
            place = {p: i for i, p in enumerate(self.module.parameters())}
            if any(p not in place for p in params):
                raise ValueError(
                    "module must hold every parameter the optimizer trains: "
                    "pass the model whose parameters these are"
                )
            params = sorted(params, key=place.__getitem__)
        backward_order = list(reversed(params))
        sizes = [p.numel() * p.element_size() for p in backward_order]
        keys = [(p.dtype, p.device) for p in backward_order]
        cap = int(self.bucket_cap_mb * MB)
        return [
            [backward_order[i] for i in bucket]
            for bucket in assign_buckets(sizes, cap, keys=keys)
        ]

    def _new_backward(self):
        self._ready = [set() for _ in self.buckets]
        # buckets launch in order, so that every rank calls the same collectives
        self._next_to_launch = 0
        # bucket -> its flat gradient, from its first gradient to the end of
        # its reduce-scatter: at most MAX_FLAT_GRADS of them
        self._flat_grads = {}
        # (bucket, gradient shard being received, work), oldest first
        self._in_flight = deque()
        self._callback_queued = False

    def _on_grad_ready(self, param):
        """Post-accumulate-grad hook: copy ``param.grad`` into its bucket, free it."""
        if not self._callback_queued:
            # The first gradient of a backward: at its end, flush the rest.
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._finish_backward)
            self._callback_queued = True
            self.reduce_scatters_in_backward = 0
        b, offset, numel = self._place[param]
        with torch.no_grad():
            # Divide while copying (then the reduce-scatter sums): the mean, in
            # one pass, as DDP's reducer fills its buckets.
            torch.div(
                param.grad.reshape(-1),
                self.world_size,
                out=self._flat_grad(b)[offset : offset + numel],
            )
        # The point of ZeRO-2: a full gradient lives only until it is in its bucket.
        param.grad = None
        self._ready[b].add(param)
        while self._next_to_launch < len(self.buckets) and len(
            self._ready[self._next_to_launch]
        ) == len(self.buckets[self._next_to_launch].params):
            self._launch(self._next_to_launch)
            self.reduce_scatters_in_backward += 1

    def _flat_grad(self, b):
        """Bucket b's flat gradient, zeros when its first gradient arrives.

        Before allocating one more than ``MAX_FLAT_GRADS``, wait for the
        oldest reduce-scatter, which frees its buffer.
        """
        if b not in self._flat_grads:
            while len(self._flat_grads) >= MAX_FLAT_GRADS and self._in_flight:
                self._complete_oldest()
            like = self.buckets[b].params[0]
            self._flat_grads[b] = torch.zeros(
                self.buckets[b].numel, dtype=like.dtype, device=like.device
            )
        return self._flat_grads[b]

    def _launch(self, b):
        """Start bucket b's reduce-scatter; a missing gradient counts as zeros."""
        bucket, flat_grad = self.buckets[b], self._flat_grad(b)
        received = torch.empty(
            bucket.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device
        )
        work = comm.reduce_scatter_single(
            received, flat_grad, group=self.process_group, async_op=True
        )
        self._in_flight.append((b, received, work))
        self._next_to_launch = b + 1

    def _complete_oldest(self):
        """Finish the oldest reduce-scatter: keep its averaged shard, free its input."""
        b, received, work = self._in_flight.popleft()
        work.wait()
        del self._flat_grads[b]  # the work held it until now; freed here
        bucket = self.buckets[b]
        with torch.no_grad():  # received is the mean already: divided, then summed
            if getattr(bucket, "grad_shard", None) is None:
                bucket.grad_shard = received
            else:  # gradient accumulation: backwards before one step
                bucket.grad_shard += received

    def _finish_backward(self):
        """End of backward: launch the buckets left, wait, keep the averaged shards.

        The buckets left hold unused parameters.
        """
        while self._next_to_launch < len(self.buckets):
            self._launch(self._next_to_launch)
        while self._in_flight:
            self._complete_oldest()
        self._attach_grad_shards()
        self._new_backward()

    def _shard_gradients(self):
        """The shards were reduced in the backward: only attach them to the pieces."""
        self._attach_grad_shards()

    def remove_hooks(self):
        """Detach the optimizer from the parameters' gradient hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
