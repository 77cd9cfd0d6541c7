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
:func:`draw_timelines`. Standard library only (it runs under Pyodide).
"""

from mylib.figures.svg import PALETTE, Svg, format_seconds, time_axis
from mylib.models import timeline as tl
from mylib.models.buckets import MB
from mylib.models.layers import BLOCK_BYTES, transformer_blocks

LANE_H, LANE_GAP, TITLE_H, BLOCK_GAP = 16, 4, 18, 14
LEFT, PANEL_W, AXIS_H = 70, 160, 52


def span_fill(span, index):
    """Alternate two shades per lane so neighbouring layers and buckets stand apart."""
    if span.kind == "allreduce":
        return PALETTE["comm"] if index % 2 == 0 else PALETTE["comm_alt"]
    if span.kind == "backward":
        return PALETTE["compute"] if index % 2 == 0 else "#6baed6"
    return PALETTE.get(span.kind, PALETTE["idle"])


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


def _tooltip(span):
    what = (
        f"{span.label}: {span.kind}"
        if span.label and span.label != span.kind
        else span.kind
    )
    size = f", {span.nbytes / MB:.3g} MB" if span.nbytes else ""
    return (
        f"{what}{size}, {format_seconds(span.start_s)} to {format_seconds(span.end_s)}"
    )


def _metric_lines(timeline):
    return [
        ("step_s", "step", format_seconds(timeline.step_s)),
        ("exposed_comm_s", "exposed comm", format_seconds(timeline.exposed_comm_s)),
        ("overlap", "overlap", f"{timeline.overlap:.0%}"),
        ("n_buckets", "buckets", str(timeline.n_buckets)),
    ]


# spans narrower than this are drawn together: a redraw stays fast, and the
# picture is the same
MIN_PX = 1.5


def _boxes(spans, x_of, t0):
    """Group a lane's spans into boxes to draw: ``(x0, x1, fill, tooltip)``.

    Neighbouring spans of one layer (same shade) become one box; runs of
    spans too narrow to see apart become one box in the lane's colour.
    """
    boxes, shade = [], layer_shader()
    for span in spans:
        i = shade(span)
        x0, x1, fill = (
            x_of(span.start_s - t0),
            x_of(span.end_s - t0),
            span_fill(span, i),
        )
        group = span.label.split(".", 1)[0]
        if boxes:
            last = boxes[-1]
            same_layer = (
                last["fill"] == fill
                and last["group"] == group
                and x0 - last["x1"] < 0.5
            )
            both_thin = (
                x1 - x0 < MIN_PX
                and last["x1"] - last["x0"] < MIN_PX * last["n"]
                and x0 - last["x1"] < 0.5
            )
            if same_layer or both_thin:
                if not same_layer:
                    last["fill"] = (
                        PALETTE["comm"]
                        if span.kind == "allreduce"
                        else PALETTE["compute"]
                    )
                last.update(
                    x1=max(last["x1"], x1),
                    end=span.end_s,
                    n=last["n"] + 1,
                    nbytes=last["nbytes"] + span.nbytes,
                    last_label=span.label,
                )
                continue
        boxes.append(
            dict(
                x0=x0,
                x1=x1,
                fill=fill,
                group=group,
                n=1,
                first=span,
                end=span.end_s,
                nbytes=span.nbytes,
                last_label=span.label,
            )
        )
    out = []
    for box in boxes:
        first = box["first"]
        if box["n"] == 1:
            tip = _tooltip(first)
        else:
            label = group_label = first.label.split(".", 1)[0]
            if label != box["last_label"].split(".", 1)[0]:
                group_label = f"{label} to {box['last_label'].split('.', 1)[0]}"
            size = f", {box['nbytes'] / MB:.3g} MB" if box["nbytes"] else ""
            tip = (
                f"{group_label}: {box['n']} {first.kind} spans{size}, "
                f"{format_seconds(first.start_s - t0)} to "
                f"{format_seconds(box['end'] - t0)}"
            )
        out.append((box["x0"], box["x1"], box["fill"], tip))
    return out


def _draw_lanes(fig, timeline, y, x_of):
    """Draw one timeline's lanes from height ``y``; returns each lane's height."""
    lane_y = {
        lane: y + i * (LANE_H + LANE_GAP) for i, lane in enumerate(timeline.lanes)
    }
    for lane, ly in lane_y.items():
        fig.rect(x_of(0), ly, x_of(timeline.step_s) - x_of(0), LANE_H, fill="#f4f4f4")
        fig.text(
            LEFT - 6,
            ly + LANE_H - 4,
            lane,
            anchor="end",
            size=11,
            fill=PALETTE["muted"],
        )
        spans = [s for s in timeline.spans if s.lane == lane]
        for x0, x1, fill, tip in _boxes(spans, x_of, timeline.start_s):
            fig.rect(x0, ly, max(x1 - x0, 0.6), LANE_H, fill=fill, title=tip)
    return lane_y


def _legend(fig, x, y):
    items = [
        ("forward", PALETTE["forward"]),
        ("backward, per layer", PALETTE["compute"]),
        ("optimizer", PALETTE["optimizer"]),
        ("all-reduce, per bucket", PALETTE["comm"]),
    ]
    for label, colour in items:
        fig.rect(x, y - 9, 10, 10, fill=colour)
        fig.text(x + 14, y, label, size=10, fill=PALETTE["muted"])
        x += 24 + 5.6 * len(label)
    fig.rect(x, y - 10, 16, 12, fill="none", stroke=PALETTE["exposed"], stroke_width=2)
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

    def x_of(t):
        return LEFT + plot_w * t / t_max

    time_axis(fig, x_of, t_max, top, height - AXIS_H + 4, height - AXIS_H + 17)
    fig.text(
        LEFT + plot_w / 2,
        height - AXIS_H + 30,
        "time since the step began",
        anchor="middle",
        size=10,
        fill=PALETTE["muted"],
    )
    _legend(fig, LEFT, height - 8)
    for k, timeline in enumerate(timelines):
        y = top + k * block_h
        fig.text(LEFT, y + 12, timeline.name, size=12, weight="bold")
        lane_y = _draw_lanes(fig, timeline, y + TITLE_H, x_of)
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
            ly = lane_y[tl.COMM]
            fig.rect(
                x_of(end_bwd),
                ly - 2,
                x_of(end_bwd + timeline.exposed_comm_s) - x_of(end_bwd),
                LANE_H + 4,
                fill="none",
                stroke=PALETTE["exposed"],
                stroke_width=2,
                title="exposed communication: "
                f"{format_seconds(timeline.exposed_comm_s)}",
            )
        # the numbers, one per line, each readable by a test from its data- attributes
        if panel:
            for j, (key, label, text) in enumerate(_metric_lines(timeline)):
                warn = key == "exposed_comm_s" and timeline.exposed_comm_s > 0
                fig.text(
                    width - PANEL_W + 12,
                    y + 12 + j * 14,
                    f"{label}: {text}",
                    size=11,
                    fill=PALETTE["exposed"] if warn else PALETTE["text"],
                    data_timeline=k,
                    data_metric=key,
                    data_value=repr(getattr(timeline, key)),
                )
    return fig.to_string()


# -- chapter 3's live figure ----------------------------------------


def bucketing_timelines(
    n_layers=24,
    bucket_cap_mb=25.0,
    bandwidth_gb_s=25.0,
    latency_us=50.0,
    backward_ms_per_layer=10.0,
    ranks=8,
):
    """The three timelines of :func:`bucketing_figure`.

    One all-reduce after the backward, one per parameter, and DDP's buckets.
    """
    layers = transformer_blocks(n_layers, backward_ms_per_layer)
    link = tl.Link(ranks, latency_us * 1e-6, bandwidth_gb_s * 1e9)
    return [
        tl.all_at_end(layers, link),
        tl.per_parameter(layers, link),
        tl.simulate(
            layers,
            bucket_cap_mb * MB,
            link,
            name=f"buckets of {bucket_cap_mb:g} MB (DDP)",
        ),
    ]


def bucketing_figure(
    n_layers=24,
    bucket_cap_mb=25.0,
    bandwidth_gb_s=25.0,
    latency_us=50.0,
    backward_ms_per_layer=10.0,
    ranks=8,
):
    """Chapter 3's figure (an SVG string): the two baselines and DDP's buckets.

    The arguments are one set of slider values. Bandwidth is in GB/s (1e9
    bytes/s), the cap in MB (2**20 bytes, as PyTorch's ``bucket_cap_mb``),
    latency in microseconds per message.
    """
    rows = bucketing_timelines(
        n_layers,
        bucket_cap_mb,
        bandwidth_gb_s,
        latency_us,
        backward_ms_per_layer,
        ranks,
    )
    title = (
        f"{n_layers} transformer blocks "
        f"({n_layers * BLOCK_BYTES / MB:,.0f} MB of gradients), {ranks} ranks, "
        f"{bandwidth_gb_s:g} GB/s, {latency_us:g} us per message"
    )
    return draw_timelines(rows, title=title)


# The sliders of the chapter's LiveFigure(bucketing_figure, BUCKETING_SLIDERS), as
# dicts: no import of livefig here.
BUCKETING_SLIDERS = [
    dict(name="n_layers", label="layers (blocks)", min=1, max=96, step=1, default=24),
    dict(
        name="bucket_cap_mb",
        label="bucket cap",
        options=[("0: per parameter", 0.0)]
        + [
            (f"{c:g} MB", c)
            for c in (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)
        ],
        default=25.0,
    ),
    dict(
        name="bandwidth_gb_s",
        label="bandwidth",
        options=[
            (f"{b:g} GB/s", b)
            for b in (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)
        ],
        default=25.0,
    ),
    dict(
        name="latency_us",
        label="latency per message",
        options=[
            (f"{a:g} us", a) for a in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)
        ],
        default=50.0,
    ),
    dict(
        name="backward_ms_per_layer",
        label="backward per block",
        min=1.0,
        max=40.0,
        step=1.0,
        default=10.0,
        unit="ms",
    ),
    dict(
        name="ranks",
        label="ranks",
        options=[(str(n), n) for n in (2, 4, 8, 16, 32, 64, 128, 256)],
        default=8,
    ),
]
