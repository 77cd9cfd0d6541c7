"""Chapter 8's picture: collectives are matched by their order, not by their names.

:func:`collective_pairing_figure` draws three runs of two ranks, each a row
of the collectives a rank calls, and links the calls that the backend pairs
up: the first call of rank 0 with the first of rank 1, and so on. Same order:
every pair matches. Swapped kinds: the first pair is an all-reduce against a
broadcast, and both ranks wait forever. Swapped tensors of the same shape: the
pairs look fine to the backend, which adds a metric to a gradient.
Standard library only (:mod:`mylib.figures.svg`).
"""

from mylib.figures.svg import PALETTE, Svg

BOX_W, BOX_H = 150, 26
CASES = [  # (title, rank 0's calls, rank 1's calls, verdict)
    (
        "same order: every pair matches",
        ("all_reduce(grad)", "all_reduce(metric)"),
        ("all_reduce(grad)", "all_reduce(metric)"),
        "ok",
    ),
    (
        "kinds swapped: an all-reduce meets a broadcast, both ranks wait forever",
        ("all_reduce(grad)", "broadcast(grad)"),
        ("broadcast(grad)", "all_reduce(grad)"),
        "hang",
    ),
    (
        "same shapes swapped: the backend cannot tell; "
        "rank 1's metric is summed into rank 0's gradient",
        ("all_reduce(grad)", "all_reduce(metric)"),
        ("all_reduce(metric)", "all_reduce(grad)"),
        "silent",
    ),
]
VERDICT_COLOURS = {
    "ok": PALETTE["accent"],
    "hang": PALETTE["exposed"],
    "silent": "#a65d1f",
}


def collective_pairing_figure():
    """SVG: three two-rank runs, their collectives linked pairwise in call order."""
    svg = Svg(760, 3 * 118 + 10, label="collectives are matched by call order")
    for k, (title, rank0, rank1, verdict) in enumerate(CASES):
        top = 10 + k * 118
        colour = VERDICT_COLOURS[verdict]
        svg.text(10, top + 14, title, size=12, weight="bold", fill=colour)
        for rank, calls in ((0, rank0), (1, rank1)):
            y = top + 26 + rank * 50
            svg.text(10, y + 17, f"rank {rank}", size=12)
            for i, call in enumerate(calls):
                x = 80 + i * (BOX_W + 60)
                fill = PALETTE["comm_alt"] if "metric" in call else PALETTE["comm"]
                svg.rect(
                    x,
                    y,
                    BOX_W,
                    BOX_H,
                    fill=fill if "broadcast" not in call else PALETTE["forward"],
                    title=f"rank {rank}, call {i + 1}: {call}",
                )
                svg.text(x + BOX_W / 2, y + 17, call, size=11, anchor="middle")
        for i in range(2):
            x = 80 + i * (BOX_W + 60) + BOX_W / 2
            same = rank0[i] == rank1[i]
            svg.line(
                x,
                top + 26 + BOX_H,
                x,
                top + 76,
                stroke=PALETTE["accent"] if same else colour,
                stroke_width=2,
                stroke_dasharray=None if same else "4 3",
            )
            label = (
                "pair ok"
                if same
                else ("never completes" if verdict == "hang" else "wrong pair")
            )
            svg.text(
                x + 6,
                top + 26 + BOX_H + 16,
                label,
                size=10,
                fill=PALETTE["accent"] if same else colour,
            )
    return svg.to_string()
