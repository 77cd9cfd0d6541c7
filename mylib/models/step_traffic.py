"""What one training step sends, per GPU, per NIC and per node, on a cluster.

Chapter 6 counts the bytes each rank sends under DDP, FSDP and HSDP
(:mod:`mylib.models.memory`); this module lays the same collectives on a
:class:`~mylib.models.cluster.Cluster` and prices them there:

* **DDP**: one all-reduce of the gradients over every GPU, NCCL's flat ring;
* **FSDP** over every GPU: an all-gather of the parameters before each
  unit's forward and again before its backward, a reduce-scatter of the
  gradients; every one a ring over all GPUs, so every one crosses nodes.
  ``reshard_to=k`` (FSDP2's ``reshard_after_forward=k``, ZeRO++'s hpZ)
  keeps the backward's all-gather inside groups of ``k`` GPUs of a node;
* **HSDP**: shard over a node's GPUs, replicate over the nodes. Both
  all-gathers and the reduce-scatter stay inside the node (NVLink); only an
  all-reduce of each GPU's shard crosses, between the GPUs that hold the
  same shard, one per node, all of a node's shards at once on its NICs.

Each function returns ``{collective: Cost}`` in step order;
:func:`step_totals` adds them up. Standard library only.
"""

from dataclasses import replace

from mylib.models.cluster import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    ring,
    tree_all_reduce,
)


def ddp_traffic(cluster, grad_bytes, algorithm="ring"):
    """DDP's step: one all-reduce of ``grad_bytes`` over every GPU.

    ``algorithm`` is ``"ring"`` or ``"tree"``. Buckets split the bytes but
    not the bandwidth term; their latency is the timeline's business.
    """
    if algorithm == "ring":
        cost = ring(cluster, ALL_REDUCE, grad_bytes)
    elif algorithm == "tree":
        cost = tree_all_reduce(cluster, grad_bytes)
    else:
        raise ValueError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")
    return {"all-reduce": cost}


def fsdp_traffic(
    cluster, num_params, *, gather_bytes=2, reduce_bytes=4, reshard_to=None
):
    """FSDP over every GPU of ``cluster``: two all-gathers and a reduce-scatter.

    ``gather_bytes`` per parameter gathered (2 for bf16), ``reduce_bytes``
    per gradient reduced (4 for fp32, FSDP2's usual ``reduce_dtype``).
    ``reshard_to``: None (FSDP2's ``reshard_after_forward=True``: the
    backward gathers over all GPUs again) or a divisor ``k`` of the GPUs per
    node (the backward gathers over ``k`` GPUs of one node).
    """
    _check_params(num_params)
    g = cluster.gpus_per_node
    gather = num_params * gather_bytes
    if reshard_to is None:
        backward = ring(cluster, ALL_GATHER, gather)
    else:
        if not isinstance(reshard_to, int) or reshard_to < 1 or g % reshard_to:
            raise ValueError(
                f"reshard_to must divide the {g} GPUs of a node, got {reshard_to!r}"
            )
        inside = replace(cluster, nodes=1, gpus_per_node=reshard_to)
        backward = ring(inside, ALL_GATHER, gather)
    return {
        "forward all-gather": ring(cluster, ALL_GATHER, gather),
        "backward all-gather": backward,
        "reduce-scatter": ring(cluster, REDUCE_SCATTER, num_params * reduce_bytes),
    }


def hsdp_traffic(cluster, num_params, *, gather_bytes=2, reduce_bytes=4):
    """HSDP: shard over each node's GPUs, replicate over the nodes.

    The gathers and the reduce-scatter run inside one node; the all-reduce
    carries this GPU's shard, ``num_params / g`` gradients, across the nodes,
    with the ``g`` shards of a node all-reduced at once (FSDP2's
    ``foreach_reduce``: reduce-scatter, then all-reduce of its output).
    """
    _check_params(num_params)
    g = cluster.gpus_per_node
    inside = cluster.with_nodes(1)
    gather = num_params * gather_bytes
    return {
        "forward all-gather": ring(inside, ALL_GATHER, gather),
        "backward all-gather": ring(inside, ALL_GATHER, gather),
        "reduce-scatter": ring(inside, REDUCE_SCATTER, num_params * reduce_bytes),
        "all-reduce": ring(cluster, ALL_REDUCE, num_params / g * reduce_bytes, 1),
    }


def step_totals(costs):
    """The step's collectives added up: bytes per GPU, NVLink, NIC, node; seconds.

    Collectives run one after another (as a step's do, unit by unit), so
    their times add; without overlap with compute this is the step's
    communication time.
    """
    costs = list(costs.values()) if isinstance(costs, dict) else list(costs)
    keys = ("gpu_bytes", "nvlink_bytes", "nic_bytes", "node_bytes", "seconds")
    return {key: sum(getattr(c, key) for c in costs) for key in keys}


def _check_params(num_params):
    if not num_params >= 0:
        raise ValueError(f"num_params must be >= 0, got {num_params!r}")
