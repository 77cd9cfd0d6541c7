"""Chapter 6's picture of a ZeRO-3 unit's life: what a rank holds after each event.

:func:`unit_life_picture` draws :func:`mylib.models.unit_life.unit_life`: seven
columns (gather, forward, free; gather, backward, reduce-scatter, free), each a
bar, to scale, stacked from what one rank holds of the unit at that moment:
its optimizer-state, parameter and gradient shards, and the full parameters
and gradient that exist only for a while. Above a bar its total; below a
collective the bytes this rank sends in it. Each total and each sent count
also sits in the SVG as ``data-row`` / ``data-metric`` / ``data-value``.
Standard library only.
"""

from mylib.figures.svg import PALETTE, Svg
from mylib.models.unit_life import KINDS, unit_life

# kind -> (legend, in bytes per parameter of the unit; colour)
LOOK = {
    "optimizer_shard": ("optimizer-state shard, K/N bytes a parameter", "#cbc9e2"),
    "param_shard": ("parameter shard, 2/N bytes a parameter", PALETTE["compute"]),
    "grad_shard": ("gradient shard, 2/N bytes a parameter", PALETTE["comm"]),
    "full_params": ("full parameters, 2 bytes a parameter", PALETTE["forward"]),
    "full_grads": ("full gradient, 2 bytes a parameter", PALETTE["comm_alt"]),
}
WIDTH, LEFT, TOP, PLOT_H, COL_W = 760, 64, 100, 190, 96


def mb(nbytes):
    """Decimal megabytes, as the chapter's GB: ``550 MB``."""
    return f"{nbytes / 1e6:,.0f} MB"


def unit_life_picture(unit_params=100e6, world_size=4, k=12):
    """SVG: one unit of ``unit_params`` parameters on ``world_size`` ranks.

    The ZeRO paper's accounting: bf16 parameters and gradients, ``k`` bytes
    of optimizer state per parameter (12: mixed-precision Adam).
    """
    rows = unit_life(unit_params, world_size, k)
    top_bytes = max(row.total for row in rows)
    height = TOP + PLOT_H + 44 + 16 * ((len(KINDS) + 1) // 2)
    fig = Svg(
        WIDTH,
        height,
        label="one ZeRO-3 unit's life: gather, forward, free; gather, backward, "
        "reduce-scatter, free, with the memory one rank holds after each",
    )
    fig.text(
        LEFT,
        18,
        f"A unit of {unit_params / 1e6:g}M parameters on N = {world_size} ranks, "
        f"mixed-precision Adam (K = {k})",
        size=13,
        weight="bold",
    )
    fig.text(
        LEFT,
        36,
        "what one rank holds of it after each event, in MB (10^6 bytes)",
        size=12,
        fill=PALETTE["muted"],
    )

    def y_of(nbytes):
        return TOP + PLOT_H * (1 - nbytes / top_bytes)

    # the two passes, bracketed over their columns
    for phase in ("forward", "backward"):
        cols = [i for i, row in enumerate(rows) if row.phase == phase]
        x0, x1 = LEFT + cols[0] * COL_W + 6, LEFT + (cols[-1] + 1) * COL_W - 6
        fig.line(x0, 62, x1, 62, stroke=PALETTE["muted"])
        fig.text((x0 + x1) / 2, 58, phase, size=12, anchor="middle", weight="bold")
    fig.line(LEFT, TOP + PLOT_H, LEFT + len(rows) * COL_W, TOP + PLOT_H)
    for i, row in enumerate(rows):
        x, bar_w = LEFT + i * COL_W + 24, COL_W - 48
        centre = x + bar_w / 2
        fig.text(centre, 78, f"{i + 1}. {row.event}", size=12, anchor="middle")
        base = 0.0
        for kind in KINDS:
            nbytes = getattr(row, kind)
            if nbytes:
                legend, colour = LOOK[kind]
                fig.rect(
                    x,
                    y_of(base + nbytes),
                    bar_w,
                    y_of(base) - y_of(base + nbytes),
                    fill=colour,
                    title=f"{legend.split(',')[0]}: {mb(nbytes)}",
                )
            base += nbytes
        fig.text(
            centre,
            y_of(row.total) - 5,
            mb(row.total),
            size=11,
            anchor="middle",
            weight="bold",
            data_row=i,
            data_metric="held_bytes",
            data_value=repr(row.total),
        )
        if row.collective:
            fig.text(
                centre,
                TOP + PLOT_H + 16,
                f"sends {mb(row.sent)}",
                size=11,
                anchor="middle",
                fill=PALETTE["comm"],
                data_row=i,
                data_metric="sent_bytes",
                data_value=repr(row.sent),
            )
    fig.text(
        LEFT - 8,
        y_of(0) + 4,
        "0",
        size=10,
        anchor="end",
        fill=PALETTE["muted"],
    )
    legend_top = TOP + PLOT_H + 38
    for j, kind in enumerate(KINDS):
        legend, colour = LOOK[kind]
        lx, ly = LEFT + (j % 2) * 330, legend_top + 16 * (j // 2)
        fig.rect(lx, ly - 9, 10, 10, fill=colour)
        fig.text(lx + 14, ly, legend, size=11, fill=PALETTE["muted"])
    return fig.to_string()
