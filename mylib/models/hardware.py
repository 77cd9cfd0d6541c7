"""The machines a plan runs on: a GPU's memory and peak, and the nodes it sits in.

The cluster model (:mod:`mylib.models.cluster`) knows the links: NVLink
inside a node, the NICs out of it. A plan also needs what one GPU holds and
computes. Both come from the vendor's datasheet:

* **H100 SXM** (NVIDIA H100 Tensor Core GPU datasheet): 80 GB of HBM3;
  BF16 Tensor Core "1,979 teraFLOPS", a figure "shown with sparsity",
  "specifications 1/2 lower without sparsity": 989.4 TFLOP/s dense; FP32
  67 TFLOP/s.
* **H200 SXM** (NVIDIA H200 datasheet): the same GPU with 141 GB of HBM3e;
  the same 1,979 (sparse) BF16 and 67 FP32 TFLOP/s.
* **A100 SXM 80GB** (NVIDIA A100 datasheet): BF16 312 TFLOP/s dense (624 with
  sparsity), FP32 19.5 TFLOP/s.

torchtitan's ``get_peak_flops`` uses the same dense BF16 peaks (989e12 for
H100 SXM and H200, 312e12 for A100). A node preset pairs a GPU with the
cluster model's node: DGX A100 and DGX H100 (as :mod:`mylib.models.cluster`
builds them), DGX H200 (NVIDIA's DGX BasePOD reference architecture, "Core
Components": eight H200, 1,128 GB of GPU memory in all, "eight single-port
NVIDIA ConnectX-7 VPI, ... up to 400 Gb/s", the same network as DGX H100),
and nodes of eight H100 with one or two 400 Gb/s NICs, the shape of many
cloud instances (a generic node, not any provider's product).

Standard library only: the planner runs in the reader's browser.
"""

from dataclasses import dataclass

from mylib.models.cluster import (
    Cluster,
    dgx_a100,
    dgx_h100,
    nic_each_way,
    nvlink_each_way,
    one_nic_nodes,
)

GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True)
class GPU:
    """One GPU: its memory (bytes) and peak dense FLOP/s in bf16 and in fp32."""

    name: str
    memory: float
    bf16_flops: float
    fp32_flops: float
    source: str

    def peak_flops(self, precision):
        """Dense peak for ``precision`` (``"bf16"``, mixed precision, or ``"fp32"``)."""
        if precision not in ("bf16", "fp32"):
            raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
        return self.bf16_flops if precision == "bf16" else self.fp32_flops


H100 = GPU(
    "H100 SXM 80GB",
    80 * GB,
    1979 / 2 * TFLOPS,
    67 * TFLOPS,
    "NVIDIA H100 datasheet: 80 GB; BF16 1,979 TFLOP/s with sparsity (half dense); "
    "FP32 67 TFLOP/s",
)
H200 = GPU(
    "H200 SXM 141GB",
    141 * GB,
    1979 / 2 * TFLOPS,
    67 * TFLOPS,
    "NVIDIA H200 datasheet: 141 GB HBM3e; BF16 1,979 TFLOP/s with sparsity "
    "(half dense); FP32 67 TFLOP/s",
)
A100 = GPU(
    "A100 SXM 80GB",
    80 * GB,
    312 * TFLOPS,
    19.5 * TFLOPS,
    "NVIDIA A100 datasheet: 80 GB; BF16 312 TFLOP/s dense (624 with sparsity); "
    "FP32 19.5 TFLOP/s",
)


def dgx_h200(nodes=1):
    """NVIDIA DGX H200: 8 H200 on NVSwitch (18 NVLinks each), 8 x 400 Gb/s NDR."""
    return Cluster("DGX H200", nodes, 8, nvlink_each_way(18), 8, nic_each_way(400))


def two_nic_nodes(nodes=1, gbit_s=400):
    """8 H100 on NVSwitch with two NICs for the whole node (``gbit_s`` each)."""
    return Cluster(
        f"8 GPUs, 2 x {gbit_s} Gb/s",
        nodes,
        8,
        nvlink_each_way(18),
        2,
        nic_each_way(gbit_s),
    )


@dataclass(frozen=True)
class NodeType:
    """A node preset: its GPU, and the cluster model's node as of any count."""

    name: str
    gpu: GPU
    make: object  # nodes -> Cluster
    about: str

    def cluster(self, nodes):
        """The cluster of ``nodes`` such nodes."""
        return self.make(nodes)


#: The planner's node menu.
NODES = {
    "DGX H100": NodeType(
        "DGX H100", H100, dgx_h100, "8 H100 on NVSwitch, 8 x 400 Gb/s NDR NICs"
    ),
    "DGX H200": NodeType(
        "DGX H200", H200, dgx_h200, "8 H200 on NVSwitch, 8 x 400 Gb/s NDR NICs"
    ),
    "DGX A100": NodeType(
        "DGX A100", A100, dgx_a100, "8 A100 on NVSwitch, 8 x 200 Gb/s HDR NICs"
    ),
    "cloud, 1 NIC": NodeType(
        "cloud, 1 NIC", H100, one_nic_nodes, "8 H100 on NVSwitch, one 400 Gb/s NIC"
    ),
    "cloud, 2 NICs": NodeType(
        "cloud, 2 NICs", H100, two_nic_nodes, "8 H100 on NVSwitch, two 400 Gb/s NICs"
    ),
}
