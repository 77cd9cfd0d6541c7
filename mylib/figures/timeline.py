"""Drawing timelines: the model's and a measured run's, with one drawing code.

:func:`draw_timelines` stacks timelines on one time axis, each with a
compute lane (forward, backward per layer, optimizer) and a comm lane (one box
per all-reduce), marks where the backward ends, frames the exposed
communication in red and prints the panel of numbers: step time, exposed
communication, overlap, buckets. Each number also sits in the SVG as
``data-metric``/``data-value`` attributes, so a test can read it exactly.

:func:`bucketing_figure` is the render function of chapter 3's live figure
(sliders: :data:`BUCKETING_SLIDERS`): three timelines of one step of a stack
of transformer blocks: one all-reduce after the backward, one per parameter,
and DDP's buckets. Other chapters draw their own timelines with
:func:`draw_timelines`, or with its pieces (:func:`draw_lane`,
:mod:`mylib.figures.spans`, :func:`frame_exposed`, :func:`draw_numbers`,
:func:`swatch`). Standard library only (it runs under Pyodide).
"""

import functools

from mylib.figures.livefig import choices, settings, steps
from mylib.figures.spans import (
    LANE_H,
    draw_boxes,
    lane_markup,
    span_boxes,
)
from mylib.figures.svg import PALETTE, Svg, format_seconds, time_axis
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.layers import BLOCK_BYTES, transformer_blocks

LANE_GAP, TITLE_H, BLOCK_GAP = 4, 18, 14
LEFT, PANEL_W, AXIS_H = 70, 160, 52


def layer_shader():
    """A function giving each span its shade index, which changes with the layer.

    A span's layer is its label up to the first dot.
    """
    last, counters = {}, {}

    def shade(span):
        group = span.label.split(".", 1)[0]
        if last.get(span.lane) != group:
            counters[span.lane] = counters.get(span.lane, -1) + 1
            last[span.lane] = group
        return counters[span.lane]

    return shade


def _metric_lines(timeline):
    # four digits for the step: two caps a figure is asked to tell apart can end
    # 0.1% apart (chapter 3's exercise: 2.153 s against 2.150 s)
    return [
        ("step_s", "step", format_seconds(timeline.step_s, 4)),
        ("exposed_comm_s", "exposed comm", format_seconds(timeline.exposed_comm_s)),
        ("overlap", "overlap", f"{timeline.overlap:.0%}"),
        ("n_buckets", "buckets", str(timeline.n_buckets)),
    ]


class TimeScale:
    """Seconds to x: ``left + width * t / t_max`` (a drawing's time axis)."""

    def __init__(self, left, width, t_max):
        self.left, self.width, self.t_max = left, width, t_max

    def __call__(self, t):
        return self.left + self.width * t / self.t_max


# -- the pieces every timeline figure draws with (chapters 3 to 6) ------------


def lane_heights(lanes, y):
    """The height of each of ``lanes`` in a row whose title is at height ``y``."""
    return {lane: y + TITLE_H + i * (LANE_H + LANE_GAP) for i, lane in enumerate(lanes)}


def draw_lane(fig, lane, y, x0, x1, left=LEFT):
    """A lane's grey background from ``x0`` to ``x1`` at height ``y``.

    Its name ends just left of ``left``.
    """
    fig.rect(x0, y, x1 - x0, LANE_H, fill="#f4f4f4")
    fig.text(
        left - 6, y + LANE_H - 4, lane, anchor="end", size=11, fill=PALETTE["muted"]
    )


def frame_exposed(fig, x0, x1, y, title):
    """A red frame, from ``x0`` to ``x1``, round the comm lane at height ``y``.

    It marks communication that the compute waits for.
    """
    fig.rect(
        x0,
        y - 2,
        x1 - x0,
        LANE_H + 4,
        fill="none",
        stroke=PALETTE["exposed"],
        stroke_width=2,
        title=title,
    )


def draw_numbers(fig, x, y, numbers, line_h=14, **attrs):
    """A row's panel: one number a line, from baseline ``y`` down.

    ``numbers`` holds ``(key, text, value, warn)``: the text is printed (in
    red if ``warn``), key and value go in ``data-metric``/``data-value``
    attributes after ``attrs``, so that a test can read each number exactly.
    """
    for j, (key, text, value, warn) in enumerate(numbers):
        fig.text(
            x,
            y + j * line_h,
            text,
            size=11,
            fill=PALETTE["exposed"] if warn else PALETTE["text"],
            **attrs,
            data_metric=key,
            data_value=repr(value),
        )


