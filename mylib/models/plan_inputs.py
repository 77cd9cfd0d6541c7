"""The planner's inputs, as every front end offers them: one list, one parser.

The page's form, the Jupyter widget and ``python -m mylib.plan`` all take
the :data:`FIELDS` below, with these defaults, and turn what the reader
entered into a plan with :func:`run`; so the three cannot disagree. A value
no run can have raises :class:`~mylib.models.planner.PlanError`, whose
message names the field and the fix.

Standard library only: the page parses its form in the reader's browser.
"""

from dataclasses import dataclass

from mylib.models import nccl_tests
from mylib.models.cluster import (
    NVLINK_PAYLOAD_SHARE,
    Cluster,
    nic_each_way,
)
from mylib.models.hardware import GPU, NODES, NodeType
from mylib.models.planner import PlanError, Training, plan
from mylib.models.transformer import MODELS, Transformer

MTOKENS = 2**20  # "4M tokens" in the Llama 3 paper: 1,024 sequences of 4,096


@dataclass(frozen=True)
class Field:
    """One input: its name, label, kind and default, and its allowed values.

    ``kind`` is ``"choice"`` (``options``: ``(label, value)`` pairs), ``"int"``,
    ``"float"``, ``"bool"`` or ``"text"``; ``group`` is where a form shows it.
    """

    name: str
    label: str
    kind: str
    default: object
    group: str
    options: tuple = ()
    minimum: object = None
    maximum: object = None
    step: object = None

    @property
    def flag(self):
        """The terminal's option: ``--global-batch-mtokens``."""
        return "--" + self.name.replace("_", "-")


def _custom(name, label, default):
    return Field(name, label, "int", default, "custom shapes", minimum=1)


def _node(name, label, kind, default):
    return Field(name, label, kind, default, "custom node", minimum=1)


FIELDS = (
    Field(
        "model",
        "model",
        "choice",
        "Llama 3 70B",
        "model",
        tuple((k, k) for k in MODELS) + (("custom (the shapes below)", "custom"),),
    ),
    Field("seq", "sequence length (0: the model's)", "int", 0, "model", minimum=0),
    _custom("layers", "layers", 80),
    _custom("hidden", "hidden size", 8192),
    _custom("heads", "attention heads", 64),
    _custom("kv_heads", "key/value heads", 8),
    _custom("ffn", "FFN size (gated MLP)", 28672),
    _custom("vocab", "vocabulary", 128256),
    Field(
        "node",
        "nodes of",
        "choice",
        "DGX H100",
        "cluster",
        tuple((f"{k} ({v.about})", k) for k, v in NODES.items())
        + (("custom (the node below)", "custom"),),
    ),
    Field("nodes", "number of nodes", "int", 8, "cluster", minimum=1, maximum=65536),
    _node("gpus_per_node", "GPUs a node", "int", 8),
    _node("nvlink_gb_s", "NVLink a GPU (GB/s each way, the vendor's)", "float", 450.0),
    _node("nics_per_node", "NICs a node", "int", 8),
    _node("nic_gbit_s", "a NIC's rate (Gb/s)", "float", 400.0),
    _node("gpu_memory_gb", "GPU memory (GB)", "float", 80.0),
    _node("bf16_tflops", "dense bf16 peak (TFLOP/s)", "float", 989.5),
    _node("fp32_tflops", "fp32 peak (TFLOP/s)", "float", 67.0),
    Field(
        "global_batch_mtokens",
        "global batch (millions of tokens, 2^20)",
        "float",
        4.0,
        "training",
        minimum=0.0001,
        step=0.25,
    ),
    Field(
        "micro_batch", "micro-batch (sequences a GPU)", "int", 1, "training", minimum=1
    ),
    Field(
        "precision",
        "precision",
        "choice",
        "bf16",
        "training",
        (("bf16 mixed", "bf16"), ("fp32", "fp32")),
    ),
    Field(
        "optimizer",
        "optimizer",
        "choice",
        "adam",
        "training",
        (("Adam", "adam"), ("SGD with momentum", "sgd-momentum")),
    ),
    Field("checkpointing", "activation checkpointing", "bool", True, "training"),
    Field("flash_attention", "flash attention", "bool", True, "training"),
    Field(
        "efficiency_pct",
        "kernel efficiency (% of peak)",
        "float",
        40.0,
        "training",
        minimum=1,
        maximum=100,
        step=1,
    ),
    Field(
        "node_mtbf_days",
        "MTBF per node (days; Llama 3: 264)",
        "float",
        264.0,
        "failures",
        minimum=0.01,
    ),
    Field(
        "checkpoint_write_s",
        "checkpoint write time (s)",
        "float",
        60.0,
        "failures",
        minimum=0.01,
    ),
    Field("restart_s", "restart time (s)", "float", 300.0, "failures", minimum=0),
    Field(
        "nccl_tests",
        "all_reduce_perf output from your cluster (optional)",
        "text",
        "",
        "calibration",
    ),
)
BY_NAME = {f.name: f for f in FIELDS}


