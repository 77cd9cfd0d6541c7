"""What each data-parallel strategy costs on a cluster: memory, bytes, time.

The planner's physics, each number from the chapter that builds it:

* memory per GPU: chapter 6's :func:`~mylib.models.memory.memory_per_rank`
  with the bytes PyTorch keeps (fp32 parameters, fp32 gradients, Adam's two
  fp32 moments: chapter 6's ``RECIPES``), plus the activations of
  :mod:`mylib.models.transformer` and the parameters FSDP holds gathered
  (chapter 6's ZeRO-3 timeline);
* bytes sent: chapter 7's :mod:`~mylib.models.step_traffic` on the cluster
  model (NVLink inside a node, NICs out);
* time: chapter 3's bucketed timeline for DDP
  (:func:`~mylib.models.timeline.simulate`; the first ``m - 1`` micro-steps
  under ``no_sync()`` send nothing, chapter 4), chapter 6's ZeRO-3 timeline
  with prefetch for FSDP (:func:`~mylib.models.timeline_zero3.zero3_step`),
  each on the ring the cluster model lays over the GPUs
  (:func:`~mylib.models.cluster.ring_alpha_beta`).

The strategies, as PyTorch runs them:

* **DDP**: every GPU holds everything; buckets all-reduce the gradients
  (in bf16 with chapter 5's ``bf16_compress_hook``, when training in bf16).
* **ZeRO-1**: ``ZeroRedundancyOptimizer`` behind DDP: the optimizer state is
  sharded; after the step each GPU all-gathers the updated fp32 parameters,
  and nothing computes while they travel.
* **ZeRO-2**: FSDP2 with ``reshard_after_forward=False``: everything sharded,
  each unit gathered once before its forward and kept whole until its
  backward is done (ZeRO-2's traffic; chapter 6).
* **ZeRO-3**: FSDP2 with ``reshard_after_forward=True``: gathered again for
  the backward.
* **HSDP**: ZeRO-3 inside each node, replicas across nodes: the gradient
  shards are all-reduced across nodes, one GPU per node and shard.

FSDP reshards after every micro-step's backward (FSDP2's default), so each
micro-step gathers and reduce-scatters again; its gradients stay sharded.

Standard library only: the planner runs in the reader's browser.
"""

import functools
from dataclasses import dataclass

from mylib.models import buckets
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.cluster import ALL_GATHER, ALL_REDUCE, ring, ring_alpha_beta
from mylib.models.memory import memory_per_rank
from mylib.models.step_traffic import (
    ddp_traffic,
    fsdp_traffic,
    hsdp_traffic,
    step_totals,
)
from mylib.models.timeline_zero3 import zero3_step

STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "HSDP")
#: bucket_cap_mb values the planner tries (DDP counts MiB); 25 is DDP's default.
CAPS_MB = (1, 5, 10, 25, 50, 100, 250)
DEFAULT_CAP_MB = 25
#: Bytes PyTorch keeps per parameter: fp32 parameters and gradients (autocast
#: computes in bf16 from fp32 parameters) and the optimizer's fp32 state.
KEPT = {"params": 4, "grads": 4}
OPTIMIZER_BYTES = {"adam": 8, "sgd-momentum": 4}
#: Chapter 6's stage whose sharding each strategy keeps (FSDP2 shards all three).
STAGE = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 3, "ZeRO-3": 3, "HSDP": 3}


@dataclass(frozen=True)
class Bytes:
    """Element sizes: what is gathered, reduced and kept as activations."""

    gather: int  # FSDP's all-gathered parameters (2: bf16)
    reduce: int  # gradients on the wire (2: bf16)
    activation: int  # activations (2: bf16)


def wire_bytes(precision):
    """:class:`Bytes` of ``"bf16"`` mixed precision or of ``"fp32"`` training.

    In bf16 the gradients travel in bf16 too: DDP with chapter 5's
    ``bf16_compress_hook``, FSDP2 with ``MixedPrecisionPolicy(param_dtype=
    torch.bfloat16)``, whose ``reduce_dtype`` then defaults to the compute
    dtype. The ZeRO paper counts the same 2 bytes.
    """
    if precision == "bf16":
        return Bytes(gather=2, reduce=2, activation=2)
    if precision == "fp32":
        return Bytes(gather=4, reduce=4, activation=4)
    raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")


def state_memory(strategy, psi, ranks, gpus_per_node, optimizer="adam"):
    """Chapter 6's :class:`~mylib.models.memory.MemoryPerRank` of ``strategy``.

    Parameters, gradients and optimizer state per GPU, without activations
    and without the gathered parameters FSDP holds for a while (buffers).
    """
    k = OPTIMIZER_BYTES[_check_optimizer(optimizer)]
    group = min(ranks, gpus_per_node) if _check_strategy(strategy) == "HSDP" else ranks
    return memory_per_rank(
        psi, group, STAGE[strategy], k, KEPT["params"], KEPT["grads"]
    )


