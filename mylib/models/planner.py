"""Plan your run: a model and a cluster in, the whole data-parallel plan out.

:func:`plan` is the one function behind the book's "Plan your run" page, its
Jupyter widget and ``python -m mylib.plan``. From a model's shapes
(:mod:`mylib.models.transformer`), a node type and a node count
(:mod:`mylib.models.hardware`, or a cluster calibrated from nccl-tests,
:mod:`mylib.models.nccl_tests`) and the training settings (:class:`Training`)
it derives, per GPU and per strategy (DDP, ZeRO-1, ZeRO-2, ZeRO-3, HSDP),
memory, bytes sent, communication and exposed time and the step
(:mod:`mylib.models.plan_strategies`); then, for the fastest strategy that
fits, the accumulation steps, the best ``bucket_cap_mb``, tokens per second,
MFU, scaling efficiency against one node, the checkpoint interval (chapter 9)
and the lines to run it (:mod:`mylib.models.plan_advice`).

Every number is a :class:`Derived`: its value, the formula, the inputs and
the chapter that explains it. A page shows the formula beside the number; a
number the planner cannot derive is not in the plan.

Standard library only: the page runs this file in the reader's browser.
"""

import functools
from dataclasses import dataclass

from mylib.models import plan_advice as advice
from mylib.models import plan_numbers as numbers
from mylib.models import plan_strategies as ps
from mylib.models import transformer as tf
from mylib.models.hardware import NODES

#: Llama 3's pre-training: 419 unexpected interruptions in a 54-day snapshot on
#: 16,384 GPUs, 2,048 nodes of 8 (the Llama 3 paper): one per 264 node-days.
LLAMA3_NODE_MTBF_DAYS = 2048 * 54 / 419


class PlanError(ValueError):
    """An input the planner cannot plan for; the message names the fix."""


@dataclass(frozen=True)
class Training:
    """How the reader trains: batch, precision, optimizer, and what to expect.

    ``efficiency``: the share of the GPU's dense peak its kernels reach while
    computing (recomputation included, communication not; the Llama 3 paper
    reports 38 to 43% BF16 MFU on H100). ``node_mtbf_days``: mean time
    between failures of one node; ``checkpoint_write_s`` blocks training;
    ``restart_s`` is detection, relaunch and loading.
    """

    global_batch_tokens: int = 4 * 2**20
    micro_batch: int = 1
    precision: str = "bf16"
    optimizer: str = "adam"
    checkpointing: bool = True
    flash_attention: bool = True
    efficiency: float = 0.40
    node_mtbf_days: float = 264.0
    checkpoint_write_s: float = 60.0
    restart_s: float = 300.0

    def check(self):
        """Refuse settings no run can have, naming the fix."""
        t = self
        if not (isinstance(t.micro_batch, int) and t.micro_batch >= 1):
            raise PlanError(
                f"the micro-batch is a whole number of sequences >= 1, "
                f"got {t.micro_batch!r}"
            )
        if not t.global_batch_tokens >= 1:
            raise PlanError("the global batch must hold at least one token")
        if not 0 < t.efficiency <= 1:
            raise PlanError(
                "the kernel efficiency is a share of the GPU's peak, in "
                f"(0, 1], got {t.efficiency!r}; 0.4 is typical on H100"
            )
        if not (t.node_mtbf_days > 0 and t.checkpoint_write_s > 0 and t.restart_s >= 0):
            raise PlanError(
                "need a node MTBF > 0, a checkpoint write time > 0 and a "
                "restart time >= 0"
            )
        for check, value in (
            (ps.wire_bytes, t.precision),
            (ps.OPTIMIZER_BYTES.__getitem__, t.optimizer),
        ):
            try:
                check(value)
            except (KeyError, ValueError):
                raise PlanError(
                    f"unknown setting {value!r}: precision is 'bf16' or "
                    "'fp32', optimizer 'adam' or 'sgd-momentum'"
                ) from None


@dataclass(frozen=True)
class Derived:
    """One number of the plan, with how it was derived."""

    key: str
    label: str
    value: float
    text: str
    formula: str
    inputs: str
    chapter: str


LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer",
    "activations": "activations",
    "buffers": "buffers",
    "total": "total",
    "free": "free",
    "gpu_bytes": "sent per GPU",
    "nic_bytes": "sent per NIC",
    "comm_s": "on the wire",
    "exposed_s": "exposed",
    "step_s": "step",
}


@dataclass
class Plan:
    """The plan: every :class:`Derived` by key, the costs, the choice, the lines."""

    model: object
    node: object
    cluster: object
    training: Training
    micro_steps: int
    values: dict
    costs: dict
    fits: dict
    recommended: object = None
    advice: str = ""
    lines: tuple = ()

    def add(self, key, value, text, how, label=None):
        """Record a number and ``how = (formula, inputs, chapter)``: the only way in."""
        label = label or LABELS.get(key.rsplit(".", 1)[-1], key)
        self.values[key] = Derived(key, label, value, text, *how)
        return value

    def tables(self):
        """``[(title, header, rows)]``; each cell a key of :attr:`values` or text."""
        mem = (
            "params",
            "grads",
            "optimizer",
            "activations",
            "buffers",
            "total",
            "free",
        )
        comm = ("gpu_bytes", "nic_bytes", "comm_s", "exposed_s", "step_s")
        run = [[self.values[k].label, k] for k in self.values if k.startswith("run.")]
        return [
            (
                "Memory per GPU",
                ["strategy"] + [LABELS[c] for c in mem],
                [[s] + [f"mem.{s}.{c}" for c in mem] for s in ps.STRATEGIES],
            ),
            (
                "Communication per step",
                ["strategy"] + [LABELS[c] for c in comm],
                [[s] + [f"comm.{s}.{c}" for c in comm] for s in ps.STRATEGIES],
            ),
            ("The run", ["", ""], run),
        ]


