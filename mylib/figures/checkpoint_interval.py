"""Chapter 9's slider figure: hours lost per day against the checkpoint interval.

:func:`checkpoint_interval_figure` draws the wall-clock time lost per day
(saving plus redoing lost work plus restarting) against the interval between
checkpoints, on a log axis, for a checkpoint cost, a failure rate per node, a
cluster size and a restart time: the first-order model (solid) and Daly's,
where failures also strike during saves and restarts (dashed). It marks
Young's and Daly's optimum intervals and prints their numbers (each in a
``data-metric`` attribute the browser test reads).

Standard library only (with :mod:`mylib.figures.svg` and
:mod:`mylib.models.checkpoint_interval`): the static site runs this very
function in the reader's browser.
"""

import math

from mylib.figures.livefig import choices, settings
from mylib.figures.svg import PALETTE, Axes, Svg
from mylib.models.checkpoint_interval import (
    daly_interval,
    job_mtbf,
    lost_per_day,
    lost_per_day_daly,
    young_interval,
)

T_MIN, T_MAX = 1.0, 1e6  # seconds: the interval axis
TICKS = [(1, "1 s"), (10, "10 s"), (60, "1 min"), (600, "10 min"), (3600, "1 h")]
TICKS += [(36000, "10 h"), (86400, "1 d"), (864000, "10 d")]
# Llama 3's 54-day snapshot: 419 unexpected interruptions on 16,384 GPUs, that is
# 2,048 nodes of 8 GPUs: one per 2,048 * 54 / 419 = 264 node-days.
LLAMA3_NODE_MTBF_DAYS = 2048 * 54 / 419


class _LogX(Axes):
    """A panel with a log10 x axis and a linear y axis."""

    def __init__(self, svg, x, y, width, height, xlim, ylim):
        super().__init__(svg, x, y, width, height)
        self.lx = (math.log10(xlim[0]), math.log10(xlim[1]))
        self.ylim = ylim

    def px(self, value):
        return self.x + self.w * (math.log10(value) - self.lx[0]) / (
            self.lx[1] - self.lx[0]
        )

    def py(self, value):
        lo, hi = self.ylim
        return self.y + self.h * (1 - (min(value, hi) - lo) / (hi - lo))


def duration(seconds):
    """A duration in the unit that reads best: ``45 s``, ``7.7 min``, ``3.1 h``."""
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def interval_numbers(**values):
    """The figure's numbers for slider ``values``: a dict, in seconds and hours."""
    s = settings(CHECKPOINT_SLIDERS, values)
    mtbf = job_mtbf(s.node_mtbf_days * 86400.0, s.nodes)
    young = young_interval(s.cost_s, mtbf)
    daly = daly_interval(s.cost_s, mtbf)
    return {
        "mtbf_s": mtbf,
        "young_s": young,
        "daly_s": daly,
        "lost_h_at_young": lost_per_day(young, s.cost_s, mtbf, s.restart_s) / 3600,
        "lost_h_hourly": lost_per_day(3600.0, s.cost_s, mtbf, s.restart_s) / 3600,
        "lost_h_daly": lost_per_day_daly(daly, s.cost_s, mtbf, s.restart_s) / 3600,
    }


def checkpoint_interval_figure(**values):
    """SVG: hours lost per day against the interval, optima marked."""
    s = settings(CHECKPOINT_SLIDERS, values)
    n = interval_numbers(**values)
    mtbf = n["mtbf_s"]
    svg = Svg(720, 410, label="time lost per day against the checkpoint interval")
    ax = _LogX(svg, 70, 40, 600, 240, (T_MIN, T_MAX), (0.0, 24.0))
    ax.frame(
        [t for t, _ in TICKS],
        dict(TICKS).get,
        "interval between checkpoints (log scale)",
        [0, 4, 8, 12, 16, 20, 24],
        lambda v: f"{v:g} h",
        "hours lost per day",
    )
    grid = [T_MIN * (T_MAX / T_MIN) ** (i / 240) for i in range(241)]
    for model, dash, metric in (
        (lost_per_day, "none", "curve"),
        (lost_per_day_daly, "5 3", "curve_daly"),
    ):
        points = [(t, model(t, s.cost_s, mtbf, s.restart_s) / 3600) for t in grid]
        ax.curve(points, stroke=PALETTE["compute"], dash=dash, metric=metric)
    for t, name, colour in (
        (n["young_s"], "Young", PALETTE["comm"]),
        (n["daly_s"], "Daly", PALETTE["optimizer"]),
    ):
        if T_MIN <= t <= T_MAX:
            x = ax.px(t)
            svg.line(x, ax.y, x, ax.y + ax.h, stroke=colour, stroke_dasharray="4 3")
            svg.text(
                x + 3,
                ax.y + 12 + (14 if name == "Daly" else 0),
                name,
                size=10,
                fill=colour,
            )
    lines = [
        (
            f"job MTBF {duration(mtbf)} ({s.nodes} nodes, one failure per "
            f"{s.node_mtbf_days:.0f} days per node)",
            "mtbf_s",
            mtbf,
        ),
        (
            f"Young sqrt(2 C M) = {duration(n['young_s'])}; "
            f"Daly = {duration(n['daly_s'])}",
            "young_s",
            n["young_s"],
        ),
        (
            f"first order (solid): {n['lost_h_at_young']:.2f} h/day lost at Young's "
            f"interval, {n['lost_h_hourly']:.2f} h/day checkpointing hourly",
            "lost_h_at_young",
            n["lost_h_at_young"],
        ),
        (
            f"Daly's model (dashed, failures in saves and restarts too): "
            f"{n['lost_h_daly']:.2f} h/day at Daly's interval",
            "lost_h_daly",
            n["lost_h_daly"],
        ),
    ]
    for i, (text, metric, value) in enumerate(lines):
        svg.text(
            10,
            338 + 18 * i,
            text,
            size=12,
            data_metric=metric,
            data_value=f"{value:.6g}",
        )
    return svg.to_string()


# The sliders of LiveFigure(checkpoint_interval_figure, CHECKPOINT_SLIDERS).
CHECKPOINT_SLIDERS = [
    choices(
        "cost_s",
        "checkpoint cost",
        [1, 5, 10, 30, 60, 120, 300, 600, 1800],
        30,
        "{:g} s",
    ),
    choices(
        "node_mtbf_days",
        "MTBF per node",
        [
            30,
            90,
            180,
            (f"{LLAMA3_NODE_MTBF_DAYS:.0f} days (Llama 3)", LLAMA3_NODE_MTBF_DAYS),
        ]
        + [365, 730, 1825],
        LLAMA3_NODE_MTBF_DAYS,
        "{:g} days",
    ),
    choices("nodes", "nodes (8 GPUs each)", [1, 8, 64, 256, 1024, 2048, 4096], 2048),
    choices("restart_s", "restart time", [10, 60, 300, 900], 300, "{:g} s"),
]
