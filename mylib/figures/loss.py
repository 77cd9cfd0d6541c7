"""The slider figure of chapter 2: how much each target token weighs in the loss.

Two ranks hold ``tokens_rank0`` and ``tokens_rank1`` target tokens, every
token of rank ``r`` with loss ``loss_rank_r``. Each bar is one token; its
height is the token's weight in the loss that the gradients optimise:

* **mean of per-rank means** (each rank takes the mean over its own tokens,
  gradient averaging then takes the mean over ranks): a token of rank ``r``
  weighs ``1 / (n * tokens_r)``, so tokens on a rank with few tokens weigh more;
* **token mean** (:func:`mylib.loss.token_mean_cross_entropy`): every token
  weighs ``1 / total_tokens``, as in one process on the whole batch.

Standard library only: the static site runs this function in the browser.
"""

from mylib.figures.svg import PALETTE, Svg

# the colours of ranks 0 and 1 in mylib.figures.ring
RANK_COLORS = ["#4e79a7", "#f28e2b"]


def loss_weights(tokens_rank0, tokens_rank1, loss_rank0, loss_rank1):
    """The two losses and the per-token weights, as a dict.

    A value is NaN where PyTorch's mean divides 0 by 0.
    """
    counts, losses = (tokens_rank0, tokens_rank1), (loss_rank0, loss_rank1)
    if min(counts) < 0:
        raise ValueError(f"token counts cannot be negative, got {counts}")
    nan = float("nan")
    # F.cross_entropy of no tokens is 0/0
    rank_means = [losses[r] if counts[r] else nan for r in range(2)]
    total = sum(counts)
    return {
        "mean_of_means": sum(rank_means) / 2,
        "token_mean": sum(c * l for c, l in zip(counts, losses)) / total
        if total
        else 0.0,
        "weight_mean_of_means": [1 / (2 * c) if c else nan for c in counts],
        "weight_token_mean": [1 / total if total else 0.0] * 2,
    }


def token_weights_figure(
    tokens_rank0=3, tokens_rank1=1, loss_rank0=1.0, loss_rank1=3.0
):
    """SVG: one bar per target token, its height its weight under each normalisation."""
    w = loss_weights(tokens_rank0, tokens_rank1, loss_rank0, loss_rank1)
    counts = (tokens_rank0, tokens_rank1)
    svg = Svg(
        760,
        330,
        label=f"mean of means {w['mean_of_means']:.3g}, "
        f"token mean {w['token_mean']:.3g}",
    )
    rows = [
        ("mean of per-rank means", w["weight_mean_of_means"]),
        ("token mean (all-reduced count)", w["weight_token_mean"]),
    ]
    finite = [x for _, ws in rows for x in ws if x == x and x > 0]
    top = max(finite) if finite else 1.0
    n_bars = max(sum(counts), 1)
    bar_w = min(18.0, 520.0 / n_bars)
    for i, (title, weights) in enumerate(rows):
        y0, h = 40 + i * 120, 80  # the baseline of this row is y0 + h
        svg.text(20, y0 - 10, title, size=12, weight="bold")
        svg.line(200, y0 + h, 740, y0 + h, stroke=PALETTE["muted"])
        x = 210.0
        for r in range(2):
            for _ in range(counts[r]):
                weight = weights[r]
                if weight == weight:  # not NaN
                    height = h * weight / top
                    svg.rect(
                        x,
                        y0 + h - height,
                        bar_w * 0.85,
                        height,
                        fill=RANK_COLORS[r],
                        title=f"a token of rank {r}: weight {weight:.4g}",
                    )
                x += bar_w
            x += bar_w  # a gap between the ranks
        for r in range(2):
            each = "NaN (0/0)" if weights[r] != weights[r] else f"{weights[r]:.3g} each"
            text = (
                "no tokens"
                if not counts[r]
                else (f"{counts[r]} token{'s' if counts[r] != 1 else ''}, {each}")
            )
            svg.text(
                20, y0 + 30 + 18 * r, f"rank {r}: {text}", size=11, fill=RANK_COLORS[r]
            )
    mom, tm = w["mean_of_means"], w["token_mean"]
    if mom != mom:
        verdict = "mean of means is NaN: a rank without target tokens divides 0 by 0"
    else:
        verdict = (
            f"mean of means = {mom:.4g}   vs   token mean = {tm:.4g}   "
            f"(off by {mom - tm:+.4g})"
        )
    svg.text(20, 300, verdict, size=13, weight="bold", data_metric="verdict")
    ratio = (
        f"a rank-1 token weighs {counts[0] / counts[1]:.3g}x a rank-0 token"
        if all(counts)
        else ""
    )
    svg.text(
        20,
        320,
        f"token losses: {loss_rank0:g} on rank 0, {loss_rank1:g} on rank 1.  {ratio}",
        size=11,
        fill=PALETTE["muted"],
    )
    return svg.to_string()
