"""Chapter 6's timeline figure: one step of DDP, of ZeRO-2 two ways, and of ZeRO-3.

:func:`zero3_timeline_figure` is the render function of the chapter's
:class:`mylib.figures.livefig.LiveFigure`. Five rows (:data:`ROWS`) share one
time axis, each a compute lane and a comm lane; the compute lane's idle stretches
(waiting for a gather) are shaded red, and each row prints its numbers: step
time, time waiting for communication, bytes each rank sends, and the most
parameter bytes whole at once. Each number also sits in the SVG as
``data-metric``/``data-value`` attributes.

The ranks sit on nodes of ``gpus_per_node`` GPUs, NVLink inside and
``nics_per_node`` NICs out (:class:`mylib.models.cluster.Cluster`); every
collective is NCCL's ring over all of them, priced by
:func:`mylib.models.timeline_zero3.cluster_link`: across nodes at the node's
NICs together, inside one node at NVLink's rate. One GPU and one NIC per node
is chapter 1's flat link. Standard library only (Pyodide).
"""

import functools

from mylib.figures.livefig import choices, node_sliders, steps
from mylib.figures.spans import (
    box,
    draw_boxes,
    lane_markup,
    paint,
    stripe,
    titled_stripes,
)
from mylib.figures.svg import PALETTE, Svg, format_seconds, time_axis
from mylib.figures.timeline import (
    TimeScale,
    draw_lane,
    draw_numbers,
    lane_heights,
    swatch,
)
from mylib.models import timeline as tl
from mylib.models.cluster import ALL_GATHER, GB, Cluster, ring
from mylib.models.timeline_zero3 import cluster_link, zero2_step, zero3_step

ROW_H, LEFT, PANEL_W = 62, 78, 214
DDP_CAP = 25 * 2**20  # DDP's and ZeRO-2's buckets
# The rows, top to bottom: each one's name, as drawn.
ROWS = (
    "DDP (25 MB buckets)",
    "ZeRO-2: reduce-scatter in the backward, all-gather after the step",
    "ZeRO-2 traffic, gathered in the forward (reshard_after_forward=False)",
    "ZeRO-3, no prefetch",
    "ZeRO-3, prefetch",
)
FILLS = {
    "forward": PALETTE["forward"],
    "backward": PALETTE["compute"],
    "optimizer": PALETTE["optimizer"],
    "allreduce": PALETTE["comm"],
    "reducescatter": PALETTE["comm_alt"],
    "allgather": PALETTE["accent"],
}
# what one rank sends: share x (n-1)/n x buffer bytes, with the ring algorithms
SENT_SHARE = {"allreduce": 2.0, "reducescatter": 1.0, "allgather": 1.0}


@functools.lru_cache(maxsize=32)
def _paint(kind, lighter):
    """A box's paint, by its span's kind and whether it is the lighter of two."""
    return paint(FILLS.get(kind, PALETTE["idle"]), 0.75 if lighter else None)


def _span_tip(box_, t0=0.0):
    span = box_[4]
    return (
        f"{span.label or span.kind}: {format_seconds(span.start_s)} "
        f"to {format_seconds(span.end_s)}"
    )


def row_numbers(timeline, ranks, model_bytes):
    """What a row's panel prints, as a dict.

    The step time, the time waiting, the bytes sent per rank and the most
    parameter bytes whole at once.
    """
    compute = sum(s.duration_s for s in timeline.spans if s.lane == tl.COMPUTE)
    sent = sum(
        SENT_SHARE[s.kind] * (ranks - 1) / ranks * s.nbytes
        for s in timeline.spans
        if s.lane == tl.COMM
    )
    return {
        "step_s": timeline.step_s,
        "waiting_s": timeline.step_s - compute,
        "sent_bytes": sent,
        "whole_bytes": getattr(timeline, "peak_gathered_bytes", model_bytes),
    }


def decimal_bytes(nbytes):
    """A size in decimal units: ``4.20 GB`` or ``200 MB``.

    Units of 10^9 and 10^6 bytes, like the chapter's GB/s and its memory model.
    """
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def _idle(spans, end):
    """Stretches of the compute lane with nothing on it, before ``end``."""
    gaps, reach = [], 0.0
    for s in sorted(
        (s for s in spans if s.lane == tl.COMPUTE), key=lambda s: s.start_s
    ):
        if s.start_s > reach + 1e-12:
            gaps.append((reach, s.start_s))
        reach = max(reach, s.end_s)
    if end > reach + 1e-12:
        gaps.append((reach, end))
    return gaps


