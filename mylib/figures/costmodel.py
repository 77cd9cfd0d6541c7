"""Chapter 1's slider figure: what a ring all-reduce costs, by the alpha-beta model.

:func:`allreduce_cost_figure` draws two log-log panels and a line of numbers:

* left, time against message size for the chosen rank count: flat while
  the latency term ``2(n-1) alpha`` dominates, then rising along the
  bandwidth term ``2(n-1)/n * b / beta``; the two regions are shaded and
  split at ``b = n alpha beta``;
* right, time against rank count for the chosen size: the latency term
  grows with ``n``, the bandwidth term hardly moves;
* the numbers: the predicted time, each term's share, which regime the
  message is in, and the bytes each rank sends.

Standard library only (with :mod:`mylib.figures.svg` and
:mod:`mylib.models.costmodel`): the static site runs this very function in the
reader's browser.
"""

import math

from mylib.figures.svg import (
    PALETTE,
    Axes,
    Svg,
    caption_lines,
    format_bytes,
    format_seconds,
)
from mylib.models.costmodel import crossover_bytes, ring_all_reduce_terms

MIN_BYTES, MAX_BYTES = 1, 2**32
MIN_RANKS, MAX_RANKS = 2, 1024
LATENCY_FILL, BANDWIDTH_FILL = "#fde0c5", "#dbe9f6"


class _LogAxes(Axes):
    """A panel with log10 scales on both axes."""

    def __init__(self, svg, x, y, width, height, xlim, ylim):
        super().__init__(svg, x, y, width, height)
        self.lx = (math.log10(xlim[0]), math.log10(xlim[1]))
        self.ly = (math.log10(ylim[0]), math.log10(ylim[1]))

    def px(self, value):
        return self.x + self.w * (math.log10(value) - self.lx[0]) / (
            self.lx[1] - self.lx[0]
        )

    def py(self, value):
        return self.y + self.h * (
            1 - (math.log10(value) - self.ly[0]) / (self.ly[1] - self.ly[0])
        )

    def curve(self, points, stroke=PALETTE["text"], width=2, dash="none", metric=None):
        """A line through those of the ``points`` inside the panel's time range."""
        points = [
            (a, b) for a, b in points if 10 ** self.ly[0] <= b <= 10 ** self.ly[1]
        ]
        if len(points) >= 2:
            super().curve(points, stroke, width, dash, metric)

    def time_frame(self, x_ticks, x_label, y_label, x_format):
        """The frame, time up: a line at every power of ten (about 7 at most)."""
        decades = range(math.ceil(self.ly[0]), math.floor(self.ly[1]) + 1)
        every = max(1, math.ceil(len(decades) / 7))
        super().frame(
            x_ticks,
            x_format,
            x_label,
            [10**k for k in decades[::every]],
            lambda v: format_seconds(v, 1),
            y_label,
        )

    def labelled_marker(self, x_value, y_value, label, metric):
        """The dot on its dashed line, labelled in bold beside it."""
        self.marker(x_value, y_value)
        anchor = "end" if self.px(x_value) > self.x + self.w * 0.6 else "start"
        dx = -8 if anchor == "end" else 8
        self.svg.text(
            self.px(x_value) + dx,
            self.py(y_value) - 8,
            label,
            size=11,
            anchor=anchor,
            weight="bold",
            data_metric=metric,
        )


