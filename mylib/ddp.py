"""Chapter 3. MyDDP: bucketed all-reduce that overlaps the backward pass.

Every rank holds a full copy of the model and computes gradients on its own
slice of the batch. Before the optimizer step the gradients are averaged over
ranks, so every rank takes the same step and the copies stay identical.

What makes it fast is *when* the averaging happens:

1. Gradients are grouped into buckets in backward order; after the first step
   they are rebuilt in the order the gradients really arrived (rank 0's), once,
   as PyTorch's DDP does (:mod:`mylib.models.buckets`, which also says where
   the small first bucket lands before and after, and why, from torch's source).
2. Each bucket is one flat buffer and ``param.grad`` is a view of its slice
   (PyTorch's ``gradient_as_bucket_view=True``), so a bucket is sent as it is.
   When autograd hands over a fresh ``.grad`` it is copied in: in the first
   step, and in *every* step after ``zero_grad()``'s default
   ``set_to_none=True`` (``copied_bytes`` counts the bytes).
3. A hook fires as soon as autograd has accumulated a parameter's gradient;
   when a bucket is complete its all-reduce is launched asynchronously while
   autograd keeps computing the gradients of earlier layers.
4. ``finish_gradient_sync()`` waits for the buckets still in flight; only the
   last ones are exposed.

Whether a backward synchronises is decided by the forward before it, as in
PyTorch's DDP (chapter 4): a forward outside ``no_sync()`` prepares the next
backward to all-reduce, one inside it does not.

Usage, on every rank::

    model = MyDDP(net, bucket_cap_mb=25)
    loss_fn(model(x), y).backward()
    model.finish_gradient_sync()
    optimizer.step()

``tests/test_ddp_like_torch.py`` checks each of these behaviours against
PyTorch's ``DistributedDataParallel`` (torch 2.13). The class reads in the
chapter's order: construction, the forward, the gradient hook, the launch,
the finish, ``no_sync``. The guard rails (misuse that would otherwise hang or silently
diverge) and ``find_unused_parameters`` are in :mod:`mylib.ddp_checks`, which
:class:`MyDDP` inherits from: read them after chapter 8.
"""

import contextlib
import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from mylib import comm
from mylib.ddp_checks import DDPChecks, check_arguments
from mylib.models.buckets import MB, assign_buckets, first_iteration_buckets


class Bucket:
    """Gradients that travel in one all-reduce: one flat buffer, a view per parameter.

    Besides its attributes it offers the methods of PyTorch's ``GradBucket``
    (``buffer()``, ``index()``, ``parameters()``, ``gradients()``,
    ``is_last()``), so a communication hook written for DDP runs unchanged.
    """

    def __init__(self, index, params, names, is_last):
        self._index, self._is_last = index, is_last
        self.params, self.names = params, names
        self.numel = sum(p.numel() for p in params)
        first = params[0]
        self.flat = torch.zeros(self.numel, dtype=first.dtype, device=first.device)
        self.nbytes = comm.nbytes(self.flat)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.ready = set()  # slots whose gradient arrived in this backward
        self.copied = 0  # bytes copied in from fresh .grad tensors since the last sync

    def is_full(self):
        return len(self.ready) == len(self.params)

    def buffer(self):
        return self.flat

    def index(self):
        return self._index

    def parameters(self):
        return list(self.params)

    def gradients(self):
        return list(self.views)

    def is_last(self):
        return self._is_last

    def __repr__(self):
        size = f"{self.nbytes / MB:.2f} MB"
        return f"Bucket({self._index}, {len(self.params)} params, {size})"