def draw_waiting(fig, gaps, x_of, y):
    """The compute lane's waits (``gaps``, in seconds), shaded red at height ``y``.

    One shape with one tooltip (how many waits, how long in all): a ZeRO-3 step
    without prefetch waits before every layer, and a redraw stays cheap.
    """
    if not gaps:
        return
    waited = format_seconds(sum(b - a for a, b in gaps))
    times = f"{len(gaps)} time{'s' * (len(gaps) > 1)}"
    shapes = {
        paint(PALETTE["exposed"], 0.35): [stripe(x_of(a), x_of(b)) for a, b in gaps]
    }
    title = f"waiting for communication: {times}, {waited} in all"
    draw_boxes(fig, titled_stripes(title, shapes), y)


def slider_cluster(gpus_per_node, nics_per_node, nic_gb_s, nvlink_gb_s):
    """The sliders' nodes as a :class:`~mylib.models.cluster.Cluster` (rates in GB/s).

    One node: the rank count decides how many
    (:meth:`~mylib.models.cluster.Cluster.for_ranks`). Latency per ring step
    is the cluster model's own, 5 µs on either link.
    """
    return Cluster(
        "slider nodes", 1, gpus_per_node, nvlink_gb_s * GB, nics_per_node, nic_gb_s * GB
    )


def layer_gather(ranks, params_per_layer_m, cluster):
    """One bf16 layer's all-gather over ``ranks`` GPUs of ``cluster``: a ``Cost``.

    :func:`mylib.models.cluster.ring` itself; the timeline's gathers cost its
    ``seconds``, and its ``bottleneck`` says which link binds.
    """
    nbytes = 2 * params_per_layer_m * 1e6
    return ring(cluster.for_ranks(ranks), ALL_GATHER, nbytes)


def _where(ranks, cluster, gather):
    """Where the ring runs, in words, for the figure's second title line."""
    laid = cluster.for_ranks(ranks)
    nics = f"{laid.nics_per_node} NIC{'s' * (laid.nics_per_node > 1)}"
    gpus = f"{laid.gpus_per_node} GPU{'s' * (laid.gpus_per_node > 1)}"
    if laid.nodes == 1:
        node = f"one node of {gpus}, NVLink {laid.nvlink_bw / GB:g} GB/s"
    else:
        node = f"{laid.nodes} nodes of {gpus}, {nics} of {laid.nic_bw / GB:g} GB/s"
    binds = {"nic": "the NICs bind", "nvlink": "NVLink binds"}[gather.bottleneck]
    took = format_seconds(gather.seconds)
    return f"{ranks} ranks on {node}: a layer's all-gather takes {took} ({binds})"


