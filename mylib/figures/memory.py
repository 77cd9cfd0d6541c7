"""Chapter 6's memory calculator: per-rank memory under DDP and ZeRO, as stacked bars.

:func:`memory_figure` is the render function of the chapter's
:class:`mylib.figures.livefig.LiveFigure`: for a model size, a rank count, a
chosen stage and K (optimizer bytes per parameter) it draws one bar per setup
(DDP, ZeRO-1, ZeRO-2, ZeRO-3), each stacked from parameters, gradients and
optimizer state, with the 80 GB of one large GPU as a line; the chosen stage
is drawn solid, the others faint. Beside the bars: the chosen stage's numbers,
whether it fits, the fewest ranks at which it would, and the bytes it sends
per step. Every number also sits in the SVG as ``data-metric`` /
``data-value`` attributes, so a test can read it exactly.

Mixed precision throughout (2-byte parameters and gradients), as in the ZeRO
paper. Standard library only: the static site runs this very function in the
reader's browser (Pyodide).
"""

from mylib.figures.livefig import choices, steps
from mylib.figures.svg import PALETTE, Svg, ticks
from mylib.models.memory import (
    GB,
    STAGE_NAMES,
    STAGES,
    comm_per_step,
    comm_volume_in_psi,
    memory_per_rank,
    min_ranks_to_fit,
)

GPU_GB = 80.0  # one A100/H100 80GB
# Ψ is the number of parameters; every size says its unit (2Ψ bytes: bf16)
PARTS = (
    ("params", "parameters (2Ψ bytes)", PALETTE["compute"]),
    ("grads", "gradients (2Ψ bytes)", PALETTE["comm_alt"]),
    ("optimizer", "optimizer state (KΨ bytes)", PALETTE["optimizer"]),
)
WIDTH, HEIGHT = 760, 360
LEFT, TOP, PLOT_W, PLOT_H = 58, 40, 380, 250
# taller bars are cut (and say so): the 80 GB line stays readable
CLIP_AT = 3 * GPU_GB