@dataclass(frozen=True)
class StrategyCost:
    """One strategy's optimizer step on the cluster.

    Seconds for the whole step of ``micro_steps`` micro-steps; bytes per GPU
    and per NIC for the whole step. ``comm_s``: the collectives back to back
    on the cluster model; ``exposed_s``: what compute waits for;
    ``step_bound`` says whether ``step_s`` is an upper bound (HSDP).
    ``buffers``: parameter and gradient bytes held whole for a while.
    """

    strategy: str
    step_s: float
    exposed_s: float
    comm_s: float
    gpu_bytes: float
    nic_bytes: float
    buffers: float
    step_bound: bool = False
    cap_mb: object = None  # DDP and ZeRO-1: the best bucket_cap_mb
    default_exposed_s: object = None  # ... and the exposed time at 25


@dataclass(frozen=True)
class Step:
    """One micro-step's compute per GPU, as the timelines need it."""

    forward_s: float  # the whole forward
    ddp_layers: tuple  # backward order, the gradients' bytes on the wire
    fsdp_layers: tuple  # backward order, gathered parameter bytes
    forward_ratio: float  # a layer's forward over its backward (FSDP timelines)
    psi: float
    wire_share: float = 1.0  # bytes on the wire per byte of DDP's fp32 buckets

    @property
    def compute_s(self):
        """Forward and backward of one micro-step."""
        return self.forward_s + sum(layer.backward_s for layer in self.ddp_layers)


def ddp_timeline(step, link, cap_mb):
    """Chapter 3's timeline of a micro-step that all-reduces, ``bucket_cap_mb=cap_mb``.

    An explicit ``bucket_cap_mb`` is also DDP's first bucket cap
    (:mod:`mylib.models.buckets`); the default (``None``, 25 MiB) keeps 1 MiB.
    DDP fills its buckets with fp32 gradients; a compressing hook sends
    ``step.wire_share`` of each (chapter 5), so the layers hold the bytes on
    the wire and the caps shrink alike: the same buckets, fewer bytes.
    """
    share = step.wire_share
    first = buckets.DEFAULT_FIRST_BUCKET_BYTES if cap_mb is None else cap_mb * MB
    cap = (DEFAULT_CAP_MB if cap_mb is None else cap_mb) * MB
    first, cap = first * share, cap * share
    return tl.simulate(
        step.ddp_layers, cap, link, first_cap_bytes=first, forward_s=step.forward_s
    )


def flat_link(cluster):
    """Chapter 1's ring over every GPU of ``cluster``, as the cluster model lays it."""
    return tl.Link(cluster.ranks, *ring_alpha_beta(cluster, cluster.ranks))


@functools.lru_cache(maxsize=32)
def ddp_timelines(step, cluster):
    """``({cap: timeline} for CAPS_MB, the default's timeline)``, remembered.

    The planner redraws on every input; a new checkpoint time or global batch
    does not change these.
    """
    link = flat_link(cluster)
    timelines = {cap: ddp_timeline(step, link, cap) for cap in CAPS_MB}
    return timelines, ddp_timeline(step, link, None)


def ddp_cost(step, cluster, micro_steps, zero1=False, cap_mb=None):
    """DDP (or ZeRO-1): the best cap of :data:`CAPS_MB` (or ``cap_mb``).

    The first ``micro_steps - 1`` micro-steps run under ``no_sync()`` and
    send nothing (chapter 4); the last one plays chapter 3's timeline.
    """
    timelines, default = ddp_timelines(step, cluster)
    if cap_mb is None:
        cap_mb = min(CAPS_MB, key=lambda cap: (timelines[cap].step_s, cap))
    chosen = timelines[cap_mb]
    traffic = ddp_traffic(cluster, step.psi * KEPT["grads"] * step.wire_share)
    step_s = (micro_steps - 1) * step.compute_s + chosen.step_s
    exposed, default_exposed = chosen.exposed_comm_s, default.exposed_comm_s
    if zero1:  # the updated fp32 parameters, gathered after the step
        gather = ring(cluster, ALL_GATHER, step.psi * KEPT["params"])
        traffic = {**traffic, "all-gather": gather}
        step_s, exposed = step_s + gather.seconds, exposed + gather.seconds
        default_exposed += gather.seconds
    totals = step_totals(traffic)
    return StrategyCost(
        "ZeRO-1" if zero1 else "DDP",
        step_s,
        exposed,
        totals["seconds"],
        totals["gpu_bytes"],
        totals["nic_bytes"],
        0.0,
        cap_mb=cap_mb,
        default_exposed_s=default_exposed,
    )