def defaults():
    """Every field's default, by name."""
    return {f.name: f.default for f in FIELDS}


def coerce(field, raw):
    """``raw`` (a form's string, a checkbox's bool, a number) as the field's value."""
    if field.kind == "bool":
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "on")
    if field.kind in ("text",):
        return "" if raw is None else str(raw)
    if field.kind == "choice":
        values = [value for _, value in field.options]
        if raw not in values:
            raise PlanError(f"{field.label}: {raw!r} is not one of {', '.join(values)}")
        return raw
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise PlanError(f"{field.label}: {raw!r} is not a number") from None
    if field.kind == "int":
        if value != int(value):
            raise PlanError(f"{field.label}: {raw!r} is not a whole number")
        value = int(value)
    low, high = field.minimum, field.maximum
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"between {low} and {high}"
        raise PlanError(f"{field.label}: {raw!r} must be {span}")
    return value


def model_of(v):
    """The model the values describe: a preset (at another length) or custom shapes."""
    if v["model"] == "custom":
        try:
            m = Transformer(
                "custom",
                v["layers"],
                v["hidden"],
                v["heads"],
                v["ffn"],
                v["vocab"],
                v["seq"] or 8192,
                kv_heads=v["kv_heads"],
            )
        except ValueError as err:
            raise PlanError(f"custom shapes: {err}") from None
        return m
    m = MODELS[v["model"]]
    if v["seq"]:
        if m.positions and v["seq"] > m.positions:
            raise PlanError(
                f"{m.name} learns {m.positions:,} positions: sequences "
                f"of up to {m.positions:,} tokens"
            )
        m = m.with_seq(v["seq"])
    return m


def node_of(v):
    """The node the values describe: a preset, or the custom node's fields.

    A custom node's NVLink is the vendor's rate each way, of which NCCL moves
    :data:`~mylib.models.cluster.NVLINK_PAYLOAD_SHARE` (chapter 1), as for
    the presets.
    """
    if v["node"] != "custom":
        return NODES[v["node"]]
    gpu = GPU(
        "custom GPU",
        v["gpu_memory_gb"] * 1e9,
        v["bf16_tflops"] * 1e12,
        v["fp32_tflops"] * 1e12,
        "the reader's",
    )
    g, nics, nic_gbit = v["gpus_per_node"], v["nics_per_node"], v["nic_gbit_s"]
    nvlink = v["nvlink_gb_s"] * 1e9 * NVLINK_PAYLOAD_SHARE
    about = f"{g} GPUs, NVLink {v['nvlink_gb_s']:g} GB/s, {nics} x {nic_gbit:g} Gb/s"
    make = CustomNodes(g, nvlink, nics, nic_each_way(nic_gbit))
    return NodeType("custom node", gpu, make, about)


@dataclass(frozen=True)
class CustomNodes:
    """``nodes -> Cluster`` for the custom node (hashable: the planner remembers)."""

    gpus: int
    nvlink_bw: float
    nics: int
    nic_bw: float

    def __call__(self, nodes):
        return Cluster(
            "custom node", nodes, self.gpus, self.nvlink_bw, self.nics, self.nic_bw
        )


def run(values):
    """``(plan, fit)``: the plan for these values (defaults for the rest).

    ``fit`` is the :class:`~mylib.models.nccl_tests.Fit` of a pasted
    ``all_reduce_perf`` output, or None; with one, the plan runs on the
    calibrated cluster.
    """
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise PlanError(f"unknown input(s) {unknown}; the inputs are {list(BY_NAME)}")
    v = {f.name: coerce(f, values.get(f.name, f.default)) for f in FIELDS}
    m, node = model_of(v), node_of(v)
    training = Training(
        global_batch_tokens=max(1, round(v["global_batch_mtokens"] * MTOKENS)),
        micro_batch=v["micro_batch"],
        precision=v["precision"],
        optimizer=v["optimizer"],
        checkpointing=v["checkpointing"],
        flash_attention=v["flash_attention"],
        efficiency=v["efficiency_pct"] / 100,
        node_mtbf_days=v["node_mtbf_days"],
        checkpoint_write_s=v["checkpoint_write_s"],
        restart_s=v["restart_s"],
    )
    fit, cluster = None, None
    if v["nccl_tests"].strip():
        try:
            fit = nccl_tests.fit(nccl_tests.parse(v["nccl_tests"]))
        except ValueError as err:
            raise PlanError(f"all_reduce_perf output: {err}") from None
        cluster = nccl_tests.calibrated_cluster(node.cluster(v["nodes"]), fit)
    return plan(m, node, v["nodes"], training, cluster), fit
