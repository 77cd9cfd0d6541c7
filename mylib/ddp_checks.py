"""Chapter 8. What MyDDP checks and finds: misuse, and parameters without a gradient.

Data-parallel bugs rarely raise where they happen: a rank that skips a
collective leaves the others waiting forever, and a step on gradients that were
never averaged lets the replicas drift apart in silence. :class:`DDPChecks`
holds :class:`mylib.MyDDP`'s answers, kept out of the teaching path of
:mod:`mylib.ddp`:

* the guard rails: a misuse raises an error that names the fix (a forgotten
  ``finish_gradient_sync()``, a second backward, ``no_sync()`` entered while
  buckets are in flight, models that differ across ranks, an older wrapper of
  the same parameters, an optimizer step on unaveraged gradients);
* ``find_unused_parameters=True``: as PyTorch's DDP, the parameters the
  forward's graph does not reach are found after the forward and marked ready
  at once, and one that no rank used keeps its ``.grad`` as it was.
"""

import functools
import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mylib import comm


class DDPChecks:
    """The checks and the unused-parameter search of :class:`mylib.MyDDP`."""

    # -- guard rails: misuse that would hang or silently diverge ------------------
    def _install_guard_rails(self):
        self._param_ids = {id(p) for b in self.buckets for p in b.params}
        self._released = False
        self._forward_ran = False  # through this wrapper, since the last sync
        # An older MyDDP on these parameters (a re-run with another cap) lets go.
        older = (_OWNERS.get(i) for i in self._param_ids)
        for old in {id(o): o for o in older if o is not None}.values():
            old._release()
        _OWNERS.update(dict.fromkeys(self._param_ids, self))
        # A step on local gradients lets the replicas drift apart silently:
        # check every optimizer step in the process.
        check = functools.partial(_check_step, weakref.ref(self))
        self._step_guard = register_optimizer_step_pre_hook(check)
        weakref.finalize(self, self._step_guard.remove)

    def _release(self):
        """Let go of the parameters: remove our hooks (a newer MyDDP wraps them)."""
        for handle in [*self._hooks, self._step_guard]:
            handle.remove()
        self._hooks, self._released = [], True

    def _check_not_released(self):
        if self._released:
            raise RuntimeError(
                "this MyDDP was replaced: a newer MyDDP wraps the same parameters "
                "(a re-run with another bucket_cap_mb?) and now averages their "
                "gradients. Use the newer one"
            )

    def _check_forward(self):
        self._check_not_released()
        self._forward_ran = True
        if self._backward_seen:
            raise RuntimeError(
                "the previous backward's gradients were never synchronised: call "
                "finish_gradient_sync() after loss.backward() and before "
                "optimizer.step()"
            )

    def _refuse_second_gradient(self, bucket, slot, index):
        """A parameter whose slot is already ready got a gradient: say why it is wrong.

        Called only then, so that the hook pays one set lookup per gradient.
        """
        if index in self._unused:
            raise RuntimeError(
                f"parameter {bucket.names[slot]!r} got a gradient, but the forward's "
                "outputs do not depend on it, so find_unused_parameters=True had "
                "already sent it as unused: compute everything that uses it inside "
                "the module's forward()"
            )
        raise RuntimeError(
            f"parameter {bucket.names[slot]!r} got a second gradient before "
            "finish_gradient_sync(): run one backward per synchronised step "
            "(use no_sync() to accumulate micro-steps)"
        )

    def _check_finish(self):
        self._check_not_released()
        forward_ran, self._forward_ran = self._forward_ran, False
        if not self._backward_seen and self._local_grads and not forward_ran:
            raise RuntimeError(
                "the backward followed no forward of this MyDDP (model.module(x) "
                "instead of model(x)?), so nothing was sent: the wrapper's forward "
                "prepares the backward to synchronise, as in PyTorch's DDP (which "
                "then sends nothing, silently). Call model(x)"
            )
        if not self._backward_seen and self._local_grads:
            raise RuntimeError(
                "every backward since the last sync followed a forward inside "
                "no_sync(), so nothing was sent (the forward decides, as in PyTorch's "
                "DDP): run the last micro-step's forward and backward outside "
                "no_sync(), then call this"
            )
        if not self._backward_seen:
            raise RuntimeError(
                "finish_gradient_sync() was called without a backward() since the "
                "last call: call it exactly once per step, after loss.backward()"
            )
        if self._next_bucket == len(self.buckets) or self.find_unused_parameters:
            return  # every bucket left, or the missing ones are found as unused
        missing = [
            b.names[s]
            for b in self.buckets
            for s in range(len(b.params))
            if s not in b.ready
        ]
        if missing:
            self._reset_iteration()
            raise RuntimeError(
                f"{len(missing)} parameter(s) got no gradient in this backward: "
                f"{missing[:5]}. Every rank must all-reduce every bucket, or the other "
                "ranks wait forever. Fix: freeze them (p.requires_grad_(False)), "
                "remove them from the module, or pass find_unused_parameters=True"
            )

    def _check_no_sync(self):
        if self._backward_seen:  # its buckets are in flight: more gradients would race
            raise RuntimeError(
                "no_sync() entered after a backward whose gradients are still being "
                "averaged: call finish_gradient_sync() first"
            )

    def _check_same_model_on_every_rank(self):
        # A mismatch would otherwise surface as a hang or a garbled broadcast.
        mine = [
            (n, tuple(t.shape), str(t.dtype)) for n, t in self._params_and_buffers()
        ]
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.process_group)
        for rank, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                detail = next(
                    (
                        f"{a[0]!r} is {a[1:]} on rank 0 but {b[0]!r} is {b[1:]} "
                        f"on rank {rank}"
                        for a, b in zip(everyone[0], theirs)
                        if a != b
                    ),
                    f"rank 0 has {len(everyone[0])} tensors, rank {rank} has "
                    f"{len(theirs)}",
                )
                raise ValueError(
                    f"the module differs across ranks: {detail}. Every rank must "
                    "build the same model (same layers, shapes and dtypes) before "
                    "wrapping it in MyDDP"
                )

    # -- find_unused_parameters=True: parameters without a gradient (chapter 8) ----
    def _find_unused(self, output):
        """As PyTorch, after the forward: what the outputs' graph does not reach.

        Those parameters will get no gradient; the backward's first hook marks
        them ready, so that no bucket waits for them.
        """
        reached = _parameters_reached(output)
        self._unused = [
            i for i, (_, p) in enumerate(self._named) if id(p) not in reached
        ]

    def _mark_unused_ready(self, index):
        """No gradient this backward: send what ``.grad`` holds (zero if None).

        ``.grad`` itself is set aside, untouched, in case no rank used it.
        """
        bucket, slot = self._where[index]
        param, view = self._named[index][1], bucket.views[slot]
        if param.grad is None:
            view.zero_()
        elif param.grad.data_ptr() == view.data_ptr():
            param.grad = view.clone()
        else:
            view.copy_(param.grad)
        bucket.ready.add(slot)

    def _used_on_any_rank(self):
        """The parameters that got a gradient anywhere (PyTorch all-reduces a map)."""
        used = torch.zeros(len(self._named), dtype=torch.int32)
        used[sorted(self._used)] = 1
        used = used.to(self._named[0][1].device)
        comm.all_reduce(used, group=self.process_group)
        return used.nonzero().flatten().tolist()


