"""The slider figure of chapter 7: where adding ranks stops paying.

:func:`scaling_figure` draws, for a model of ``grad_gb`` GB of gradients
trained at a fixed global batch, against the number of ranks (1 to 1024):

* left, one rank's backward (falling as 1/n: only the backward can hide
  communication), the all-reduces of its buckets (rising: the bandwidth term
  towards 2G/β, the latency term 2(n-1)α per bucket without bound) and the step
  time from the timeline model (:func:`mylib.models.scaling.scaled_step`); past
  their crossing, the shaded region, the step is bound by communication;
* right, the efficiency (speed-up / n) at that fixed global batch, and, dashed,
  at a fixed batch per rank (the global batch grows with n instead);
* the numbers at the chosen rank count.

The ranks sit on nodes of ``gpus_per_node`` GPUs with NVLink inside and
``nics_per_node`` NICs out (:class:`mylib.models.cluster.Cluster`): NCCL's
ring over them runs at the node's NICs together, or NVLink's rate, whichever
binds (:func:`mylib.models.cluster.ring_alpha_beta`). One GPU and one NIC per
node is the flat link of chapter 1.

Standard library only (with :mod:`mylib.figures.svg`,
:mod:`mylib.models.scaling`): the static site runs this very function in the
reader's browser.
"""

import functools
import math

from mylib.figures.livefig import choices, node_sliders, settings, steps
from mylib.figures.svg import PALETTE, Axes, Svg, caption_lines, format_seconds
from mylib.models.buckets import MB
from mylib.models.cluster import GB, Cluster, ring_alpha_beta
from mylib.models.scaling import (
    H100_NVLINK_EACH_WAY,
    NIC_400G_EACH_WAY,
    WEAK,
    comm_bound_ranks,
    ring_limit_s,
    scaled_step,
    scaling_table,
    transformer_like_layers,
)

MAX_RANKS = 1024
COMM_BOUND_FILL = "#fde0c5"
FORWARD_PER_BACKWARD = 0.5  # a forward costs about half a backward