@functools.lru_cache(maxsize=32)
def zero3_micro(step, cluster, bytes_, reshard_after_forward):
    """Chapter 6's ZeRO-3 timeline of one micro-step with prefetch, remembered."""
    return zero3_step(
        step.fsdp_layers,
        flat_link(cluster),
        prefetch=True,
        reshard_after_forward=reshard_after_forward,
        forward_ratio=step.forward_ratio,
    )


def fsdp_cost(step, cluster, bytes_, micro_steps, reshard_after_forward=True):
    """ZeRO-3 (or ZeRO-2, ``reshard_after_forward=False``): ``micro_steps`` alike.

    Each micro-step gathers and reduce-scatters again (FSDP2 reshards after
    every backward and keeps its gradients sharded).
    """
    one = zero3_micro(step, cluster, bytes_, reshard_after_forward)
    traffic = step_totals(
        fsdp_traffic(
            cluster,
            step.psi,
            gather_bytes=bytes_.gather,
            reduce_bytes=bytes_.reduce,
            reshard_to=None if reshard_after_forward else 1,
        )
    )
    m = micro_steps
    return StrategyCost(
        "ZeRO-3" if reshard_after_forward else "ZeRO-2",
        m * one.step_s,
        m * one.waiting_s,
        m * traffic["seconds"],
        m * traffic["gpu_bytes"],
        m * traffic["nic_bytes"],
        fsdp_buffers(step, one.peak_gathered_bytes, bytes_),
    )


def fsdp_buffers(step, peak_gathered_bytes, bytes_):
    """Gathered parameters at their peak, plus the largest unit's unsharded gradient."""
    largest = max(layer.nbytes for layer in step.fsdp_layers)
    return peak_gathered_bytes + largest / bytes_.gather * bytes_.reduce


@functools.lru_cache(maxsize=32)
def hsdp_micro(step, cluster, bytes_):
    """HSDP's micro-step: the node's ZeRO-3 timeline, and the cross-node tail.

    The tail is a DDP-like timeline of one gradient shard per unit (FSDP2
    all-reduces each unit's reduce-scatter output) on the ring of one GPU per
    node: the exposed part of the all-reduce across nodes.
    """
    g, nodes = cluster.gpus_per_node, cluster.nodes
    one = zero3_micro(step, cluster.with_nodes(1), bytes_, True)
    if nodes == 1:
        return one, 0.0
    probe = ring(cluster, ALL_REDUCE, 1.0, 1)
    cross = tl.Link(nodes, probe.latency_s / (2 * (nodes - 1)), probe.peak_busbw)
    shards = [
        tl.Layer(layer.name, layer.backward_s, [_shard(layer, bytes_, g)])
        for layer in step.fsdp_layers
    ]
    return one, tl.simulate(shards, 0, cross, forward_s=step.forward_s).exposed_comm_s


def hsdp_cost(step, cluster, bytes_, micro_steps):
    """HSDP: ZeRO-3 inside each node, plus the gradient shards' all-reduce across.

    The two use different links (NVLink, NICs) and run together: the step is
    at most the node's ZeRO-3 step plus the all-reduce's exposed tail, an
    upper bound (``step_bound``).
    """
    one, tail = hsdp_micro(step, cluster, bytes_)
    traffic = step_totals(
        hsdp_traffic(
            cluster, step.psi, gather_bytes=bytes_.gather, reduce_bytes=bytes_.reduce
        )
    )
    m = micro_steps
    return StrategyCost(
        "HSDP",
        m * (one.step_s + tail),
        m * (one.waiting_s + tail),
        m * traffic["seconds"],
        m * traffic["gpu_bytes"],
        m * traffic["nic_bytes"],
        fsdp_buffers(step, one.peak_gathered_bytes, bytes_),
        step_bound=cluster.nodes > 1,
    )


def _shard(layer, bytes_, g):
    return layer.nbytes / bytes_.gather * bytes_.reduce / g


def strategy_cost(strategy, step, cluster, bytes_, micro_steps, cap_mb=None):
    """The :class:`StrategyCost` of ``strategy``, ``micro_steps`` micro-steps a step."""
    strategy = _check_strategy(strategy)
    if strategy in ("DDP", "ZeRO-1"):
        return ddp_cost(step, cluster, micro_steps, strategy == "ZeRO-1", cap_mb)
    if strategy == "HSDP":
        return hsdp_cost(step, cluster, bytes_, micro_steps)
    return fsdp_cost(step, cluster, bytes_, micro_steps, strategy == "ZeRO-3")


def _check_strategy(strategy):
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def _check_optimizer(optimizer):
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZER_BYTES)}, got {optimizer!r}"
        )
    return optimizer
