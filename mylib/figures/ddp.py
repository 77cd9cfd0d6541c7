"""Chapter 3's six-panel strip: one step of MyDDP at six moments.

:func:`ddp_step_strip` draws one data-parallel step (a timeline of
:mod:`mylib.models.timeline`) at six moments, each bucket coloured by its
state: filling, queued, all-reducing, done. Standard library only: the
static site runs this file in the reader's browser.
"""

from mylib.figures.spans import span_fill
from mylib.figures.svg import PALETTE, Svg
from mylib.figures.timeline import LANE_GAP, LANE_H, LEFT, layer_shader

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
    if not (
        comm and backward and opt and len(comm) >= 2 and timeline.exposed_comm_s > 0
    ):
        raise ValueError(
            "the strip needs a forward, an optimizer step, >= 2 buckets "
            "and some exposed communication"
        )
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


BUCKET_STATES = {
    "filling": PALETTE["idle"],
    "queued": "#fdd0a2",
    "all-reducing": PALETTE["comm"],
    "averaged": PALETTE["accent"],
}


def bucket_states(timeline, t):
    """The state of each bucket at time ``t``.

    A bucket is filling (gradients missing), queued (ready, link busy),
    all-reducing or averaged.
    """
    states = []
    for span in (s for s in timeline.spans if s.kind == "allreduce"):
        ready, start, end = (
            x - timeline.start_s for x in (span.ready_s, span.start_s, span.end_s)
        )
        states.append(
            "averaged"
            if end <= t
            else "all-reducing"
            if start <= t
            else "queued"
            if ready <= t
            else "filling"
        )
    return states


def ddp_step_strip(timeline, *, width=780):
    """Six panels of one DDP step, each the timeline up to a moment.

    Every panel also shows each bucket's state (:func:`bucket_states`).
    """
    moments = strip_moments(timeline)
    cols, panel_w, panel_h = 2, width / 2, 124
    rows = (len(STRIP_CAPTIONS) + cols - 1) // cols
    fig = Svg(width, rows * panel_h + 26, label="one DDP step in six panels")
    states_at = [bucket_states(timeline, t) for t in moments]
    shown = {state for states in states_at for state in states}
    x = 8
    for state, colour in BUCKET_STATES.items():  # the legend: the states drawn
        if state not in shown:
            continue
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
            fig.text(
                ox + LEFT * 0.7 - 6,
                lanes_y + i * (LANE_H + LANE_GAP) + LANE_H - 4,
                lane,
                anchor="end",
                size=10,
                fill=PALETTE["muted"],
            )
        shade = layer_shader()
        for span in timeline.spans:
            i = shade(span)
            ly = lanes_y + timeline.lanes.index(span.lane) * (LANE_H + LANE_GAP)
            start, end = span.start_s - timeline.start_s, span.end_s - timeline.start_s
            done_end = min(end, t)
            if done_end > start:
                fig.rect(
                    x_of(start),
                    ly,
                    max(x_of(done_end) - x_of(start), 0.6),
                    LANE_H,
                    fill=span_fill(span, i),
                )
            if end > t:
                fig.rect(
                    x_of(max(start, t)),
                    ly,
                    x_of(end) - x_of(max(start, t)),
                    LANE_H,
                    fill=span_fill(span, i),
                    opacity=0.15,
                )
        fig.line(
            x_of(t),
            lanes_y - 4,
            x_of(t),
            lanes_y + 2 * (LANE_H + LANE_GAP),
            stroke=PALETTE["text"],
            stroke_width=1.5,
        )
        states = states_at[k]
        by = lanes_y + 2 * (LANE_H + LANE_GAP) + 10
        fig.text(ox + 8, by + 10, "buckets", size=10, fill=PALETTE["muted"])
        box = min(14.0, (panel_w - 70) / max(len(states), 1) - 2)
        for j, state in enumerate(states):
            fig.rect(
                ox + 58 + j * (box + 2),
                by,
                box,
                box,
                fill=BUCKET_STATES[state],
                title=f"bucket {j}: {state}",
            )
        counts = {s: states.count(s) for s in BUCKET_STATES}
        fig.text(
            ox + 8,
            by + 32,
            ", ".join(f"{n} {s}" for s, n in counts.items() if n),
            size=10,
            fill=PALETTE["muted"],
        )
    return fig.to_string()
