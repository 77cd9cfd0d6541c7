"""Chapter 3. DDP in four steps, each a whole class small enough to read at once.

Each step changes one thing about *when* and *how* the gradients are
averaged; each is used like :class:`mylib.MyDDP`::

    model = Step4BucketViews(net, bucket_cap_mb=25)
    loss_fn(model(x), y).backward()
    model.finish_gradient_sync()
    optimizer.step()

1. :class:`Step1AfterBackward`: one blocking all-reduce per parameter, after
   the backward (chapter 2's ``average_gradients``).
2. :class:`Step2PerParamHooks`: one asynchronous all-reduce per parameter,
   launched by a hook as soon as autograd has accumulated its gradient.
3. :class:`Step3CatBuckets`: buckets in backward order, concatenated with
   ``torch.cat`` when full, all-reduced, and copied back into each ``.grad``.
4. :class:`Step4BucketViews`: every ``.grad`` is a view of its bucket's flat
   buffer, so a full bucket is sent as it is: no concatenation, no copy back.

Each broadcasts rank 0's weights when it wraps the module (chapter 2's
``broadcast_parameters``), averages by dividing by the world size and then
summing (as :class:`mylib.MyDDP` and PyTorch do), and counts, for the last
step, the all-reduces it launched (``collectives``) and how many of them it
launched during the backward (``launched_in_backward``); steps 3 and 4 also
count the gradient bytes they copied (``copied_bytes``). The collectives come
from :mod:`mylib.comm`, so ``count_bytes()`` sees them. These are teaching
classes: misuse (an unused parameter, a forgotten ``finish_gradient_sync()``)
hangs or diverges instead of raising; :class:`mylib.MyDDP` adds the guard rails.
"""

import functools

import torch
import torch.distributed as dist
from torch import nn

from mylib import comm
from mylib.averaging import broadcast_parameters
from mylib.models.buckets import MB, assign_buckets


class Step1AfterBackward(nn.Module):
    """Step 1: after ``backward()``, one blocking all-reduce per parameter.

    Correct and simple; the network idles during the backward, and the
    backward is over before the first byte leaves.
    """

    def __init__(self, module):
        super().__init__()
        self.module, self.world = module, dist.get_world_size()
        broadcast_parameters(module)  # every replica starts from rank 0's weights
        self.collectives = self.launched_in_backward = 0

    def forward(self, *args, **kwargs):
        self.collectives = self.launched_in_backward = 0  # counts are per step
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        for p in self.module.parameters():
            if p.requires_grad:
                p.grad.div_(self.world)  # divide, then sum: the mean
                comm.all_reduce(p.grad)  # blocks until every rank has sent
                self.collectives += 1


class Step2PerParamHooks(nn.Module):
    """Step 2: an asynchronous all-reduce per parameter, launched during the backward.

    ``register_post_accumulate_grad_hook`` (PyTorch 2.1 or later) calls the
    hook once autograd has accumulated the parameter's ``.grad``; autograd goes
    on with earlier layers while the gradient travels. One message per
    parameter: every bias pays the per-message latency.
    """

    def __init__(self, module):
        super().__init__()
        self.module, self.world = module, dist.get_world_size()
        broadcast_parameters(module)
        self.works = []  # all-reduces in flight
        self.collectives = self.launched_in_backward = 0
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._launch)

    def forward(self, *args, **kwargs):
        self.collectives = self.launched_in_backward = 0
        return self.module(*args, **kwargs)

    def _launch(self, param):  # called by autograd, during the backward
        param.grad.div_(self.world)
        self.works.append(comm.all_reduce(param.grad, async_op=True))
        self.collectives += 1
        self.launched_in_backward += 1

    def finish_gradient_sync(self):
        for work in self.works:
            work.wait()  # the all-reduce result is in param.grad
        self.works = []


def backward_buckets(module, bucket_cap_mb):
    """The trainable parameters in buckets of ``bucket_cap_mb``, in backward order.

    Backward order is roughly the reverse of registration; a bucket holds one
    dtype on one device (it becomes one flat tensor).
    """
    params = [p for p in module.parameters() if p.requires_grad][::-1]
    groups = assign_buckets(
        [p.numel() * p.element_size() for p in params],
        int(bucket_cap_mb * MB),
        keys=[(p.dtype, p.device) for p in params],
    )
    return [[params[i] for i in group] for group in groups]