def _gb(value):
    """GB with the digits that matter: 1,120 / 31.4 / 1.88 / 0.234."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def _params_text(num_params):
    return f"{num_params / 1e9:g}B" if num_params >= 1e9 else f"{num_params / 1e6:g}M"


def memory_figure(params_b=7.5, world_size=64, stage=3, k=12):
    """SVG: per-rank memory of every stage for ``params_b`` billion parameters.

    The model is trained on ``world_size`` ranks.
    """
    num_params = params_b * 1e9
    bars = {s: memory_per_rank(num_params, world_size, s, k).gb() for s in STAGES}
    tallest = max(bar["total"] for bar in bars.values())
    y_top = min(max(tallest * 1.1, GPU_GB * 1.25), CLIP_AT)
    fig = Svg(
        WIDTH,
        HEIGHT,
        label="per-rank memory of DDP and ZeRO for "
        f"{_params_text(num_params)} parameters",
    )
    fig.text(
        LEFT,
        18,
        f"{_params_text(num_params)} parameters, {world_size} ranks, K = {k}: "
        f"memory per rank (GB = 10^9 bytes)",
        size=13,
        weight="bold",
    )

    def y_of(gb):
        return TOP + PLOT_H * (1 - min(gb, y_top) / y_top)

    for tick in ticks(0, y_top):
        if tick <= y_top:
            fig.line(
                LEFT, y_of(tick), LEFT + PLOT_W, y_of(tick), stroke=PALETTE["grid"]
            )
            fig.text(
                LEFT - 6,
                y_of(tick) + 4,
                f"{tick:g}",
                size=10,
                anchor="end",
                fill=PALETTE["muted"],
            )
    slot = PLOT_W / len(STAGES)
    for s in STAGES:
        x, bar_w, chosen = LEFT + s * slot + slot * 0.2, slot * 0.6, s == stage
        base, bar = 0.0, bars[s]
        for key, label, colour in PARTS:
            top = base + bar[key]
            fig.rect(
                x,
                y_of(top),
                bar_w,
                y_of(base) - y_of(top),
                fill=colour,
                opacity=None if chosen else 0.3,
                title=f"{STAGE_NAMES[s]}: {label} {_gb(bar[key])} GB",
            )
            base = top
        # cut: a white zig-zag across the top says the bar goes on
        if bar["total"] > y_top:
            zig = " ".join(
                f"{x + i * bar_w / 6:.1f},{y_of(y_top) + (6 if i % 2 else 12):.1f}"
                for i in range(7)
            )
            fig.raw(
                f'<polyline points="{zig}" fill="none" '
                'stroke="#ffffff" stroke-width="3"/>'
            )
        fig.text(
            x + bar_w / 2,
            y_of(bar["total"]) - 5,
            _gb(bar["total"]),
            size=11,
            anchor="middle",
            weight="bold" if chosen else None,
            fill=PALETTE["text"] if chosen else PALETTE["muted"],
            data_metric=f"total_gb_{s}",
            data_value=repr(bar["total"]),
        )
        fig.text(
            x + bar_w / 2,
            TOP + PLOT_H + 16,
            STAGE_NAMES[s],
            size=12,
            anchor="middle",
            weight="bold" if chosen else None,
            fill=PALETTE["text"] if chosen else PALETTE["muted"],
        )
        if chosen:
            fig.rect(x - 3, TOP + PLOT_H + 21, bar_w + 6, 3, fill=PALETTE["text"])
    fig.line(LEFT, TOP + PLOT_H, LEFT + PLOT_W, TOP + PLOT_H, stroke=PALETTE["muted"])
    fig.line(
        LEFT,
        y_of(GPU_GB),
        LEFT + PLOT_W,
        y_of(GPU_GB),
        stroke=PALETTE["exposed"],
        stroke_width=2,
        stroke_dasharray="6,4",
    )
    fig.text(
        LEFT + PLOT_W - 2,
        y_of(GPU_GB) - 5,
        f"{GPU_GB:g} GB: one GPU",
        size=11,
        anchor="end",
        fill=PALETTE["exposed"],
    )
    for i, (_, label, colour) in enumerate(PARTS):
        fig.rect(LEFT + i * 130, HEIGHT - 22, 10, 10, fill=colour)
        fig.text(
            LEFT + i * 130 + 14, HEIGHT - 13, label, size=10, fill=PALETTE["muted"]
        )
    _panel(fig, num_params, world_size, stage, k, bars[stage])
    return fig.to_string()


def _panel(fig, num_params, world_size, stage, k, bar):
    """The chosen stage's numbers, right of the bars."""
    x, y, line = LEFT + PLOT_W + 28, TOP + 8, 18
    fits = bar["total"] <= GPU_GB
    need = min_ranks_to_fit(num_params, stage, GPU_GB * GB, k)
    sent = sum(comm_per_step(num_params, world_size, stage).values()) / GB
    elements = comm_volume_in_psi(stage)  # the paper's unit; 2 bytes each in bf16
    psi_units = f"{elements:g}Ψ elements, {2 * elements:g}Ψ bytes"
    rows = [
        (None, f"{STAGE_NAMES[stage]} on {world_size} ranks", True, PALETTE["text"]),
        ("params_gb", f"parameters  {_gb(bar['params'])} GB", False, PALETTE["text"]),
        ("grads_gb", f"gradients  {_gb(bar['grads'])} GB", False, PALETTE["text"]),
        (
            "optimizer_gb",
            f"optimizer state  {_gb(bar['optimizer'])} GB",
            False,
            PALETTE["text"],
        ),
        ("total_gb", f"total  {_gb(bar['total'])} GB per rank", True, PALETTE["text"]),
        (
            "fits",
            f"fits in {GPU_GB:g} GB: " + ("yes" if fits else "no"),
            True,
            PALETTE["accent"] if fits else PALETTE["exposed"],
        ),
        (
            "min_ranks",
            "never, at any rank count"
            if need is None
            else f"fits from {need} rank{'s' * (need > 1)}",
            False,
            PALETTE["text"],
        ),
        (
            "sent_gb",
            f"sends {_gb(sent)} GB a step ({psi_units})",
            False,
            PALETTE["text"],
        ),
    ]
    values = {
        "params_gb": bar["params"],
        "grads_gb": bar["grads"],
        "optimizer_gb": bar["optimizer"],
        "total_gb": bar["total"],
        "fits": fits,
        "min_ranks": need,
        "sent_gb": sent,
    }
    for i, (key, text, bold, colour) in enumerate(rows):
        extra = (
            {} if key is None else {"data_metric": key, "data_value": repr(values[key])}
        )
        fig.text(
            x,
            y + i * line + (6 if i >= 5 else 0),
            text,
            size=12,
            weight="bold" if bold else None,
            fill=colour,
            **extra,
        )
    fig.text(
        x,
        y + len(rows) * line + 20,
        "Activations, buffers and fragmentation",
        size=10,
        fill=PALETTE["muted"],
    )
    fig.text(
        x,
        y + len(rows) * line + 34,
        "come on top of this model state.",
        size=10,
        fill=PALETTE["muted"],
    )


