"""Published NCCL measurements, and what the cluster model predicts for each.

Every row is an all-reduce bus bandwidth at large sizes (nccl-tests'
``all_reduce_perf``), read in a public thread of NVIDIA's ``nccl`` or
``nccl-tests`` repositories: by NVIDIA's engineers or by users, the hardware
as they describe it. ``kind`` says which of two things a row is: a run
someone reports (``"measured"``) or what an NVIDIA engineer says a setup
should reach (``"expected"``). ``stated`` is False where the thread does not
say which algorithm ran; the model then prices the row as a ring. The
model's parameters are the vendors' numbers (:mod:`mylib.models.cluster`:
line rates, NVLink's payload share), never fitted to these rows. ``matches``
says whether the model is meant to hit the row (within :data:`TARGET`);
where it is not, ``why`` says why.

Standard library only.
"""

from dataclasses import dataclass

from mylib.models.cluster import (
    ALL_REDUCE,
    GB,
    Cluster,
    dgx_a100,
    dgx_h100,
    nic_each_way,
    nvlink_each_way,
    ring,
    tree_all_reduce,
)

#: How close a bandwidth prediction must come: 15% of the measurement.
TARGET = 0.15
#: What a row is: a reported run, or an NVIDIA engineer's figure for a setup.
KINDS = ("measured", "expected")


@dataclass(frozen=True)
class Measurement:
    """One published bus bandwidth, its source, and the cluster it ran on."""

    source: str  # "NVIDIA/nccl#812"
    who: str  # "NVIDIA engineer" or "user"
    hardware: str
    cluster: Cluster
    algorithm: str  # "ring", "tree" or "nvls"
    measured: float  # busbw, bytes/s
    says: str  # what the thread says, in a few words
    kind: str = "measured"  # or "expected": an engineer's figure for a setup
    stated: bool = True  # False: the thread does not say which algorithm ran
    matches: bool = True
    why: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def url(self):
        """The thread's address on GitHub."""
        repo, number = self.source.split("#")
        return f"https://github.com/{repo}/issues/{number}"

    @property
    def predicted(self):
        """The model's bus bandwidth for this row (bytes/s), large-size limit.

        NVLS is not in the model: its row gets the ring's, the best that
        point-to-point sends can show.
        """
        size = 8 * 2**30
        if self.algorithm == "tree":
            return tree_all_reduce(self.cluster, size).peak_busbw
        return ring(self.cluster, ALL_REDUCE, size).peak_busbw

    @property
    def tree_predicted(self):
        """The model's tree bus bandwidth (bytes/s): the other guess, unstated rows."""
        return tree_all_reduce(self.cluster, 8 * 2**30).peak_busbw

    @property
    def error(self):
        """``(predicted - measured) / measured``."""
        return (self.predicted - self.measured) / self.measured


def _nodes(name, nodes, gpus, nvlinks, nics, gbit_s):
    return Cluster(
        name, nodes, gpus, nvlink_each_way(nvlinks), nics, nic_each_way(gbit_s)
    )


TREE_WHY = (
    "NCCL's own tuner expects less of a tree channel than its bytes allow (the "
    "caps perChMaxTreeBws in its tuning.cc), and on H100 a maintainer notes that a "
    "tree needs more SMs than NCCL's default to reach its peak (NVIDIA/nccl#1649). "
    "The model counts bytes only."
)