class Step3CatBuckets(nn.Module):
    """Step 3: buckets in backward order, concatenated, then copied back.

    Parameters go into buckets of about ``bucket_cap_mb`` in backward order
    (the reverse of registration). When a bucket's last gradient arrives,
    ``torch.cat`` copies its gradients into one flat tensor, all-reduced
    asynchronously; ``finish_gradient_sync()`` copies the result back into
    each ``.grad``. Few messages, at two copies of every gradient per step.
    """

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module, self.world = module, dist.get_world_size()
        broadcast_parameters(module)
        self.buckets = backward_buckets(module, bucket_cap_mb)
        for b, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(functools.partial(self._ready, b))
        self.ready, self.works = [0] * len(self.buckets), []
        self.collectives = self.launched_in_backward = self.copied_bytes = 0

    def forward(self, *args, **kwargs):
        self.collectives = self.launched_in_backward = self.copied_bytes = 0
        return self.module(*args, **kwargs)

    def _ready(self, b, param):
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient
            flat = torch.cat([p.grad.flatten() for p in self.buckets[b]])  # copy 1
            self.copied_bytes += comm.nbytes(flat)
            flat.div_(self.world)
            self.works.append((b, flat, comm.all_reduce(flat, async_op=True)))
            self.collectives += 1
            self.launched_in_backward += 1

    def finish_gradient_sync(self):
        for b, flat, work in self.works:
            work.wait()
            sizes = [p.numel() for p in self.buckets[b]]
            for p, averaged in zip(self.buckets[b], flat.split(sizes)):
                p.grad.copy_(averaged.view_as(p))  # copy 2
            self.copied_bytes += comm.nbytes(flat)
        self.ready, self.works = [0] * len(self.buckets), []


class Step4BucketViews(nn.Module):
    """Step 4: every ``.grad`` is a view of its bucket's flat buffer.

    PyTorch's ``gradient_as_bucket_view=True``. Autograd accumulates each
    gradient straight into its slice of the buffer, so a full bucket is
    all-reduced in place and the averages land in every ``.grad``: no cat, no
    copy back. A gradient is copied in only when its ``.grad`` is not the view:
    in the first backward, and after ``zero_grad(set_to_none=True)``.
    """

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module, self.world = module, dist.get_world_size()
        broadcast_parameters(module)
        self.buckets = []  # (parameters, flat buffer)
        for b, bucket in enumerate(backward_buckets(module, bucket_cap_mb)):
            flat = bucket[0].new_zeros(sum(p.numel() for p in bucket))
            for p, view in zip(bucket, flat.split([p.numel() for p in bucket])):
                hook = functools.partial(self._ready, b, view.view_as(p))
                p.register_post_accumulate_grad_hook(hook)
            self.buckets.append((bucket, flat))
        self.ready, self.works = [0] * len(self.buckets), []
        self.collectives = self.launched_in_backward = self.copied_bytes = 0

    def forward(self, *args, **kwargs):
        self.collectives = self.launched_in_backward = self.copied_bytes = 0
        return self.module(*args, **kwargs)

    def _ready(self, b, view, param):
        if param.grad.data_ptr() != view.data_ptr():  # a fresh tensor, not the view
            view.copy_(param.grad)
            param.grad = view  # from now on autograd accumulates into the bucket
            self.copied_bytes += comm.nbytes(view)
        self.ready[b] += 1
        bucket, flat = self.buckets[b]
        if self.ready[b] == len(bucket):
            flat.div_(self.world)
            self.works.append(comm.all_reduce(flat, async_op=True))
            self.collectives += 1
            self.launched_in_backward += 1

    def finish_gradient_sync(self):
        for work in self.works:
            work.wait()  # the averages are already in every .grad
        self.ready, self.works = [0] * len(self.buckets), []


STEPS = (Step1AfterBackward, Step2PerParamHooks, Step3CatBuckets, Step4BucketViews)
