"""Chapter 8's slider figure: how N samples are shared by n ranks, and when that hangs.

:func:`sharding_figure` draws one row per rank: its samples in reading order,
cut into batches (alternating shades), with samples read twice (the sampler's
padding) marked and samples never read listed. Underneath, the verdict: every
rank takes the same number of steps, or some ranks take a step the others never
join, so their all-reduce waits forever.

Standard library only (with :mod:`mylib.figures.svg`,
:mod:`mylib.models.sharding`): the static site runs this very function in the
reader's browser.
"""

from mylib.figures.svg import PALETTE, Svg
from mylib.models.sharding import shares

CELL, GAP = 26, 3
BATCH_FILLS = ("#c6dbef", "#9ecae1")
REPEAT_FILL, MISSING_FILL = "#fdae6b", PALETTE["idle"]


def sharding_verdict(dataset_size, world_size, batch_size, mode):
    """What the split means for training, as a dict.

    Steps per rank, repeated and unread samples, and whether it hangs.
    """
    per_rank = shares(dataset_size, world_size, batch_size, mode)
    steps = [len(b) for b in per_rank]
    read = [i for batches in per_rank for batch in batches for i in batch]
    repeated = sorted({i for i in read if read.count(i) > 1})
    unread = sorted(set(range(dataset_size)) - set(read))
    return {
        "batches": per_rank,
        "steps": steps,
        "repeated": repeated,
        "unread": unread,
        "hangs": len(set(steps)) > 1,
    }


def sharding_figure(dataset_size=10, world_size=4, batch_size=2, mode="naive"):
    """SVG of each rank's batches under ``mode``.

    ``mode`` is ``"naive"``, ``"sampler"`` or ``"drop_last"``.
    """
    v = sharding_verdict(dataset_size, world_size, batch_size, mode)
    longest = max((sum(len(b) for b in batches) for batches in v["batches"]), default=0)
    width = max(560, 110 + longest * (CELL + GAP) + 40)
    height = 40 + world_size * (CELL + 10) + 80
    svg = Svg(
        width, height, label=f"{dataset_size} samples over {world_size} ranks, {mode}"
    )
    names = {
        "naive": "naive split: rank r takes r, r+n, ...",
        "sampler": "DistributedSampler (pads)",
        "drop_last": "DistributedSampler(drop_last=True)",
    }
    svg.text(
        10,
        18,
        f"{dataset_size} samples, {world_size} ranks, "
        f"batches of {batch_size}: {names[mode]}",
        size=13,
        weight="bold",
    )
    top = 34
    for rank, batches in enumerate(v["batches"]):
        y = top + rank * (CELL + 10)
        svg.text(10, y + CELL * 0.65, f"rank {rank}", size=12)
        svg.text(
            70,
            y + CELL * 0.65,
            f"{len(batches)} step{'s' if len(batches) != 1 else ''}",
            size=11,
            fill=PALETTE["exposed"]
            if v["hangs"] and len(batches) == max(v["steps"])
            else PALETTE["muted"],
            data_metric=f"steps_rank{rank}",
        )
        x = 130
        for b, batch in enumerate(batches):
            for i in batch:
                repeat = i in v["repeated"]
                svg.rect(
                    x,
                    y,
                    CELL,
                    CELL,
                    fill=REPEAT_FILL if repeat else BATCH_FILLS[b % 2],
                    stroke=PALETTE["text"] if repeat else "none",
                    title=f"sample {i}, batch {b}"
                    + (" (read twice: padding)" if repeat else ""),
                )
                svg.text(
                    x + CELL / 2, y + CELL * 0.65, str(i), size=11, anchor="middle"
                )
                x += CELL + GAP
            x += 8  # a gap between batches
    y = top + world_size * (CELL + 10) + 14
    if v["hangs"]:
        more = [r for r, s in enumerate(v["steps"]) if s == max(v["steps"])]
        verdict = (
            f"HANG: ranks {', '.join(map(str, more))} take step {max(v['steps'])}, "
            "whose all-reduce the other ranks never start"
        )
    else:
        verdict = f"every rank takes {v['steps'][0]} step(s): the all-reduces match"
    svg.text(
        10,
        y,
        verdict,
        size=12,
        weight="bold",
        fill=PALETTE["exposed"] if v["hangs"] else PALETTE["accent"],
        data_metric="verdict",
    )
    for dy, what, key in (
        (20, "read twice (padding)", "repeated"),
        (38, "never read this epoch", "unread"),
    ):
        samples = ", ".join(map(str, v[key])) or "none"
        svg.text(10, y + dy, f"{what}: {samples}", size=11, data_metric=key)
    return svg.to_string()
