"""Chapter 5: what a PowerSGD step costs besides the bytes, PyTorch's hook and mylib's.

Both hooks run on a bucket that holds a model's gradients (the chapter's
character model by default), on every rank of a process group.

* :func:`powersgd_step_costs` counts, per compressed step, the matrix
  products and the new tensors as large as the bucket, and reads the bytes
  each hook's state keeps between steps (error, P, Q).
* :func:`allreduce_chain` records the all-reduces PyTorch's hook issues in a
  step, and whether the ones before had completed when each was issued.
* :func:`bf16_hook_accepted` asks PyTorch's DDP to take its bf16 hook on this
  build, or on this build described as a CUDA build with NCCL.

``tests/test_powersgd.py`` and ``tests/test_comm_hooks.py`` assert what
chapter 5 prints from them.
"""

import contextlib
from unittest import mock

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from mylib.powersgd import PowerSGDState, compression_plan, powersgd_hook


class _Bucket:
    """A bucket as a hook sees it: one flat buffer, one view per gradient."""

    def __init__(self, shapes, generator):
        self.shapes = shapes
        self.flat = torch.randn(sum(s.numel() for s in shapes), generator=generator)

    def buffer(self):
        return self.flat

    def gradients(self):
        views, offset = [], 0
        for shape in self.shapes:
            views.append(self.flat[offset : offset + shape.numel()].view(shape))
            offset += shape.numel()
        return views

    def index(self):
        return 0

    def is_last(self):
        return True


def char_model_shapes():
    """The gradient shapes of chapter 5's character model, in backward order."""
    from mylib.experiments.compress_training import CHAR_TASK, CharMLP, corpus

    c = CHAR_TASK
    model = CharMLP(corpus()[2], c["context"], c["dim"], c["hidden"])
    return [p.shape for p in reversed(list(model.parameters()))]


class _Count(TorchDispatchMode):
    """Matrix products, and new tensors of ``numel`` elements, as ATen runs them."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.products, self.new_bucket_sized = numel, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
            self.products += 1
        inputs = [
            a.untyped_storage().data_ptr()
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor)
        ]
        if (
            isinstance(out, torch.Tensor)
            and out.numel() == self.numel
            and out.untyped_storage().data_ptr() not in inputs  # not a view, in place
        ):
            self.new_bucket_sized += 1
        return out


class _Done:
    """The work of an all-reduce that has already completed."""

    def __init__(self, tensor):
        self.future = torch.futures.Future()
        self.future.set_result([tensor])

    def get_future(self):
        return self.future

    def wait(self):
        return True


@contextlib.contextmanager
def _synchronous_all_reduce():
    """``dist.all_reduce`` completes before it returns, so callbacks run inline.

    A future's callbacks then run in this thread, where :class:`_Count` sees
    their operations.
    """
    real = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real(tensor, op=op, group=group)
        return _Done(tensor) if async_op else None

    with mock.patch.object(dist, "all_reduce", all_reduce):
        yield


def _hooks(rank):
    """``{name: (state, hook)}`` of PyTorch's PowerSGD hook and mylib's, compressing."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

    theirs = torch_psgd.PowerSGDState(
        None, matrix_approximation_rank=rank, start_powerSGD_iter=2
    )
    mine = PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    for state in (theirs, mine):
        state.iter = 2  # past the plain steps
    return {
        "PyTorch": (theirs, torch_psgd.powerSGD_hook),
        "mylib": (mine, powersgd_hook),
    }


def powersgd_step_costs(shapes=None, rank=4, steps=3):
    """On every rank: one bucket of ``shapes`` through each hook, ``steps`` times.

    ``shapes`` defaults to the chapter's character model. Per hook: the matrices
    it compresses; per compressed step, the matrix products (mm and bmm) and
    the new tensors as large as the bucket; and the bytes its state keeps
    between steps, per kind (error, P, Q; mylib keeps no P). The first step
    allocates the error, so the counts that repeat are those of the later steps.
    """
    shapes = shapes or char_model_shapes()
    numel = sum(s.numel() for s in shapes)
    out = {}
    for name, (state, hook) in _hooks(rank).items():
        g = torch.Generator().manual_seed(dist.get_rank())
        products, new = [], []
        for _ in range(steps):
            bucket = _Bucket(shapes, g)
            with _synchronous_all_reduce(), _Count(numel) as count:
                hook(state, bucket).wait()
            products.append(count.products)
            new.append(count.new_bucket_sized)
        kept = {
            kind: sum(t.nbytes for t in getattr(state, f"{kind}_dict", {}).values())
            for kind in ("error", "p_memory", "q_memory")
        }
        out[name] = {
            "compressed": len(compression_plan(bucket.gradients(), state)[0]),
            "products": products,
            "new_bucket_sized": new,
            "bucket_bytes": numel * 4,
            "error_bytes": kept["error"],
            "p_bytes": kept["p_memory"],
            "q_bytes": kept["q_memory"],
        }
    return out


def allreduce_chain(shapes=None, rank=4):
    """On every rank: the all-reduces of one compressed step of PyTorch's hook.

    In the order issued: ``(elements, whether every earlier one had completed
    when it was issued)``. PyTorch issues the uncompressed rest's, then P's from
    the rest's callback, then Q's from P's: each waits for the one before.
    """
    shapes = shapes or char_model_shapes()
    state, hook = _hooks(rank)["PyTorch"]
    real, futures, issued = dist.all_reduce, [], []

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        issued.append((tensor.numel(), all(f.done() for f in futures)))
        work = real(tensor, op=op, group=group, async_op=async_op)
        futures.append(work.get_future())
        return work

    with mock.patch.object(dist, "all_reduce", all_reduce):
        hook(state, _Bucket(shapes, torch.Generator().manual_seed(0))).wait()
    # The chain's callbacks ran on gloo's worker threads and the futures hold
    # its work: let every one finish and drop them here, on the main thread,
    # before the group is destroyed (else a worker can end up joining itself).
    for future in futures:
        future.wait()
    futures.clear()
    dist.barrier()
    return issued


AS_CUDA_BUILD = {"cuda": "12.8", "nccl": (2, 27, 3)}
"""How :func:`bf16_hook_accepted` describes a CUDA build: its CUDA and NCCL versions."""


def bf16_hook_accepted(as_cuda_build=False):
    """On every rank: does PyTorch's DDP take ``default_hooks.bf16_compress_hook``?

    DDP checks the hook's *name* when it is registered, and the build: CUDA or
    ROCm with NCCL 2.10 or later, or XPU with XCCL and an XPU present.
    ``as_cuda_build`` describes this build as a CUDA build with NCCL
    (:data:`AS_CUDA_BUILD`: ``torch.version.cuda`` and the NCCL queries), while
    ``torch.cuda.is_available()`` stays what it is.
    Returns ``(accepted, the refusal or None, torch.cuda.is_available())``.
    """
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 3))
    build = contextlib.ExitStack()
    if as_cuda_build:
        cuda, nccl = AS_CUDA_BUILD["cuda"], AS_CUDA_BUILD["nccl"]
        build.enter_context(mock.patch.object(torch.version, "cuda", cuda))
        build.enter_context(mock.patch.object(dist, "is_nccl_available", lambda: True))
        build.enter_context(mock.patch.object(torch.cuda.nccl, "version", lambda: nccl))
    with build:
        try:
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        except TypeError as refusal:
            return False, str(refusal), torch.cuda.is_available()
    return True, None, torch.cuda.is_available()