class _Axes(Axes):
    """A panel: log2 ranks across, log10 (or linear) values up."""

    def __init__(self, svg, x, y, width, height, ylim, log_y=True):
        super().__init__(svg, x, y, width, height)
        self.log_y = log_y
        self.ylim = (math.log10(ylim[0]), math.log10(ylim[1])) if log_y else ylim

    def px(self, ranks):
        return self.x + self.w * math.log2(ranks) / math.log2(MAX_RANKS)

    def py(self, value):
        v = math.log10(max(value, 1e-30)) if self.log_y else value
        frac = (v - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return self.y + self.h * (1 - min(max(frac, -0.02), 1.02))

    def ranks_frame(self, y_label, y_ticks, y_format):
        """The frame, ranks across: a line at every other power of two."""
        super().frame(
            [2**k for k in range(0, int(math.log2(MAX_RANKS)) + 1, 2)],
            str,
            "ranks n (log scale)",
            y_ticks,
            y_format,
            y_label,
        )


NETWORK = (
    "gpus_per_node",
    "nics_per_node",
    "nic_gb_s",
    "nvlink_gb_s",
    "alpha_us",
    "bucket_cap_mb",
)


def _link(gpus_per_node, nics_per_node, nic_gb_s, nvlink_gb_s, alpha_us, bucket_cap_mb):
    """The network sliders in the model's units: ``(cluster, cap_bytes)``.

    The cluster has one node: the rank count decides how many
    (:meth:`~mylib.models.cluster.Cluster.for_ranks`).
    """
    cluster = Cluster(
        "slider nodes",
        1,
        gpus_per_node,
        nvlink_gb_s * GB,
        nics_per_node,
        nic_gb_s * GB,
        alpha_us * 1e-6,
        alpha_us * 1e-6,
    )
    return cluster, bucket_cap_mb * MB


@functools.lru_cache(maxsize=8)
def _layers(global_batch, backward_ms_per_sample, grad_gb):
    """``(layers, forward_s)``; remembered, as a redraw asks up to three times.

    The layers come as a tuple: shared, they are never changed.
    """
    backward_s = global_batch * backward_ms_per_sample * 1e-3
    layers = tuple(transformer_like_layers(grad_gb * 1e9, backward_s))
    return layers, FORWARD_PER_BACKWARD * backward_s


RANK_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def scaling_rows(**values):
    """The figure's data: :func:`mylib.models.scaling.scaling_table` rows.

    For the figure's slider values (:data:`SCALING_SLIDERS`; a value left out
    takes its slider's default), at a fixed global batch, each row with its
    ``batch_per_rank``. The backward of the whole global batch on one rank is
    ``global_batch x backward_ms_per_sample``; a forward costs half that. Rows
    cover :data:`RANK_COUNTS` up to the global batch (at least one sample per
    rank); the ``ranks`` slider only marks one of them.
    """
    s = settings(SCALING_SLIDERS, values)
    layers, forward_s = _layers(s.global_batch, s.backward_ms_per_sample, s.grad_gb)
    cluster, cap = _link(*(getattr(s, name) for name in NETWORK))
    rows = scaling_table(
        layers,
        [n for n in RANK_COUNTS if n <= s.global_batch],
        None,
        None,
        cap,
        forward_s=forward_s,
        cluster=cluster,
    )
    for row in rows:
        row["batch_per_rank"] = s.global_batch / row["ranks"]
    return rows


def weak_efficiency(batch_per_rank, ranks, backward_ms_per_sample, grad_gb, link):
    """Efficiency at a fixed batch per rank.

    One rank's step time on that batch, divided by the step time on ``ranks``
    ranks; ``link`` is ``(cluster, cap_bytes)`` (:func:`_link`).
    """
    curve = _weak_curve(
        batch_per_rank, (ranks,), backward_ms_per_sample, grad_gb, tuple(link)
    )
    return curve[0][1]


@functools.lru_cache(maxsize=32)
def _weak_curve(batch_per_rank, ranks_list, backward_ms_per_sample, grad_gb, link):
    """``(ranks, weak efficiency)`` for each of ``ranks_list``: one rank played once."""
    layers, forward_s = _layers(batch_per_rank, backward_ms_per_sample, grad_gb)
    cluster, cap = link

    def step_s(n):
        return scaled_step(
            layers, n, None, None, cap, mode=WEAK, forward_s=forward_s, cluster=cluster
        ).step_s

    one = step_s(1)
    return tuple(
        (n, 1.0 if n == 1 else one / step_s(n))  # one rank is its own reference
        for n in ranks_list
    )


@functools.lru_cache(maxsize=32)
def _model(global_batch, backward_ms_per_sample, grad_gb, *link_values):
    """The rows, the link and the communication-bound rank count, for every ``ranks``.

    ``link_values``: the :data:`NETWORK` sliders. The ``ranks`` slider only
    marks a rank count: moving it replays nothing.
    """
    rows = scaling_rows(
        global_batch=global_batch,
        backward_ms_per_sample=backward_ms_per_sample,
        grad_gb=grad_gb,
        **dict(zip(NETWORK, link_values)),
    )
    layers, _ = _layers(global_batch, backward_ms_per_sample, grad_gb)
    cluster, cap = link = _link(*link_values)
    bound = comm_bound_ranks(
        layers, None, None, cap, max_ranks=MAX_RANKS, cluster=cluster
    )
    return rows, link, bound


def scaling_figure(**values):
    """SVG: step time and efficiency against rank count at a fixed global batch.

    ``values`` are slider values (:data:`SCALING_SLIDERS`); the numbers printed
    below are those at ``ranks`` ranks.
    """
    s = settings(SCALING_SLIDERS, values)
    if not (
        1 <= s.ranks <= MAX_RANKS
        and s.global_batch >= 1
        and s.grad_gb > 0
        and s.nic_gb_s > 0
        and s.nvlink_gb_s > 0
    ):
        raise ValueError(
            "need 1 <= ranks <= 1024, global_batch >= 1, "
            "grad_gb > 0, nic_gb_s > 0 and nvlink_gb_s > 0"
        )
    rows, link, bound = _model(
        s.global_batch,
        s.backward_ms_per_sample,
        s.grad_gb,
        *(getattr(s, name) for name in NETWORK),
    )
    ranks = min(s.ranks, rows[-1]["ranks"])
    at = next(r for r in rows if r["ranks"] >= ranks)
    weak = list(
        _weak_curve(
            at["batch_per_rank"],
            tuple(r["ranks"] for r in rows),
            s.backward_ms_per_sample,
            s.grad_gb,
            link,
        )
    )
    weak_at = dict(weak)[at["ranks"]]

    svg = Svg(
        820,
        420,
        label=f"scaling efficiency at {at['ranks']} ranks: {at['efficiency']:.0%}",
    )
    values = [
        v
        for r in rows
        for v in (r["backward_s"], r["step_s"])
        + ((r["comm_s"],) if r["ranks"] > 1 else ())
    ]
    ylim = (
        10 ** math.floor(math.log10(min(values))),
        10 ** math.ceil(math.log10(max(values))),
    )
    left = _Axes(svg, 70, 40, 330, 240, ylim)
    if bound is not None:
        left.band(left.px(bound), left.x + left.w, COMM_BOUND_FILL)
        if left.x + left.w - left.px(bound) > 70:
            left.corner_label("communication-bound", "#a65d1f", anchor="end")
    decades = list(range(int(round(left.ylim[0])), int(round(left.ylim[1])) + 1))
    every = max(1, math.ceil(len(decades) / 6))
    left.ranks_frame(
        "time per step, one rank",
        [10.0**k for k in decades[::every]],
        lambda v: format_seconds(v, 1),
    )
    left.curve(
        [(r["ranks"], r["backward_s"]) for r in rows],
        PALETTE["compute"],
        metric="backward",
    )
    left.curve(
        [(r["ranks"], r["comm_s"]) for r in rows if r["ranks"] > 1],
        PALETTE["comm"],
        metric="comm",
    )
    left.curve(
        [(r["ranks"], r["step_s"]) for r in rows],
        PALETTE["text"],
        width=2.5,
        dash="6 3",
        metric="step",
    )
    for i, (label, colour) in enumerate(
        (
            ("backward (hides the all-reduce)", PALETTE["compute"]),
            ("all-reduces of the buckets", PALETTE["comm"]),
            ("step (timeline model)", PALETTE["text"]),
        )
    ):
        # bottom left: the curves start high at one rank
        y = left.y + left.h - 44 + 14 * i
        svg.line(left.x + 8, y, left.x + 26, y, stroke=colour, stroke_width=2.5)
        svg.text(left.x + 30, y + 4, label, size=10)

    right = _Axes(svg, 470, 40, 320, 240, (0.0, 1.05), log_y=False)
    right.ranks_frame(
        "efficiency = speed-up / n", [0.0, 0.25, 0.5, 0.75, 1.0], lambda v: f"{v:.0%}"
    )
    right.curve(
        [(r["ranks"], r["efficiency"]) for r in rows],
        PALETTE["accent"],
        metric="efficiency",
    )
    right.curve(weak, PALETTE["muted"], dash="5 4", metric="weak_efficiency")
    legend = (
        (24, f"global batch fixed at {s.global_batch}", PALETTE["accent"]),
        (10, f"- - batch per rank fixed at {at['batch_per_rank']:g}", PALETTE["muted"]),
    )
    for above_bottom, text, colour in legend:
        svg.text(
            right.x + 8, right.y + right.h - above_bottom, text, size=10, fill=colour
        )
    left.marker(at["ranks"], at["step_s"])
    right.marker(at["ranks"], at["efficiency"])

    cluster = link[0]
    laid = cluster.for_ranks(at["ranks"])
    beta = ring_alpha_beta(cluster, at["ranks"])[1]
    gpus = laid.gpus_per_node
    nodes_text = (
        f"{laid.nodes} node{'s' if laid.nodes > 1 else ''} "
        f"of {gpus} GPU{'s' if gpus > 1 else ''}"
    )
    if at["ranks"] == 1:
        binds = "no communication"
    elif laid.nodes > 1 and laid.node_nic_bw <= beta * (1 + 1e-12):
        k = laid.nics_per_node
        binds = "the node's NIC" if k == 1 else f"a node's {k} NICs together"
    else:
        binds = "NVLink"
    lines = [
        (
            f"{at['ranks']} ranks, {at['batch_per_rank']:g} samples each: "
            f"compute {format_seconds(at['compute_s'])}, "
            f"all-reduces {format_seconds(at['comm_s'])}, "
            f"exposed {format_seconds(at['exposed_comm_s'])}, "
            f"step {format_seconds(at['step_s'])}: efficiency {at['efficiency']:.0%}",
            "summary",
        ),
        (
            (
                f"Communication-bound from {bound} ranks "
                "(one rank's backward < its all-reduces); "
                if bound
                else "Never communication-bound up to 1024 ranks; "
            )
            + (
                "bandwidth term → 2G/β = "
                f"{format_seconds(ring_limit_s(s.grad_gb * 1e9, beta))}"
            ),
            "bound",
        ),
        (
            f"The ring at {at['ranks']} ranks: {nodes_text}, bus bandwidth "
            f"β = {beta / 1e9:.0f} GB/s ({binds})",
            "ring",
        ),
        (
            f"Keeping {at['batch_per_rank']:g} samples per rank instead "
            "(the global batch grows): "
            f"efficiency {weak_at:.0%} at {at['ranks']} ranks",
            "weak",
        ),
    ]
    caption_lines(svg, 20, 346, 17, lines)
    return svg.to_string()


# -- where data parallelism sits ----------------------------------------------

_SHADES = ("#08519c", "#3182bd", "#6baed6", "#9ecae1")  # one per rank's data


def _gpu(svg, x, y, w, n_layers, rank, ranks, mode, label):
    """One GPU: a box holding ``n_layers`` layer bars, drawn for ``mode``.

    ``"data"``: every layer whole; ``"tensor"``: every layer faint, this rank's
    1/``ranks`` slice of each solid; ``"pipeline"``: only this rank's layers.
    """
    bar_h, gap = 14, 5
    height = 22 + n_layers * (bar_h + gap)
    svg.rect(x, y, w, height, fill="#ffffff", stroke=PALETTE["muted"])
    svg.text(x + w / 2, y + 14, label, size=10, anchor="middle", fill=PALETTE["muted"])
    per_stage = max(1, n_layers // ranks)
    for k in range(n_layers):
        bx, by, bw = x + 6, y + 20 + k * (bar_h + gap), w - 12
        title = f"layer {k + 1}"
        if mode == "data":
            svg.rect(
                bx, by, bw, bar_h, fill=PALETTE["compute"], title=f"{title}, whole"
            )
        elif mode == "tensor":
            svg.rect(bx, by, bw, bar_h, fill=PALETTE["compute"], opacity=0.15)
            svg.rect(
                bx + rank * bw / ranks,
                by,
                bw / ranks,
                bar_h,
                fill=PALETTE["compute"],
                title=f"{title}: this GPU's 1/{ranks} of its matrices",
            )
        elif k // per_stage == rank:
            svg.rect(bx, by, bw, bar_h, fill=PALETTE["compute"], title=f"{title}")
        else:
            svg.rect(bx, by, bw, bar_h, fill=PALETTE["grid"], opacity=0.5)
    return height


def parallelism_picture(ranks=4, n_layers=4, nvlink_gb_s=None, network_gb_s=None):
    """SVG: data, tensor and pipeline parallelism, then data across nodes.

    Top row, ``ranks`` GPUs each way: data parallelism (every GPU holds the
    whole model and reads its own share of the batch; the gradients are
    all-reduced once a step), tensor parallelism (every layer's matrices are
    split across the GPUs, which see the same data and all-reduce activations
    inside every layer: Megatron-LM's two all-reduces per transformer layer in
    the forward and two in the backward) and pipeline parallelism (each GPU
    holds consecutive layers; activations go to the next stage, their
    gradients come back). Bottom: two nodes of ``ranks`` GPUs, tensor parallel
    inside each node, data parallel across them: GPU r of one node all-reduces
    its slice of the gradients with GPU r of the other, over the network.
    ``nvlink_gb_s`` and ``network_gb_s`` label the two links (each way).
    """
    if ranks < 2 or n_layers < ranks:
        raise ValueError(f"need 2 <= ranks <= n_layers, got {ranks} and {n_layers}")
    nvlink = H100_NVLINK_EACH_WAY / 1e9 if nvlink_gb_s is None else nvlink_gb_s
    network = NIC_400G_EACH_WAY / 1e9 if network_gb_s is None else network_gb_s
    width, panel_w, gpu_gap = 840, 270, 6
    gpu_w = (panel_w - 20 - (ranks - 1) * gpu_gap) / ranks
    svg = Svg(
        width,
        470,
        label="data, tensor and pipeline parallelism; data parallel across nodes "
        "with tensor parallel inside each",
    )
    panels = (
        (
            "data",
            "Data parallel",
            "whole model on every GPU, its own data",
            "all-reduce the gradients, once a step",
        ),
        (
            "tensor",
            "Tensor parallel",
            "every layer split, the same data",
            "all-reduce activations inside every layer",
        ),
        (
            "pipeline",
            "Pipeline parallel",
            "consecutive layers per GPU (a stage)",
            "activations to the next stage, and back",
        ),
    )
    top = 52
    for i, (mode, title, what, comm) in enumerate(panels):
        x0 = 10 + i * (panel_w + 10)
        svg.text(x0, 18, title, size=13, weight="bold")
        svg.text(x0, 34, what, size=10, fill=PALETTE["muted"])
        for r in range(ranks):
            gx = x0 + 10 + r * (gpu_w + gpu_gap)
            h = _gpu(svg, gx, top, gpu_w, n_layers, r, ranks, mode, f"GPU {r}")
            data = {
                "data": (_SHADES[r % len(_SHADES)], "its own share of the batch"),
                "tensor": (PALETTE["forward"], "the same input on every GPU"),
                "pipeline": (
                    PALETTE["forward"],
                    "the input, one micro-batch at a time",
                ),
            }[mode]
            if mode != "pipeline" or r == 0:
                svg.rect(
                    gx + 6, top + h + 6, gpu_w - 12, 8, fill=data[0], title=data[1]
                )
        y = top + h + 30
        svg.line(
            x0 + 10 + gpu_w / 2,
            y,
            x0 + 10 + (ranks - 1) * (gpu_w + gpu_gap) + gpu_w / 2,
            y,
            stroke=PALETTE["comm"],
            stroke_width=2,
            stroke_dasharray="5 3" if mode == "pipeline" else None,
        )
        svg.text(x0, y + 16, comm, size=10, fill=PALETTE["comm"])

    # Bottom: two nodes, tensor parallel inside, data parallel across.
    y0 = 250
    svg.text(
        10,
        y0,
        "Together: tensor parallel inside a node, data parallel across nodes",
        size=13,
        weight="bold",
    )
    node_w, node_top = 395, y0 + 14
    for node in range(2):
        nx = 10 + node * (node_w + 30)
        svg.rect(nx, node_top, node_w, 148, fill="#f7f7f7", stroke=PALETTE["muted"])
        svg.text(nx + 8, node_top + 16, f"node {node}", size=11, weight="bold")
        gw = (node_w - 20 - (ranks - 1) * gpu_gap) / ranks
        for r in range(ranks):
            gx = nx + 10 + r * (gw + gpu_gap)
            _gpu(svg, gx, node_top + 24, gw, n_layers, r, ranks, "tensor", f"GPU {r}")
        svg.text(
            nx + 8,
            node_top + 140,
            f"NVLink, {nvlink:g} GB/s each way: activations, every layer",
            size=10,
            fill=PALETTE["compute"],
        )
    across = node_top + 160
    for r in range(ranks):
        gw = (node_w - 20 - (ranks - 1) * gpu_gap) / ranks
        xa = 10 + 10 + r * (gw + gpu_gap) + gw / 2
        xb = xa + node_w + 30
        y = across + 6 * r
        svg.line(xa, node_top + 148, xa, y, stroke=PALETTE["comm"])
        svg.line(xb, node_top + 148, xb, y, stroke=PALETTE["comm"])
        svg.line(xa, y, xb, y, stroke=PALETTE["comm"])
    svg.text(
        10,
        across + 6 * ranks + 18,
        f"Network, {network:g} GB/s each way per GPU: the gradients' all-reduce, "
        f"once a step; GPU r sends only its 1/{ranks} of them, to GPU r of the "
        "other nodes",
        size=10,
        fill=PALETTE["comm"],
    )
    return svg.to_string()


# The sliders of chapter 7's LiveFigure(scaling_figure, SCALING_SLIDERS), as
# dicts of Slider arguments.
SCALING_SLIDERS = [
    choices("ranks", "ranks", [2**k for k in range(11)], 64),
    choices("global_batch", "global batch", (256, 512, 1024, 2048, 4096), 1024),
    steps("backward_ms_per_sample", "backward per sample", 5.0, 200.0, 5.0, 50.0, "ms"),
    steps("grad_gb", "gradients", 0.5, 40.0, 0.5, 14.0, "GB"),
    *node_sliders(nics_per_node=8),
    steps("alpha_us", "latency \u03b1 per ring step", 0.0, 50.0, 1.0, 5.0, "\u00b5s"),
    choices("bucket_cap_mb", "bucket cap", (1, 5, 25, 100, 400), 25, "{:g} MiB"),
]
