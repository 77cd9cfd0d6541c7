"""The planner against published training runs: its figure beside theirs.

Each configuration is a run someone published with its settings and a
measured number; :func:`comparisons` plans the same run
(:func:`mylib.models.planner.plan`, or the planner's own pieces) and puts the
planner's figure beside the published one. The planner is never fitted to
the number it is compared with. Where a comparison needs the kernel
efficiency, it is taken from another row of the same source (the smaller
run), so what is checked is how the plan changes with the cluster. The
planner reduces gradients in bf16 (2 bytes a parameter); torchtitan and
MosaicML's ``amp_bf16`` runs reduce in fp32, 8 bytes a parameter on the wire
per FSDP micro-step where the planner counts 6, so the planner's
communication is, if anything, light for them.

* **ZeRO** (Rajbhandari et al., 2020, figure 1): model states per GPU for
  7.5B parameters on 64 GPUs with mixed-precision Adam.
* **torchtitan** (``benchmarks/llama3_h100_202412_torchtitan.md``, Tables 1
  and 3): Llama 3.1 8B with FSDP on 8 and 128 H100 ("Grand Teton": 8 GPUs on
  NVLink, 400 Gb/s per GPU), local batch 2, sequences of 8,192 (its
  ``train_configs/llama3_8b.toml`` at the commit the page names), selective
  activation checkpointing: memory and tokens per second per GPU.
* **MosaicML** (llm-foundry's ``scripts/train/benchmarking/README.md``): MPT
  models with FSDP ``FULL_SHARD`` on 128 and 512 H100, and on 32 and 128
  A100 40GB "with 1600 Gbps node-node interconnect (RoCE)", the same
  micro-batch at every GPU count, no accumulation: tokens per second per GPU.
  Shapes from its ``scripts/train/yamls/pretrain/mpt-*.yaml`` (MPT: a
  two-matrix MLP of 4 d, biases, learned positions, tied output layer; the
  counts are the table's ``NumParams`` exactly).
* **Llama 3 405B** (the Llama 3 paper): 15.6T tokens, "3.8 x 10^25 FLOPs";
  Table 4: 400 TFLOP/s per GPU on 16,384 H100; GPU hours from the Llama 3.1
  model card (``meta-llama/llama-models``, ``models/llama3_1/MODEL_CARD.md``).

Standard library only.
"""

from dataclasses import dataclass, replace

from mylib.models import transformer as tf
from mylib.models.cluster import dgx_a100, dgx_h100
from mylib.models.hardware import A100, H100, NodeType
from mylib.models.memory import GB, memory_per_rank
from mylib.models.planner import Training, plan

TARGET = 0.20  # the planner within 20% of the published figure, or explained
GIB = 2**30

GRAND_TETON = NodeType(
    "Grand Teton H100",
    replace(H100, name="H100 96GB HBM2e (500 W)", memory=96 * GB),
    dgx_h100,
    "torchtitan's benchmark hosts: 8 H100 on NVLink, 400 Gb/s RDMA per GPU",
)
MOSAIC_H100 = NodeType(
    "H100 node (network not stated)",
    H100,
    dgx_h100,
    "llm-foundry's H100 tables do not state the network: DGX H100 assumed",
)
MOSAIC_A100_40 = NodeType(
    "A100 40GB node, 1600 Gbps RoCE",
    replace(A100, name="A100 SXM 40GB", memory=40 * GB),
    dgx_a100,
    "8 A100 40GB, 1,600 Gb/s per node (8 x 200 Gb/s, as DGX A100)",
)


def mpt(name, layers, d_model, heads, seq=2048):
    """An MPT model of llm-foundry's yamls: vocabulary 50,368, expansion ratio 4."""
    return tf.Transformer(
        name,
        layers,
        d_model,
        heads,
        4 * d_model,
        50368,
        seq,
        gated_mlp=False,
        tied=True,
        biases=True,
        positions=seq,
    )


MPT_70B = mpt("MPT-70B", 80, 8192, 64)
MPT_7B = mpt("MPT-7B", 32, 4096, 32)
MPT_1B = mpt("MPT-1B", 24, 2048, 16)


@dataclass(frozen=True)
class Comparison:
    """One published number and the planner's figure for the same run."""

    run: str
    quantity: str
    published: float
    planner: float
    unit: str
    source: str
    note: str = ""
    efficiency: object = None  # the kernel efficiency fitted to the smaller run

    @property
    def error(self):
        """``(planner - published) / published``."""
        return (self.planner - self.published) / self.published

    @property
    def within_target(self):
        """Whether the planner lands within :data:`TARGET` of the published figure."""
        return abs(self.error) <= TARGET


def tokens_per_gpu_s(
    model, node, nodes, micro_batch, efficiency, checkpointing, strategy="ZeRO-3"
):
    """The planner's tokens per second per GPU for ``strategy``, no accumulation."""
    cluster = node.cluster(nodes)
    training = Training(
        global_batch_tokens=cluster.ranks * micro_batch * model.seq,
        micro_batch=micro_batch,
        checkpointing=checkpointing,
        efficiency=efficiency,
    )
    p = plan(model, node, nodes, training)
    return training.global_batch_tokens / p.costs[strategy].step_s / cluster.ranks


def fitted_efficiency(target, model, node, nodes, micro_batch, checkpointing, strategy):
    """The kernel efficiency at which the planner gives ``target`` tokens/s/GPU."""
    lo, hi = 0.01, 1.0
    for _ in range(40):  # tokens per second grow with the efficiency
        mid = (lo + hi) / 2
        got = tokens_per_gpu_s(
            model, node, nodes, micro_batch, mid, checkpointing, strategy
        )
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return (lo + hi) / 2