def resolve(model, node):
    """The model (:class:`~mylib.models.transformer.Transformer`) and the node type."""
    if isinstance(model, str):
        if model not in tf.MODELS:
            raise PlanError(
                f"unknown model preset {model!r}; the presets are "
                f"{', '.join(tf.MODELS)} (or give the shapes)"
            )
        model = tf.MODELS[model]
    if isinstance(node, str):
        if node not in NODES:
            raise PlanError(
                f"unknown node preset {node!r}; the presets are {', '.join(NODES)}"
            )
        node = NODES[node]
    return model, node


def micro_step(m, gpu, training):
    """One micro-step's compute per GPU, as the timelines play it (remembered)."""
    t = training
    return _micro_step(
        m, gpu, t.precision, t.efficiency, t.micro_batch, t.checkpointing
    )


@functools.lru_cache(maxsize=32)
def _micro_step(m, gpu, precision, efficiency, micro_batch, checkpointing):
    peak = gpu.peak_flops(precision) * efficiency
    tokens = micro_batch * m.seq
    block_fwd = tf.block_forward_flops(m, tokens) / peak
    out_fwd = tf.output_forward_flops(m, tokens) / peak
    block_bwd = (3 if checkpointing else 2) * block_fwd  # + the recomputed forward
    wire = ps.wire_bytes(precision)
    return ps.Step(
        forward_s=m.layers * block_fwd + out_fwd,
        ddp_layers=tuple(tf.timeline_layers(m, wire.reduce, block_bwd, 2 * out_fwd)),
        fsdp_layers=tuple(tf.timeline_layers(m, wire.gather, block_bwd, 2 * out_fwd)),
        forward_ratio=block_fwd / block_bwd,
        psi=tf.num_params(m),
        wire_share=wire.reduce / ps.KEPT["grads"],
    )


def plan(model, node, nodes, training=Training(), cluster=None):
    """The plan for ``model`` on ``nodes`` nodes of ``node`` (names or objects).

    ``cluster``: a cluster to plan on instead of the preset's (a calibrated
    one, :func:`mylib.models.nccl_tests.calibrated_cluster`). Raises
    :class:`PlanError` on an input no run can have.
    """
    m, node = resolve(model, node)
    training.check()
    if not (isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1):
        raise PlanError(f"the node count is a whole number >= 1, got {nodes!r}")
    cluster = node.cluster(nodes) if cluster is None else cluster.with_nodes(nodes)
    ranks, t = cluster.ranks, training
    per_micro = ranks * t.micro_batch * m.seq
    if t.global_batch_tokens < per_micro:
        raise PlanError(
            f"a global batch of {t.global_batch_tokens:,} tokens is less than one "
            f"micro-batch on each of the {ranks} GPUs ({t.micro_batch} x {m.seq} x "
            f"{ranks} = {per_micro:,} tokens): raise the global batch to at least "
            "that, or lower the micro-batch or the node count"
        )
    steps = max(1, round(t.global_batch_tokens / per_micro))
    p = Plan(m, node, cluster, t, steps, {}, {}, {})
    psi = tf.num_params(m)
    p.add(
        "model.params",
        psi,
        f"{psi / 1e9:.2f} B",
        (
            "Ψ = L (attention + MLP + 2 norms) + embedding + output layer + final norm",
            f"{m.name}: L = {m.layers}, h = {m.hidden}, {m.heads} heads ({m.kv_heads} "
            f"key/value), FFN {m.ffn}, vocabulary {m.vocab:,}",
            "6",
        ),
        "parameters",
    )
    p.add(
        "run.accumulation",
        steps,
        f"{steps}",
        (
            "m = global batch / (micro-batch x sequence x GPUs), rounded",
            f"{t.global_batch_tokens:,} / ({t.micro_batch} x {m.seq} x {ranks})",
            "2, 4",
        ),
        "accumulation steps",
    )
    batch = steps * per_micro
    p.add(
        "run.global_batch",
        batch,
        f"{batch:,} tokens",
        (
            "B = m x micro-batch x sequence x GPUs",
            f"{steps} x {t.micro_batch} x {m.seq} x {ranks}",
            "2",
        ),
        "global batch",
    )
    step = micro_step(m, node.gpu, t)
    numbers.compute(p, step)
    numbers.memory(p, step)
    numbers.communication(p, step)
    fitting = [s for s in ps.STRATEGIES if p.fits[s]]
    if not fitting:
        p.advice = advice.smallest_fit(m, node, nodes, t)
        return p
    p.recommended = min(
        fitting, key=lambda s: (p.costs[s].step_s, p.values[f"mem.{s}.total"].value)
    )
    numbers.run(p, step, batch)
    numbers.checkpoint(p, nodes)
    p.lines = tuple(advice.run_lines(p))
    return p