def check_arguments(bucket_cap_mb):
    """Refuse a MyDDP without a process group, or with a bad cap."""
    if not dist.is_initialized():
        raise RuntimeError(
            "MyDDP needs a process group: build it inside mylib.run_ranks(...), or "
            "call mylib.init_from_env() (torchrun) / dist.init_process_group() first"
        )
    if not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb < 0:
        raise ValueError(
            "bucket_cap_mb must be a number >= 0 (0 = one bucket per parameter), "
            f"got {bucket_cap_mb!r}"
        )


_OWNERS = weakref.WeakValueDictionary()  # id(parameter) -> the MyDDP hooked on it


def _check_step(model_ref, optimizer, args, kwargs):
    """Before every optimizer step in the process: refuse unaveraged gradients."""
    model = model_ref()
    if model is None or model._released:
        return
    if not (model._backward_seen or model._local_grads):
        return
    mine = model._param_ids
    if not any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
        return  # another model's optimizer
    if model._backward_seen:
        raise RuntimeError(
            "optimizer.step() before finish_gradient_sync(): some buckets may still "
            "be in flight. Call model.finish_gradient_sync() after loss.backward() "
            "and before optimizer.step()"
        )
    raise RuntimeError(
        "optimizer.step() on gradients accumulated inside no_sync() and never "
        "averaged: each rank would take its own step and the replicas would drift "
        "apart. Run the last micro-step's forward and backward outside no_sync(), "
        "call finish_gradient_sync(), then step"
    )


# -- what the autograd graph tells MyDDP ----------------------------------------------


def _parameters_reached(output):
    """The ids of the tensors whose gradients ``output``'s autograd graph computes.

    The walk PyTorch's reducer makes after each forward with
    ``find_unused_parameters=True`` (``DistributedDataParallel._post_forward``
    passes ``_find_tensors(output)`` to ``reducer.prepare_for_backward``): from
    each output's ``grad_fn`` along ``next_functions``; an ``AccumulateGrad``
    node holds the parameter it accumulates into.
    """
    stack, reached, seen = [], set(), set()
    for t in _tensors(output):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:  # the output is a parameter itself
            reached.add(id(t))
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            reached.add(id(fn.variable))
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return reached


def _tensors(obj):
    """The tensors in a forward's output: a tensor, or lists, tuples, dicts of them."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []
