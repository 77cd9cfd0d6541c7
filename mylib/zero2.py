"""Chapter 6. ZeRO-2: each rank keeps only its shard of the averaged gradient.

ZeRO-1 still materialises every full gradient on every rank, though each
rank needs only its shard of it to update its shard. ZeRO-2 reduce-scatters
the gradients during the backward pass, bucket by bucket, as soon as a
bucket's gradients are ready (the overlap of chapter 3, with a
reduce-scatter in place of the all-reduce), and frees the full gradients
at once. After ``loss.backward()`` a rank holds 1/N of the gradients.

Buckets are formed in backward order by the same rule as DDP
(:func:`mylib.models.buckets.assign_buckets`); each bucket is one flat buffer
of parameters, cut into N shards as in ZeRO-1 (:class:`mylib.zero1.FlatParams`),
so the reduce-scatter of a bucket's gradient leaves rank r the average of its
shard r, exactly the part that rank r's optimizer updates.
"""

import torch

from mylib import comm
from mylib.models.buckets import MB, assign_buckets
from mylib.zero1 import ShardedOptimizer


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
    as a zero gradient.
    """

    def __init__(
        self,
        params,
        optimizer_class,
        process_group=None,
        bucket_cap_mb=25.0,
        **defaults,
    ):
        if bucket_cap_mb < 0:
            raise ValueError(
                "bucket_cap_mb must be >= 0 (0 = one bucket per parameter), "
                f"got {bucket_cap_mb}"
            )
        self.bucket_cap_mb = bucket_cap_mb
        super().__init__(
            params,
            optimizer_class,
            process_group=process_group,
            average_gradients=True,
            **defaults,
        )
        self._bucket_of = {
            p: b for b, bucket in enumerate(self.buckets) for p in bucket.params
        }
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
            for p in self._bucket_of
        ]
        # launched from hooks during the last backward
        self.reduce_scatters_in_backward = 0
        self._new_backward()

    def _bucket_params(self, params):
        """Buckets in backward order, as DDP forms them.

        Backward order is the reverse of the parameter order.
        """
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
        # (bucket, gradient shard being received, flat gradient being sent, work)
        self._in_flight = []
        self._callback_queued = False

    def _on_grad_ready(self, param):
        """Post-accumulate-grad hook: ``param.grad`` is now final."""
        if not self._callback_queued:
            # The first gradient of a backward: at its end, flush the rest.
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._finish_backward)
            self._callback_queued = True
            self.reduce_scatters_in_backward = 0
        b = self._bucket_of[param]
        self._ready[b].add(param)
        while self._next_to_launch < len(self.buckets) and len(
            self._ready[self._next_to_launch]
        ) == len(self.buckets[self._next_to_launch].params):
            self._launch(self._next_to_launch)
            self.reduce_scatters_in_backward += 1

    def _launch(self, b):
        """Start bucket b's reduce-scatter and free its full gradients."""
        bucket = self.buckets[b]
        with torch.no_grad():
            flat_grad = bucket.flatten([p.grad for p in bucket.params])
        for p in bucket.params:
            # The point of ZeRO-2: no full gradient outlives its bucket's launch.
            p.grad = None
        received = torch.empty(
            bucket.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device
        )
        work = comm.reduce_scatter_tensor(
            received, flat_grad, group=self.process_group, async_op=True
        )
        self._in_flight.append((bucket, received, flat_grad, work))
        self._next_to_launch = b + 1

    def _finish_backward(self):
        """End of backward: launch the buckets left, wait, keep the averaged shards.

        The buckets left hold unused parameters.
        """
        while self._next_to_launch < len(self.buckets):
            self._launch(self._next_to_launch)
        with torch.no_grad():
            for bucket, received, _, work in self._in_flight:
                work.wait()
                received /= self.world_size
                if getattr(bucket, "grad_shard", None) is None:
                    bucket.grad_shard = received
                else:  # gradient accumulation: backwards before one step
                    bucket.grad_shard += received
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
