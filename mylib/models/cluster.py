"""The cluster a reader trains on: nodes of GPUs, NVLink inside, NICs out.

Chapter 1 prices a ring all-reduce on one link. A real cluster has two: inside
a node, every GPU reaches the others over NVLink (through NVSwitch chips);
between nodes, traffic leaves through the node's network adapters (NICs), of
which a node may have one per GPU (a DGX) or one for all of them. This module
prices the collectives data parallelism uses on that topology, the way NCCL
lays them out:

* **ring** (:func:`ring`): one flat ring over every rank, ordered by topology
  so that it enters and leaves each node once. NCCL runs several such rings
  at once (channels), about one per NIC, each a different GPU's exit, so a
  node's traffic spreads over all its NICs. Per node, a ring all-reduce of
  ``b`` bytes sends ``2 (n-1)/n b`` into the network, whatever the GPUs per
  node: the node behaves like one rank whose link is all its NICs together;
* **tree** (:func:`tree_all_reduce`): NCCL's double binary tree. Inside a
  node the GPUs form a chain; across nodes two binary trees, each carrying
  half the data, complementary so that a node that is a leaf in one is inner
  in the other. On 2 nodes each node sends ``b`` into the network instead of
  a ring's ``2 (n-1)/n b``, so the tree beats the ring there;
* **hierarchical** (:func:`hierarchical_all_reduce`): reduce-scatter inside
  the node, all-reduce across nodes between the GPUs that hold the same
  shard (one per node, each through its own NIC), all-gather inside. It is
  what HSDP does to gradients (chapter 6).

Every result is a :class:`Cost`: the seconds, the two bandwidths nccl-tests
prints (``algbw = S / t`` and ``busbw = algbw`` times the collective's
factor, ``2 (n-1)/n`` for an all-reduce: :func:`bus_factor`), and the bytes
each GPU, each NIC and each node sends. Time is latency plus the busiest
resource's bytes over its rate: NVLink per GPU, or the NICs per node (both
directions work at once; every rate here is one direction's).

Not in numbers: NVLink SHARP (NVLS) and InfiniBand SHARP (CollNet), where the
switches add. The NVSwitch of an H100 node reduces the GPUs' data in the
switch, so each GPU sends its data in once and reads the sum once; nccl-tests
still multiplies by ``2 (n-1)/n``, so an NVLS all-reduce reports a bus
bandwidth above NVLink's rate (the published table shows one).

Standard library only: the book's figures run it in the browser, and the
planner of "Plan your run" calls it.
"""

import functools
import math
from dataclasses import dataclass, replace

from mylib.models.double_tree import tree_node_sends

GB = 1e9

# -- what the hardware carries, one direction, from the vendors' numbers ------

#: One NVLink's line rate each way: 25 GB/s for NVLink 2, 3 and 4 (NVIDIA's
#: A100 and H100 pages count 12 and 18 links as "600" and "900 GB/s"
#: bidirectional per GPU).
NVLINK_LINK_EACH_WAY = 25 * GB
#: Of that line rate, GPUs' SMs carry about 80%: they write 128-byte payloads,
#: and each packet's header takes the rest (an NVIDIA engineer on
#: NVIDIA/nccl-tests#149: "25GB/s ... converts to ~20GB/s effective
#: bandwidth with a 128B payload size"; #212: "protocol overhead (~20%)").
NVLINK_PAYLOAD_SHARE = 0.8


def nvlink_each_way(links):
    """What ``links`` NVLinks carry each way for NCCL: line rate x payload share."""
    return links * NVLINK_LINK_EACH_WAY * NVLINK_PAYLOAD_SHARE


def nic_each_way(gbit_s):
    """A NIC's rate each way in bytes/s from its rated speed (400 for NDR)."""
    return gbit_s * 1e9 / 8


#: The book's round figure for one step of a ring, on either link. NCCL's own
#: tuner charges 0.6 to 4 µs per NVLink step and 2.7 to 14 µs per network step,
#: by protocol (``hwLatencies`` in NCCL's ``src/graph/tuning.cc``).
STEP_LATENCY_S = 5e-6