def panel_numbers(timeline, lines):
    """``(key, text, value, warn)`` of each of ``lines``, for :func:`draw_numbers`.

    ``lines`` holds ``(key, label, text)``: the value is the timeline's
    attribute ``key``; exposed communication, if any, is printed in red.
    """
    return [
        (
            key,
            f"{label}: {text}",
            getattr(timeline, key),
            key == "exposed_comm_s" and timeline.exposed_comm_s > 0,
        )
        for key, label, text in lines
    ]


def swatch(fig, x, y, label, fill, **attrs):
    """A legend entry on baseline ``y``: a square of ``fill``, its label after it."""
    fig.rect(x, y - 9, 10, 10, fill=fill, **attrs)
    fig.text(x + 14, y, label, size=10, fill=PALETTE["muted"])


def _draw_lanes(fig, timeline, y, x_of, laid_out):
    """Draw a timeline's lanes, its row's title at ``y``; returns each lane's height.

    ``laid_out`` maps the lanes already laid out in this drawing to their
    markup, by the identity of their spans: model timelines that compute alike
    share their compute spans (:func:`mylib.models.playout._compute_spans`), and
    a lane's markup does not depend on its height (its ``<g>`` moves it).
    """
    lane_y = lane_heights(timeline.lanes, y)
    for lane, ly in lane_y.items():
        draw_lane(fig, lane, ly, x_of(0), x_of(timeline.step_s))
        spans = [s for s in timeline.spans if s.lane == lane]
        key = (timeline.start_s, *map(id, spans))  # the spans live till the end
        if key not in laid_out:
            t0 = timeline.start_s
            laid_out[key] = lane_markup(span_boxes(spans, x_of, t0), t0=t0)
        draw_boxes(fig, laid_out[key], ly)
    return lane_y


# the legend's entries, in its order: (span kind, label, colour)
LEGEND = (
    ("forward", "forward", PALETTE["forward"]),
    ("backward", "backward, per layer", PALETTE["compute"]),
    ("sync", "waiting for the all-reduces", PALETTE["idle"]),
    ("optimizer", "optimizer", PALETTE["optimizer"]),
    ("allreduce", "all-reduce, per bucket", PALETTE["comm"]),
)


def _legend(fig, x, y, timelines):
    """The legend of :func:`draw_timelines`: only what the timelines draw."""
    drawn = {span.kind for timeline in timelines for span in timeline.spans}
    for kind, label, colour in LEGEND:
        if kind in drawn:
            swatch(fig, x, y, label, colour)
            x += 24 + 5.6 * len(label)
    if any(t.exposed_comm_s > 0 and tl.COMM in t.lanes for t in timelines):
        fig.rect(
            x, y - 10, 16, 12, fill="none", stroke=PALETTE["exposed"], stroke_width=2
        )
        fig.text(x + 20, y, "exposed communication", size=10, fill=PALETTE["muted"])
        x += 30 + 5.6 * len("exposed communication")
    fig.line(x, y - 11, x, y + 2, stroke=PALETTE["text"], stroke_dasharray="3,2")
    fig.text(x + 5, y, "backward ends", size=10, fill=PALETTE["muted"])


