"""Spans (:mod:`mylib.models.spans`) as a lane's boxes, in compact SVG.

What every timeline figure redraws most.
A live figure redraws hundreds of boxes per slider move, in the reader's browser
(Pyodide, several times slower than CPython), and the page then parses them. So a
lane is written once with what its boxes share: one ``<g>`` moves the lane to its
height, one ``<g>`` per paint holds the boxes of that colour, and a box is a
``<rect>`` with its x, its width and its tooltip. Boxes too narrow to point at
(under :data:`NARROW_PX`), such as one all-reduce per parameter, are drawn as
stripes, one ``<path>`` per paint, and a run of them shares one tooltip: the same
picture, with far fewer elements and far fewer tooltips to format.

:func:`span_boxes` groups a lane's spans into boxes (neighbouring spans of one
layer, and runs of spans too thin to tell apart); :func:`lane_markup` writes
boxes and :func:`draw_boxes` puts them in place. Standard library only (it runs
under Pyodide).
"""

from mylib.figures.svg import PALETTE, _escape, _num, format_seconds
from mylib.models.buckets import MB

LANE_H = 16
# spans narrower than this are drawn together: a redraw stays fast, and the
# picture is the same
MIN_PX = 1.5
# a box narrower than this, next to others (less than RUN_GAP_PX apart), is a stripe
# without a tooltip of its own: hard to point at, its run has one
NARROW_PX = 6.0
RUN_GAP_PX = 1.5
MIN_BOX_PX = 0.6  # the narrowest box drawn, so that a very short span is still seen


def span_fill(span, index):
    """Alternate two shades per lane so neighbouring layers and buckets stand apart."""
    if span.kind == "allreduce":
        return PALETTE["comm"] if index % 2 == 0 else PALETTE["comm_alt"]
    if span.kind == "backward":
        return PALETTE["compute"] if index % 2 == 0 else "#6baed6"
    return PALETTE.get(span.kind, PALETTE["idle"])


def paint(fill, opacity=None):
    """The attributes a box's colour is written with: its group's key."""
    return f'fill="{fill}"' + (f' opacity="{opacity}"' if opacity else "")


def box(x0, x1, paint_, span):
    """One box of a lane, of one span: ``[x0, x1, paint, n, first, last, nbytes]``.

    From ``x0`` to ``x1`` (px), drawn with ``paint``; it holds ``n`` spans, from
    ``first`` to ``last``, ``nbytes`` in all. A list, not an object: a redraw
    makes hundreds, and Pyodide pays for every attribute.
    """
    return [x0, x1, paint_, 1, span, span, span.nbytes]


def span_boxes(spans, x_of, t0):
    """Group a lane's spans into boxes (:func:`box`), in time order.

    ``x_of`` is a :class:`mylib.figures.timeline.TimeScale`. Neighbouring spans
    of one layer (the label up to its first dot; same shade) become one box;
    runs of spans too narrow to see apart (under :data:`MIN_PX` on average)
    become one box in the lane's colour.
    """
    # hot: a redraw walks every span of every lane, so x_of is inlined here,
    # with the same arithmetic
    left, width, t_max = x_of.left, x_of.width, x_of.t_max
    boxes, last, last_group, shade = [], None, None, -1
    for span in spans:
        group = span.label.partition(".")[0]
        if group != last_group:  # each layer its shade, alternating
            shade += 1
            last_group = group
        x0 = left + width * (span.start_s - t0) / t_max
        x1 = left + width * (span.end_s - t0) / t_max
        fill = span_fill(span, shade)
        if last is not None and x0 - last[1] < 0.5:
            same_layer = last[7] == group and last[2] == fill
            if same_layer or (
                x1 - x0 < MIN_PX and last[1] - last[0] < MIN_PX * last[3]
            ):
                if not same_layer:
                    last[2] = (
                        PALETTE["comm"]
                        if span.kind == "allreduce"
                        else PALETTE["compute"]
                    )
                if x1 > last[1]:
                    last[1] = x1
                last[3] += 1
                last[5] = span
                last[6] += span.nbytes
                continue
        # a box, and its layer for the merging above
        last = [x0, x1, fill, 1, span, span, span.nbytes, group]
        boxes.append(last)
    for b in boxes:
        b[2] = f'fill="{b[2]}"'
    return boxes