def scaling(run, model, node, small, large, settings, source, strategy="ZeRO-3"):
    """Tokens/s/GPU on ``large`` nodes, from the efficiency fitted on ``small``.

    ``settings``: ``(micro_batch, checkpointing)`` of both runs.
    """
    (n_small, tps_small), (n_large, tps_large) = small, large
    micro_batch, checkpointing = settings
    eff = fitted_efficiency(
        tps_small, model, node, n_small, micro_batch, checkpointing, strategy
    )
    got = tokens_per_gpu_s(
        model, node, n_large, micro_batch, eff, checkpointing, strategy
    )
    g = node.cluster(1).gpus_per_node
    return Comparison(
        f"{run}, {n_small * g} -> {n_large * g} GPUs",
        f"tokens/s per GPU on {n_large * g} GPUs",
        tps_large,
        got,
        "tokens/s",
        source,
        f"kernel efficiency {eff:.1%} fitted to the {n_small * g}-GPU row "
        f"({tps_small:,} tokens/s per GPU); {node.about}",
        eff,
    )


def zero_paper():
    """ZeRO's figure 1: 7.5B parameters, 64 GPUs, K = 12, 2-byte parameters/grads."""
    published = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    names = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    return [
        Comparison(
            "ZeRO paper, 7.5B on 64 GPUs",
            f"{names[stage]} model states per GPU",
            gbs,
            memory_per_rank(7.5e9, 64, stage).total / GB,
            "GB",
            "Rajbhandari et al. (2020), figure 1",
            "the paper rounds 1.875 GB to 1.9" if stage == 3 else "",
        )
        for stage, gbs in published.items()
    ]


def torchtitan_memory():
    """torchtitan's Llama 3.1 8B: what 16 times the GPUs take off each GPU's memory."""
    m = tf.MODELS["Llama 3 8B"]
    totals = []
    for nodes in (1, 16):
        training = Training(global_batch_tokens=nodes * 8 * 2 * m.seq, micro_batch=2)
        p = plan(m, GRAND_TETON, nodes, training)
        totals.append(p.values["mem.ZeRO-3.total"].value)
    return Comparison(
        "torchtitan, Llama 3.1 8B, FSDP, 8 -> 128 H100",
        "memory saved per GPU (82.4 -> 67.0 GiB)",
        82.4 - 67.0,
        (totals[0] - totals[1]) / GIB,
        "GiB",
        "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3",
        "only the sharded state changes, 16 bytes x 8.03 B parameters x (1/8 - "
        "1/128); the rest of the gap is the allocator's (torchtitan reports peak "
        "reserved memory)",
    )


def llama3_compute():
    """Llama 3 405B's pre-training: FLOPs and GPU hours at the paper's throughput."""
    m = tf.MODELS["Llama 3 405B"]
    flops = tf.model_flops_per_token(m) * 15.6e12
    return [
        Comparison(
            "Llama 3 405B pre-training, 15.6T tokens",
            "training FLOPs",
            3.8e25,
            flops,
            "FLOP",
            "the Llama 3 paper (section 3)",
            "the paper's figure is 6 N D (6 x 405B x 15.6T = 3.8e25); the planner "
            "adds attention's 12 L h s per token at 8,192 tokens (+8%)",
        ),
        Comparison(
            "Llama 3 405B pre-training, 15.6T tokens",
            "H100 GPU hours at 400 TFLOP/s per GPU",
            30.84e6,
            flops / 400e12 / 3600,
            "GPU hours",
            "Llama 3 paper Table 4 (400 TFLOP/s/GPU on 16,384 H100); "
            "Llama 3.1 model card (30.84M GPU hours)",
            "the model card counts all of the 405B's training, long-context "
            "stages and restarts included; the planner counts the 8K stage's "
            "throughput over all tokens",
        ),
    ]


def comparisons():
    """Every comparison, as :class:`Comparison` rows."""
    mosaic = "llm-foundry scripts/train/benchmarking/README.md"
    return (
        zero_paper()
        + [torchtitan_memory()]
        + [
            scaling(
                "torchtitan, Llama 3.1 8B, FSDP",
                tf.MODELS["Llama 3 8B"],
                GRAND_TETON,
                (1, 5762),
                (16, 5605),
                (2, False),
                "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, "
                "Tables 1 and 3 (FSDP rows)",
            ),
            scaling(
                "MosaicML, MPT-70B, FULL_SHARD",
                MPT_70B,
                MOSAIC_H100,
                (16, 1058),
                (64, 1007),
                (8, True),
                mosaic + ", H100 80GB BF16 (Large Scale)",
            ),
            scaling(
                "MosaicML, MPT-1B, SHARD_GRAD_OP",
                MPT_1B,
                MOSAIC_H100,
                (16, 44123),
                (64, 39837),
                (12, False),
                mosaic + ", H100 80GB BF16 (Large Scale)",
                "ZeRO-2",
            ),
            scaling(
                "MosaicML, MPT-7B, FULL_SHARD",
                MPT_7B,
                MOSAIC_A100_40,
                (4, 3725),
                (16, 3623),
                (18, True),
                mosaic + ", A100 40GB with 1600 Gbps node-node interconnect (RoCE)",
            ),
        ]
        + llama3_compute()
    )