def draw_timelines(timelines, *, width=780, t_max_s=None, title=None, panel=True):
    """One SVG of several timelines on a shared time axis.

    For example the model above and a measured run below. ``t_max_s`` fixes
    the axis length (default: the longest step), so figures for different
    slider positions can share a scale when wanted.
    """
    timelines = list(timelines)
    if not timelines:
        raise ValueError("draw_timelines needs at least one Timeline")
    t_max = t_max_s or max(t.step_s for t in timelines) or 1e-9
    plot_w = width - LEFT - (PANEL_W if panel else 12)
    top = 24 if title else 6
    block_h = (
        TITLE_H + max(len(t.lanes) for t in timelines) * (LANE_H + LANE_GAP) + BLOCK_GAP
    )
    height = top + len(timelines) * block_h + AXIS_H
    fig = Svg(width, height, label=title or "timeline of a data-parallel step")
    if title:
        fig.text(LEFT, 16, title, size=13, weight="bold")

    x_of = TimeScale(LEFT, plot_w, t_max)
    time_axis(fig, x_of, t_max, top, height - AXIS_H + 4, height - AXIS_H + 17)
    fig.text(
        LEFT + plot_w / 2,
        height - AXIS_H + 30,
        "time since the step began",
        anchor="middle",
        size=10,
        fill=PALETTE["muted"],
    )
    _legend(fig, LEFT, height - 8, timelines)
    laid_out = {}  # lane -> boxes, for _draw_lanes
    for k, timeline in enumerate(timelines):
        y = top + k * block_h
        fig.text(LEFT, y + 12, timeline.name, size=12, weight="bold")
        lane_y = _draw_lanes(fig, timeline, y, x_of, laid_out)
        end_bwd = timeline.backward_end_s
        lanes_bottom = (
            y + TITLE_H + len(timeline.lanes) * (LANE_H + LANE_GAP) - LANE_GAP
        )
        fig.line(
            x_of(end_bwd),
            y + TITLE_H - 3,
            x_of(end_bwd),
            lanes_bottom + 3,
            stroke=PALETTE["text"],
            stroke_dasharray="3,2",
        )
        if timeline.exposed_comm_s > 0 and tl.COMM in lane_y:
            frame_exposed(
                fig,
                x_of(end_bwd),
                x_of(end_bwd + timeline.exposed_comm_s),
                lane_y[tl.COMM],
                f"exposed communication: {format_seconds(timeline.exposed_comm_s)}",
            )
        if panel:
            numbers = panel_numbers(timeline, _metric_lines(timeline))
            draw_numbers(fig, width - PANEL_W + 12, y + 12, numbers, data_timeline=k)
    return fig.to_string()


# -- chapter 3's live figure ----------------------------------------


@functools.lru_cache(maxsize=16)  # a link slider moves: the same layers
def _blocks(n_layers, backward_ms_per_layer):
    return tuple(transformer_blocks(n_layers, backward_ms_per_layer))


def bucketing_timelines(**values):
    """The three timelines of :func:`bucketing_figure`, for its slider values.

    One all-reduce after the backward, one per parameter, and DDP's buckets.
    A value left out takes its slider's default (:data:`BUCKETING_SLIDERS`).
    """
    s = settings(BUCKETING_SLIDERS, values)
    layers = _blocks(s.n_layers, s.backward_ms_per_layer)
    link = tl.Link(s.ranks, s.latency_us * 1e-6, s.bandwidth_gb_s * 1e9)
    cap = s.bucket_cap_mb
    return [
        tl.all_at_end(layers, link),
        tl.per_parameter(layers, link),
        tl.simulate(layers, cap * MB, link, name=f"buckets of {cap:g} MB (DDP)"),
    ]


def bucketing_figure(**values):
    """Chapter 3's figure (an SVG string): the two baselines and DDP's buckets.

    ``values`` are slider values (:data:`BUCKETING_SLIDERS`): bandwidth in GB/s
    (1e9 bytes/s), the cap in MB (2**20 bytes, as PyTorch's ``bucket_cap_mb``),
    latency in microseconds per message.
    """
    s = settings(BUCKETING_SLIDERS, values)
    title = (
        f"{s.n_layers} transformer blocks "
        f"({s.n_layers * BLOCK_BYTES / MB:,.0f} MB of gradients), {s.ranks} ranks, "
        f"{s.bandwidth_gb_s:g} GB/s, {s.latency_us:g} µs per message"
    )
    return draw_timelines(bucketing_timelines(**vars(s)), title=title)


def bandwidth_choices(values, default):
    """The slider of the link's bandwidth ``bandwidth_gb_s``, in GB/s.

    Every timeline figure has one, among its own ``values``.
    """
    return choices("bandwidth_gb_s", "bandwidth", values, default, "{:g} GB/s")


# The sliders of the chapter's LiveFigure(bucketing_figure, BUCKETING_SLIDERS), as
# dicts of Slider arguments.
BUCKETING_SLIDERS = [
    steps("n_layers", "layers (blocks)", 1, 96, 1, 24),
    choices(
        "bucket_cap_mb",
        "bucket cap",
        [("0: per parameter", 0.0)]
        + [1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0],
        25.0,
        "{:g} MB",
    ),
    bandwidth_choices((1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0), 25.0),
    choices(
        "latency_us",
        "latency per message",
        (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0),
        50.0,
        "{:g} µs",
    ),
    steps("backward_ms_per_layer", "backward per block", 1.0, 40.0, 1.0, 10.0, "ms"),
    choices("ranks", "ranks", (2, 4, 8, 16, 32, 64, 128, 256), 8),
]
