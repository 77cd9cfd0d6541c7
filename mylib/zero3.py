"""Chapter 6. ZeRO-3: a unit's full parameters exist only while it computes.

ZeRO-2 still keeps every parameter whole on every rank. ZeRO-3 keeps 1/N of
them, and rebuilds a *unit* (a layer, a block) just in time:

* before the unit's forward: all-gather its parameters, compute, free them;
* before the unit's backward: all-gather them again (the backward needs
  the weights to compute the gradient of the unit's input), compute;
* once the unit's gradient is complete: reduce-scatter it, so that rank r
  keeps the averaged gradient of its shard only, and free everything full.

So a rank holds its shards plus the full parameters of one unit (two with
prefetching), and sends 3 psi elements per step (two all-gathers and a
reduce-scatter) against DDP's 2 psi. This is what PyTorch's FSDP does. Its
gradients peak at its shard plus two units' worth: the unit whose
reduce-scatter is in flight, and the one being computed.

:class:`ShardedModel` is the scheduling: hooks on each unit's module gather
before its forward, free after it, and hook the unit's outputs, whose
gradient arrives just before the unit's backward; the module's parameter
slots point at views of the unit's full buffer (:mod:`mylib.zero3_flat`), so
autograd accumulates the unit's whole gradient into one flat ``full.grad``
and a single post-accumulate-grad hook says it is complete. A plain
``torch.optim.AdamW(model.parameters())`` then steps this rank's shard, with
parameter groups and frozen parameters as usual (as FSDP's
``use_orig_params=True``), for element-wise optimizers. ``mp_policy`` and
``ignored_params`` are ``fully_shard``'s: ignored parameters stay whole on
every rank and their gradients are *not* averaged (chapter 6 says what to do).
"""

import torch
import torch.distributed as dist
from torch import nn

from mylib import comm
from mylib.zero3_flat import MixedPrecisionPolicy, ShardedFlat, cast_at_the_edges

__all__ = ["MixedPrecisionPolicy", "ShardedFlat", "ShardedModel", "Unit"]


class Unit:
    """A module whose parameters are gathered and freed together.

    A layer, a block, or the root.
    """

    def __init__(self, module, flats):
        self.module, self.flats = module, flats
        self.gathered = False
        self.pending = []  # works of a prefetch in flight
        # trainable flats whose gradient was reduce-scattered in this backward
        self.reduced = 0