@dataclass(frozen=True)
class Cluster:
    """Nodes of GPUs: NVLink inside (per GPU), NICs between nodes (per node).

    ``nvlink_bw`` is what one GPU can send over NVLink, bytes/s each way;
    ``nic_bw`` what one NIC can send, bytes/s each way; latencies are per
    ring step. A node with one GPU has no NVLink traffic.
    """

    name: str
    nodes: int
    gpus_per_node: int
    nvlink_bw: float
    nics_per_node: int
    nic_bw: float
    nvlink_latency_s: float = STEP_LATENCY_S
    nic_latency_s: float = STEP_LATENCY_S

    def __post_init__(self):
        for field in ("nodes", "gpus_per_node", "nics_per_node"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if not (self.nvlink_bw > 0 and self.nic_bw > 0):
            raise ValueError(
                "nvlink_bw and nic_bw are bytes/s each way and must be > 0, "
                f"got {self.nvlink_bw} and {self.nic_bw}"
            )
        if self.nvlink_latency_s < 0 or self.nic_latency_s < 0:
            raise ValueError("latencies are seconds per ring step, >= 0")

    @property
    def ranks(self):
        """All the GPUs: ``nodes x gpus_per_node``."""
        return self.nodes * self.gpus_per_node

    @property
    def node_nic_bw(self):
        """A node's NICs together, bytes/s each way."""
        return self.nics_per_node * self.nic_bw

    def with_nodes(self, nodes):
        """The same nodes, ``nodes`` of them."""
        return replace(self, nodes=nodes)

    def for_ranks(self, ranks):
        """The cluster that ``ranks`` GPUs fill: whole nodes, or part of one.

        Fewer ranks than a node's GPUs sit in one node (NVLink only);
        otherwise ``ranks`` must fill whole nodes.
        """
        g = self.gpus_per_node
        if not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
        if ranks < g:
            return replace(self, nodes=1, gpus_per_node=ranks)
        if ranks % g:
            raise ValueError(f"{ranks} ranks do not fill nodes of {g} GPUs")
        return replace(self, nodes=ranks // g)


def dgx_a100(nodes=1):
    """NVIDIA DGX A100: 8 A100 on NVSwitch (12 NVLinks each), 8 x 200 Gb/s HDR."""
    return Cluster("DGX A100", nodes, 8, nvlink_each_way(12), 8, nic_each_way(200))


def dgx_h100(nodes=1):
    """NVIDIA DGX H100: 8 H100 on NVSwitch (18 NVLinks each), 8 x 400 Gb/s NDR."""
    return Cluster("DGX H100", nodes, 8, nvlink_each_way(18), 8, nic_each_way(400))


def one_nic_nodes(nodes=1, gbit_s=400, links=18):
    """8 GPUs on NVSwitch with one NIC for the whole node (``gbit_s`` Gb/s)."""
    return Cluster(
        f"8 GPUs, 1 x {gbit_s} Gb/s",
        nodes,
        8,
        nvlink_each_way(links),
        1,
        nic_each_way(gbit_s),
    )


#: The presets by name, each a function of the node count (the planner's menu).
PRESETS = {
    "DGX A100": dgx_a100,
    "DGX H100": dgx_h100,
    "8 GPUs, 1 x 400 Gb/s": one_nic_nodes,
}


# -- what a collective costs ---------------------------------------------------

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all-reduce", "reduce-scatter", "all-gather"
_PASSES = {ALL_REDUCE: 2, REDUCE_SCATTER: 1, ALL_GATHER: 1}


def bus_factor(op, ranks):
    """nccl-tests' busbw / algbw: ``2(n-1)/n`` for an all-reduce, ``(n-1)/n`` else.

    From nccl-tests' ``doc/PERFORMANCE.md``; the same whatever the algorithm.
    """
    _check_op(op)
    return _PASSES[op] * (ranks - 1) / ranks


@dataclass(frozen=True)
class Cost:
    """One collective on a cluster: its time, bandwidths and bytes.

    ``nbytes`` is nccl-tests' size S (an all-reduce's buffer, a
    reduce-scatter's input, an all-gather's output). Bytes sent, one
    direction: ``gpu_bytes`` by each GPU over all its links,
    ``nvlink_bytes`` by the busiest GPU over NVLink, ``nic_bytes`` by the
    busiest NIC, ``node_bytes`` by each node into the network.
    """

    op: str
    algorithm: str
    ranks: int
    nodes: int
    nbytes: float
    latency_s: float
    bandwidth_s: float
    gpu_bytes: float
    nvlink_bytes: float
    nic_bytes: float
    node_bytes: float
    bottleneck: str

    @property
    def seconds(self):
        """Latency plus the busiest resource's bytes over its rate."""
        return self.latency_s + self.bandwidth_s

    @property
    def algbw(self):
        """nccl-tests' algorithm bandwidth, ``S / t`` (bytes/s)."""
        return self.nbytes / self.seconds if self.seconds else math.inf

    @property
    def busbw(self):
        """nccl-tests' bus bandwidth, ``algbw x bus_factor``."""
        return self.algbw * bus_factor(self.op, self.ranks)

    @property
    def peak_busbw(self):
        """The bus bandwidth without latency: what nccl-tests shows at large sizes."""
        if not self.bandwidth_s:
            return math.inf
        return self.nbytes / self.bandwidth_s * bus_factor(self.op, self.ranks)


def _cost(cluster, op, algorithm, nbytes, latency_s, nvlink, nic, gpu, node):
    """A :class:`Cost`; the NVLink and NIC bytes decide the bandwidth time."""
    times = {"nvlink": nvlink / cluster.nvlink_bw, "nic": nic / cluster.nic_bw}
    bottleneck = max(times, key=times.get) if max(times.values()) > 0 else "none"
    return Cost(
        op,
        algorithm,
        cluster.ranks,
        cluster.nodes,
        nbytes,
        latency_s,
        max(times.values()),
        gpu,
        nvlink,
        nic,
        node,
        bottleneck,
    )


def ring(cluster, op, nbytes, gpus_per_group=None):
    """A ring collective of ``nbytes`` over groups laid on ``cluster``.

    By default one group of every GPU. ``gpus_per_group`` GPUs of each node
    (a divisor of ``gpus_per_node``) make one group spanning every node, and
    ``gpus_per_node / gpus_per_group`` such groups run at once, sharing the
    NICs: with 1 they are the replica groups of HSDP or of data parallelism
    beside tensor parallelism, GPU r of every node together.

    Each rank sends ``passes x (n-1)/n x S`` (2 passes for an all-reduce).
    Inside a node a ring hop is NVLink; per channel one GPU per node sends
    across, so each node sends one rank's bytes into the network, spread
    over its NICs. Latency: NCCL counts ``passes (n - N)`` NVLink steps and
    ``passes (N - 1)`` network steps (``tuning.cc``), N nodes.
    """
    _check_op(op)
    _check_bytes(nbytes)
    g, nodes = cluster.gpus_per_node, cluster.nodes
    p = g if gpus_per_group is None else gpus_per_group
    if not isinstance(p, int) or p < 1 or g % p:
        raise ValueError(f"gpus_per_group must divide {g}, got {gpus_per_group!r}")
    n, passes = nodes * p, _PASSES[op]
    group = replace(cluster, gpus_per_node=p)
    gpu = passes * (n - 1) / n * nbytes
    if nodes == 1:
        nvlink, node = gpu, 0.0
    else:  # one exit per node and channel; g / p groups share the node's NICs
        nvlink, node = gpu * (p - 1) / p, gpu * (g // p)
    nic = node / cluster.nics_per_node
    latency = passes * (
        (n - nodes) * cluster.nvlink_latency_s + (nodes - 1) * cluster.nic_latency_s
    )
    return _cost(group, op, "ring", nbytes, latency, nvlink, nic, gpu, node)


# Remembered: a figure asks again for every rank count at each redraw (chapter 7's
# scan for the communication-bound point); clusters are frozen, results floats.
@functools.lru_cache(maxsize=4096, typed=True)
def ring_alpha_beta(cluster, ranks):
    """The chapter-1 ring that prices an all-reduce on ``ranks`` GPUs of ``cluster``.

    Returns ``(alpha_s, beta)`` such that ``2(n-1) alpha + 2(n-1)/n b / beta``
    is :func:`ring`'s time for ``b`` bytes on ``cluster.for_ranks(ranks)``:
    ``beta`` is the ring's bus bandwidth without latency (the node's NICs
    together, or NVLink's ``g/(g-1)`` times its rate, whichever is lower),
    ``alpha`` its latency per step, averaged over NVLink and network steps.
    Every model that takes a flat link can run on the cluster this way.
    """
    laid = cluster.for_ranks(ranks)
    if ranks == 1:
        return 0.0, laid.nvlink_bw
    cost = ring(laid, ALL_REDUCE, 1.0)
    return cost.latency_s / (2 * (ranks - 1)), cost.peak_busbw


def tree_all_reduce(cluster, nbytes):
    """NCCL's tree all-reduce of ``nbytes`` over every GPU of ``cluster``.

    Reduce up, then broadcast down, pipelined. Inside a node a chain: every
    GPU but one forwards the data up and every GPU but one forwards it down,
    ``2 (g-1)/g S`` per GPU on average. Across nodes the double binary tree
    of :func:`tree_node_sends`. Latency: ``2 ((g-1) + ceil(log2 N))`` steps.
    """
    _check_bytes(nbytes)
    g, nodes = cluster.gpus_per_node, cluster.nodes
    nvlink = 2 * (g - 1) / g * nbytes
    node = max(tree_node_sends(nodes)) * nbytes
    nic = node / cluster.nics_per_node
    gpu = nvlink + node / g
    levels = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    latency = 2 * ((g - 1) * cluster.nvlink_latency_s + levels * cluster.nic_latency_s)
    return _cost(cluster, ALL_REDUCE, "tree", nbytes, latency, nvlink, nic, gpu, node)


def hierarchical_all_reduce(cluster, nbytes):
    """Reduce-scatter in each node, all-reduce across, all-gather in each node.

    The three steps run one after another (as HSDP runs them), so their
    times add. The middle all-reduce is ``g`` rings of one GPU per node, each
    over ``S / g`` bytes, all at once on the node's NICs.
    """
    _check_bytes(nbytes)
    inside = cluster.with_nodes(1)
    rs = ring(inside, REDUCE_SCATTER, nbytes)
    ag = ring(inside, ALL_GATHER, nbytes)
    across = ring(cluster, ALL_REDUCE, nbytes / cluster.gpus_per_node, 1)
    parts = (rs, across, ag)
    total = _cost(
        cluster,
        ALL_REDUCE,
        "hierarchical",
        nbytes,
        sum(c.latency_s for c in parts),
        sum(c.nvlink_bytes for c in parts),
        across.nic_bytes,
        sum(c.gpu_bytes for c in parts),
        across.node_bytes,
    )
    return replace(total, bandwidth_s=sum(c.bandwidth_s for c in parts))


def _check_op(op):
    if op not in _PASSES:
        raise ValueError(f"op must be one of {sorted(_PASSES)}, got {op!r}")


def _check_bytes(nbytes):
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
