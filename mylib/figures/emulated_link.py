"""Measured beside modelled: step time per bucket cap on an emulated link.

:func:`cap_sweep_figure` draws one panel per link: the bucket caps across
(one all-reduce per parameter on the left, one bucket at the end on the
right), the step time up, the measured steps as a solid line with dots and
the model's as a dashed line with rings. On a link that does not compete with
the backward for the cores the two trace the same U. Each point also sits in
the SVG as ``data-series``/``data-cap``/``data-value`` attributes, so a test
can read it exactly. Standard library only.
"""

from mylib.figures.svg import PALETTE, Svg, format_seconds, ticks

PANEL_W, PANEL_H, GAP = 300, 200, 70
LEFT, TOP, BOTTOM = 64, 54, 70
SERIES = (  # key in a row, label, colour, dashes, dot filled
    ("measured_s", "measured", PALETTE["text"], "none", True),
    ("model_s", "model", PALETTE["comm"], "5,3", False),
)


def _label(cap):
    if isinstance(cap, str):
        return cap
    return "0 (per param.)" if cap == 0 else f"{cap:g} MB"


def cap_sweep_figure(panels, title=None):
    """An SVG string: per panel ``(name, rows)``, measured and model step against cap.

    ``rows`` are :func:`mylib.experiments.calibrate.compare`'s: dicts with
    ``cap``, ``measured_s`` and ``model_s``, in the order to draw.
    """
    panels = list(panels)
    if not panels or any(not rows for _, rows in panels):
        raise ValueError("cap_sweep_figure needs at least one panel, each with rows")
    width = LEFT + len(panels) * (PANEL_W + GAP) - GAP + 20
    height = TOP + PANEL_H + BOTTOM
    svg = Svg(width, height, label=title or "step time per bucket cap")
    if title:
        svg.text(LEFT, 16, title, size=13, weight="bold")
    top_s = 1.1 * max(row[k] for _, rows in panels for row in rows for k, *_ in SERIES)
    for p, (name, rows) in enumerate(panels):
        x0 = LEFT + p * (PANEL_W + GAP)

        def px(i, x0=x0, n=len(rows)):
            return x0 + PANEL_W * (i + 0.5) / n

        def py(seconds):
            return TOP + PANEL_H * (1 - seconds / top_s)

        svg.text(x0, TOP - 12, name, size=12, weight="bold")
        for tick in ticks(0, top_s):
            svg.line(x0, py(tick), x0 + PANEL_W, py(tick), stroke=PALETTE["grid"])
            svg.text(
                x0 - 4,
                py(tick) + 3,
                format_seconds(tick, 2) if tick else "0",
                size=10,
                anchor="end",
                fill=PALETTE["muted"],
            )
        svg.rect(x0, TOP, PANEL_W, PANEL_H, fill="none", stroke=PALETTE["muted"])
        for i, row in enumerate(rows):
            svg.text(
                px(i),
                TOP + PANEL_H + 14,
                _label(row["cap"]),
                size=10,
                anchor="middle",
                fill=PALETTE["muted"],
            )
        svg.text(
            x0 + PANEL_W / 2,
            TOP + PANEL_H + 32,
            "bucket cap",
            size=11,
            anchor="middle",
        )
        for key, label, colour, dash, filled in SERIES:
            points = " ".join(
                f"{px(i):.1f},{py(row[key]):.1f}" for i, row in enumerate(rows)
            )
            svg.raw(
                f'<polyline points="{points}" fill="none" stroke="{colour}" '
                f'stroke-width="2" stroke-dasharray="{dash}"/>'
            )
            for i, row in enumerate(rows):
                svg.raw(
                    f'<circle cx="{px(i):.1f}" cy="{py(row[key]):.1f}" r="4" '
                    f'fill="{colour if filled else "white"}" stroke="{colour}" '
                    f'stroke-width="2" data-panel="{p}" data-series="{label}" '
                    f'data-cap="{_label(row["cap"])}" data-value="{row[key]!r}">'
                    f"<title>{label}, cap {_label(row['cap'])}: "
                    f"{format_seconds(row[key])}</title></circle>"
                )
    x = LEFT
    for _, label, colour, dash, filled in SERIES:
        y = height - 14
        svg.line(
            x,
            y - 4,
            x + 26,
            y - 4,
            stroke=colour,
            stroke_width=2,
            stroke_dasharray=dash,
        )
        svg.raw(
            f'<circle cx="{x + 13}" cy="{y - 4}" r="4" '
            f'fill="{colour if filled else "white"}" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        svg.text(x + 32, y, f"{label} step", size=10, fill=PALETTE["muted"])
        x += 120
    return svg.to_string()
