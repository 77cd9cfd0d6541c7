"""Chapter 4's figure: one optimizer step with and without ``no_sync()``.

:func:`accumulation_figure` draws the two timelines of
:func:`mylib.models.timeline_accum.accumulation_step` (with ``no_sync()`` on
the first m - 1 micro-steps, and with an all-reduce after every micro-step)
on one time axis, each micro-step marked and its exposed communication
framed in red. Standard library only: it runs in the reader's browser.
"""

from mylib.figures.livefig import choices, settings, steps
from mylib.figures.spans import box, draw_boxes, lane_markup, paint, span_fill
from mylib.figures.svg import PALETTE, Svg, format_bytes, format_seconds, time_axis
from mylib.figures.timeline import (
    LANE_GAP,
    LANE_H,
    bandwidth_choices,
    draw_lane,
    draw_numbers,
    frame_exposed,
    lane_heights,
    panel_numbers,
)
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.layers import linear_layers
from mylib.models.timeline_accum import accumulation_step

LEFT, PANEL_W, ROW_H = 78, 200, 74
# the figure's layers are Linear(2048, 2048) in fp32: a 16 MB weight and an 8 KB bias
HIDDEN = 2048


def _draw_row(fig, timeline, k, y, x_of, width):
    fig.text(LEFT, y + 12, timeline.name, size=12, weight="bold")
    lane_y = lane_heights(timeline.lanes, y)
    for lane, ly in lane_y.items():
        draw_lane(fig, lane, ly, x_of(0), x_of(timeline.step_s), LEFT)
        boxes = [
            box(x_of(span.start_s), x_of(span.end_s), paint(span_fill(span, i)), span)
            for i, span in enumerate(s for s in timeline.spans if s.lane == lane)
        ]
        draw_boxes(fig, lane_markup(boxes), ly)
    # Each micro-step's exposed tail: from the end of its backward to the end of
    # its last all-reduce.
    ends = timeline.micro_starts_s[1:] + [timeline.step_s]
    for j, (start, end) in enumerate(zip(timeline.micro_starts_s, ends)):
        fig.line(
            x_of(start),
            y + 15,
            x_of(start),
            y + 18 + 2 * (LANE_H + LANE_GAP),
            stroke=PALETTE["text"],
            stroke_dasharray="2,2",
        )
        inside = [s for s in timeline.spans if start <= s.start_s < end]
        backward_end = max(s.end_s for s in inside if s.kind == "backward")
        comm_end = max(
            (s.end_s for s in inside if s.kind == "allreduce"), default=backward_end
        )
        if comm_end > backward_end:
            frame_exposed(
                fig,
                x_of(backward_end),
                x_of(comm_end),
                lane_y[tl.COMM],
                f"micro-step {j + 1}: communication exposed for "
                f"{format_seconds(comm_end - backward_end)}",
            )
    lines = [
        ("step_s", "optimizer step", format_seconds(timeline.step_s)),
        ("exposed_comm_s", "exposed comm", format_seconds(timeline.exposed_comm_s)),
        ("n_allreduces", "all-reduces", str(timeline.n_allreduces)),
        ("bytes_sent", "sent per rank", format_bytes(timeline.bytes_sent)),
    ]
    numbers = panel_numbers(timeline, lines)
    draw_numbers(fig, width - PANEL_W + 12, y + 14, numbers, data_timeline=k)


def draw_accumulation(timelines, *, width=900, title=None):
    """One SVG of accumulation timelines on a shared time axis, micro-steps marked."""
    timelines = list(timelines)
    if not timelines:
        raise ValueError("draw_accumulation needs at least one AccumulationTimeline")
    t_max = max(t.step_s for t in timelines) or 1e-9
    plot_w, top = width - LEFT - PANEL_W, 24 if title else 6
    height = top + len(timelines) * ROW_H + 40
    fig = Svg(width, height, label=title or "gradient accumulation timeline")
    if title:
        fig.text(LEFT, 16, title, size=13, weight="bold")

    def x_of(t):
        return LEFT + plot_w * t / t_max

    time_axis(fig, x_of, t_max, top, height - 36, height - 22)
    fig.text(
        LEFT + plot_w / 2,
        height - 8,
        "time since the optimizer step began (dashed: a micro-step starts; "
        "red: communication the compute waits for)",
        anchor="middle",
        size=10,
        fill=PALETTE["muted"],
    )
    for k, timeline in enumerate(timelines):
        _draw_row(fig, timeline, k, top + k * ROW_H, x_of, width)
    return fig.to_string()


def accumulation_timelines(latency_us=20.0, **values):
    """The figure's two timelines, for its slider values: with and without no_sync.

    Without it, every micro-step ends with an all-reduce. Layers are
    Linear(2048, 2048) in fp32 (16 MB of gradient each); each micro-step's
    forward takes half its backward. A value left out takes its slider's
    default (:data:`ACCUMULATION_SLIDERS`).
    """
    s = settings(ACCUMULATION_SLIDERS, values)
    layers = linear_layers(s.n_layers, HIDDEN, s.backward_ms_per_layer)
    link = tl.Link(s.ranks, latency_us * 1e-6, s.bandwidth_gb_s * 1e9)
    forward_s = 0.5 * sum(layer.backward_s for layer in layers)
    cap = s.bucket_cap_mb * MB
    return [
        accumulation_step(
            layers, cap, link, s.micro_steps, no_sync=flag, forward_s=forward_s
        )
        for flag in (True, False)
    ]


def accumulation_figure(**values):
    """Chapter 4's figure (SVG): one optimizer step with and without no_sync.

    ``values`` are slider values (:data:`ACCUMULATION_SLIDERS`).
    """
    s = settings(ACCUMULATION_SLIDERS, values)
    layers = linear_layers(s.n_layers, HIDDEN, s.backward_ms_per_layer)
    grads = sum(layer.nbytes for layer in layers)
    title = (
        f"{s.micro_steps} micro-steps per optimizer step, {s.n_layers} layers "
        f"({format_bytes(grads)} of gradients), {s.ranks} ranks, "
        f"{s.bandwidth_gb_s:g} GB/s"
    )
    return draw_accumulation(accumulation_timelines(**vars(s)), title=title)


ACCUMULATION_SLIDERS = [
    steps("micro_steps", "micro-steps (m)", 1, 8, 1, 4),
    steps("n_layers", "layers", 2, 48, 1, 12),
    choices(
        "bucket_cap_mb",
        "bucket cap",
        [("0: per parameter", 0.0), 5.0, 25.0, 100.0, 400.0],
        25.0,
        "{:g} MB",
    ),
    bandwidth_choices((1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 400.0), 5.0),
    steps("backward_ms_per_layer", "backward per layer", 0.5, 10.0, 0.5, 3.0, "ms"),
    choices("ranks", "ranks", (2, 4, 8, 16, 64, 256), 8),
]
"""The sliders of ``LiveFigure(accumulation_figure, ACCUMULATION_SLIDERS)``."""