def zero3_timeline_figure(
    n_layers=12,
    params_per_layer_m=100,
    backward_ms_per_layer=10.0,
    ranks=32,
    gpus_per_node=8,
    nics_per_node=1,
    nic_gb_s=50.0,
    nvlink_gb_s=360.0,
):
    """SVG: one step of each of :data:`ROWS`.

    DDP; the paper's ZeRO-2 (:func:`mylib.models.timeline_zero3.zero2_step`);
    ZeRO-2's traffic with the gather moved into the forward, prefetched
    (FSDP2's ``reshard_after_forward=False``); ZeRO-3 without and with
    prefetch. The layers are in bf16, ``params_per_layer_m`` M parameters
    each. Forward takes half the backward; DDP and ZeRO-2 use 25 MB buckets.
    The ``ranks`` sit on nodes of ``gpus_per_node`` GPUs with
    ``nics_per_node`` NICs of ``nic_gb_s`` GB/s each way and NVLink of
    ``nvlink_gb_s`` GB/s per GPU each way (:func:`slider_cluster`).
    """
    layer_bytes = 2 * params_per_layer_m * 1e6  # bf16 parameters, bf16 gradients
    layers = tl.uniform_layers(n_layers, layer_bytes, backward_ms_per_layer * 1e-3)
    cluster = slider_cluster(gpus_per_node, nics_per_node, nic_gb_s, nvlink_gb_s)
    link = cluster_link(cluster, ranks)
    forward_s = 0.5 * backward_ms_per_layer * 1e-3 * n_layers
    rows = [
        tl.simulate(layers, DDP_CAP, link, forward_s=forward_s, name=ROWS[0]),
        zero2_step(layers, link, DDP_CAP, name=ROWS[1]),
        zero3_step(
            layers, link, prefetch=True, reshard_after_forward=False, name=ROWS[2]
        ),
        zero3_step(layers, link, prefetch=False, name=ROWS[3]),
        zero3_step(layers, link, prefetch=True, name=ROWS[4]),
    ]
    width, top = 900, 42
    height = top + len(rows) * ROW_H + 58
    t_max = max(r.step_s for r in rows)
    plot_w = width - LEFT - PANEL_W
    fig = Svg(
        width,
        height,
        label="one step of DDP, of ZeRO-2 with its gather after the step or "
        "in the forward, and of ZeRO-3 without and with prefetch",
    )
    fig.text(
        LEFT,
        16,
        f"{n_layers} layers of {params_per_layer_m:g}M parameters (bf16), "
        f"backward {backward_ms_per_layer:g} ms per layer",
        size=13,
        weight="bold",
    )
    gather = layer_gather(ranks, params_per_layer_m, cluster)
    fig.text(
        LEFT,
        33,
        _where(ranks, cluster, gather),
        size=12,
        data_metric="gather_s",
        data_value=repr(gather.seconds),
    )

    x_of = TimeScale(LEFT, plot_w, t_max)
    time_axis(fig, x_of, t_max, top, height - 52, height - 40)
    for k, row in enumerate(rows):
        y = top + k * ROW_H
        fig.text(LEFT, y + 12, row.name, size=12, weight="bold")
        for lane, ly in lane_heights((tl.COMPUTE, tl.COMM), y).items():
            draw_lane(fig, lane, ly, x_of(0), x_of(row.step_s), LEFT)
            boxes = [
                # every other box lighter: neighbouring boxes stand apart
                box(x_of(s.start_s), x_of(s.end_s), _paint(s.kind, i % 2), s)
                for i, s in enumerate(x for x in row.spans if x.lane == lane)
            ]
            draw_boxes(fig, lane_markup(boxes, _span_tip), ly)
            if lane == tl.COMPUTE:
                draw_waiting(fig, _idle(row.spans, row.step_s), x_of, ly)
        numbers = row_numbers(row, ranks, layer_bytes * n_layers)
        texts = [
            ("step_s", f"step {format_seconds(numbers['step_s'])}"),
            ("waiting_s", f"waiting for comm {format_seconds(numbers['waiting_s'])}"),
            ("sent_bytes", f"sent per rank {decimal_bytes(numbers['sent_bytes'])}"),
            ("whole_bytes", f"whole at once {decimal_bytes(numbers['whole_bytes'])}"),
        ]
        waits = numbers["waiting_s"] > 0.05 * numbers["step_s"]
        panel = [
            (key, text, numbers[key], key == "waiting_s" and waits)
            for key, text in texts
        ]
        draw_numbers(fig, width - PANEL_W + 12, y + 12, panel, 13, data_row=k)
    x = LEFT
    for label, kind in (
        ("forward", "forward"),
        ("backward", "backward"),
        ("all-gather", "allgather"),
        ("reduce-scatter", "reducescatter"),
        ("all-reduce", "allreduce"),
    ):
        swatch(fig, x, height - 8, label, FILLS[kind])
        x += 30 + 5.6 * len(label)
    swatch(fig, x, height - 8, "compute waits", PALETTE["exposed"], opacity=0.35)
    return fig.to_string()


# The sliders of the chapter's live figure:
# LiveFigure(zero3_timeline_figure, ZERO3_TIMELINE_SLIDERS).
ZERO3_TIMELINE_SLIDERS = [
    steps("n_layers", "layers", 2, 48, 1, 12),
    choices(
        "params_per_layer_m",
        "parameters per layer",
        (10, 25, 50, 100, 200, 500, 1000),
        100,
        "{:g}M",
    ),
    steps("backward_ms_per_layer", "backward per layer", 1.0, 40.0, 1.0, 10.0, "ms"),
    choices("ranks", "ranks", (2, 4, 8, 16, 32, 64, 128, 256), 32),
    *node_sliders(nics_per_node=1),
]