def box_tip(box, t0=0.0):
    """A box's tooltip: its span, or its spans from first to last."""
    first, n = box[4], box[3]
    if n == 1:
        what = (
            f"{first.label}: {first.kind}"
            if first.label and first.label != first.kind
            else first.kind
        )
        size = f", {_megabytes(first.nbytes)}" if first.nbytes else ""
        return (
            f"{what}{size}, {format_seconds(first.start_s)} to "
            f"{format_seconds(first.end_s)}"
        )
    return run_tip(first, box[5], n, box[6], t0)


def _megabytes(nbytes):
    """``0.004 MB``, ``32 MB``, ``1,153 MB``: three digits, never an exponent."""
    mb = nbytes / MB
    return f"{mb:.3g} MB" if mb < 1000 else f"{mb:,.0f} MB"


def run_tip(first, last, n, nbytes, t0=0.0):
    """The tooltip of ``n`` spans drawn together, ``first`` to ``last``."""
    label = group_label = first.label.partition(".")[0]
    if label != last.label.partition(".")[0]:
        group_label = f"{label} to {last.label.partition('.')[0]}"
    kind = f"{first.kind} " if first.kind == last.kind else ""
    size = f", {_megabytes(nbytes)}" if nbytes else ""
    return (
        f"{group_label}: {n} {kind}spans{size}, "
        f"{format_seconds(first.start_s - t0)} to {format_seconds(last.end_s - t0)}"
    )


def lane_markup(boxes, tip=box_tip, t0=0.0):
    """SVG of a lane's ``boxes`` (:func:`box`, in time order), at height 0.

    :func:`draw_boxes` puts it at a lane's height; the same markup serves
    lanes alike at other heights. ``tip(box, t0)`` gives a box's tooltip; it is
    called only for boxes drawn with one of their own. Boxes under
    :data:`NARROW_PX`, each less than :data:`RUN_GAP_PX` after the last, are
    drawn as stripes under one tooltip (:func:`run_tip`); a lone one keeps its own.
    """
    rects = {}  # paint -> the rects of that paint
    runs = []  # the markup of each run of stripes
    run = []

    def close_run():
        if len(run) == 1:
            x0, x1, paint_ = run[0][:3]
            rects.setdefault(paint_, []).append(
                f'<rect x="{x0:.1f}" width="{max(x1 - x0, MIN_BOX_PX):.1f}" '
                f'height="{LANE_H}"><title>{_escape(tip(run[0], t0))}</title></rect>'
            )
        else:
            stripes = {}
            n = nbytes = 0
            for x0, x1, paint_, count, _, _, size, *_ in run:
                stripes.setdefault(paint_, []).append(stripe(x0, x1))
                n += count
                nbytes += size
            runs.append(
                titled_stripes(run_tip(run[0][4], run[-1][5], n, nbytes, t0), stripes)
            )
        run.clear()

    run_end = None
    for b in boxes:
        x0, x1 = b[0], b[1]
        if x1 - x0 < NARROW_PX:
            if run and x0 - run_end >= RUN_GAP_PX:
                close_run()
            run.append(b)
            run_end = x1
            continue
        if run:
            close_run()
        rects.setdefault(b[2], []).append(
            f'<rect x="{x0:.1f}" width="{x1 - x0:.1f}" height="{LANE_H}">'
            f"<title>{_escape(tip(b, t0))}</title></rect>"
        )
    if run:
        close_run()
    return "".join(f"<g {p}>{''.join(r)}</g>" for p, r in rects.items()) + "".join(runs)


def stripe(x0, x1):
    """Path data of a box from ``x0`` to ``x1`` at height 0 (MIN_BOX_PX at least)."""
    w = max(x1 - x0, MIN_BOX_PX)
    return f"M{x0:.1f} 0h{w:.1f}v{LANE_H}h-{w:.1f}z"


def titled_stripes(title, stripes):
    """Stripes under one tooltip; ``stripes``: a paint to its :func:`stripe` data."""
    return (
        f"<g><title>{_escape(title)}</title>"
        + "".join(f'<path {p} d="{"".join(d)}"/>' for p, d in stripes.items())
        + "</g>"
    )


def draw_boxes(fig, markup, y):
    """Put a lane's boxes (:func:`lane_markup`) on ``fig`` at height ``y``."""
    fig.raw(f'<g transform="translate(0 {_num(float(y))})">{markup}</g>')
