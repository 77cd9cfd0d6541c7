"""How much memory one rank needs, and how many bytes it sends, under DDP and ZeRO.

The accounting of the ZeRO paper (Rajbhandari et al., 2020). A model of
``psi`` parameters trained with mixed-precision Adam holds, per rank:

* parameters in 16-bit: 2 psi bytes,
* gradients in 16-bit: 2 psi bytes,
* optimizer state: K psi bytes, K = 12 for Adam (a 32-bit master copy of
  the parameters, the momentum and the variance: 4 + 4 + 4 bytes).

DDP replicates all three on every rank. ZeRO splits them over the N ranks,
one more of them at each stage:

=========  ======================  =====================  =========================
stage      parameters              gradients              optimizer state
=========  ======================  =====================  =========================
DDP        2 psi                   2 psi                  K psi
ZeRO-1     2 psi                   2 psi                  K psi / N
ZeRO-2     2 psi                   2 psi / N              K psi / N
ZeRO-3     2 psi / N               2 psi / N              K psi / N
=========  ======================  =====================  =========================

``psi`` is always the number of parameters; bytes carry their factor (2 psi
bytes: psi parameters in bf16).

Communication per step, with the ring algorithms (each collective moves
(N-1)/N of its buffer through every rank): DDP all-reduces the gradients
(2 psi elements, 4 psi bytes in bf16); ZeRO-1 and ZeRO-2 reduce-scatter the
gradients and all-gather the updated parameters (psi + psi elements); ZeRO-3
all-gathers the parameters twice, once for the forward and once for the
backward, and reduce-scatters the gradients (3 psi elements): 1.5 times DDP
when gathers and reductions use the same dtype. :data:`RECIPES` and
:func:`traffic_ratio` say what PyTorch's mixed-precision setups keep and send
in bytes, where the dtypes differ; :func:`fsdp_comm_per_step` splits FSDP2's
traffic by group, for hybrid sharding (HSDP) and ``reshard_after_forward=<int>``.

Only the standard library is used, so the chapter's memory calculator runs
this very file in the reader's browser (Pyodide).
"""

from dataclasses import dataclass

GB = 1e9  # the ZeRO paper (and GPU vendors) count 10^9 bytes to a GB
STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
ADAM_MIXED_PRECISION_K = 12  # fp32 master parameters + momentum + variance
ADAM_FP32_K = 8  # momentum + variance; the fp32 parameters are the model's own


