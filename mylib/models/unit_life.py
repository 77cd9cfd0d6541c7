"""One ZeRO-3 unit's life in a training step: what a rank holds after each event.

Chapter 6's picture of ZeRO-3: gather, forward, free; gather, backward,
reduce-scatter, free. A *unit* (a transformer block, say) of ``psi_u``
parameters, on ``N`` ranks, in the ZeRO paper's accounting (16-bit
parameters and gradients, ``K`` bytes of optimizer state per parameter, the
numbers of :func:`mylib.models.memory.memory_per_rank`). After each event a
rank holds, of this unit, in bytes:

* always: its shard of the parameters (``2 psi_u / N``) and of the optimizer
  state (``K psi_u / N``);
* from the gather to the next free: the full parameters (``2 psi_u``);
* from the backward to the last free: the full gradient (``2 psi_u``);
* from the reduce-scatter on: its shard of the averaged gradient
  (``2 psi_u / N``), what its optimizer steps with.

Each gather and the reduce-scatter also send bytes: ``(N-1)/N`` of the full
buffer each, with a ring (:func:`mylib.models.memory.comm_per_step`). Over the
step that is ZeRO-3's three halves of an all-reduce, ``3 psi_u`` elements.
Activations are not counted.

Standard library only: the figure that draws it can run in the browser.
"""

from dataclasses import dataclass

from mylib.models.memory import ADAM_MIXED_PRECISION_K, comm_per_step, memory_per_rank

#: The events of one step, in order, each with its pass.
EVENTS = (
    ("gather", "forward"),
    ("forward", "forward"),
    ("free", "forward"),
    ("gather", "backward"),
    ("backward", "backward"),
    ("reduce-scatter", "backward"),
    ("free", "backward"),
)

#: What a rank can hold of a unit, bottom to top as the picture stacks it.
KINDS = ("optimizer_shard", "param_shard", "grad_shard", "full_params", "full_grads")


@dataclass(frozen=True)
class Held:
    """What one rank holds of one unit right after ``event``, in bytes.

    ``sent``: the bytes this rank sends in the event's collective
    (``collective``, None when the event sends nothing).
    """

    event: str
    phase: str
    optimizer_shard: float
    param_shard: float
    grad_shard: float
    full_params: float
    full_grads: float
    sent: float = 0.0
    collective: str | None = None

    @property
    def total(self):
        """Everything held of the unit, in bytes."""
        return sum(getattr(self, kind) for kind in KINDS)

    @property
    def transient(self):
        """The bytes that exist only for a while: the full parameters and gradient."""
        return self.full_params + self.full_grads


def unit_life(
    unit_params, world_size, k=ADAM_MIXED_PRECISION_K, param_bytes=2, grad_bytes=2
):
    """One :class:`Held` per event of :data:`EVENTS`, for one unit on one rank.

    ``unit_params`` parameters, ``world_size`` ranks, ``k`` optimizer bytes per
    parameter, ``param_bytes`` and ``grad_bytes`` per element (2 in bf16).
    The shards are :func:`~mylib.models.memory.memory_per_rank`'s at ZeRO-3,
    the bytes sent :func:`~mylib.models.memory.comm_per_step`'s.
    """
    shard = memory_per_rank(unit_params, world_size, 3, k, param_bytes, grad_bytes)
    sent = comm_per_step(unit_params, world_size, 3, param_bytes, grad_bytes)
    full_params, full_grads = param_bytes * unit_params, grad_bytes * unit_params
    gather = sent["all_gather"] / 2  # two gathers a step, one each pass
    rows, params, grads, grad_shard = [], 0.0, 0.0, 0.0
    for event, phase in EVENTS:
        nbytes, collective = 0.0, None
        if event == "gather":
            params, nbytes, collective = full_params, gather, "all-gather"
        elif event == "backward":
            grads = full_grads
        elif event == "reduce-scatter":
            grad_shard, nbytes = shard.grads, sent["reduce_scatter"]
            collective = "reduce-scatter"
        elif event == "free":
            params = grads = 0.0
        rows.append(
            Held(
                event,
                phase,
                shard.optimizer,
                shard.params,
                grad_shard,
                params,
                grads,
                nbytes,
                collective,
            )
        )
    return rows
