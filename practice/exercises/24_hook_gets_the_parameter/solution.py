"""Exercise 3.6, reference solution."""

import contextlib

import torch
import torch.distributed as dist


class DataParallelNaive(torch.nn.Module):
    """Data parallelism in its simplest form: a hook on every parameter averages
    its gradient over the ranks once backward has accumulated it, unless inside
    ``no_sync()`` (gradient accumulation). Every rank starts from the same
    weights."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # False inside no_sync()
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._allreduce_grads)

    def _allreduce_grads(self, param):
        """All-reduce the gradient over the ranks and divide by their number.

        The bug: a post-accumulate-grad hook is called with the parameter, not
        its gradient ("hook(param: Tensor) -> None", and "this hook operates on
        the tensor that requires grad and not the grad itself", in
        ``Tensor.register_post_accumulate_grad_hook``'s docstring). All-reducing
        its argument averaged the weights and left the gradients local.
        """
        if self.require_backward_grad_sync:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= dist.get_world_size()

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block, backward accumulates gradients without averaging."""
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True