@dataclass(frozen=True)
class MemoryPerRank:
    """Bytes of model state one rank holds: parameters, gradients, optimizer state."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self):
        """Parameters + gradients + optimizer state, in bytes."""
        return self.params + self.grads + self.optimizer

    def gb(self):
        """The same numbers in GB (10^9 bytes), as a dict."""
        return {
            "params": self.params / GB,
            "grads": self.grads / GB,
            "optimizer": self.optimizer / GB,
            "total": self.total / GB,
        }


def _check(num_params, world_size, stage):
    if not num_params >= 0:
        raise ValueError(f"num_params must be >= 0, got {num_params!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            "world_size must be a positive int (the number of ranks), "
            f"got {world_size!r}"
        )
    if stage not in STAGES:
        raise ValueError(
            f"stage must be one of {STAGES} (0 = DDP, 1-3 = ZeRO stages), got {stage!r}"
        )


def memory_per_rank(
    num_params, world_size, stage, k=ADAM_MIXED_PRECISION_K, param_bytes=2, grad_bytes=2
):
    """Bytes of parameters, gradients and optimizer state on one rank.

    ``stage`` is 0 for DDP (nothing sharded) or the ZeRO stage 1, 2 or 3.
    ``k`` is the optimizer state in bytes per parameter (12 for
    mixed-precision Adam, 8 for Adam in float32); ``param_bytes`` and
    ``grad_bytes`` the bytes of one parameter and one gradient element (2 in
    bf16/fp16, 4 in float32).

    >>> round(memory_per_rank(7.5e9, 64, 1).total / GB, 1)
    31.4
    """
    _check(num_params, world_size, stage)
    if k < 0 or param_bytes <= 0 or grad_bytes <= 0:
        raise ValueError(
            f"need k >= 0 and positive element sizes, got k={k}, "
            f"param_bytes={param_bytes}, grad_bytes={grad_bytes}"
        )
    n = world_size
    return MemoryPerRank(
        params=param_bytes * num_params / (n if stage >= 3 else 1),
        grads=grad_bytes * num_params / (n if stage >= 2 else 1),
        optimizer=k * num_params / (n if stage >= 1 else 1),
    )


def comm_per_step(
    num_params,
    world_size,
    stage,
    param_bytes=2,
    grad_bytes=2,
    zero1_after_all_reduce=False,
):
    """Bytes one rank sends per training step, by collective, with ring algorithms.

    DDP: all-reduce of the gradients. ZeRO-1 and ZeRO-2: reduce-scatter of
    the gradients, all-gather of the updated parameters. ZeRO-3: all-gather
    of the parameters before the forward and again before the backward,
    reduce-scatter of the gradients. ``zero1_after_all_reduce=True`` is
    ZeRO-1 the way PyTorch's ``ZeroRedundancyOptimizer`` runs behind DDP: the
    gradients are all-reduced (not reduce-scattered), then the parameters
    gathered, 3 psi instead of 2 psi. Returns a dict op -> bytes, with the
    ops named as :mod:`mylib.comm` counts them.
    """
    _check(num_params, world_size, stage)
    # the share of a buffer each rank sends in one ring pass
    ring = (world_size - 1) / world_size
    grads = ring * num_params * grad_bytes
    params = ring * num_params * param_bytes
    if stage == 0:
        return {"all_reduce": 2 * grads}
    if stage == 1 and zero1_after_all_reduce:
        return {"all_reduce": 2 * grads, "all_gather": params}
    if stage in (1, 2):
        return {"reduce_scatter": grads, "all_gather": params}
    return {"reduce_scatter": grads, "all_gather": 2 * params}


def comm_volume_in_psi(stage, world_size=None):
    """Elements one rank sends per step, in psi: 2 (DDP, ZeRO-1, ZeRO-2) or 3 (ZeRO-3).

    With ``world_size`` the ring's (N-1)/N factor is included; without it,
    the large-N limit that the ZeRO paper quotes.
    """
    if world_size is None:
        _check(0, 1, stage)
        return 3.0 if stage == 3 else 2.0
    return sum(
        comm_per_step(1.0, world_size, stage, param_bytes=1, grad_bytes=1).values()
    )


def max_params_that_fit(
    memory_bytes,
    world_size,
    stage,
    k=ADAM_MIXED_PRECISION_K,
    param_bytes=2,
    grad_bytes=2,
):
    """The largest psi whose model state fits in ``memory_bytes`` per rank.

    Activations are not counted.
    """
    per_param = memory_per_rank(
        1.0, world_size, stage, k, param_bytes, grad_bytes
    ).total
    return memory_bytes / per_param


def min_ranks_to_fit(
    num_params,
    stage,
    memory_bytes,
    k=ADAM_MIXED_PRECISION_K,
    param_bytes=2,
    grad_bytes=2,
):
    """The fewest ranks N at which ``num_params`` fit in ``memory_bytes`` per rank.

    ``stage`` is as for :func:`memory_per_rank`; None if no rank count does.
    Per-rank memory is ``A + B / N``: A, what every rank replicates, B what
    is sharded. It fits once ``N >= B / (memory_bytes - A)``; never when
    ``A >= memory_bytes`` (DDP's A is everything: more ranks do not help).
    """
    one = memory_per_rank(num_params, 1, stage, k, param_bytes, grad_bytes).total
    two = memory_per_rank(num_params, 2, stage, k, param_bytes, grad_bytes).total
    sharded = 2 * (one - two)
    replicated = one - sharded
    if one <= memory_bytes:
        return 1
    if replicated >= memory_bytes:
        return None
    n = max(1, int(sharded // (memory_bytes - replicated)))
    while (
        memory_per_rank(num_params, n, stage, k, param_bytes, grad_bytes).total
        > memory_bytes
    ):
        n += 1  # the division may land one short by rounding
    return n


# -- what real setups keep and send ----------------------------------------------
# The paper counts 16-bit parameters and gradients and a 12-byte optimizer
# state. PyTorch's DDP under autocast and FSDP2 with a MixedPrecisionPolicy
# keep other dtypes (chapter 6 names the torch source for each).


@dataclass(frozen=True)
class Recipe:
    """How a setup keeps and sends its model state, in bytes per parameter.

    ``stage`` as for :func:`memory_per_rank` (0 = DDP, 3 = fully sharded);
    ``params``, ``grads`` and ``optimizer`` are the bytes per parameter kept
    (divided by N where the stage shards them); ``reduce`` the bytes per
    element of the gradient reduction (all-reduce or reduce-scatter),
    ``gather`` those of the parameter all-gather (0 for DDP).
    """

    name: str
    stage: int
    params: float
    grads: float
    optimizer: float
    reduce: float
    gather: float = 0.0

    def memory(self, num_params, world_size):
        """The :class:`MemoryPerRank` this setup keeps."""
        kept = dict(k=self.optimizer, param_bytes=self.params, grad_bytes=self.grads)
        return memory_per_rank(num_params, world_size, self.stage, **kept)

    def comm(self, num_params, world_size):
        """Bytes one rank sends per step, by collective (:func:`comm_per_step`)."""
        sent = dict(param_bytes=self.gather, grad_bytes=self.reduce)
        return comm_per_step(num_params, world_size, self.stage, **sent)

    def sent_per_param(self):
        """Bytes sent per parameter per step for large N (the ring's (N-1)/N -> 1)."""
        gathers = {0: 0, 1: 1, 2: 1, 3: 2}[self.stage]
        reduces = 2 if self.stage == 0 else 1  # an all-reduce is two halves
        return reduces * self.reduce + gathers * self.gather


RECIPES = {
    "paper DDP": Recipe("DDP, as the ZeRO paper counts", 0, 2, 2, 12, reduce=2),
    "paper ZeRO-3": Recipe(
        "ZeRO-3, as the ZeRO paper counts", 3, 2, 2, 12, reduce=2, gather=2
    ),
    # fp32 parameters; autocast casts them to bf16 op by op. Their gradients
    # are fp32, in .grad and again in DDP's fp32 buckets (two copies unless
    # gradient_as_bucket_view=True); Adam's two fp32 moments.
    "DDP + autocast": Recipe("DDP under autocast(bfloat16)", 0, 4, 8, 8, reduce=4),
    "DDP + autocast, bucket view": Recipe(
        "the same, gradient_as_bucket_view=True", 0, 4, 4, 8, reduce=4
    ),
    "DDP + autocast, bf16 hook": Recipe(
        "the same, bf16_compress_hook", 0, 4, 8, 8, reduce=2
    ),
    # fp32 sharded parameters (the master copy), all-gathered in bf16;
    # gradients reduced in reduce_dtype, kept sharded in fp32.
    "FSDP2 bf16, reduce fp32": Recipe(
        "FSDP2, MixedPrecisionPolicy(bfloat16, reduce_dtype=float32)",
        3,
        4,
        4,
        8,
        reduce=4,
        gather=2,
    ),
    "FSDP2 bf16": Recipe(
        "FSDP2, MixedPrecisionPolicy(bfloat16)", 3, 4, 4, 8, reduce=2, gather=2
    ),
}
"""Setups the chapter compares, by name."""


def traffic_ratio(recipe, baseline, world_size=None):
    """Bytes ``recipe`` sends per step over the bytes ``baseline`` sends.

    Both are :class:`Recipe` (or names in :data:`RECIPES`), on ``world_size``
    ranks (None: the large-N limit; on equal N the ring factor cancels).
    """
    recipe, baseline = (RECIPES.get(r, r) for r in (recipe, baseline))
    if world_size is None:
        return recipe.sent_per_param() / baseline.sent_per_param()
    return sum(recipe.comm(1.0, world_size).values()) / sum(
        baseline.comm(1.0, world_size).values()
    )


def fsdp_comm_per_step(
    num_params,
    shard_size,
    *,
    replicas=1,
    reshard_to=None,
    gather_bytes=2,
    reduce_bytes=4,
):
    """Bytes one rank sends per step under FSDP2, with the group each goes over.

    Parameters are sharded over ``shard_size`` ranks, replicated ``replicas``
    times (HSDP when > 1: a 2-D mesh). ``reshard_to`` is FSDP2's
    ``reshard_after_forward``: None for True (the backward gathers over the
    shard group again), 1 for False (no gather in the backward), or a divisor
    k of ``shard_size`` (the backward gathers over k ranks only: ZeRO++'s
    hpZ). Returns ``{collective: (ranks in its group, bytes sent)}``; under
    HSDP the all-reduce carries only this rank's shard of the gradient.
    """
    _check(num_params, shard_size, 0)
    back = shard_size if reshard_to is None else reshard_to
    if (
        not isinstance(back, int)
        or back < 1
        or shard_size % back
        or not isinstance(replicas, int)
        or replicas < 1
    ):
        raise ValueError(
            "reshard_to must divide shard_size and replicas must be a positive "
            f"int, got reshard_to={reshard_to!r}, shard_size={shard_size}, "
            f"replicas={replicas!r}"
        )

    def ring(n):
        return (n - 1) / n

    out = {
        "forward all-gather": (
            shard_size,
            ring(shard_size) * num_params * gather_bytes,
        ),
        "backward all-gather": (back, ring(back) * num_params * gather_bytes),
        "reduce-scatter": (shard_size, ring(shard_size) * num_params * reduce_bytes),
    }
    if replicas > 1:
        shard = num_params / shard_size
        out["all-reduce"] = (replicas, 2 * ring(replicas) * shard * reduce_bytes)
    return out


def fsdp_params_after_forward(num_params, shard_size, reshard_to=None, gather_bytes=2):
    """Parameter bytes one rank keeps between a unit's forward and its backward.

    Beyond the sharded fp32 parameters it always keeps, summed over units
    (all of them at the end of the forward): 0 with FSDP2's
    ``reshard_after_forward=True`` (``reshard_to=None``), the whole model in
    ``gather_bytes`` with False (1), its 1/k with an int k.
    """
    if reshard_to is None:
        return 0.0
    if not isinstance(reshard_to, int) or reshard_to < 1 or shard_size % reshard_to:
        raise ValueError(
            f"reshard_to must divide shard_size ({shard_size}), got {reshard_to!r}"
        )
    return num_params * gather_bytes / reshard_to