def sharding_picture(world_size=4, k=12):
    """SVG: what each of ``world_size`` ranks holds under DDP and each ZeRO stage.

    Bar lengths are to scale. Each rank is one row of three bars,
    parameters (2Ψ bytes), gradients (2Ψ bytes) and optimizer state (KΨ bytes); a
    sharded bar keeps only the rank's 1/N slice, drawn in place, so the
    slices of all ranks tile the whole.
    """
    sizes = {"params": 2, "grads": 2, "optimizer": k}
    # pixels per byte-per-parameter: a whole DDP row is 150 px plus the gaps
    unit = 150 / (4 + k)
    col_w, row_h, top = 190, 22, 46
    fig = Svg(
        col_w * len(STAGES) + 20,
        top + world_size * row_h + 40,
        label=f"what each of {world_size} ranks holds under DDP and ZeRO-1, 2, 3",
    )
    for s in STAGES:
        x0 = 14 + s * col_w
        fig.text(x0, 18, STAGE_NAMES[s], size=13, weight="bold")
        per_rank = memory_per_rank(1.0, world_size, s, k).total
        fig.text(
            x0,
            34,
            f"{per_rank:.3g}Ψ bytes per rank",
            size=10,
            fill=PALETTE["muted"],
        )
        sharded = {"params": s >= 3, "grads": s >= 2, "optimizer": s >= 1}
        for r in range(world_size):
            y, x = top + r * row_h, x0 + 28
            fig.text(x0, y + 12, f"r{r}", size=10, fill=PALETTE["muted"])
            for key, label, colour in PARTS:
                w = sizes[key] * unit
                fig.rect(x, y, w, 14, fill=colour, opacity=0.15)  # the whole, faint
                if sharded[key]:
                    fig.rect(
                        x + r * w / world_size,
                        y,
                        w / world_size,
                        14,
                        fill=colour,
                        title=f"rank {r}: its 1/{world_size} of the {label}",
                    )
                else:
                    fig.rect(
                        x, y, w, 14, fill=colour, title=f"rank {r}: all of the {label}"
                    )
                x += w + 4
    for i, (_, label, colour) in enumerate(PARTS):
        label = label.replace("KΨ bytes", f"KΨ bytes, K = {k}")
        fig.rect(14 + i * 190, top + world_size * row_h + 18, 10, 10, fill=colour)
        fig.text(
            28 + i * 190,
            top + world_size * row_h + 27,
            label,
            size=10,
            fill=PALETTE["muted"],
        )
    return fig.to_string()


# The sliders of the chapter's LiveFigure(memory_figure, MEMORY_SLIDERS), as
# dicts of Slider arguments.
MEMORY_SLIDERS = [
    choices(
        "params_b",
        "model size",
        [0.125, 0.35, 1.0, 1.5, 3.0, 7.0, ("7.5B (ZeRO paper)", 7.5), 13.0, 30.0]
        + [70.0, 175.0, 405.0, 1000.0],
        7.5,
        "{:g}B",
    ),
    choices("world_size", "ranks", (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), 64),
    choices("stage", "stage", [(STAGE_NAMES[s], s) for s in STAGES], 3),
    steps("k", "optimizer bytes per parameter (K)", 0, 24, 2, 12),
]