class ShardedModel(nn.Module):
    """ZeRO stage 3 (PyTorch's FSDP): each unit is gathered just in time, then freed.

    ``unit_modules`` are submodules of ``module`` (for example every
    transformer block); each becomes a unit, and every parameter not inside
    one belongs to the root unit (``module`` itself). A parameter used by
    several units (tied weights) belongs to the smallest unit containing them
    all. ``prefetch=True`` starts the all-gather of the next unit (in the
    order recorded in the previous step) while the current unit computes.
    Every rank must run the same modules, as in DDP. Then:
    ``opt = torch.optim.AdamW(model.parameters(), lr=1e-3)``,
    ``loss.backward()``, ``opt.step()`` as usual. Form parameter groups that
    depend on shapes (no weight decay on 1-D tensors, say) *before* wrapping:
    afterwards every parameter is a 1-D piece. ``mp_policy`` and
    ``ignored_params`` are FSDP2's (``fully_shard``'s arguments): see the
    module's docstring.
    """

    def __init__(
        self,
        module,
        unit_modules=(),
        process_group=None,
        prefetch=False,
        mp_policy=MixedPrecisionPolicy(),
        ignored_params=(),
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "ShardedModel needs a process group: call dist.init_process_group "
                "first (mylib.run_ranks and torchrun do it for you)"
            )
        self.module, self.process_group, self.prefetch = module, process_group, prefetch
        self.mp_policy, self.ignored_params = mp_policy, set(ignored_params)
        world = dist.get_world_size(process_group), dist.get_rank(process_group)
        members = {m: {id(sub) for sub in m.modules()} for m in [module, *unit_modules]}
        for m in unit_modules:
            if id(m) not in members[module]:
                raise ValueError(
                    "unit_modules must be submodules of the wrapped module; "
                    f"{type(m).__name__} is not"
                )
        places = {}  # parameter -> every (module, name) slot that holds it
        for m in module.modules():
            for name, p in m._parameters.items():
                if p is not None and p not in self.ignored_params:
                    places.setdefault(p, []).append((m, name))
        owner = {
            p: min(
                (u for u in members if all(id(m) in members[u] for m, _ in slots)),
                key=lambda u: len(members[u]),
            )
            for p, slots in places.items()
        }
        self.units = []
        for u in members:
            groups = {}  # one flat per requires_grad, dtype and device
            for p in (p for p in places if owner[p] is u):
                groups.setdefault((p.requires_grad, p.dtype, p.device), []).append(p)
            flats = [
                ShardedFlat(
                    ps, [places[p] for p in ps], *world, process_group, mp_policy
                )
                for ps in groups.values()
            ]
            self.units.append(Unit(u, flats))
        for unit in self.units:
            unit.module.register_forward_pre_hook(
                lambda m, args, unit=unit: self._pre_forward(unit)
            )
            unit.module.register_forward_hook(
                lambda m, args, out, unit=unit: self._post_forward(unit, out)
            )
            cast_at_the_edges(unit.module, mp_policy)
            for flat in unit.flats:
                if flat.trainable:
                    flat.full.register_post_accumulate_grad_hook(
                        lambda full, unit=unit, flat=flat: self._post_backward(
                            unit, flat
                        )
                    )
        self.gathered_bytes = self.peak_gathered_bytes = 0
        # units in the order they ran, last step (_order) and in this one (_seen)
        self._order = {"forward": [], "backward": []}
        self._seen = {"forward": [], "backward": []}
        # the reduce-scatter still running: at most one, to bound memory
        self._in_flight = None
        self._backward_running = False

    def forward(self, *args, **kwargs):
        """Run the wrapped module.

        The hooks gather each unit just before it computes and free it after.
        """
        return self.module(*args, **kwargs)

    # -- gather / free -------------------------------------------------------------

    def _gather(self, unit, async_op=False):
        if not unit.gathered:
            unit.gathered = True
            unit.pending = [flat.gather(async_op=async_op) for flat in unit.flats]
            self.gathered_bytes += sum(flat.full_bytes for flat in unit.flats)
            self.peak_gathered_bytes = max(
                self.peak_gathered_bytes, self.gathered_bytes
            )
        if not async_op:
            for work in unit.pending:
                if work is not None:
                    work.wait()
            unit.pending = []

    def _free(self, unit, flats=None):
        flats = unit.flats if flats is None else flats
        for flat in flats:
            flat.free()
        self.gathered_bytes -= sum(flat.full_bytes for flat in flats)
        unit.gathered = False

    def _run(self, unit, phase):
        """Gather ``unit`` now and, with prefetching, start gathering the next one.

        The next one is the unit that ran after ``unit`` in the last step.
        """
        self._gather(unit)
        self._seen[phase].append(unit)
        order = self._order[phase]
        if self.prefetch and unit in order and order.index(unit) + 1 < len(order):
            self._gather(order[order.index(unit) + 1], async_op=True)

    # -- forward -------------------------------------------------------------------

    def _pre_forward(self, unit):
        if unit is self.units[0]:  # the root: a new forward begins
            self._seen["forward"] = []
        self._run(unit, "forward")
        for flat in unit.flats:
            concatenate = flat.use_full()
            if concatenate is not None:
                # The unit's gradients, one per parameter, are about to be
                # copied into one flat gradient: finish the reduce-scatter in
                # flight first, so that two unit gradients exist at once, not three.
                concatenate.register_prehook(lambda grads: self._wait_in_flight())

    def _post_forward(self, unit, output):
        for flat in unit.flats:
            flat.use_pieces()
        self._free(unit)
        if unit is self.units[0]:
            self._order["forward"] = self._seen["forward"]
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad, unit=unit: self._pre_backward(unit))
        return output

    # -- backward ------------------------------------------------------------------

    def _pre_backward(self, unit):
        if not self._backward_running:  # the first unit of this backward
            self._backward_running = True
            self._seen["backward"] = []
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._finish_backward)
            for flat in (flat for u in self.units for flat in u.flats):
                flat.drop_cleared_grad_shard()
        if unit not in self._seen["backward"]:
            self._run(unit, "backward")

    def _post_backward(self, unit, flat):
        """``flat``'s gradient is complete: reduce-scatter it, free the full gradient.

        When the unit is done, free the unit too.
        """
        self._wait_in_flight()
        # In reduce_dtype (a copy, fp32 under a bf16 policy with reduce_dtype=fp32)
        grad = flat.full.grad.to(flat.reduce_dtype)
        received = torch.empty_like(flat.shard, dtype=flat.reduce_dtype)
        with torch.no_grad():  # divide, then sum: the mean, as MyDDP does
            grad.div_(dist.get_world_size(self.process_group))
        work = comm.reduce_scatter_single(
            received, grad, group=self.process_group, async_op=True
        )
        # Keep the buffer being sent alive until the reduction is done.
        self._in_flight = (flat, received, grad, work)
        flat.full.grad = None
        unit.reduced += 1
        if unit.reduced == sum(f.trainable for f in unit.flats):
            # Frozen parameters may still be needed for the input's
            # gradient: they wait for the end.
            self._free(unit, [f for f in unit.flats if f.trainable])
            unit.gathered = any(not f.trainable for f in unit.flats)

    def _wait_in_flight(self):
        if self._in_flight is not None:
            flat, received, _, work = self._in_flight
            work.wait()
            with torch.no_grad():
                flat.add_grad_shard(received)  # the mean already
            self._in_flight = None

    def _finish_backward(self):
        self._wait_in_flight()
        for unit in self.units:
            for work in unit.pending:  # a prefetch nobody used
                if work is not None:
                    work.wait()
            unit.pending, unit.reduced = [], 0
            if unit.gathered:
                self._free(
                    unit,
                    [f for f in unit.flats if f.full.untyped_storage().nbytes() > 0],
                )
        self._order["backward"] = self._seen["backward"]
        self._backward_running = False

    # -- the whole model, for checks and checkpoints -------------------------------

    @torch.no_grad()
    def full_parameters(self):
        """``{name: full tensor}`` for every parameter, gathered on every rank.

        The tensors are copies; ignored parameters are whole already.
        """
        full = {}
        for unit in self.units:
            for flat in unit.flats:
                full.update(flat.full_copies())
        return {
            name: full[p] if p in full else p.detach().clone()
            for name, p in self.module.named_parameters()
        }


def _tensors(output):
    """Every tensor inside a module's output.

    The output is a tensor, or tuples, lists and dicts of them.
    """
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)
