"""Chapter 3's figures: the live bucketing figure and the six-panel strip of one DDP step.

:func:`bucketing_figure` is the render function of the chapter's
:class:`mylib.livefig.LiveFigure` (sliders: :data:`BUCKETING_SLIDERS`): three
timelines of one step of a stack of transformer blocks (all-reduce after the
backward, one per parameter, DDP's buckets) drawn with
:func:`mylib.timeline_svg.draw_timelines`. :func:`ddp_step_strip` draws one
step at six moments, with each bucket's state. Standard library only: the
static site runs this file in the reader's browser.
"""

from mylib import timeline as tl
from mylib.buckets import MB
from mylib.svg import PALETTE, Svg
from mylib.timeline_svg import LANE_GAP, LANE_H, LEFT, draw_timelines, layer_shader, span_fill

WIDTH = 1024  # the figure's model: GPT-2-style transformer blocks of width 1024 (GPT-2 medium's), fp32 gradients

# One block's parameters, as (sub-layer, gradient bytes of its parameters in backward order: bias, then weight),
# in backward order: the MLP first, then the attention. 12 tensors, 12.6 M parameters, 48 MB.
BLOCK = (
    ("mlp.c_proj", (4 * WIDTH, 4 * 4 * WIDTH * WIDTH)),
    ("mlp.c_fc", (4 * 4 * WIDTH, 4 * 4 * WIDTH * WIDTH)),
    ("ln_2", (4 * WIDTH, 4 * WIDTH)),
    ("attn.c_proj", (4 * WIDTH, 4 * WIDTH * WIDTH)),
    ("attn.c_attn", (4 * 3 * WIDTH, 4 * 3 * WIDTH * WIDTH)),
    ("ln_1", (4 * WIDTH, 4 * WIDTH)),
)
BLOCK_BYTES = sum(sum(sizes) for _, sizes in BLOCK)


def figure_layers(n_layers, backward_ms_per_layer):
    """The layers of :func:`bucketing_figure`: ``n_layers`` transformer blocks, in backward order.

    Each block is split into its six sub-layers, so that gradients become
    ready through the block, not all at its end; a sub-layer's share of the
    block's backward time is its share of the parameters (the matmul FLOPs).
    """
    return [tl.Layer(f"block{i}.{name}", backward_ms_per_layer * 1e-3 * sum(sizes) / BLOCK_BYTES, sizes)
            for i in reversed(range(int(n_layers))) for name, sizes in BLOCK]


def bucketing_timelines(n_layers=24, bucket_cap_mb=25.0, bandwidth_gb_s=25.0, latency_us=50.0,
                        backward_ms_per_layer=10.0, ranks=8):
    """The three timelines of :func:`bucketing_figure`: all at end, per parameter, DDP's buckets."""
    layers = figure_layers(n_layers, backward_ms_per_layer)
    link = tl.Link(ranks, latency_us * 1e-6, bandwidth_gb_s * 1e9)
    return [tl.all_at_end(layers, link), tl.per_parameter(layers, link),
            tl.simulate(layers, bucket_cap_mb * MB, link, name=f"buckets of {bucket_cap_mb:g} MB (DDP)")]


def bucketing_figure(n_layers=24, bucket_cap_mb=25.0, bandwidth_gb_s=25.0, latency_us=50.0,
                     backward_ms_per_layer=10.0, ranks=8):
    """Chapter 3's figure: the two baselines and DDP's buckets for one set of slider values (an SVG string).

    Bandwidth is in GB/s (1e9 bytes/s), the cap in MB (2**20 bytes, as
    PyTorch's ``bucket_cap_mb``), latency in microseconds per message.
    """
    rows = bucketing_timelines(n_layers, bucket_cap_mb, bandwidth_gb_s, latency_us, backward_ms_per_layer, ranks)
    title = (f"{n_layers} transformer blocks ({n_layers * BLOCK_BYTES / MB:,.0f} MB of gradients), {ranks} ranks, "
             f"{bandwidth_gb_s:g} GB/s, {latency_us:g} us per message")
    return draw_timelines(rows, title=title)


# The sliders of the chapter's LiveFigure(bucketing_figure, BUCKETING_SLIDERS) (dicts: no import of livefig here).
BUCKETING_SLIDERS = [
    dict(name="n_layers", label="layers (blocks)", min=1, max=96, step=1, default=24),
    dict(name="bucket_cap_mb", label="bucket cap",
         options=[("0: per parameter", 0.0)] + [(f"{c:g} MB", c) for c in (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0,
                                                                            200.0, 400.0)], default=25.0),
    dict(name="bandwidth_gb_s", label="bandwidth",
         options=[(f"{b:g} GB/s", b) for b in (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)], default=25.0),
    dict(name="latency_us", label="latency per message",
         options=[(f"{a:g} us", a) for a in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)], default=50.0),
    dict(name="backward_ms_per_layer", label="backward per block", min=1.0, max=40.0, step=1.0, default=10.0,
         unit="ms"),
    dict(name="ranks", label="ranks", options=[(str(n), n) for n in (2, 4, 8, 16, 32, 64, 128, 256)], default=8),
]


