"""Pictures of who holds what, before and after a collective and at each ring step.

A *holdings* grid has one row per rank and one column per chunk of the
tensor. Each cell is the set of ranks whose data it contains (drawn as
stripes in those ranks' colours, labelled ``0+2``, or ``Σ`` when it holds
every rank), or ``None`` when the rank does not hold that chunk at all.

The grids are not typed in by hand: chapter 1 runs each collective on a real
group with *bit-mask* data (rank ``r`` contributes ``2**r``, so a sum of
contributions is a number whose bits name its contributors; see
:func:`holdings`), and draws what came back. The ring's steps are drawn from
the same schedule (:func:`mylib.ring.simulate_ring`) the implementation runs.
"""

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from mylib.ring import REDUCE_SCATTER, ring_steps, simulate_ring

RANK_COLORS = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
]
EMPTY_COLOR = "#f2f2f2"


def contributors(mask):
    """The ranks named by the bits of a bit-mask value (``5.0`` means ranks 0 and 2).

    NaN means not held, and gives None.
    """
    if mask is None or (isinstance(mask, float) and math.isnan(mask)):
        return None
    value = int(round(mask))
    if value != mask or value < 0:
        raise ValueError(
            f"{mask!r} is not a bit mask: expected a non-negative whole number or NaN"
        )
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def holdings(rows):
    """A holdings grid from per-rank lists of bit-mask values.

    A value is NaN where the rank holds nothing.
    """
    return [[contributors(float(v)) for v in row] for row in rows]


def _cell_label(ranks, n):
    if ranks is None:
        return ""
    if len(ranks) == n and n > 1:
        return "Σ"
    return "+".join(str(r) for r in sorted(ranks))


def draw_holdings(ax, grid, title="", highlight=(), n_ranks=None):
    """Draw one holdings grid on a matplotlib axis.

    Cells in ``highlight``, as ``(rank, chunk)`` pairs, get a bold frame.
    """
    n_rows, n_cols = len(grid), len(grid[0])
    n = n_ranks or n_rows
    for r, row in enumerate(grid):
        for c, ranks in enumerate(row):
            x, y = c, n_rows - 1 - r
            if ranks is None:
                ax.add_patch(
                    Rectangle(
                        (x + 0.05, y + 0.05),
                        0.9,
                        0.9,
                        facecolor=EMPTY_COLOR,
                        edgecolor="#cccccc",
                        linestyle="--",
                        linewidth=0.8,
                    )
                )
                continue
            owners = sorted(ranks)
            width = 0.9 / len(owners)
            for i, owner in enumerate(owners):  # one stripe per contributing rank
                ax.add_patch(
                    Rectangle(
                        (x + 0.05 + i * width, y + 0.05),
                        width,
                        0.9,
                        facecolor=RANK_COLORS[owner % len(RANK_COLORS)],
                        edgecolor="none",
                    )
                )
            bold = (r, c) in highlight
            ax.add_patch(
                Rectangle(
                    (x + 0.05, y + 0.05),
                    0.9,
                    0.9,
                    facecolor="none",
                    edgecolor="black",
                    linewidth=2.2 if bold else 0.6,
                )
            )
            label = _cell_label(ranks, n)
            ax.text(
                x + 0.5,
                y + 0.5,
                label,
                ha="center",
                va="center",
                color="white",
                fontweight="bold",
                fontsize=10 if len(label) <= 3 else 6,
            )
    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, n_rows)
    ax.set_xticks(
        [c + 0.5 for c in range(n_cols)], [str(c) for c in range(n_cols)], fontsize=7
    )
    ax.set_xlabel("chunk", fontsize=7, labelpad=1)
    ax.set_yticks(
        [n_rows - 1 - r + 0.5 for r in range(n_rows)],
        [f"rank {r}" for r in range(n_rows)],
        fontsize=8,
    )
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=9)


def collectives_figure(panels):
    """One row per collective, before and after.

    ``panels`` is a list of ``(name, before, after)`` grids.
    """
    fig, axes = plt.subplots(
        len(panels), 2, figsize=(6.4, 2.6 * len(panels)), squeeze=False
    )
    for (name, before, after), (ax_before, ax_after) in zip(panels, axes):
        draw_holdings(ax_before, before, f"{name}: before")
        draw_holdings(ax_after, after, f"{name}: after")
        ax_after.annotate(
            "",
            xy=(-0.12, 0.5),
            xytext=(-0.32, 0.5),
            xycoords="axes fraction",
            arrowprops=dict(arrowstyle="-|>", color="black", lw=1.5),
        )
    fig.tight_layout()
    return fig