def allreduce_cost_figure(nbytes=2**20, world_size=4, alpha_us=50.0, beta_gbps=1.0):
    """SVG: predicted ring all-reduce time for ``nbytes`` over ``world_size`` ranks.

    ``alpha_us`` is the latency per message in microseconds, ``beta_gbps``
    the link bandwidth in GB/s (10^9 bytes per second); sizes are binary
    (1 MB = 2^20 bytes).
    """
    if not (MIN_BYTES <= nbytes <= MAX_BYTES and 2 <= world_size):
        raise ValueError(
            "need 1 <= nbytes <= 2**32 and world_size >= 2, "
            f"got {nbytes} and {world_size}"
        )
    alpha, beta = alpha_us * 1e-6, beta_gbps * 1e9
    n, b = world_size, nbytes
    lat, bw = ring_all_reduce_terms(b, n, alpha, beta)
    total = lat + bw
    cross = crossover_bytes(n, alpha, beta)
    max_n = max(MAX_RANKS, n)

    def time_at(size, ranks):
        return sum(ring_all_reduce_terms(size, ranks, alpha, beta))

    svg = Svg(
        780, 370, label=f"predicted ring all-reduce time: {format_seconds(total)}"
    )
    # Both panels share one time scale, wide enough for every curve drawn.
    t_lo = min(2 * alpha if alpha > 0 else math.inf, b / beta, time_at(MIN_BYTES, n))
    t_hi = max(time_at(MAX_BYTES, n), time_at(b, max_n))
    ylim = (10 ** math.floor(math.log10(t_lo)), 10 ** math.ceil(math.log10(t_hi)))

    # Left: time against message size, the two regimes shaded.
    left = _LogAxes(svg, 70, 40, 390, 220, (MIN_BYTES, MAX_BYTES), ylim)
    split = min(max(cross, MIN_BYTES), MAX_BYTES)
    left.band(left.x, left.px(split), LATENCY_FILL)
    left.band(left.px(split), left.x + left.w, BANDWIDTH_FILL)
    left.time_frame(
        [2**k for k in range(0, 33, 8)],
        "message size (bytes per rank)",
        f"time, {n} ranks",
        lambda v: format_bytes(v, 2),
    )
    if MIN_BYTES < cross < MAX_BYTES:
        svg.line(
            left.px(cross),
            left.y,
            left.px(cross),
            left.y + left.h,
            stroke=PALETTE["muted"],
        )
    if left.px(split) - left.x > 90:
        left.corner_label("latency-bound", "#a65d1f")
    if left.x + left.w - left.px(split) > 100:
        left.corner_label("bandwidth-bound", "#2b5d8a", anchor="end")
    sizes = [2 ** (k / 4) for k in range(0, 129)]
    left.curve(
        [
            (s, ring_all_reduce_terms(s, n, alpha, beta)[0])
            for s in (MIN_BYTES, MAX_BYTES)
        ],
        stroke="#a65d1f",
        width=1,
        dash="5 4",
    )
    left.curve(
        [(s, ring_all_reduce_terms(s, n, alpha, beta)[1]) for s in sizes],
        stroke="#2b5d8a",
        width=1,
        dash="5 4",
    )
    left.curve([(s, time_at(s, n)) for s in sizes], stroke=PALETTE["text"])
    left.labelled_marker(b, total, format_seconds(total), "total_s")

    # Right: time against rank count for this message size.
    right = _LogAxes(svg, 540, 40, 210, 220, (MIN_RANKS, max_n), ylim)
    right.time_frame(
        [2**k for k in range(1, int(math.log2(max_n)) + 1, 3)],
        "ranks n",
        f"time, {format_bytes(b)}",
        lambda v: str(int(v)),
    )
    ranks = [2 ** (k / 8) for k in range(8, 8 * int(math.log2(max_n)) + 1)]
    right.curve(
        [(r, 2 * (r - 1) * alpha) for r in ranks],
        stroke="#a65d1f",
        width=1.5,
        dash="5 4",
    )
    right.curve(
        [(r, 2 * (r - 1) / r * b / beta) for r in ranks],
        stroke="#2b5d8a",
        width=1.5,
        dash="5 4",
    )
    right.curve(
        [(r, 2 * (r - 1) * (alpha + b / r / beta)) for r in ranks],
        stroke=PALETTE["text"],
    )
    right.labelled_marker(n, total, f"n = {n}", "world_size")
    svg.text(right.x + 4, right.y + 14, "- - latency 2(n-1)α", size=10, fill="#a65d1f")
    svg.text(
        right.x + 4, right.y + 28, "- - bandwidth 2(n-1)/n·b/β", size=10, fill="#2b5d8a"
    )

    # The numbers under the panels.
    regime = "latency-bound" if b < cross else "bandwidth-bound"
    lines = [
        (
            f"Ring all-reduce of {format_bytes(b)} over {n} ranks: "
            f"{format_seconds(total)} predicted "
            f"(α = {alpha_us:g} µs, β = {beta_gbps:g} GB/s)",
            "summary",
        ),
        (
            f"= latency 2(n-1)α = {format_seconds(lat)} ({100 * lat / total:.0f}%)"
            f"  +  bandwidth 2(n-1)/n·b/β = {format_seconds(bw)} "
            f"({100 * bw / total:.0f}%)",
            "terms",
        ),
        (
            f"{regime}: the terms are equal at b = n·α·β = {format_bytes(cross)};  "
            f"each rank sends 2(n-1)/n·b = {format_bytes(2 * (n - 1) * b / n)}",
            "regime",
        ),
    ]
    caption_lines(svg, 20, 318, 17, lines)
    return svg.to_string()