STRIP_CAPTIONS = (
    "1. forward",
    "2. backward of the last layers",
    "3. the first bucket fires",
    "4. backward and all-reduce overlap",
    "5. wait for the last bucket",
    "6. optimizer step",
)


def strip_moments(timeline):
    """The six moments of :func:`ddp_step_strip`, in seconds since the step began."""
    comm = [s for s in timeline.spans if s.kind == "allreduce"]
    backward = [s for s in timeline.spans if s.kind == "backward"]
    opt = [s for s in timeline.spans if s.kind == "optimizer"]
    if not (comm and backward and opt and len(comm) >= 2 and timeline.exposed_comm_s > 0):
        raise ValueError("the strip needs a forward, an optimizer step, >= 2 buckets and some exposed communication")
    t0 = timeline.start_s
    first = comm[0].start_s - t0
    bwd_start, bwd_end = backward[0].start_s - t0, timeline.backward_end_s
    return [
        backward[0].start_s / 2 - t0 / 2,
        (bwd_start + first) / 2,
        first + min(comm[0].duration_s, bwd_end - first) / 2,
        (max(first + comm[0].duration_s, bwd_start) + bwd_end) / 2,
        bwd_end + timeline.exposed_comm_s / 2,
        (opt[0].start_s + opt[0].end_s) / 2 - t0,
    ]


BUCKET_STATES = {"filling": PALETTE["idle"], "queued": "#fdd0a2", "all-reducing": PALETTE["comm"],
                 "averaged": PALETTE["accent"]}


def bucket_states(timeline, t):
    """Each bucket at time ``t``: filling (gradients missing), queued (ready, link busy), all-reducing, averaged."""
    states = []
    for span in (s for s in timeline.spans if s.kind == "allreduce"):
        ready, start, end = (x - timeline.start_s for x in (span.ready_s, span.start_s, span.end_s))
        states.append("averaged" if end <= t else "all-reducing" if start <= t else "queued" if ready <= t
                      else "filling")
    return states


def ddp_step_strip(timeline, *, width=780):
    """Six panels of one DDP step, each the timeline up to a moment, with every bucket's state."""
    moments = strip_moments(timeline)
    cols, panel_w, panel_h = 2, width / 2, 124
    rows = (len(STRIP_CAPTIONS) + cols - 1) // cols
    fig = Svg(width, rows * panel_h + 26, label="one DDP step in six panels")
    x = 8
    for state, colour in BUCKET_STATES.items():  # the legend of the bucket squares
        fig.rect(x, rows * panel_h + 10, 10, 10, fill=colour)
        fig.text(x + 14, rows * panel_h + 19, state, size=10, fill=PALETTE["muted"])
        x += 30 + 6 * len(state)
    for k, (t, caption) in enumerate(zip(moments, STRIP_CAPTIONS)):
        ox, oy = (k % cols) * panel_w, (k // cols) * panel_h

        def x_of(s, ox=ox):
            return ox + LEFT * 0.7 + (panel_w - LEFT * 0.7 - 12) * s / timeline.step_s

        fig.text(ox + 8, oy + 16, caption, size=12, weight="bold")
        lanes_y = oy + 26
        for i, lane in enumerate(timeline.lanes):
            fig.text(ox + LEFT * 0.7 - 6, lanes_y + i * (LANE_H + LANE_GAP) + LANE_H - 4, lane, anchor="end",
                     size=10, fill=PALETTE["muted"])
        shade = layer_shader()
        for span in timeline.spans:
            i = shade(span)
            ly = lanes_y + timeline.lanes.index(span.lane) * (LANE_H + LANE_GAP)
            start, end = span.start_s - timeline.start_s, span.end_s - timeline.start_s
            done_end = min(end, t)
            if done_end > start:
                fig.rect(x_of(start), ly, max(x_of(done_end) - x_of(start), 0.6), LANE_H, fill=span_fill(span, i))
            if end > t:
                fig.rect(x_of(max(start, t)), ly, x_of(end) - x_of(max(start, t)), LANE_H, fill=span_fill(span, i),
                         opacity=0.15)
        fig.line(x_of(t), lanes_y - 4, x_of(t), lanes_y + 2 * (LANE_H + LANE_GAP), stroke=PALETTE["text"],
                 stroke_width=1.5)
        states = bucket_states(timeline, t)
        by = lanes_y + 2 * (LANE_H + LANE_GAP) + 10
        fig.text(ox + 8, by + 10, "buckets", size=10, fill=PALETTE["muted"])
        box = min(14.0, (panel_w - 70) / max(len(states), 1) - 2)
        for j, state in enumerate(states):
            fig.rect(ox + 58 + j * (box + 2), by, box, box, fill=BUCKET_STATES[state], title=f"bucket {j}: {state}")
        counts = {s: states.count(s) for s in BUCKET_STATES}
        fig.text(ox + 8, by + 32, ", ".join(f"{n} {s}" for s, n in counts.items() if n), size=10,
                 fill=PALETTE["muted"])
    return fig.to_string()