def ring_figure(n):
    """Every step of a ring all-reduce on ``n`` ranks.

    The states come from :func:`mylib.ring.simulate_ring`. Cells that a step
    changed have a bold frame. The first row is the start and the
    reduce-scatter phase; the second, the all-gather phase.
    """
    states, steps = simulate_ring(n), ring_steps(n)
    cols = n
    fig, axes = plt.subplots(2, cols, figsize=(2.1 * cols, 5.0), squeeze=False)
    draw_holdings(axes[0][0], states[0], "start: rank r holds r")
    for i, step in enumerate(steps):
        phase = step[0][0]
        s = i + 1 if phase == REDUCE_SCATTER else i - (n - 1) + 1
        ax = axes[0][s] if phase == REDUCE_SCATTER else axes[1][s - 1]
        changed = {(dst, c) for _, _, dst, c in step}
        what = "adds" if phase == REDUCE_SCATTER else "copies"
        draw_holdings(
            ax,
            states[i + 1],
            f"{phase} {s}/{n - 1}:\nr+1 {what} r's chunk",
            highlight=changed,
        )
    axes[1][cols - 1].axis("off")
    axes[1][cols - 1].text(
        0.0,
        0.5,
        f"each rank sent\n2(n-1) = {2 * (n - 1)} chunks\nof 1/{n} of the tensor",
        fontsize=9,
        va="center",
    )
    fig.tight_layout()
    return fig


def data_parallel_step_figure(world_size=2):
    """A data-parallel step: split the batch, compute on all ranks, average, step alike.

    A schematic (boxes and arrows), drawn by code so that it follows
    ``world_size`` and the rank colours of the other pictures.
    """
    n = world_size
    fig, ax = plt.subplots(figsize=(8.0, 1.4 + 1.1 * n))
    height = n * 1.0
    ax.set_xlim(0, 10.2)
    ax.set_ylim(-0.2, height + 0.4)
    ax.axis("off")

    def box(x, y, w, h, text, color="#ffffff", text_color="black"):
        ax.add_patch(
            Rectangle((x, y), w, h, facecolor=color, edgecolor="black", linewidth=0.8)
        )
        ax.text(
            x + w / 2,
            y + h / 2,
            text,
            ha="center",
            va="center",
            fontsize=10,
            color=text_color,
        )

    def arrow(x1, y1, x2, y2):
        ax.annotate(
            "",
            xy=(x2, y2),
            xytext=(x1, y1),
            arrowprops=dict(arrowstyle="-|>", lw=1.0, color="black"),
        )

    shard_h = height / n
    for r in range(n):  # the global batch, cut into one shard per rank
        color = RANK_COLORS[r % len(RANK_COLORS)]
        y = height - (r + 1) * shard_h
        box(
            0.1,
            y + 0.05,
            1.3,
            shard_h - 0.1,
            f"shard {r}\n(B/{n} rows)",
            color,
            "white",
        )
        box(
            2.0,
            y + 0.15,
            2.2,
            shard_h - 0.3,
            f"rank {r}: same w\nforward, backward\n" + rf"$g_{r}=\nabla L_{r}(w)$",
        )
        arrow(1.4, y + shard_h / 2, 2.0, y + shard_h / 2)
        arrow(4.2, y + shard_h / 2, 5.0, height / 2)
        box(
            7.3,
            y + 0.15,
            2.7,
            shard_h - 0.3,
            f"rank {r}: " + r"$w \leftarrow w - \eta\,\bar g$" + "\nsame step, same w",
        )
        arrow(6.6, height / 2, 7.3, y + shard_h / 2)
    box(
        5.0,
        height / 2 - 0.45,
        1.6,
        0.9,
        "all-reduce\n" + r"$\bar g = \frac{1}{n}\sum_r g_r$",
        "#fdae6b",
    )
    ax.text(0.1, height + 0.15, "global batch", fontsize=11, fontweight="bold")
    ax.text(7.3, height + 0.15, "optimizer step", fontsize=11, fontweight="bold")
    fig.tight_layout()
    return fig