def allreduce_average_hook(process_group, bucket):
    """The default communication hook: average the bucket over ranks.

    Dividing before the sum (rather than after) keeps the values in range for
    low-precision gradients; it is what PyTorch's default hook does.
    """
    flat = bucket.buffer()
    flat.div_(dist.get_world_size(process_group))
    work = comm.all_reduce(flat, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class MyDDP(DDPChecks, nn.Module):
    """Wrap ``module`` so that its gradients are averaged over all ranks.

    ``bucket_cap_mb`` caps a bucket (0 means one bucket per parameter);
    ``first_bucket_cap_mb`` caps the first one (default: ``min(1, cap)``, so the
    first all-reduce starts early; PyTorch's DDP uses 1 MB only while its
    ``bucket_cap_mb`` is None: :mod:`mylib.models.buckets`).
    ``broadcast_buffers`` copies rank 0's buffers (e.g. BatchNorm statistics)
    to every rank before each forward. ``find_unused_parameters`` lets a
    parameter go without a gradient: it is sent at once as a zero from this
    rank, and if no rank used it its ``.grad`` is left as it was.
    ``copied_bytes``: the bytes the last step copied from fresh ``.grad``
    tensors into the buckets.
    """

    def __init__(
        self,
        module,
        bucket_cap_mb=25.0,
        first_bucket_cap_mb=None,
        broadcast_buffers=True,
        find_unused_parameters=False,
        process_group=None,
    ):
        super().__init__()
        check_arguments(bucket_cap_mb)
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.broadcast_buffers = broadcast_buffers
        # Whether a forward broadcasts buffers is decided here, as DDP decides:
        # a module without any is not walked submodule by submodule every forward.
        self._has_buffers = any(True for _ in module.buffers())
        self.find_unused_parameters = find_unused_parameters
        self.tracer = None  # callable(event, t, **fields): see mylib.experiments.tracer
        self._check_same_model_on_every_rank()
        # Every replica starts from rank 0's weights.
        self._broadcast_from_rank0(t for _, t in self._params_and_buffers())

        # The parameters that get gradients, in registration order; hooks and
        # buckets name each by its index here.
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not self._named:
            raise ValueError(
                "the module has no parameter that requires grad: there is "
                "nothing to synchronise"
            )
        first = None if first_bucket_cap_mb is None else int(first_bucket_cap_mb * MB)
        self._caps = (int(bucket_cap_mb * MB), first)
        # Before any backward: buckets in the reverse of registration order.
        self._make_buckets(first_iteration_buckets, range(len(self._named)))
        # A hook on every parameter: autograd calls it once .grad is complete.
        self._hooks = [
            p.register_post_accumulate_grad_hook(
                functools.partial(self._on_grad_ready, i)
            )
            for i, (_, p) in enumerate(self._named)
        ]
        self._comm_hook, self._comm_state = allreduce_average_hook, process_group
        # False inside no_sync(). The forward reads it, as DDP's does: a forward
        # outside no_sync() prepares the coming backward to all-reduce (_prepared;
        # DDP's reducer.prepare_for_backward).
        self.require_backward_grad_sync = True
        self._prepared = False
        self._local_grads = False  # gradients of unprepared backwards, not averaged
        # The order the gradients arrive in the first synchronised backward: the
        # buckets are rebuilt in it before the next forward, once (not with
        # find_unused_parameters=True, as PyTorch).
        self._ready_order = None if find_unused_parameters else []
        self._rebuild_due = False
        self.copied_bytes = 0
        self._install_guard_rails()
        self._reset_iteration()

    def _make_buckets(self, rule, order):
        """Buckets by ``rule`` (:mod:`mylib.models.buckets`) over ``order``.

        ``order`` lists parameter indices; ``_where[i]`` is (bucket, slot).
        Returns False if the buckets are the ones we have.
        """
        params = [self._named[i][1] for i in order]
        sizes = [p.numel() * p.element_size() for p in params]
        keys = [(p.dtype, p.device) for p in params]
        groups = [[order[i] for i in g] for g in rule(sizes, *self._caps, keys=keys)]
        if groups == getattr(self, "_groups", None):
            return False
        # Drop the old buckets before making the new ones, so that one set is
        # alive at a time (PyTorch's Reducer::initialize_buckets clears buckets_
        # first too): a gradient kept since the last step still holds its own.
        self._groups, self.buckets, self._where = groups, [], {}
        for b, g in enumerate(groups):
            names, params = zip(*(self._named[j] for j in g))
            last = b == len(groups) - 1
            self.buckets.append(Bucket(b, list(params), list(names), last))
        self._where = {
            j: (bucket, slot)
            for bucket, g in zip(self.buckets, groups)
            for slot, j in enumerate(g)
        }
        return True

    def _rebuild_buckets(self):
        """Bucket again, in the order the gradients arrived on rank 0 (as PyTorch)."""
        order = _from_rank0(self._ready_order, self.process_group, self._named[0][1])
        self._ready_order, self._rebuild_due = None, False
        if self._make_buckets(assign_buckets, order):
            with torch.no_grad():  # gradients kept since the last step move in too
                for j, (bucket, slot) in self._where.items():
                    p = self._named[j][1]
                    if p.grad is not None:
                        p.grad = bucket.views[slot].copy_(p.grad)

    # -- the step -----------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._check_forward()
        if self._rebuild_due and torch.is_grad_enabled():
            self._rebuild_buckets()
        if self.broadcast_buffers and self._has_buffers and self.world_size > 1:
            self._broadcast_from_rank0(self.module.buffers())
        output = self.module(*args, **kwargs)
        # The forward decides, as DDP's: inside no_sync() the coming backward
        # only accumulates, wherever that backward runs.
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._prepared = True
            if self.find_unused_parameters:
                self._find_unused(output)
        return output

    def _on_grad_ready(self, index, param):
        """Autograd has accumulated ``param.grad``: file it in its bucket.

        If that fills the bucket, launch the buckets that are complete, in order.
        """
        bucket, slot = self._where[index]
        self._note_arrival(index, bucket, slot)  # tracing, checks, arrival order
        self._into_bucket(bucket, slot, param)  # .grad becomes a view of the bucket
        if self._prepared:  # a forward inside no_sync() (chapter 4): nothing is sent
            bucket.ready.add(slot)
            if bucket.is_full():  # only a bucket just filled can let buckets go
                self._launch_ready_buckets()
                self.allreduces_in_backward = self._next_bucket

    def _note_arrival(self, index, bucket, slot):
        """The bookkeeping of a gradient's arrival: trace, checks, arrival order."""
        if self.tracer is not None:
            self._trace("grad_ready", name=bucket.names[slot], bucket=bucket.index())
        self._used.add(index)
        if not self._prepared:
            self._local_grads = True  # no_sync(): accumulated here, averaged later
            return
        if not self._backward_seen:
            self._backward_seen, self.allreduces_in_backward = True, 0
            for i in self._unused:  # find_unused_parameters (chapter 8)
                self._mark_unused_ready(i)
            self._launch_ready_buckets()  # buckets those filled leave now, as DDP's
        if slot in bucket.ready:  # a second gradient in one synchronised backward
            self._refuse_second_gradient(bucket, slot, index)
        if self._ready_order is not None:
            self._ready_order.append(index)

    def _into_bucket(self, bucket, slot, param):
        view = bucket.views[slot]
        if param.grad.data_ptr() != view.data_ptr():
            # First backward, or zero_grad(set_to_none=True): autograd made a
            # fresh tensor. Copy it in and make .grad a view again.
            view.copy_(param.grad)
            param.grad = view
            bucket.copied += comm.nbytes(view)

    def _launch_ready_buckets(self):
        # Collectives are matched by order, not by name: every rank must launch
        # bucket 0, then 1, ... even if its gradients arrive in another order.
        while (
            self._next_bucket < len(self.buckets)
            and self.buckets[self._next_bucket].is_full()
        ):
            bucket = self.buckets[self._next_bucket]
            self._trace("bucket_launch", bucket=bucket.index())
            future = self._comm_hook(self._comm_state, bucket)
            if self.tracer is not None:
                done = functools.partial(self._trace_done, bucket.index())
                future.add_done_callback(done)
            self._futures.append(future)
            self._next_bucket += 1

    def finish_gradient_sync(self):
        """Wait for every bucket's all-reduce; then ``p.grad`` is the ranks' average."""
        self._check_finish()
        used = self._launch_the_rest()  # buckets of unused parameters (chapter 8)
        for bucket, future in zip(self.buckets, self._futures):
            reduced = future.wait()
            if reduced.data_ptr() != bucket.flat.data_ptr():  # a hook may return a copy
                bucket.flat.copy_(reduced)
        self._end_iteration(used)

    def _launch_the_rest(self):
        """Mark parameters without a gradient ready and launch what is left.

        Returns the parameters some rank used (``find_unused_parameters``).
        """
        if self._next_bucket < len(self.buckets):  # some bucket waits for a gradient
            for i, (bucket, slot) in self._where.items():
                if slot not in bucket.ready:  # reached by the forward, no gradient
                    self._mark_unused_ready(i)
            self._launch_ready_buckets()
        return self._used_on_any_rank() if self.find_unused_parameters else ()

    def _end_iteration(self, used):
        """After the wait: ``.grad`` of the used parameters, counters, next step."""
        for i in used:  # used somewhere: .grad is the average
            bucket, slot = self._where[i]
            self._named[i][1].grad = bucket.views[slot]
        self.copied_bytes = sum(bucket.copied for bucket in self.buckets)
        self._rebuild_due = self._ready_order is not None
        self._reset_iteration()
        self._prepared = self._local_grads = False
        self._trace("sync_done")

    @contextlib.contextmanager
    def no_sync(self):
        """A forward inside this block prepares a backward that sends nothing.

        That backward accumulates the gradients locally, in the bucket buffers
        as in a synchronised step. As in PyTorch's DDP the forward decides: run
        the micro-step's forward *and* backward inside, the last micro-step's
        outside. It may be re-entered.
        """
        self._check_no_sync()
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state, hook):
        """Replace how a bucket is reduced, as PyTorch's DDP allows.

        ``hook(state, bucket)`` returns a Future of the averaged flat tensor.
        """
        if not callable(hook):
            raise TypeError(
                "hook must be callable as hook(state, bucket), got "
                f"{type(hook).__name__}"
            )
        self._comm_hook, self._comm_state = hook, state

    # -- plumbing -----------------------------------------------------------------
    def _reset_iteration(self):
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.copied = 0
        self._next_bucket, self._futures, self._backward_seen = 0, [], False
        self.allreduces_in_backward = getattr(self, "allreduces_in_backward", 0)
        # find_unused_parameters: not reached by the forward; given a gradient
        self._unused, self._used = [], set()
        if not self._rebuild_due and self._ready_order is not None:
            self._ready_order.clear()  # a step that failed: record the next one

    def _trace(self, event, **fields):
        if self.tracer is not None:
            self.tracer(event, time.perf_counter(), **fields)

    def _trace_done(self, index, _future):
        self._trace("bucket_done", bucket=index)

    def _params_and_buffers(self):
        return [*self.module.named_parameters(), *self.module.named_buffers()]

    def _broadcast_from_rank0(self, tensors):
        group = self.process_group
        src = dist.get_global_rank(group, 0) if group is not None else 0
        with torch.no_grad():
            for t in tensors:
                comm.broadcast(t.data, src=src, group=group)


def _from_rank0(values, group, like):
    """Rank 0's list of ints, on every rank (a one-off control message, not counted)."""
    t = torch.tensor(values, dtype=torch.int64, device=like.device)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    return t.tolist()