MEASUREMENTS = (
    Measurement(
        "NVIDIA/nccl#812",
        "NVIDIA engineer",
        "DGX A100 nodes: 8 A100 on NVSwitch, 8 x 200 Gb/s HDR InfiniBand",
        dgx_a100(4),
        "ring",
        192 * GB,
        "we measure 192 GB/s all-reduce busbw across DGX A100 nodes",
        kind="measured",
    ),
    Measurement(
        "NVIDIA/nccl#412",
        "NVIDIA engineer",
        "12 nodes of 8 A800 (NVLink, about 160 GB/s in the node), "
        "one 200 Gb/s HDR NIC each",
        _nodes("8 A800, 1 x HDR", 12, 8, 8, 1, 200),
        "ring",
        24 * GB,
        "you should get ~24 GB/s across nodes with one HDR NIC at 8 GB",
        kind="expected",
    ),
    Measurement(
        "NVIDIA/nccl-tests#119",
        "NVIDIA engineer and user",
        "3 nodes of 8 A100 SXM4, 4 x 200 Gb/s HDR InfiniBand each",
        _nodes("8 A100, 4 x HDR", 3, 8, 12, 4, 200),
        "ring",
        96 * GB,
        "the user's run peaks at about 96 GB/s; an engineer: 24 GB/s per 200G "
        "NIC is the peak, so 96 GB/s is the target",
        kind="measured",
    ),
    Measurement(
        "NVIDIA/nccl-tests#100",
        "user",
        "2 HGX A100 nodes (8 A100 SXM 80GB), 4 x 200 Gb/s ConnectX-6 each",
        _nodes("HGX A100, 4 x HDR", 2, 8, 12, 4, 200),
        "ring",
        91 * GB,
        "reaches 91 GB/s busbw between the two nodes (algorithm not stated; "
        "on two nodes NCCL often picks the tree)",
        kind="measured",
        stated=False,
    ),
    Measurement(
        "NVIDIA/nccl#307",
        "NVIDIA engineer",
        "DGX-1 nodes: 8 V100, hybrid cube-mesh NVLink, 4 x 100 Gb/s EDR "
        "InfiniBand (NVIDIA's DGX-1 with V100 white paper)",
        _nodes("DGX-1", 4, 8, 6, 4, 100),
        "ring",
        47 * GB,
        "always gets 47 GB/s with rings on DGX-1 nodes; about 12 GB/s per NIC",
        kind="measured",
    ),
    Measurement(
        "NVIDIA/nccl-tests#267",
        "NVIDIA engineer",
        "H100 nodes, ConnectX-7 NICs at 400 Gb/s NDR; one NIC's share",
        _nodes("H100, 1 NIC used", 6, 8, 18, 1, 400),
        "ring",
        48.5 * GB,
        "a CX-7 at NDR should achieve up to 48-49 GB/s per NIC",
        kind="expected",
    ),
    Measurement(
        "NVIDIA/nccl-tests#319",
        "NVIDIA engineer",
        "HGX H100 nodes, 8 x 400 Gb/s ConnectX-7 each",
        dgx_h100(4),
        "ring",
        396 * GB,
        "should achieve about 48 GB/s per NIC, up to ~396 GB/s with the ring",
        kind="expected",
    ),
    Measurement(
        "NVIDIA/nccl#1368",
        "user",
        "5 nodes of 8 H100, 4 x 400 Gb/s RoCE each",
        _nodes("8 H100, 4 x 400G", 5, 8, 18, 4, 400),
        "ring",
        190 * GB,
        "ring busbw 190 GB/s on 40 GPUs",
        kind="measured",
    ),
    Measurement(
        "NVIDIA/nccl-tests#309",
        "user",
        "4 HGX H100 nodes (Dell XE9680), 8 x 400 Gb/s ConnectX-7 InfiniBand each",
        dgx_h100(4),
        "ring",
        365.84 * GB,
        "4 nodes, 32 GPU-NIC pairs: max busbw 365.84 GB/s (NCCL 2.26, its "
        "default algorithm)",
        kind="measured",
        stated=False,
    ),
    Measurement(
        "NVIDIA/nccl-tests#149",
        "NVIDIA engineer",
        "one node of 8 A100 on NVSwitch (12 NVLinks each)",
        dgx_a100(1),
        "ring",
        230 * GB,
        "12 links at ~20 GB/s effective: 240 GB/s; should reach ~230 GB/s",
        kind="expected",
    ),
    Measurement(
        "NVIDIA/nccl#1048",
        "user",
        "one node of 8 A100 (with 4 x 200 Gb/s NICs, unused in the node)",
        dgx_a100(1),
        "ring",
        232.54 * GB,
        "single-node all-reduce: 232.54 GB/s",
        kind="measured",
    ),
    Measurement(
        "NVIDIA/nccl-tests#212",
        "NVIDIA engineer",
        "one node of 8 H100 SXM on NVSwitch (18 NVLinks each), NCCL_ALGO=RING",
        dgx_h100(1),
        "ring",
        370 * GB,
        "450 GB/s line rate, ~20% protocol overhead: NCCL can get 370 GB/s with rings",
        kind="expected",
    ),
    Measurement(
        "NVIDIA/nccl-tests#212",
        "NVIDIA engineer",
        "one node of 8 H100 SXM, NVLink SHARP (NCCL's default there)",
        dgx_h100(1),
        "nvls",
        480 * GB,
        "you should reach a peak busbw of ~480 GB/s (algbw ~275 GB/s) with "
        "NVLink SHARP",
        kind="expected",
        matches=False,
        why="The NVSwitch adds the data (NVLS): each GPU sends its buffer in "
        "once and reads the sum once, so no point-to-point algorithm, which "
        "is all the model prices, can match it. nccl-tests still multiplies "
        "by 2(n-1)/n, so the bus bandwidth exceeds NVLink's own rate.",
    ),
    Measurement(
        "NVIDIA/nccl#837",
        "user, explained by an NVIDIA engineer",
        "2 nodes of 8 A100 80GB, 2 x 200 Gb/s InfiniBand each",
        _nodes("8 A100, 2 x HDR", 2, 8, 12, 2, 200),
        "tree",
        57.06 * GB,
        "57 GB/s on 2 nodes with NCCL 2.10: above the 50 GB/s of two NICs, "
        "as the tree can on 2 nodes",
        kind="measured",
        matches=False,
        why="Above the ring's bound, as the model says a tree on 2 nodes can "
        "be, but at 61% of the tree's byte bound. " + TREE_WHY,
    ),
    Measurement(
        "NVIDIA/nccl#1368",
        "user",
        "5 nodes of 8 H100, 4 x 400 Gb/s RoCE each",
        _nodes("8 H100, 4 x 400G", 5, 8, 18, 4, 400),
        "tree",
        150 * GB,
        "tree busbw 150 GB/s, below the ring's 190 GB/s",
        kind="measured",
        matches=False,
        why="Below the ring, as the model says a tree on 3 nodes or more is, "
        "but further below its byte bound. " + TREE_WHY,
    ),
)


def comparison_rows():
    """The table: one dict per measurement, the model's prediction and error."""
    return [
        {
            "source": m.source,
            "url": m.url,
            "who": m.who,
            "hardware": m.hardware,
            "algorithm": m.algorithm,
            "ranks": m.cluster.ranks,
            "nodes": m.cluster.nodes,
            "measured_gb_s": m.measured / GB,
            "predicted_gb_s": m.predicted / GB,
            "error": m.error,
            "kind": m.kind,
            "stated": m.stated,
            "tree_gb_s": m.tree_predicted / GB,
            "matches": m.matches,
            "says": m.says,
            "why": m.why,
        }
        for m in MEASUREMENTS
    ]
